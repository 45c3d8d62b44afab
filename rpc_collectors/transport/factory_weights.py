"""Weights for policies that the workers build themselves (TorchRL's ``policy_factory``).

The trainer then holds no policy, so its weight plane cannot be laid out at construction. It
is laid out from the first weights the user pushes (a TensorDict such as
``TensorDict.from_module(policy).lock_()``, a state dict or a module), once every worker's
policy was found to hold tensors of the same keys, dtypes and shapes. From then on pushes take
the same transports and version counting as for a policy given to the constructor; a push
without weights (``update_policy_weights_()``, ``update_after_each_batch``,
``max_weight_update_interval``) sends the weights given last.
"""
from __future__ import annotations

from typing import Any

from rpc_collectors.transport import weights

NO_WEIGHTS = (
    "update_policy_weights_: the workers build their policies (policy_factory) and no weights were "
    "pushed yet, so there are none to send; accepted: update_policy_weights_(weights) with a "
    "TensorDict (TensorDict.from_module(policy)), a state dict or a module of the workers' policy"
)
NOT_A_MODULE = ("update_policy_weights_: the policy is not an nn.Module, so it has no weights "
                "to push")


def check_workers(signatures: dict[int, tuple | None], source: Any) -> None:
    """A ValueError if ``source`` (weights, or the trainer's policy) does not fit a worker's policy
    (None: a node, which takes any)."""
    mine = weights.signature_of(source)
    for worker_id, theirs in sorted(signatures.items()):
        if theirs is None:
            continue
        if not theirs:
            raise TypeError(f"update_policy_weights_: worker {worker_id}'s policy has no weights "
                            "to update")
        weights.check_layout(mine, theirs, f"update_policy_weights_ to worker {worker_id}",
                             "the worker's policy")


def signature_of(policy: Any) -> tuple:
    """What a worker's policy holds, for :func:`check_workers` (empty: no weights at all)."""
    return weights.signature_of(policy) if policy is not None else ()
