"""How a multi-worker collector is built from its arguments, before any process starts, and where
it runs.

:func:`rendezvous` resolves the launcher and, on a process that is not the trainer (a
torchrun/SLURM rank > 0, or a collector joining an elastic trainer), serves a collector there
and exits the process. :func:`plan` turns the remaining arguments into
the collector's :class:`~rpc_collectors.trainer.plan.Plan`: each wrong one is a
``ValueError``/``TypeError`` naming the argument, the value and what is accepted. This layer may
reach both sides of the process boundary: the worker's (what a worker serves, a node's spec) and
the cluster's (jobs, elastic joins); the trainer's side below it imports neither.
"""
from __future__ import annotations

import inspect
import os
import sys
from typing import Any

import torch
from tensordict.nn import TensorDictModuleBase

from rpc_collectors.cluster import jobs as collector_jobs
from rpc_collectors.cluster.elastic import JOIN_VARIABLE, join_rendezvous, member_rendezvous
from rpc_collectors.core import (
    checks,
    options,
    pickling,
    rank_limits,
    torchrl_args,
    worker_checks,
    worker_warnings,
)
from rpc_collectors.core.protocol import NodeSpec, WorkerSpec
from rpc_collectors.single_process.collector import Collector
from rpc_collectors.single_process.envs import check_env_id
from rpc_collectors.single_process.policies import StepPolicy, check_forward
from rpc_collectors.trainer.plan import Plan
from rpc_collectors.transport.rendezvous import Rendezvous, detect_launcher, from_environment
from rpc_collectors.worker.node import check_inference
from rpc_collectors.worker.rpc_rank import serve_rank

COLLECTOR_KWARGS = set(inspect.signature(Collector.__init__).parameters) - {
    "self", "create_env_fn", "policy", "frames_per_batch", "total_frames", "traj_id_start",
    "traj_id_stride", "split_trajs", "postproc", "replay_buffer", "extend_buffer",
    "create_env_kwargs", "policy_factory", "trajs_per_batch", "traj_format", "trajs_per_write",
    "replay_write_mode", "weight_sync_schemes", "worker_idx",
}
# one value for every worker, or a list of them
PER_WORKER = ("create_env_kwargs", "policy_factory")
DEVICES = ("device", "storing_device", "env_device", "policy_device")


def rendezvous(
    launcher: str, elastic: bool, join_timeout: float, rpc_timeout: float,
) -> tuple[str, Rendezvous | None]:
    """The resolved launcher and, under torchrun/SLURM, this trainer's rendezvous.

    Any other process of the run serves a collector here until the trainer stops it, then exits.
    """
    resolved = detect_launcher(launcher, elastic)
    joining = join_rendezvous()
    # a collector process started to join a running trainer
    if joining is not None:
        if not elastic:
            raise ValueError(
                f"{JOIN_VARIABLE} is set, so this process joins a trainer as a collector; "
                "that needs elastic=True")
        _serve(member_rendezvous(joining, join_timeout), rpc_timeout)
    # this process trains; the collector jobs it submits join it
    if resolved == "submitit":
        return resolved, None
    if resolved in ("torchrun", "slurm"):
        rdv = from_environment(resolved)
        if rdv.rank != 0:
            _serve(member_rendezvous(rdv, join_timeout) if elastic else rdv, rpc_timeout)
        return resolved, rdv
    if elastic:
        raise ValueError(
            "elastic=True needs a trainer that collectors can join over the network; "
            f"accepted with launcher={launcher!r} (resolved to {resolved!r}): False "
            "(elastic launchers: 'torchrun', 'slurm', 'submitit')")
    return resolved, None


