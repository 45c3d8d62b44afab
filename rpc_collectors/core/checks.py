"""Argument checks shared by every collector, run before any env or process starts."""
from __future__ import annotations

import numbers
import os
from typing import Any

import torch
from tensordict.nn import InteractionType

from rpc_collectors.core import pickling, user_warnings

# seconds (11.6 days): what every timer below the RPC layer can hold
MAX_TIMEOUT = 1e6


def _is_int(value: Any) -> bool:
    """Python and numpy integers, not bools."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def positive_int(name: str, value: Any) -> int:
    if not _is_int(value) or value <= 0:
        raise ValueError(f"{name}={value!r} is invalid; accepted: an int > 0")
    return int(value)


def choice(name: str, value: Any, accepted: tuple) -> Any:
    if isinstance(value, bool) or value not in accepted:
        raise ValueError(f"{name}={value!r} is invalid; accepted: {', '.join(map(repr, accepted))}")
    return value


def timeout(name: str, value: Any, *, zero: bool = False) -> float:
    """A finite number of seconds, > 0 (>= 0 with ``zero``) and at most
    ``MAX_TIMEOUT``; NaN is refused."""
    number = not isinstance(value, bool) and isinstance(value, numbers.Real)
    if not number or not (0 <= value if zero else 0 < value) or not value <= MAX_TIMEOUT:
        bound = ">= 0" if zero else "> 0"
        raise ValueError(f"{name}={value!r} is invalid; accepted: a number of seconds "
                         f"{bound} and <= {MAX_TIMEOUT:.0f}")
    return float(value)


def seed(value: Any) -> int:
    if not _is_int(value):
        raise TypeError(f"seed={value!r} is invalid; accepted: an int")
    return int(value)


def picklable(name: str, value: Any) -> None:
    """``value`` must survive the trip to a worker process (cloudpickle)."""
    try:
        pickling.dumps(value)
    except Exception as err:
        raise TypeError(
            f"{name}={value!r} cannot be sent to the worker processes ({type(err).__name__}: "
            f"{err}); accepted: an object cloudpickle can pickle: build locks, sockets, open "
            "files and the like inside the env factory"
        ) from err


def optional_positive_int(name: str, value: Any) -> int | None:
    return None if value is None else positive_int(name, value)


def max_frames_per_traj(value: Any, name: str = "max_frames_per_traj") -> int | None:
    """None or -1 (TorchRL's spelling) for no limit, else an int > 0."""
    if value is None or (_is_int(value) and value == -1):
        return None
    if not _is_int(value) or value <= 0:
        raise ValueError(f"{name}={value!r} is invalid; accepted: None or -1 "
                         "(no limit), or an int > 0")
    return int(value)


def no_step_counter(env: Any, max_frames: Any) -> None:
    """``max_frames_per_traj`` counts steps itself: refused, as TorchRL refuses it, on an env whose
    ``output_spec`` already has a ``"step_count"`` (a ``StepCounter`` transform)."""
    spec = getattr(env, "output_spec", None)
    keys = spec.keys(True, True) if spec is not None else ()
    counted = [key for key in keys if "step_count" in ((key,) if isinstance(key, str) else key)]
    if counted:
        raise ValueError(
            f"max_frames_per_traj={max_frames!r} conflicts with the env's own step counter "
            f"({counted[0]!r} in its output_spec, e.g. a StepCounter transform); accepted: "
            "max_frames_per_traj=None or -1 with this env, or an env without a StepCounter (use "
            "StepCounter(max_steps=...) to limit its trajectories)"
        )


def init_random_frames(value: Any, name: str = "init_random_frames") -> int:
    """None or -1 (TorchRL's spelling) for no random frames, else an int >= 0."""
    if value is None or (_is_int(value) and value == -1):
        return 0
    if not _is_int(value) or value < 0:
        raise ValueError(f"{name}={value!r} is invalid; accepted: None or "
                         "-1 (none), or an int >= 0")
    return int(value)


def non_negative_int(name: str, value: Any) -> int:
    value = 0 if value is None else value
    if not _is_int(value) or value < 0:
        raise ValueError(f"{name}={value!r} is invalid; accepted: an int >= 0")
    return int(value)


def boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r} is invalid; accepted: True or False")
    return value


def optional_boolean(name: str, value: Any) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{name}={value!r} is invalid; accepted: None, True or False")
    return value


def return_same_td(value: Any, writes_buffer: bool, trajs_per_batch: Any) -> bool:
    """TorchRL's ``return_same_td``, refused beside a replay buffer the collector writes (as
    TorchRL's) and beside ``trajs_per_batch``, whose held-back trajectories a batch overwritten
    in place would change."""
    value = boolean("return_same_td", value)
    if value and writes_buffer:
        raise TypeError("return_same_td=True and a replay_buffer were both given; accepted with a "
                        "replay_buffer: return_same_td=False")
    if value and trajs_per_batch is not None:
        raise TypeError(f"return_same_td=True and trajs_per_batch={trajs_per_batch!r} were both "
                        "given; accepted with trajs_per_batch: return_same_td=False")
    return value


