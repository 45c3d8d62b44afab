"""``Collector(..., num_collectors=N, backend=..., sync=..., backend_options=...)``: TorchRL
0.14.1's dispatch.

Calling :class:`~rpc_collectors.Collector` itself with any of these keywords builds the collector
the backend names, as TorchRL's ``Collector`` does: ``"direct"`` (this process; the default
without ``num_collectors``), ``"process"`` (:class:`~rpc_collectors.MultiCollector`, the default
with it), ``"rpc"`` (:class:`~rpc_collectors.RPCCollector`), ``"distributed"`` and
``"submitit"`` (:class:`~rpc_collectors.DistributedCollector`, the latter with
``launcher="submitit"``) and ``"ray"`` (``RayCollector``). Contradictory arguments raise before
anything starts. ``backend_options`` are the chosen class's own keywords.

Where the program imported TorchRL, its ``torchrl.service_backend(...)`` context chooses the
backend when none is given, and a class put at TorchRL's path of a backend's class (rebinding
``torchrl.collectors.distributed.rpc.RPCCollector``, or ``unittest.mock.patch`` of it) is what
that backend builds, as TorchRL's dispatch looks its classes up there; TorchRL's own classes
standing there are not used, and torchrl is never imported here.
"""
from __future__ import annotations

import inspect
import sys
from typing import Any

from rpc_collectors.collectors.distributed_collector import DistributedCollector
from rpc_collectors.collectors.multi import MultiCollector
from rpc_collectors.collectors.ray_extra import ray_collector
from rpc_collectors.collectors.rpc import RPCCollector
from rpc_collectors.single_process.collector import Collector

BACKENDS = ("direct", "process", "ray", "rpc", "distributed", "submitit")
# TorchRL's long spelling
ALIASES = {"multiprocessing": "process"}
POSITIVE = "it must be a positive integer; accepted: None or an int >= 1"
RESERVED_OPTIONS = {"backend_options", "num_collectors", "num_workers", "sync"}
# where TorchRL's dispatch finds each backend's class
TORCHRL_PATHS = {
    "process": ("torchrl.collectors._multi_base", "MultiCollector"),
    "ray": ("torchrl.collectors.distributed.ray", "RayCollector"),
    "rpc": ("torchrl.collectors.distributed.rpc", "RPCCollector"),
    "distributed": ("torchrl.collectors.distributed.generic", "DistributedCollector"),
    "submitit": ("torchrl.collectors.distributed.generic", "DistributedCollector"),
}


def resolve(args: tuple, kwargs: dict, backend: Any, backend_options: Any, num_collectors: Any,
            sync: Any) -> tuple:
    """``(class, args, kwargs)`` that ``Collector(*args, **kwargs)`` with these selectors builds;
    class None: the single-process ``Collector``. Raises on contradictory arguments."""
    if len(args) > 2:
        raise TypeError(f"Collector takes at most create_env_fn and policy positionally, got "
                        f"{len(args)} positional arguments; accepted: the others as keywords")
    not_int = isinstance(num_collectors, bool) or not isinstance(num_collectors, int)
    if num_collectors is not None and not_int:
        raise TypeError(f"num_collectors={num_collectors!r} is invalid: {POSITIVE}")
    if num_collectors is not None and num_collectors < 1:
        raise ValueError(f"num_collectors={num_collectors!r} is invalid: {POSITIVE}")
    from_context = backend is None and _context_backend() is not None
    if backend is None:
        backend = _context_backend() or ("direct" if num_collectors is None else "process")
    backend = ALIASES.get(backend, backend) if isinstance(backend, str) else backend
    if backend not in BACKENDS:
        context = " (selected by an enclosing torchrl.service_backend context)"
        chosen = context if from_context else ""
        raise ValueError(f"backend={backend!r}{chosen} is not supported by Collector; "
                         f"accepted: {', '.join(map(repr, BACKENDS))}")
    if backend_options is not None and not isinstance(backend_options, dict):
        raise TypeError(f"backend_options={backend_options!r} is invalid; accepted: None or a "
                        "dict of keywords")
    options = dict(backend_options or {})
    reserved = sorted(RESERVED_OPTIONS & set(options))
    if reserved:
        raise ValueError(f"backend_options has the keys {reserved}, reserved for Collector's own "
                         f"arguments; accepted: pass them as Collector(..., {reserved[0]}=...)")
    positional = set(("create_env_fn", "policy")[: len(args)])
    duplicates = sorted(set(options) & (set(kwargs) | positional))
    if duplicates:
        raise ValueError(f"backend_options has duplicate arguments {duplicates}, also given to "
                         "Collector; accepted: each once")
    if backend == "direct":
        return None, *_direct(args, kwargs, num_collectors, sync, options)
    if sync is not None and not isinstance(sync, bool):
        raise TypeError(f"sync={sync!r} is invalid; accepted: None (False), True or False")
    kwargs.update(options)
    args, kwargs, num_collectors = _env_list(args, kwargs, num_collectors)
    target, extra = _target(backend, num_collectors)
    if backend == "submitit":
        launcher = kwargs.setdefault("launcher", "submitit")
        if launcher != "submitit":
            raise ValueError(f"backend='submitit' with launcher={launcher!r}: it requires "
                             "launcher='submitit'; accepted: launcher='submitit' or none "
                             "(backend='distributed' takes the other launchers)")
    _drop_collector_defaults(target, kwargs)
    return _torchrl_path_class(backend) or target, args, {**kwargs, **extra, "sync": bool(sync)}


