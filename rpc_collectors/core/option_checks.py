"""Each option's own check, as the options table (:mod:`rpc_collectors.core.options`) runs it when
a group is built: ``(name, value) -> value``, the value as the group keeps it; and the checks of
options that read others of their group (``preemptive_threshold``, ``max_policy_lag``,
``extend_buffer=False``), which the groups run after the others.
"""
from __future__ import annotations

from typing import Any

import torch
from tensordict.nn import InteractionType

from rpc_collectors.core import checks, torchrl_args


def frames_per_batch(name: str, value: Any) -> int | list[int]:
    """An int > 0, or TorchRL's list of one per worker (each an int > 0)."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{name}={value!r} is invalid; accepted: an int > 0, or a "
                             "list of them, one per worker")
        return [checks.positive_int(f"{name}[{i}]", f) for i, f in enumerate(value)]
    return checks.positive_int(name, value)


def total_frames(name: str, value: Any) -> int:
    if not checks._is_int(value) or (value <= 0 and value != -1):
        raise ValueError(f"total_frames={value!r} is invalid; accepted: -1 (endless) or an int > 0")
    return int(value)


def replay_buffer(name: str, value: Any) -> Any:
    if value is not None and not callable(getattr(value, "extend", None)):
        raise TypeError(
            f"replay_buffer={value!r} has no extend() method; accepted: None or any object with "
            ".extend(tensordict), such as a TorchRL ReplayBuffer"
        )
    return value


def optional_boolean(name: str, value: Any) -> bool | None:
    return checks.optional_boolean(name, value)


def optional_dict(name: str, value: Any) -> dict | None:
    if value is not None and not isinstance(value, dict):
        raise TypeError(f"{name}={value!r} is invalid; accepted: None or a dict")
    return value


def reset_when_done(name: str, value: Any) -> bool:
    """Envs are always reset when done; False is refused, as TorchRL refuses it."""
    if value is not True:
        raise ValueError(f"reset_when_done={value!r} is invalid; accepted: True (envs "
                         "are reset when done, as in TorchRL)")
    return value


def boolean(name: str, value: Any) -> bool:
    return checks.boolean(name, value)


def optional_positive_int(name: str, value: Any) -> int | None:
    return checks.optional_positive_int(name, value)


def exploration_type(name: str, value: Any) -> InteractionType:
    return checks.exploration_type(value, name)


def max_frames_per_traj(name: str, value: Any) -> Any:
    checks.max_frames_per_traj(value, name)
    # as given: None and TorchRL's -1 both say no limit
    return value


def init_random_frames(name: str, value: Any) -> Any:
    checks.init_random_frames(value, name)
    # as given: None and TorchRL's -1 both say none
    return value


def split_trajs(name: str, value: Any) -> bool:
    # TorchRL's None is False
    return checks.boolean(name, False if value is None else value)


def optional_callable(name: str, value: Any) -> Any:
    return checks.optional_callable(name, value)


def compile_policy(name: str, value: Any) -> dict | None:
    return checks.compile_kwargs(value)


def trust_policy(name: str, value: Any) -> bool:
    return torchrl_args.trust_policy(value, name)


def cudagraph_policy(name: str, value: Any) -> Any:
    torchrl_args.cudagraph_policy(value, name)
    return value


def timeout(name: str, value: Any) -> float:
    return checks.timeout(name, value)


def backend(name: str, value: Any) -> str:
    checks.choice(name, value, ("gloo", "nccl"))
    if value == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend='nccl' needs CUDA, which this machine does "
                         "not have; accepted here: 'gloo'")
    return value


def device(name: str, value: Any) -> Any:
    """One device, or TorchRL's list of one per worker (their number is checked
    with the workers), as given."""
    listed = isinstance(value, (list, tuple))
    for i, entry in enumerate(value if listed else [value]):
        checks.device(f"{name}[{i}]" if listed else name, entry)
    return value


def non_negative_int(name: str, value: Any) -> int:
    return checks.non_negative_int(name, value)


def update_interval(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise ValueError(f"{name}={value!r} is invalid; accepted: -1 (never) or an int >= 0")
    return value


def preemptive_threshold(value: Any, sync: Any) -> float | None:
    """TorchRL's ``preemptive_threshold``: None (or 1.0: every worker finishes) for no preemption,
    else a fraction in [0, 1) of the workers of a sync round that finish before the others stop."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"preemptive_threshold={value!r} is invalid; "
                         "accepted: None or a number in [0, 1]")
    if value == 1.0:
        return 1.0
    if sync is False:
        raise ValueError(
            f"preemptive_threshold={value!r} ends the rounds of a sync collector early; an async "
            "one hands in each worker's batch as soon as it is ready, so nothing waits on "
            "the slowest; accepted with sync=False: None"
        )
    return float(value)


def max_policy_lag(value: Any, sync: Any) -> int | None:
    """``max_policy_lag``: None (no bound) or an int >= 0 (for async collection:
    :mod:`~rpc_collectors.trainer.continuity`)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"max_policy_lag={value!r} is invalid; accepted: "
                         "None (no bound) or an int >= 0")
    if sync:
        raise ValueError(
            f"max_policy_lag={value!r} applies to async collection, where a worker's batch may lag "
            "the trainer's weights; accepted with sync=True: None"
        )
    return value


def step_by_step_buffer(buffer: Any, postproc: Any, split_trajs: bool) -> None:
    """``extend_buffer=False`` adds steps one at a time: no whole batch for
    ``postproc``/``split_trajs``."""
    if not callable(getattr(buffer, "add", None)):
        raise TypeError(f"extend_buffer=False needs a replay_buffer with add(); {buffer!r} "
                        "has none; accepted: extend_buffer=True")
    if postproc is not None or split_trajs:
        raise ValueError("extend_buffer=False adds each step to the replay buffer; "
                         "accepted with it: postproc=None, split_trajs=False")