def use_buffers(value: Any, replay_buffer: Any) -> bool | None:
    value = optional_boolean("use_buffers", value)
    if value and replay_buffer is not None:
        raise TypeError("use_buffers=True and a replay_buffer were both given; accepted "
                        "with a replay_buffer: None or False")
    return value


def optional_callable(name: str, value: Any) -> Any:
    if value is not None and not callable(value):
        raise TypeError(f"{name}={value!r} is not callable; accepted: None or a callable")
    return value


def traj_format(value: Any, trajs_per_batch: int | None, split_trajs: bool,
                replay_buffer: Any = None) -> str:
    """``traj_format`` of ``trajs_per_batch`` batches: ``"padded"`` (default, TorchRL 0.14's) or
    ``"cat"``. Left to its default where batches are yielded, it warns as TorchRL does that TorchRL
    0.16's default, which this package follows, is ``"cat"``."""
    if value is not None and trajs_per_batch is None:
        raise ValueError(f"traj_format={value!r} needs trajs_per_batch; accepted without it: None")
    if trajs_per_batch is not None and split_trajs:
        raise ValueError("trajs_per_batch yields whole trajectories; accepted "
                         "with it: split_trajs=False")
    # TorchRL's wording, which its users match on
    if value not in (None, "padded", "cat"):
        raise ValueError(f"traj_format={value!r} is invalid: it must be 'padded' or 'cat'")
    if value is None and trajs_per_batch is not None and replay_buffer is None:
        user_warnings.warn(
            "trajs_per_batch is set but traj_format is not: batches are 'padded', but the default "
            "will change to 'cat' in torchrl v0.16 (and here with it); pass traj_format='padded' "
            "to keep this layout, or traj_format='cat' for whole "
            "trajectories laid end to end", FutureWarning)
    return "padded" if value is None else value


def interruptor(value: Any, name: str = "interruptor") -> Any:
    """TorchRL's ``interruptor``: None, or an object with a ``collection_stopped()`` method."""
    if value is not None and not callable(getattr(value, "collection_stopped", None)):
        raise TypeError(f"{name}={value!r} is invalid; accepted: None or an object with a "
                        "collection_stopped() method (TorchRL's _Interruptor)")
    return value


# TorchRL's collector_class, by name: what each worker runs (None: a single-process Collector)
NODE_CLASSES = {
    "single": None, "Collector": None, "SyncDataCollector": None,
    "sync": "sync", "MultiSyncCollector": "sync", "MultiSyncDataCollector": "sync",
    "async": "async", "MultiAsyncCollector": "async", "MultiaSyncDataCollector": "async",
}


def node_class(collector_class: Any, num_workers_per_collector: Any) -> tuple[str | None, int]:
    """``("sync" | "async" | None, W)`` of TorchRL's ``collector_class`` (a string, or one of
    the collector classes, ours or TorchRL's, by name) and ``num_workers_per_collector``."""
    accepted = ("'single', 'sync', 'async', or the classes Collector, MultiSyncCollector, "
                "MultiAsyncCollector (ours or TorchRL's; also their older names)")
    name = collector_class if isinstance(collector_class,
                                         str) else getattr(collector_class, "__name__", None)
    module = getattr(collector_class, "__module__", "") or ""
    known = isinstance(collector_class, str) or (
        isinstance(collector_class, type) and module.split(".")[0] in ("rpc_collectors", "torchrl")
    )
    if not known or name not in NODE_CLASSES:
        raise ValueError(f"collector_class={collector_class!r} is invalid; accepted: {accepted}")
    kind = NODE_CLASSES[name]
    count = num_workers_per_collector
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"num_workers_per_collector={num_workers_per_collector!r} is invalid; "
                         "accepted: an int >= 1")
    if kind is None and num_workers_per_collector != 1:
        raise ValueError(
            f"num_workers_per_collector={num_workers_per_collector} needs a multi-process "
            f"collector_class; accepted with collector_class={collector_class!r}: 1 (or "
            "collector_class='sync' / 'async')"
        )
    return kind, int(num_workers_per_collector)


def split_needs_ids(split_trajs: bool, track_traj_ids: Any) -> None:
    if split_trajs and track_traj_ids is False:
        raise ValueError("split_trajs=True and trajs_per_batch need track_traj_ids=True "
                         "(trajectories are told apart by their ids)")


def preemption_fits(value: float | None, elastic: bool, whole_trajectories: bool) -> None:
    """``preemptive_threshold`` (checked, below 1.0) against the options of other groups."""
    if value is None or value == 1.0:
        return
    if elastic:
        raise ValueError(f"preemptive_threshold={value!r} does not work with "
                         "elastic=True; accepted with it: None")
    if whole_trajectories:
        raise ValueError(
            f"preemptive_threshold={value!r} pads a preempted worker's batch with steps it did not "
            "collect, which split_trajs=True, trajs_per_batch and replay_write_mode='trajectory' "
            "would take for a trajectory; accepted with them: None"
        )


