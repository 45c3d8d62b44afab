"""How a rollout's steps become a batch: a batched env's lazy stacks made dense, the steps stacked
along time as TorchRL stacks them, and which envs ended a trajectory at a step."""
from __future__ import annotations

import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase

from rpc_collectors.single_process.step_records import time_names


def _dense(td: TensorDictBase) -> TensorDictBase:
    """A batched env's lazy stack of its envs' own TensorDicts (``share_individual_td=True``), which
    it writes again at its next step or reset, as a TensorDict of its own; anything else as it
    is."""
    return td.contiguous() if isinstance(td, LazyStackedTensorDict) else td


def _stack_steps(steps: list, dim: int, stacking: str = "auto") -> TensorDictBase:
    """The steps of a batch stacked along time, as TorchRL stacks them: ``"auto"``, one TensorDict
    (entries that are heterogeneous lazy stacks stay so), or, where an entry's shape changes from
    step to step (an env with dynamic specs), a lazy stack; ``"dense"`` (TorchRL's
    ``use_buffers=True``): a ``RuntimeError`` there instead; ``"lazy"``: a lazy stack of the steps,
    which a replay buffer's storage writes step by step without a dense copy first."""
    if stacking == "lazy":
        out = LazyStackedTensorDict.lazy_stack(steps, dim=dim)
    else:
        out = (torch.stack(steps, dim=dim) if stacking == "dense"
               else TensorDict.maybe_dense_stack(steps, dim=dim))
    out.names = time_names(out.batch_dims)
    return out


def end_of_trajectory(nxt: TensorDictBase, done_keys: list, batch_size: torch.Size) -> torch.Tensor:
    """Which envs of ``batch_size`` ended a trajectory: any of their ``done_keys`` (nested ones,
    such as per-agent flags, reduced over their extra dims), as TorchRL's collectors read them."""
    n = len(batch_size)
    ended = torch.zeros(batch_size, dtype=torch.bool)
    for key in done_keys:
        flag = nxt.get(key).to("cpu")
        ended = ended | (flag.flatten(n).any(-1) if flag.dim() > n else flag)
    return ended
