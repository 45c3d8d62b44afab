"""The :class:`~rpc_collectors.collectors.evaluator.Evaluator`'s arguments, each checked before
anything is built or started (messages name the argument, its value and what is accepted), and
the run they choose (:mod:`.evaluation_runs`), the targets its results are written to
(``metrics=``, :mod:`~rpc_collectors.single_process.metric_exports`'s, and collectors whose
``metrics()`` get them); the weights and steps an
evaluation is asked for.
"""
from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from tensordict import TensorDict, TensorDictBase
from torch import nn

from rpc_collectors.collectors.evaluation_envs import WorkerSetup, is_factory
from rpc_collectors.collectors.evaluation_runs import (
    CollectorRun,
    InThreadRun,
    RunRecipe,
    RunSettings,
    WorkerRun,
    worker_collector,
)
from rpc_collectors.collectors.ray_extra import ray_collector
from rpc_collectors.core import checks
from rpc_collectors.core.metrics import TAKEN, shadows
from rpc_collectors.single_process import metric_exports
from rpc_collectors.single_process.base_collector import BaseCollector
from rpc_collectors.single_process.collector import Collector
from rpc_collectors.trainer.collector_front import CollectorFront

BACKENDS = ("thread", "process", "ray", "worker")
BUSY_POLICIES = ("skip", "error", "queue")
# TorchRL's single-process collector
SINGLE_COLLECTORS = ("Collector", "SyncDataCollector")
# the collector's arguments the Evaluator sets itself, and the argument of its own that sets each
SET_HERE = {"create_env_fn": "env", "policy": "policy", "policy_factory": "policy_factory",
            "frames_per_batch": "frames_per_batch", "total_frames": "(endless)",
            "max_frames_per_traj": "max_steps", "trajs_per_batch": "num_trajectories",
            "exploration_type": "exploration_type"}
# metrics=: a collector's targets, written at each result (no Export: it has an interval)
TARGETS = ("None, a target (TensorBoard, Prometheus, PrometheusTextfile, JsonLines, an object with "
           f"log_scalar, one of the strings {', '.join(metric_exports.STRINGS)}, or a collector of "
           "this library, whose metrics() and exports get the results) or a list of targets")


@dataclass(frozen=True)
class Request:
    """An evaluation asked for: the weights to load (None: those loaded), their version, a step."""

    weights: Any
    version: int | None
    step: int | None


def busy_policy(value: Any) -> str:
    if value not in BUSY_POLICIES:
        raise ValueError(f"Unknown busy_policy {value!r}; accepted: 'skip', 'error' or 'queue'")
    return value


def backend(value: Any) -> str:
    if value not in BACKENDS:
        raise ValueError(f"Unknown backend {value!r}; accepted: 'thread', 'process', 'ray' or "
                         "'worker'")
    return value


def text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name}={value!r} is invalid; accepted: a str")
    return value


def key(name: str, value: Any) -> str | tuple:
    """A TensorDict key: a str, or a non-empty tuple of them (a nested key)."""
    nested = isinstance(value, tuple) and value and all(isinstance(part, str) for part in value)
    if not (isinstance(value, str) or nested):
        raise TypeError(f"{name}={value!r} is invalid; accepted: a str or a tuple of str such as "
                        "('next', 'reward')")
    return value


def mapping(name: str, value: Any) -> dict:
    if value is not None and not isinstance(value, Mapping):
        raise TypeError(f"{name}={value!r} is invalid; accepted: None or a dict")
    return dict(value or {})