def compile_kwargs(value: Any) -> dict | None:
    """``compile_policy``: None/False (not compiled), True (``torch.compile``'s
    defaults) or its keyword arguments."""
    if value is None or value is False:
        return None
    if value is True:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"compile_policy={value!r} is invalid; accepted: None, a bool or "
                        "a dict of torch.compile arguments")
    return dict(value)


def policy_or_factory(policy: Any, policy_factory: Any) -> Any:
    """The policy, built by ``policy_factory`` when one is given (not both, as in TorchRL)."""
    if policy_factory is None:
        return policy
    if policy is not None:
        raise TypeError("policy and policy_factory were both given; accepted: one of them")
    if not callable(policy_factory):
        raise TypeError(f"policy_factory={policy_factory!r} is not callable; accepted: "
                        "None or a callable returning a policy")
    return policy_factory()


def env_kwargs(value: Any, each: str | None = None) -> Any:
    """TorchRL's ``create_env_kwargs``, as given: None or a dict of keyword arguments (str keys);
    where each ``each`` (``"worker"``, ``"env"``) builds its own env, also a list of such dicts, one
    per ``each`` (their number is checked where it is known)."""
    entries = value if each is not None and isinstance(value, (list, tuple)) else [value]
    dicts = all(isinstance(kw, dict) and all(isinstance(key, str) for key in kw) for kw in entries)
    if value is None or (entries and dicts):
        return value
    listed = f", or a list of them, one per {each}" if each is not None else ""
    raise TypeError(f"create_env_kwargs={value!r} is invalid; accepted: None or a dict of "
                    f"keyword arguments (str keys){listed}")


def device(name: str, value: Any) -> torch.device | None:
    if value is None:
        return None
    try:
        dev = torch.device(value)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"{name}={value!r} is not a device; accepted: None, 'cpu', "
                         "'cuda', 'cuda:N' or a torch.device") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name}={value!r} asks for CUDA, which this machine does not "
                         "have; accepted here: None or 'cpu'")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(
            f"{name}={value!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
        )
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}={value!r} is not supported; accepted: "
                         "None, 'cpu', 'cuda' or 'cuda:N'")
    return dev


def devices(device_: Any, storing_device: Any, env_device: Any,
            policy_device: Any) -> dict[str, torch.device | None]:
    """Resolve the four device arguments; ``device`` is the default for the other three."""
    base = device("device", device_)
    return {
        "storing_device": device("storing_device", storing_device) or base,
        "env_device": device("env_device", env_device) or base,
        "policy_device": device("policy_device", policy_device) or base,
    }


def exploration_type(value: Any, name: str = "exploration_type") -> InteractionType:
    """TorchRL's ``ExplorationType`` (tensordict's ``InteractionType``) or its
    name; None: RANDOM."""
    if value is None:
        return InteractionType.RANDOM
    if isinstance(value, InteractionType):
        return value
    names = [t.name for t in InteractionType]
    if isinstance(value, str) and value.upper() in names:
        return InteractionType[value.upper()]
    raise ValueError(
        f"{name}={value!r} is invalid; accepted: None (RANDOM), an ExplorationType "
        f"(tensordict.nn.InteractionType) or one of the names {names}"
    )


def frames_per_batch_fits(frames_per_batch: int, parts: int, what: str = "envs") -> int:
    """Frames for each of ``parts`` envs or workers: ``frames_per_batch`` divided, rounded up.

    As TorchRL does, a ``frames_per_batch`` that does not divide evenly is rounded up with a
    warning.
    """
    per_part = -(-frames_per_batch // parts)
    if frames_per_batch % parts:
        user_warnings.warn(
            f"frames_per_batch={frames_per_batch} does not divide evenly over {parts} {what}: each "
            f"batch holds {per_part * parts} frames ({per_part} per {what[:-1]}); pass a multiple "
            f"of {parts} to get exactly frames_per_batch"
        )
    return per_part


def total_frames_fits(total_frames: int, frames_per_batch: int) -> None:
    """As TorchRL, a warning when whole batches of ``frames_per_batch`` overshoot ``total_frames``
    (the run collects every frame of its last batch)."""
    if total_frames != -1 and total_frames % frames_per_batch:
        batches = -(-total_frames // frames_per_batch)
        user_warnings.warn(
            f"total_frames={total_frames} is not a multiple of the batch size ({frames_per_batch} "
            f"frames): the run collects {batches * frames_per_batch} frames in {batches} "
            f"batch{'es' if batches > 1 else ''}; pass a multiple of "
            f"{frames_per_batch} to get exactly total_frames"
        )


def writable_file(name: str, value: Any) -> str:
    """A path a file can be written to now: its folder exists and is writable,
    and it is no folder."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name}={value!r} is invalid; accepted: a file path (str or os.PathLike)")
    path = os.fspath(value)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(folder) or not os.access(folder, os.W_OK) \
            or (os.path.exists(path) and not os.access(path, os.W_OK)):
        why = "is a folder" if os.path.isdir(path) else f"cannot be written in {folder!r}"
        raise ValueError(f"{name}={path!r} {why}; accepted: a file path in "
                         "an existing, writable folder")
    return path