def _serve(rdv: Rendezvous, rpc_timeout: float) -> None:
    """Serve a collector in this process until the trainer stops it, then exit the process."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(serve_rank(rdv, float(rpc_timeout)))


def plan(
    o: options.Options, *, create_env_fn: Any, policy: Any, default_cat_results: Any,
    node_collector: type | None = None, ray: bool = False,
) -> Plan:
    """The :class:`Plan` of a multi-worker collector: ``o`` (each option checked by the table when
    its group was built) checked where options read each other (:func:`_across`), the launcher or
    the env, with the launcher resolved (:func:`rendezvous`, which serves a collector on any other
    rank of the run; ``ray``: the workers are the Ray actors of ``RayCollector``).

    ``o.collect`` are the options of each worker's :class:`Collector` (``init_random_frames`` is
    for the whole collector, shared out here). ``collector_class`` ``"sync"``/``"async"`` makes each
    worker a node of ``num_workers_per_collector`` local workers
    (:mod:`rpc_collectors.worker.node`): frames are shared out over every local worker, and
    ``max_worker_restarts`` is each node's budget for replacing its own local workers.
    ``node_collector`` is the multi-worker class a node runs (the public layer passes its
    ``MultiCollector``: this layer does not import it); ``inference`` ``"node"`` runs one policy
    per node (:func:`~rpc_collectors.worker.node.check_inference`).
    """
    launch, run, weights = o.launch, o.run, o.weights
    weight_transport, threshold = _across(o, ray)
    launcher, rdv = ("ray", None) if ray else rendezvous(
        launch.launcher, launch.elastic, launch.join_timeout, launch.rpc_timeout)
    # 1.0: every worker finishes, as no threshold
    preempting = None if threshold == 1.0 else threshold
    node_kind, per_node, inference = _node_kind(o, policy, preempting, node_collector)
    env_fns = _env_fns(create_env_fn, launch.num_collectors, rdv, launch.elastic)
    num_workers = len(env_fns)
    # the trainer's open files and the ranks measured to work, before its RPC agent starts
    if launcher in ("torchrun", "slurm", "submitit"):
        given = f"WORLD_SIZE={rdv.world_size}" if rdv and not launch.elastic else None
        rank_limits.check_trainer(num_workers, given or f"num_collectors={num_workers}")
    cat_results = default_cat_results if run.cat_results is None else run.cat_results
    pushes = "auto" if weight_transport == torchrl_args.NO_PUSH else weight_transport
    if launch.elastic:
        worker_checks.elastic(pushes, weights.backend)
    tcp_port, executor = _launcher(launch, launcher)
    # a node replaces its own local workers, the trainer no node
    node = None if node_kind is None else NodeSpec(
        collector=node_collector, sync=node_kind == "sync", num_workers=per_node,
        launcher="debug" if launcher == "debug" else "local", rpc_timeout=launch.rpc_timeout,
        inference=inference, max_worker_restarts=launch.max_worker_restarts,
        credits=node_kind == "async" and run.admits, fresh=node_kind == "async" and run.sync,
    )
    restarts = 0 if node is not None else worker_checks.max_worker_restarts(
        launch.max_worker_restarts, launcher, pushes, weights.backend)
    frames = o.batches.frames_per_batch
    frames_per_batch, frames_per_batch_worker = _frames(
        frames, sum(frames) if isinstance(frames, list) else frames, num_workers, run.sync,
        cat_results, per_node if node_kind == "sync" else 1,
        launch.collector_class if node is not None else None,
    )
    if preempting is None:
        # preempted batches vary in size
        checks.total_frames_fits(o.batches.total_frames, frames_per_batch)
    _check_policy(policy, o.collect.trust_policy)
    kwargs, per_worker = _worker_options(
        o, frames_per_batch_worker, num_workers * per_node, per_node, preempting)
    devices = worker_checks.worker_devices_of(
        *[kwargs.get(name, per_worker.get(name)) for name in DEVICES], num_workers)
    worker_checks.shared_weights(pushes, launch.collector_class, node is not None,
                                 devices["policy_device"])
    # batches travel in host memory; the trainer places them (data_plane)
    kwargs["storing_device"] = "cpu"
    per_worker.pop("storing_device", None)
    if executor is not None:
        # the last check: it makes the folder if it is missing
        collector_jobs.writable_folder(executor)
    return Plan(
        options=o, launcher=launcher, rdv=rdv, num_workers=num_workers, cat_results=cat_results,
        frames_per_batch=frames_per_batch, frames_per_batch_worker=frames_per_batch_worker,
        weight_transport=pushes, no_push=weight_transport == torchrl_args.NO_PUSH,
        max_worker_restarts=restarts,
        preemptive_threshold=threshold,
        preempt_after=None if preempting is None else int(num_workers * preempting),
        update_after_each_batch=weights.update_after_each_batch or weights.update_at_each_batch,
        exploration_type=kwargs["exploration_type"],
        track_policy_version=kwargs["track_policy_version"], policy_device=devices["policy_device"],
        storing_device=devices["storing_device"],
        specs=_specs(env_fns, policy, kwargs, per_worker, node),
        tcp_port=tcp_port, executor=executor, node=node,
        policy_factory=any(factory is not None for factory in per_worker["policy_factory"]),
    )


def _across(o: options.Options, ray: bool) -> tuple[str, float | None]:
    """The checks of options that read options of other groups; the weight transport that
    ``weight_sync_schemes`` names and ``preemptive_threshold`` as checked."""
    batches, run, launch, collect = o.batches, o.run, o.launch, o.collect
    whole = batches.trajs_per_batch is not None or batches.replay_write_mode == "trajectory"
    checks.split_needs_ids(batches.split_trajs or whole, collect.track_traj_ids)
    checks.use_buffers(collect.use_buffers, batches.replay_buffer)
    checks.preemption_fits(run.preemptive_threshold, launch.elastic, batches.split_trajs or whole)
    factories = o.collect.policy_factory
    distinct = isinstance(factories, (list, tuple)) and len(set(map(id, factories))) > 1
    transport = torchrl_args.weight_sync_schemes(
        o.weights.weight_sync_schemes, o.weights.weight_transport, ray=ray,
        distinct_factories=distinct)
    return transport, run.preemptive_threshold


def _node_kind(o: options.Options, policy: Any, preemptive_threshold: float | None,
               node_collector: type | None) -> tuple[str | None, int, str]:
    """What each worker runs: ``("sync" | "async" | None, its local workers, inference)``, checked
    against the rest."""
    collector_class = o.launch.collector_class
    node_kind, per_node = checks.node_class(collector_class, o.launch.num_workers_per_collector)
    factories = o.collect.policy_factory
    factories = list(factories) if isinstance(factories, (list, tuple)) else [factories]
    inference = check_inference(o.launch.inference, node_kind, collector_class, policy, factories)
    if node_kind is not None and node_collector is None:
        raise ValueError(
            f"collector_class={collector_class!r} runs node collectors, which this collector "
            "does not support; accepted: collector_class='single'")
    if preemptive_threshold is not None and node_kind is not None:
        raise ValueError(
            f"preemptive_threshold={preemptive_threshold!r} does not work with node collectors "
            f"(collector_class={collector_class!r}); accepted with them: None"
        )
    return node_kind, per_node, inference


def _launcher(launch: options.Launch, launcher: str) -> tuple[int | None, Any]:
    """The port and, for ``"submitit"``, the executor of the collector jobs."""
    tcp_port = worker_checks.tcp_port(launch.tcp_port, launcher)
    slurm_kwargs = launch.slurm_kwargs
    if slurm_kwargs is not None and launcher != "submitit":
        raise ValueError(
            f"slurm_kwargs={slurm_kwargs!r} is for launcher='submitit'; "
            f"accepted with launcher={launcher!r}: None")
    return tcp_port, collector_jobs.executor(slurm_kwargs) if launcher == "submitit" else None


def _worker_options(o: options.Options, frames_per_batch_worker: list[int], local_workers: int,
                    per_node: int, preemptive_threshold: float | None) -> tuple[dict, dict]:
    """Each worker's :class:`Collector` options: those shared by all, and those with one value per
    worker.

    ``local_workers``: the worker processes of the whole collector (``per_node`` in each worker),
    over which ``init_random_frames`` is shared out."""
    kwargs = {
        name: value for name, value in o.collect.arguments().items() if name != "cudagraph_policy"}
    num_workers = len(frames_per_batch_worker)
    # here: a worker would refuse it once started
    checks.env_kwargs(kwargs["create_env_kwargs"], "worker")
    per_worker = {name: _per_worker(name, kwargs.pop(name), num_workers) for name in PER_WORKER}
    per_worker["frames_per_batch"] = frames_per_batch_worker
    # TorchRL's list of one device per worker
    for name in DEVICES:
        if isinstance(kwargs[name], (list, tuple)):
            per_worker[name] = _per_worker(name, kwargs.pop(name), num_workers)
    # with a policy too, the trainer's weight source only
    for i, factory in enumerate(per_worker["policy_factory"]):
        checks.optional_callable(f"policy_factory[{i}]", factory)
    random_frames = checks.init_random_frames(kwargs["init_random_frames"])
    kwargs["init_random_frames"] = -(-random_frames // local_workers) * per_node
    # each value checked there
    kwargs.update(_collector_kwargs(o.launch.collector_kwargs))
    # one collector_kwargs may set
    kwargs["exploration_type"] = checks.exploration_type(kwargs["exploration_type"])
    # the worker numbers its batches and pads cut ones
    kwargs["preemptible"] = preemptive_threshold is not None
    # the workers' phase clocks read no time either
    if o.batches.metrics is False:
        kwargs["metrics"] = False
    return kwargs, per_worker


def _frames(given: Any, total: int, num_workers: int, sync: bool, cat_results: Any, split: int,
            node_class_given: Any) -> tuple[int, list[int]]:
    """The collector's frames per batch and each worker's (``frames_per_batch_worker``, one per
    worker).

    ``given`` is ``frames_per_batch`` as given (TorchRL's list of one per worker, kept in sync
    batches; async ones each have the list's sum, as TorchRL's), ``total`` the collector's frames
    per batch as given (a list's sum); ``split``: the local workers a sync node's batch holds one
    batch of each of; ``node_class_given``: the ``collector_class`` of node collectors, None
    without them."""
    if not isinstance(given, list):
        parts = num_workers * split if sync else split
        each = checks.frames_per_batch_fits(total, parts, "workers") * split
        return each * num_workers if sync else each, [each] * num_workers
    if node_class_given is not None:
        raise ValueError(
            f"frames_per_batch={given!r}: a list of one per worker does not work with node "
            "collectors "
            f"(collector_class={node_class_given!r}); accepted: one int"
        )
    frames = worker_checks.frames_per_worker(given, num_workers, sync, cat_results)
    return sum(frames), frames if sync else [sum(frames)] * num_workers


def _check_policy(policy: Any, trust_policy: bool | None) -> None:
    """The trainer's ``policy``, here, before any worker builds it: a step policy, and a plain
    module's forward (unless ``trust_policy``)."""
    if policy is not None and not callable(policy):
        # raises the TypeError naming the argument
        StepPolicy(policy)
    plain = isinstance(policy, torch.nn.Module) and not isinstance(policy, TensorDictModuleBase)
    if plain and not trust_policy:
        check_forward(policy)


def _env_fns(
    create_env_fn: Any, num_collectors: int | None, rdv: Rendezvous | None, elastic: bool,
) -> list:
    if num_collectors is not None:
        checks.positive_int("num_collectors", num_collectors)
    if isinstance(create_env_fn, (list, tuple)):
        if not create_env_fn:
            raise ValueError(
                "create_env_fn=[] is empty; accepted: an env factory or a non-empty list of them")
        if num_collectors is not None and num_collectors != len(create_env_fn):
            raise ValueError(
                f"num_collectors={num_collectors} does not match the {len(create_env_fn)} entries "
                "of create_env_fn")
        fns = list(create_env_fn)
    else:
        n = num_collectors if num_collectors is not None else (rdv.world_size - 1 if rdv else None)
        if not n:
            raise ValueError(
                "num_collectors=None: give the number of workers "
                "(with elastic=True: of collector slots), "
                "or a list of env factories as create_env_fn"
            )
        fns = [create_env_fn] * n
    for i, fn in enumerate(fns):
        if fn is None or not (callable(fn) or isinstance(fn, str) or hasattr(fn, "step")):
            raise TypeError(f"create_env_fn[{i}]={fn!r} is not an env or env factory")
        if isinstance(fn, str):
            check_env_id(fn, "create_env_fn")
    if rdv is not None and not elastic and rdv.world_size - 1 != len(fns):
        raise ValueError(
            f"{len(fns)} collectors were asked for, but the {rdv.launcher} world has WORLD_SIZE="
            f"{rdv.world_size} (one trainer + {rdv.world_size - 1} collector ranks)"
        )
    return fns


def _collector_kwargs(collector_kwargs: dict | None) -> dict:
    if collector_kwargs is None:
        return {}
    unknown = set(collector_kwargs) - COLLECTOR_KWARGS
    if unknown:
        raise ValueError(
            f"collector_kwargs has unknown keys {sorted(unknown)}; "
            f"accepted: {sorted(COLLECTOR_KWARGS)}")
    worker_checks.collector_kwargs(collector_kwargs)
    return dict(collector_kwargs)


def _per_worker(name: str, value: Any, num_workers: int) -> list:
    """``value`` for each worker: a list of one per worker, or one value for all."""
    if not isinstance(value, (list, tuple)):
        return [value] * num_workers
    if len(value) != num_workers:
        raise ValueError(
            f"{name} has {len(value)} entries for {num_workers} workers; "
            "accepted: one value, or one per worker")
    return list(value)


def _specs(
    env_fns: list, policy: Any, kwargs: dict, per_worker: dict, node: NodeSpec | None,
) -> list[bytes]:
    """What each worker builds its collector from, pickled here so that failures name the
    argument."""
    kwargs = dict(kwargs, **{worker_warnings.KEY: worker_warnings.for_workers()})
    worker_kwargs = [
        dict(kwargs, **{name: values[i] for name, values in per_worker.items()})
        for i in range(len(env_fns))
    ]
    # a worker that builds its policy (policy_factory) is not sent the trainer's, whose weights it
    # gets pushed
    policies = [policy if kw["policy_factory"] is None else None for kw in worker_kwargs]
    try:
        # workers given the same factory, policy and options share one pickle
        specs, pickled = [], {}
        for fn, p, kw in zip(env_fns, policies, worker_kwargs):
            key = (id(fn), id(p), pickling.dumps(kw))
            if key not in pickled:
                pickled[key] = WorkerSpec(fn, p, kw, node).dumps()
            specs.append(pickled[key])
        return specs
    except Exception:
        named = [(f"create_env_fn[{i}]", fn) for i, fn in enumerate(env_fns)] + [("policy", policy)]
        named += [(f"{name}[{i}]", v)
                  for name, values in per_worker.items() for i, v in enumerate(values)]
        named += [
            (name, kwargs[name]) for name in ("init_fn", "pre_collect_hook", "post_collect_hook")]
        for name, value in named:
            checks.picklable(name, value)
        raise