def _direct(args: tuple, kwargs: dict, num_collectors: Any, sync: Any,
            options: dict) -> tuple[tuple, dict]:
    """The single-process collector's arguments: one env (a list must hold exactly one)."""
    if num_collectors not in (None, 1):
        raise ValueError(f"backend='direct' with num_collectors={num_collectors!r}: it runs at "
                         "most one collector; accepted: None or 1 (more collectors: "
                         "backend='process', 'rpc', 'distributed', 'submitit' or 'ray')")
    if sync is not None:
        raise ValueError(f"sync={sync!r} with backend='direct'; accepted: None (sync is for "
                         "multi-collector backends)")
    if options:
        raise ValueError(f"backend_options={options!r} with backend='direct'; accepted: None "
                         "(options are for multi-collector backends)")
    env, put = _env_argument(args, kwargs)
    if isinstance(env, (list, tuple)):
        if len(env) != 1:
            raise ValueError(f"backend='direct' with {len(env)} env constructors in "
                             "create_env_fn; accepted: exactly one")
        args, kwargs = put(env[0])
    return args, kwargs


def _env_argument(args: tuple, kwargs: dict) -> tuple[Any, Any]:
    """``create_env_fn`` as given, and a function that puts a new value where it was."""
    if args:
        return args[0], lambda value: ((value, *args[1:]), kwargs)
    return kwargs.get("create_env_fn"), lambda value: (args, {**kwargs, "create_env_fn": value})


def _env_list(args: tuple, kwargs: dict, num_collectors: int | None) -> tuple[tuple, dict, int]:
    """``create_env_fn`` as a list of one constructor per collector, checked against
    ``num_collectors``."""
    env, put = _env_argument(args, kwargs)
    if isinstance(env, (list, tuple)):
        if not env:
            raise ValueError("create_env_fn=[] is empty; accepted: an env constructor or a "
                             "non-empty list of them")
        if num_collectors is not None and num_collectors != len(env):
            raise ValueError(f"num_collectors={num_collectors} does not match the {len(env)} env "
                             "constructors of create_env_fn; accepted: the same number, or "
                             "num_collectors=None")
        num_collectors = len(env)
    else:
        num_collectors = num_collectors or 1
    args, kwargs = put([env] * num_collectors if not isinstance(env, (list, tuple)) else list(env))
    return args, kwargs, num_collectors


def _context_backend() -> str | None:
    """The backend of an enclosing ``torchrl.service_backend(...)`` context, where TorchRL is
    imported."""
    backends = sys.modules.get("torchrl._comm.backends")
    current = getattr(backends, "_get_service_backend", None)
    return current() if callable(current) else None


def _torchrl_path_class(backend: str) -> Any:
    """What stands at TorchRL's path of ``backend``'s class, unless that is TorchRL's own class
    (None then, and where TorchRL is not imported)."""
    module, name = TORCHRL_PATHS[backend]
    found = getattr(sys.modules.get(module), name, None)
    if found is None or str(getattr(found, "__module__", "")).split(".")[0] == "torchrl":
        return None
    return found


def _target(backend: str, num_collectors: int) -> tuple[Any, dict]:
    """Our class of ``backend`` and the keywords it takes beyond the env list."""
    if backend == "process":
        return MultiCollector, {}
    if backend == "rpc":
        return RPCCollector, {}
    if backend in ("distributed", "submitit"):
        return DistributedCollector, {}
    try:
        RayCollector = ray_collector()
    except ImportError as err:
        raise ImportError(
            f"backend='ray': {err}; or choose backend 'process', 'rpc', 'distributed' or 'submitit'"
        ) from err
    return RayCollector, {"num_collectors": num_collectors}


def _drop_collector_defaults(target: Any, kwargs: dict) -> None:
    """As TorchRL does for generic configs: a keyword equal to ``Collector``'s default, where the
    chosen class's default differs (or it has no such keyword), is left to the chosen class."""
    own = inspect.signature(Collector.__init__).parameters
    theirs = _parameters(target)
    for name in list(kwargs):
        mine = own.get(name)
        if mine is None or mine.default is inspect.Parameter.empty:
            continue
        value = kwargs[name]
        if value is not mine.default and value != mine.default:
            continue
        other = theirs.get(name)
        if other is None or other.default != mine.default:
            kwargs.pop(name)


def _parameters(target: Any) -> dict:
    """The keywords ``target`` takes, following ``**kwargs`` on to the base classes'
    constructors."""
    parameters: dict = {}
    for cls in target.__mro__:
        if "__init__" not in vars(cls):
            continue
        found = inspect.signature(cls.__init__).parameters
        for name, parameter in found.items():
            parameters.setdefault(name, parameter)
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in found.values()):
            break
    return parameters
