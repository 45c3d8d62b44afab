"""TorchRL arguments whose meaning here is another setting: ``weight_sync_schemes``,
``cudagraph_policy`` and ``trust_policy``; and those that have none (:data:`NOT_HERE`), accepted as
None.

TorchRL's weight-sync scheme objects are recognised by class name (torchrl is never imported)
and mapped onto this package's weight transport for the link they describe:

========================================  ==========================================
TorchRL scheme                            weight transport here
========================================  ==========================================
``SharedMemWeightSyncScheme``             ``"shared"`` (the policy's memory, shared; ``"shm"``
                                          with ``per_worker_weights`` or distinct factories)
``MultiProcessWeightSyncScheme``          ``"rpc"`` (a copy in each worker's message)
``RPCWeightSyncScheme``                   ``"rpc"``
``DistributedWeightSyncScheme``           ``"broadcast"`` (a process group of its own)
``RayWeightSyncScheme`` (RayCollector)    ``"rpc"`` (one ``ray.put`` per version)
``NoWeightSyncScheme``                    none: ``update_policy_weights_`` does nothing
========================================  ==========================================

:func:`scheme_objects` is the other direction: TorchRL's scheme object for the transport a
collector chose, as its ``_weight_sync_schemes`` shows it.
"""
from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from typing import Any

import torch

from rpc_collectors.core import user_warnings

SCHEMES = {
    "SharedMemWeightSyncScheme": "shared",
    "MultiProcessWeightSyncScheme": "rpc",
    "RPCWeightSyncScheme": "rpc",
    "DistributedWeightSyncScheme": "broadcast",
    "RayWeightSyncScheme": "rpc",
    "NoWeightSyncScheme": None,
}
# the transport of NoWeightSyncScheme: weights never move
NO_PUSH = "none"
# the TorchRL scheme that describes each transport chosen here (TorchRL's
# default for local workers: shared memory)
SCHEME_OF = {"shm": "SharedMemWeightSyncScheme", "shared": "SharedMemWeightSyncScheme",
             "rpc": "MultiProcessWeightSyncScheme",
             "broadcast": "DistributedWeightSyncScheme", NO_PUSH: "NoWeightSyncScheme"}


# TorchRL's arguments with no counterpart here: None (TorchRL's default) is
# accepted, anything else refused with why
_WEIGHT_PLANE = (
    "weights go through the collector's own weight plane "
    "(update_policy_weights_; the policy is sent to every worker)"
)
NOT_HERE = {
    # multi-process collectors take it (:mod:`rpc_collectors.trainer.legacy_updater`)
    "weight_updater": _WEIGHT_PLANE,
    "weight_recv_schemes": _WEIGHT_PLANE,
    "visible_devices": (
        "TorchRL's RPC device map, over which its workers hand CUDA tensors to the trainer; these "
        "workers hand their batches over in host memory and the trainer puts them on "
        "storing_device, so no device map is used"
    ),
    "tensorpipe_options": (
        "the collector's RPC agents set their own TensorPipe options (TCP "
        "transport; rpc_timeout sets their timeout)"
    ),
}


def weight_updater(name: str, value: Any) -> Any:
    """TorchRL's legacy ``weight_updater``: a user's ``WeightUpdaterBase`` subclass (recognised by
    class name), or a callable that returns one (as TorchRL's collectors take it), or None.
    TorchRL's own updaters write into its workers' memory or call its workers, which are not
    these: they are refused."""
    if value is None:
        return None
    if not _is_updater(value) and callable(value):
        value = value()
    if not _is_updater(value):
        raise TypeError(f"{name}={value!r} is invalid; accepted: None, a torchrl "
                        "WeightUpdaterBase, or a callable that returns one")
    if type(value).__module__.split(".")[0] == "torchrl":
        raise ValueError(
            f"{name}={type(value).__name__}(...) is not supported: TorchRL's own updaters reach "
            "into TorchRL's workers; accepted: None (weights go through the collector's own "
            "weight plane; weight_sync_schemes chooses it), or a WeightUpdaterBase subclass that "
            "sends through collector.pipes")
    return value


def _is_updater(value: Any) -> bool:
    return any(c.__name__ == "WeightUpdaterBase" and c.__module__.split(".")[0] == "torchrl"
               for c in type(value).__mro__)


def not_here(**arguments: Any) -> None:
    """Refuse each of TorchRL's :data:`NOT_HERE` arguments that is not None, saying why."""
    for name, value in arguments.items():
        if value is not None:
            raise ValueError(f"{name}={value!r} is not supported: {NOT_HERE[name]}; accepted: None")


