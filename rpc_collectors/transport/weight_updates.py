"""A call of ``update_policy_weights_``, checked whole before anything changes.

Every form (an ``nn.Module``, a TensorDict of weights, a state dict, None for the policy's own
tensors, TorchRL's per-worker ``{worker_id: weights}``, with or without ``worker_ids``) and
every collector go through :func:`whole_update` first. It checks every worker id and every
entry against the policy's layout (:func:`~rpc_collectors.transport.weights.checked`) and returns
what each worker takes; only then does the collector change a policy or a version. What it
returns copies in without failing, so an update is applied whole, or, when it raises, not at all.
"""
from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

from rpc_collectors.core import worker_checks
from rpc_collectors.transport.weights import checked, signature_of, weights_of


def whole_update(
    given: Any, worker_ids: Any, layout: tuple | None, num_workers: int,
    device: torch.device | list | None,
) -> dict[int, TensorDictBase | None]:
    """``{worker_id: weights}`` of one update (weights None: the policy's own tensors at the push).

    ``layout``: the policy's :func:`~rpc_collectors.transport.weights.signature_of`; None when the
    workers build their policies and none were pushed yet (the entries must then agree with each
    other; the workers' policies check the first). ``device``: where the workers run their policy
    (TorchRL's ``worker_ids`` form). A ValueError or TypeError names what is wrong.
    """
    if worker_checks.per_worker_weights(given, worker_ids):
        ids = worker_checks.worker_ids(list(given), num_workers, None)
        update = {}
        for worker_id in ids:
            argument = f"policy_or_weights[{worker_id}]"
            # the first entry lays the others out
            if layout is None:
                layout = signature_of(weights_of(given[worker_id], argument))
            update[worker_id] = checked(given[worker_id], layout, argument)
        return update
    ids = worker_checks.worker_ids(worker_ids, num_workers, device)
    if given is None:
        weights = None
    elif layout is None:
        weights = weights_of(given)
    else:
        weights = checked(given, layout)
    return dict.fromkeys(ids, weights)