def metric_targets(value: Any, prefix: str) -> tuple[metric_exports.Export | None,
                                                     tuple[BaseCollector, ...]]:
    """``metrics=``: an Export of the targets (None: none), each checked now (its package, its
    directory, its port), with the messages of a collector's ``metrics=``; and the collectors
    given, whose ``metrics()`` get the results of log_prefix ``prefix``."""
    if value is None:
        return None, ()
    given = list(value) if isinstance(value, (list, tuple)) else [value]
    invalid = (bool, metric_exports.Export, type(None))
    if not given or any(isinstance(each, invalid) for each in given):
        raise ValueError(f"metrics={value!r} is invalid; accepted: {TARGETS}")
    collectors = tuple(each for each in given if isinstance(each, BaseCollector))
    for collector in collectors:
        if not collector.metrics_on:
            raise ValueError(f"metrics= got a {type(collector).__name__} that keeps no metrics "
                             "(it was built with metrics=False); accepted: a collector built "
                             "with metrics=None (the default) or True, or another target")
    if collectors and shadows(prefix):
        raise ValueError(f"log_prefix={prefix!r} names a group of the collector's metrics() given "
                         f"as metrics=; accepted: a prefix that begins with none of "
                         f"{', '.join(TAKEN)}")
    targets = [each for each in given if not isinstance(each, BaseCollector)]
    if not targets:
        return None, collectors
    try:
        export = metric_exports.Export(*targets)
    except ValueError as err:
        raise ValueError(str(err).replace(metric_exports.ACCEPTED, TARGETS)) from None
    export.probe()
    return export, collectors


def settings(num_trajectories: Any, max_steps: Any, frames_per_batch: Any, exploration_type: Any,
             device: Any, collector_kwargs: Any) -> RunSettings:
    """What every evaluation collects; ``frames_per_batch`` defaults to ``max_steps``, else 1000."""
    num_trajectories = checks.positive_int("num_trajectories", num_trajectories)
    max_steps = checks.optional_positive_int("max_steps", max_steps)
    frames_per_batch = checks.optional_positive_int("frames_per_batch", frames_per_batch)
    kwargs = mapping("collector_kwargs", collector_kwargs)
    clash = sorted(set(kwargs) & set(SET_HERE))
    if clash:
        raise ValueError(f"collector_kwargs keys {clash} are the Evaluator's to set (by "
                         f"{', '.join(SET_HERE[key] for key in clash)}); accepted: the collector's "
                         "other arguments")
    # TorchRL 0.14's, without a warning
    given_format = kwargs.pop("traj_format", None) or "padded"
    traj_format = checks.traj_format(given_format, num_trajectories, False)
    device = checks.device("device", device)
    if device is not None:
        kwargs = {"policy_device": device, **kwargs}
    return RunSettings(num_trajectories, max_steps, frames_per_batch or max_steps or 1000,
                       checks.exploration_type(exploration_type), traj_format, kwargs)


def open_run(env: Any, policy: Any, policy_factory: Any, run_settings: RunSettings, backend: str,
             collector_cls: Any, weight_sync_schemes: Any, init_fn: Any, num_gpus: Any,
             ray_kwargs: Any, worker_of: Any = None,
             worker_id: Any = None) -> InThreadRun | WorkerRun | CollectorRun:
    """The run of ``backend`` (``"thread"`` with ``weight_sync_schemes``: a worker process, as in
    TorchRL), every argument checked first; nothing starts before the first evaluation."""
    checks.optional_callable("policy_factory", policy_factory)
    checks.optional_callable("init_fn", init_fn)
    if policy is not None and policy_factory is not None:
        raise ValueError("policy and policy_factory were both given; accepted: one of them, "
                         "not both")
    if policy is None and policy_factory is None:
        raise ValueError("policy=None and policy_factory=None: a policy or a policy_factory must "
                         "be provided")
    host = worker(backend, worker_of, worker_id, weight_sync_schemes)
    if backend == "thread" and weight_sync_schemes is None:
        lazy = policy_factory is not None and is_factory(env)
        cls = collector_class(collector_cls)
        return InThreadRun(env, policy, policy_factory, cls, run_settings, lazy)
    schemes = " with weight_sync_schemes" if weight_sync_schemes is not None else ""
    where = f"backend={backend!r}{schemes}"
    if not is_factory(env):
        raise ValueError(f"env={env!r} is an env instance, but {where} builds the env in its "
                         "worker process; accepted: a callable returning an env (or a "
                         "gymnasium id)")
    if policy_factory is None:
        raise ValueError(f"policy={policy!r} cannot be used with {where}: the worker builds its "
                         "own policy; accepted: policy_factory, a callable (env) -> policy")
    if collector_cls is not None:
        raise ValueError(f"collector_cls={collector_cls!r} is for backend='thread'; accepted with "
                         f"{where}: None")
    checks.picklable("env", env)
    checks.picklable("policy_factory", policy_factory)
    setup = WorkerSetup(env, policy_factory, init_fn)
    if host is not None:
        return CollectorRun(worker_of, host, RunRecipe(setup, run_settings))
    if weight_sync_schemes is not None:
        kwargs = {**run_settings.collector_kwargs, "weight_sync_schemes": weight_sync_schemes}
        run_settings = replace(run_settings, collector_kwargs=kwargs)
    remote = {}
    if backend == "ray":
        remote = {"num_cpus": 1, "num_gpus": gpus(num_gpus), **mapping("ray_kwargs", ray_kwargs)}
        # an ImportError naming the extra where Ray is missing
        ray_collector()
    return WorkerRun(worker_collector(backend, setup, run_settings, remote), run_settings)