def weight_sync_schemes(value: Any, weight_transport: str, ray: bool = False,
                        distinct_factories: bool = False) -> str:
    """The weight transport that TorchRL's ``weight_sync_schemes`` (``{"policy": scheme}``) names;
    ``weight_transport`` when there is none; :data:`NO_PUSH` for ``NoWeightSyncScheme``.
    ``distinct_factories``: the workers build their policies with factories of their own."""
    if value is None or (isinstance(value, Mapping) and not value):
        return weight_transport
    if not isinstance(value, Mapping):
        raise TypeError(f"weight_sync_schemes={value!r} is invalid; accepted: None "
                        "or a dict {'policy': scheme}")
    others = sorted(str(key) for key in value if key != "policy")
    if others:
        raise ValueError(
            f"weight_sync_schemes has schemes for {others}; only the policy's weights "
            "are pushed here; accepted keys: 'policy'"
        )
    scheme = value["policy"]
    name = type(scheme).__name__
    if name not in SCHEMES or type(scheme).__module__.split(".")[0] != "torchrl":
        raise ValueError(
            f"weight_sync_schemes={{'policy': {name}}} cannot map onto this collector's weight "
            "transports (shared memory, one broadcast, or a copy per worker); accepted: "
            f"TorchRL's {', '.join(sorted(SCHEMES))}"
        )
    if name == "RayWeightSyncScheme" and not ray:
        raise ValueError(
            "weight_sync_schemes={'policy': RayWeightSyncScheme} is for RayCollector, whose actors "
            "get the weights through Ray; accepted here: SharedMemWeightSyncScheme, "
            "MultiProcessWeightSyncScheme, DistributedWeightSyncScheme, "
            "RPCWeightSyncScheme or NoWeightSyncScheme"
        )
    transport = SCHEMES[name] or NO_PUSH
    # TorchRL's per-worker buffers (asked for, or set by its scheme itself for distinct
    # factories): each worker its own weights, not the trainer's memory
    per_worker = getattr(scheme, "per_worker_weights", False) or (
        distinct_factories and weight_transport == "auto")
    if transport == "shared" and per_worker:
        transport = "shm"
    if weight_transport not in ("auto", transport):
        raise ValueError(
            f"weight_sync_schemes={{'policy': {name}}} means weight_transport={transport!r}, which "
            f"conflicts with weight_transport={weight_transport!r}; accepted: one of the two"
        )
    return transport


def scheme_objects(given: Mapping | None, transport: str, ray: bool = False) -> dict:
    """``{"policy": scheme}``: the TorchRL scheme object given to the constructor, or else a new one
    of TorchRL's class for ``transport`` (the weight transport chosen: ``"shm"``, ``"rpc"`` (with
    ``ray``: ``RayWeightSyncScheme``), ``"broadcast"`` or :data:`NO_PUSH`). Empty where torchrl is
    not installed, or no transport is chosen yet (``"auto"``, before the workers are up)."""
    if given:
        return dict(given)
    if transport not in SCHEME_OF or importlib.util.find_spec("torchrl") is None:
        return {}
    module = importlib.import_module("torchrl.weight_update")
    name = "RayWeightSyncScheme" if ray and transport == "rpc" else SCHEME_OF[transport]
    return {"policy": getattr(module, name)()}


REPLAY_WRITE_MODES = ("rollout", "trajectory")


def replay_write_mode(value: Any, replay_buffer: Any, trajs_per_batch: int | None) -> str:
    """TorchRL's ``replay_write_mode``: ``"rollout"`` writes each batch into the ``replay_buffer``,
    ``"trajectory"`` only whole trajectories, each as it ends; None: ``"trajectory"`` with
    ``trajs_per_batch`` and a ``replay_buffer`` (as TorchRL), else ``"rollout"``."""
    if value is not None and (not isinstance(value, str) or value not in REPLAY_WRITE_MODES):
        raise ValueError(f"replay_write_mode={value!r} is invalid; accepted: "
                         "None, 'rollout' or 'trajectory'")
    whole = trajs_per_batch is not None and replay_buffer is not None
    if value == "trajectory" and replay_buffer is None:
        raise ValueError("replay_write_mode='trajectory' writes whole trajectories into the replay "
                         "buffer, which needs a replay_buffer; accepted "
                         "without one: None or 'rollout'")
    if value == "rollout" and whole:
        raise ValueError("replay_write_mode='rollout' with trajs_per_batch and a replay_buffer: "
                         "trajs_per_batch writes whole trajectories; accepted "
                         "with them: None or 'trajectory'")
    return value or ("trajectory" if whole else "rollout")


def trajs_per_write(value: Any, whole_trajectories: bool, replay_buffer: Any) -> int | None:
    """TorchRL's ``trajs_per_write``: how many whole trajectories (``trajs_per_batch`` or
    ``replay_write_mode="trajectory"``) go into the ``replay_buffer`` per ``extend()``; None: all
    that completed with a batch."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"trajs_per_write={value!r} is invalid; accepted: None or an int >= 1")
    if not whole_trajectories or replay_buffer is None:
        raise ValueError(
            f"trajs_per_write={value!r} sets how many whole trajectories go into the replay buffer "
            "per write, which needs trajs_per_batch and a replay_buffer (or "
            "replay_write_mode='trajectory'); accepted without them: None"
        )
    return value


def cudagraph_policy(value: Any, name: str = "cudagraph_policy") -> None:
    """TorchRL's ``cudagraph_policy``: None/False; True or a dict of ``CudaGraphModule`` arguments
    only on a machine without CUDA, where (as TorchRL's ``CudaGraphModule`` does there) the policy
    runs as it is, with a warning that says so."""
    if value is None or value is False:
        return
    if value is not True and not isinstance(value, Mapping):
        raise TypeError(f"{name}={value!r} is invalid; accepted: None, a bool or a "
                        "dict of CudaGraphModule arguments")
    if torch.cuda.is_available():
        raise ValueError(
            f"{name}={value!r} is not supported on CUDA (the policy would not be captured in a "
            "CUDA graph); accepted: None or False (compile_policy=True compiles the policy)"
        )
    user_warnings.warn(
        f"{name}={value!r}: this machine has no CUDA device, so the policy runs as it is, without "
        "CUDA graphs or their speed-up (as TorchRL's CudaGraphModule "
        "passes calls through without CUDA)",
    )


def trust_policy(value: Any, name: str = "trust_policy") -> bool:
    """TorchRL's ``trust_policy``: True calls a policy on the step's TensorDict as it is, even a
    plain ``nn.Module`` (which otherwise reads ``"observation"`` and writes ``"action"``)."""
    if value is None:
        return False
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r} is invalid; accepted: None or a bool")
    return value