def worker(backend: str, worker_of: Any, worker_id: Any, weight_sync_schemes: Any) -> int | None:
    """``backend="worker"``: the id of ``worker_of``'s worker that evaluates (``worker_id``; None:
    its last); None for the other backends, which take neither."""
    if backend != "worker":
        for name, value in (("worker_of", worker_of), ("worker_id", worker_id)):
            if value is not None:
                raise ValueError(f"{name}={value!r} is for backend='worker'; accepted with "
                                 f"backend={backend!r}: None")
        return None
    if not isinstance(worker_of, CollectorFront):
        raise ValueError(f"backend='worker' evaluates in a worker of a running collector; "
                         f"worker_of={worker_of!r} is not one; accepted: a multi-worker collector "
                         "of this library (RPCCollector, MultiSyncCollector, MultiAsyncCollector, "
                         "DistributedCollector, RayCollector)")
    if weight_sync_schemes is not None:
        raise ValueError(f"weight_sync_schemes={weight_sync_schemes!r} is not taken by "
                         "backend='worker' (the weights travel with each evaluation); accepted: "
                         "None")
    worker_of.require_running()
    count = worker_of.num_workers
    if worker_id is None:
        return count - 1
    integer = isinstance(worker_id, numbers.Integral) and not isinstance(worker_id, bool)
    if not integer or not 0 <= worker_id < count:
        raise ValueError(f"worker_id={worker_id!r} is invalid; accepted: None (the last worker) or "
                         f"an int from 0 to {count - 1} (worker_of has {count} workers)")
    return int(worker_id)


def gpus(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value < 0:
        raise ValueError(f"num_gpus={value!r} is invalid; accepted: a number >= 0 (Ray's num_gpus)")
    return value


def collector_class(value: Any) -> type:
    if value is None or (isinstance(value, str) and value in SINGLE_COLLECTORS):
        return Collector
    if isinstance(value, type):
        return value
    raise ValueError(f"collector_cls={value!r} is invalid; accepted: None, 'Collector' (or "
                     "'SyncDataCollector') or a collector class taking the single-process "
                     "Collector's arguments")


def request(weights: Any, step: Any, weights_dict: Any, version: Any) -> Request:
    """An evaluation of ``weights`` (TorchRL's ``weights_dict={"policy": ...}`` too), copied now."""
    given = mapping("weights_dict", weights_dict)
    if weights is not None:
        given.setdefault("policy", weights)
    others = sorted(map(str, set(given) - {"policy"}))
    if others:
        raise ValueError(f"weights_dict keys {others} are not supported; accepted: 'policy' (this "
                         "Evaluator loads the policy's weights)")
    for name, value in (("step", step), ("version", version)):
        integer = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        if value is not None and not integer:
            raise TypeError(f"{name}={value!r} is invalid; accepted: None or an int")
    source = given.get("policy")
    return Request(None if source is None else copied(source), version, step)


def extract_weights(policy: nn.Module) -> TensorDictBase:
    """Detached, cloned CPU weights of ``policy``, safe to hand to another thread."""
    return TensorDict.from_module(policy).data.detach().clone().cpu()


def copied(source: Any) -> Any:
    """Weights copied to the CPU: the trainer may change them while an evaluation waits."""
    if isinstance(source, nn.Module):
        return extract_weights(source)
    if isinstance(source, TensorDictBase):
        return source.detach().clone().cpu()
    if isinstance(source, Mapping):
        return {name: value.detach().clone().cpu() for name, value in source.items()}
    raise TypeError(f"weights={source!r} is invalid; accepted: an nn.Module, a TensorDict of "
                    "weights or a state dict")
