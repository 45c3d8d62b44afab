"""``RPCCollector``: the collector front over the worker pool its launcher picks (local processes,
torchrun/SLURM ranks, elastic members, jobs it submits, or in-process debug workers).

Its constructor converts its arguments into the option groups of :mod:`rpc_collectors.core.options`
(:func:`given` does so for a class that takes ``RPCCollector``'s keywords) and opens the collector
from them (:func:`rpc_collectors.collectors.opening.start`). What a collector does with its workers
is :mod:`rpc_collectors.trainer.collector_front`.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tensordict.nn import InteractionType

from rpc_collectors.collectors.multi import MultiCollector
from rpc_collectors.core import options, torchrl_args
from rpc_collectors.trainer.collector_front import CollectorFront


class RPCCollector(CollectorFront):
    """Collects with N collector servers on other processes or nodes, over
    ``torch.distributed.rpc``.

    Args:
        create_env_fn: an env or env factory for every worker, or a list of them, one per worker.
        policy: as for :class:`~rpc_collectors.Collector`; each worker gets a copy, and
            ``update_policy_weights_`` pushes the trainer's current weights to them.
        frames_per_batch: frames per batch; in sync mode split over the workers, rounded
            up with a warning when it does not divide evenly (as TorchRL does). TorchRL's list of
            one per worker sets each worker's own (sync batches of different lengths need
            ``cat_results=-1``).
        total_frames: frames in the whole run, -1 for endless.
        num_collectors: number of workers when ``create_env_fn`` is not a list (local and debug
            launchers); under torchrun/SLURM it must be None or ``WORLD_SIZE - 1``.
        sync: True: every batch holds all workers' frames of one round, in worker order.
            False: each batch is one worker's, first ready first served, and workers keep going.
        cat_results: sync batches stacked (``"stack"``: ``[N, (B,) T]``) or concatenated along
            dim 0 (``0``: ``[N*T]`` or ``[N*B, T]``) or the time dim (``-1``). None: the layout
            of TorchRL's class of the same name, ``0`` for ``RPCCollector`` (TorchRL's
            concatenates its workers' batches) and ``"stack"`` for the ``Multi*`` classes.
        launcher: ``"auto"`` (torchrun or SLURM if their variables are set, else local),
            ``"local"`` or TorchRL's ``"mp"`` (spawn N processes on this host), ``"torchrun"``,
            ``"slurm"``, ``"debug"`` (workers in this process, no RPC) or TorchRL's
            ``"submitit"`` (this process submits one SLURM job per collector, which joins it; see
            ``slurm_kwargs``). Under torchrun/SLURM the constructor serves collectors on every
            rank but 0 and exits those processes with code 0 when the trainer shuts down.
            ``"submitit_delayed"`` is refused with what to use instead.
        tcp_port: TorchRL's port argument, an int or a string of digits. ``"submitit"``: the port
            of the rendezvous the jobs join; ``"mp"``/``"local"``: the port of the weight group's
            store on 127.0.0.1 (``weight_transport="broadcast"``; shared memory needs none).
            None: a free port.
        slurm_kwargs: ``"submitit"`` only: ``"folder"`` (where the jobs' logs go, readable from
            every node; without it ``./log_test``, as TorchRL, named in a line on stderr) and
            ``submitit.AutoExecutor.update_parameters`` arguments
            (``timeout_min``, default 10 as TorchRL; ``slurm_partition``,
            ``slurm_cpus_per_task``, ...). The jobs end when the collector shuts down (those
            still there 5 s later are cancelled), and are cancelled if this process dies. A job
            that ends before it joined is an error naming it and its log, unless ``elastic`` (its
            slot stays vacant). ``elastic``: a job that SLURM ends (time limit, preemption) is
            submitted again, at most ``"max_resubmits"`` (10) times.
        backend: weight process group backend, ``"gloo"`` (CPU) or ``"nccl"`` (CUDA).
        rpc_timeout: seconds any single wait on a worker may take (at most 10^6).
        collector_kwargs: extra keyword arguments for every worker's :class:`Collector`.
        exploration_type: TorchRL's ``ExplorationType`` the workers set around every policy
            call; default ``RANDOM``, as TorchRL's collectors.
        num_threads: torch threads of the trainer process while the collector runs (restored at
            shutdown); None: as TorchRL, the threads it had less one per worker on its host,
            at least 1, so the trainer does not compete with its own workers for cores.
        max_worker_restarts: how many times in the run a failed local or debug worker (it died,
            did not answer within ``rpc_timeout``, or its env or policy raised) is replaced by a
            fresh one, with the same worker id, the current weights and new trajectory ids; a
            warning names each. 0: the first failure raises :class:`WorkerError`. With node
            collectors: how many times each node replaces its own local workers, under any
            launcher. ``launcher="submitit"`` (with ``weight_transport="rpc"``): a collector
            whose job SLURM ended (time limit, preemption, node failure) is replaced by the job
            the trainer submits in its place.
        elastic: torchrun/SLURM only. Collector processes may join the running trainer (any
            process that runs this script with ``RPC_COLLECTORS_JOIN=<host>:<port>`` of the
            trainer's rendezvous set) and leave it. ``num_collectors`` is then the number of
            slots (worker ids), each held by one collector at a time; a failed collector leaves
            its slot vacant (:class:`WorkerLeftWarning`) for the next to join, and collectors
            beyond the slots wait as spares. Weights travel as RPC arguments
            (``weight_transport="rpc"``) and batches as RPC results. See ``docs/guide/elastic.md``.
        join_timeout: with ``elastic``, seconds a sync round waits for a vacant slot to be taken
            (async: for any collector at all) before raising ``TimeoutError``; also how long a
            collector waits for its trainer to come up.
        update_after_each_batch: push the trainer's weights before each worker's next batch.
        update_at_each_batch: TorchRL's name for ``update_after_each_batch`` (either one turns it
            on).
        max_weight_update_interval: push weights to a worker after it delivered more than this
            many batches with the same weights (-1: never on its own).
        max_policy_lag: async only: no batch handed out has its oldest step more than this many
            weight versions behind the trainer's (``front.policy_lag``); None: no bound.
        policy_lag_mode: how ``max_policy_lag`` holds. ``"admit"`` (the default): a worker is
            asked for a batch only when that batch can be handed out within the bound, so the
            workers that are ahead wait for the push that admits them, and nothing is dropped
            (:mod:`~rpc_collectors.trainer.admission`; the trainer is assumed to push at most
            once per batch it takes). ``"drop"``: a batch beyond the bound is dropped (counted in
            ``dropped_frames``/``dropped_batches``), its worker's trajectories go on under new
            ids, and it is asked again: TorchRL's and RLlib's way, which drops the slow workers'
            and the long episodes' batches more often than the others'.
        weight_transport: ``"auto"`` (shared memory when every worker shares the trainer's host,
            else ``"broadcast"`` over the weight process group; ``"rpc"`` when elastic), ``"shm"``,
            ``"broadcast"`` or ``"rpc"`` (the flat weights as the argument of each worker's call).
        collector_class: what each worker runs, as TorchRL names it: ``"single"`` (``Collector``,
            the default), ``"sync"`` (``MultiSyncCollector``) or ``"async"``
            (``MultiAsyncCollector``), ours or TorchRL's classes by name. With
            ``"sync"``/``"async"`` each worker is a node of ``num_workers_per_collector`` local
            worker processes (shared memory among them) that answers each request with one
            batch: ``[W, (B,) T]`` stacked, or one local worker's batch (see
            :mod:`rpc_collectors.worker.node` and ``docs/guide/nodes.md``).
        num_workers_per_collector: W, the local workers of each node (1 with ``"single"``).
        inference: ``"worker"`` (a policy in every worker, the default) or ``"node"`` (node
            collectors only: each node runs one copy of the policy, on ``policy_device`` or else its
            GPU if it has one, for all its local workers, which send it each step's observations;
            see ``docs/guide/batched_inference.md``).
        max_frames_per_traj, init_random_frames, reset_at_each_iter: as for ``Collector``.
        track_policy_version, split_trajs: as for ``Collector``.
        postproc, device, storing_device, env_device, policy_device, replay_buffer: as for
            ``Collector``; each device may be TorchRL's list of one per worker (the trainer stores
            batches on the workers' common storing device, or on the CPU if they differ, as
            TorchRL does); ``init_random_frames`` is shared out over the workers. Workers hand
            batches over in host memory; the trainer puts them on ``storing_device`` (from
            page-locked shared memory straight to a CUDA device, see
            :mod:`rpc_collectors.transport.data`).
        create_env_kwargs: keyword arguments for ``create_env_fn``: a dict for every worker or a
            list of dicts, one per worker.
        policy_factory: a callable (or a list, one per worker) that builds the policy inside each
            worker, instead of ``policy`` (policies that cannot be pickled, or must be built on
            the worker's device). The trainer then has no weights of its own: the first
            ``update_policy_weights_(weights)`` (a TensorDict, a state dict or a module of the
            workers' policy) lays the weight plane out, and a push without weights sends the
            weights given last (:mod:`rpc_collectors.transport.factory_weights`).
        init_fn: called in each worker process before its env and policy are built.
        set_truncated, reset_when_done, track_traj_ids, compile_policy, compact_obs: as for
            ``Collector``, in each worker.
        auto_register_policy_transforms, pre_collect_hook, post_collect_hook: as for
            ``Collector``, applied in each worker (the hooks run there, on each worker's own
            batches).
        use_buffers: as for ``Collector``, in each worker.
        trajs_per_batch, traj_format, trajs_per_write, replay_write_mode: as for ``Collector``; the
            trainer assembles the trajectories from all workers' batches.
        preemptive_threshold: sync only, TorchRL's: once this fraction of the workers handed in a
            round's batches (``int(N * threshold)`` of them), the others end theirs at their next
            step. Their batches are padded to full length: the steps they did not collect have
            ``("collector", "traj_ids")`` -1 and ``("collector", "mask")`` False (every batch has
            the mask); with ``cat_results=-1`` (or ``0`` over ``[T]`` batches) those steps are
            dropped instead, without a mask. Only collected frames count towards ``total_frames``
            and go into a ``replay_buffer`` (each worker's, one ``extend()`` each); the number of
            batches is unknown before the run, so ``len()`` raises a ``TypeError``.
            None or 1.0: every worker finishes its batch.
        extend_buffer: False: the ``replay_buffer`` gets each step of each worker with ``add()``
            (one worker's steps, then the next worker's; steps a preempted worker did not collect
            are left out) instead of whole batches with ``extend()`` (then without ``postproc``
            or ``split_trajs``).
        trust_policy, cudagraph_policy: as for ``Collector`` (``cudagraph_policy`` is checked here).
        weight_sync_schemes: TorchRL's ``{"policy": scheme}``: the scheme names the weight
            transport (:mod:`rpc_collectors.core.torchrl_args`); ``NoWeightSyncScheme``: weights
            are never pushed.
        visible_devices, tensorpipe_options, weight_updater, weight_recv_schemes: TorchRL's,
            accepted as None (its default); other values are refused, with why
            (``torchrl_args.NOT_HERE``).

    With ``track_policy_version=True`` sync and async batches carry ``("collector", "worker_id")``;
    ``last_batch.worker_frames`` says whose frames a batch holds either way.
    """

    # TorchRL's RPCCollector: torch.cat of the workers' batches
    _default_cat_results: str | int = 0

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        frames_per_batch: int | list[int],
        total_frames: int = -1,
        num_collectors: int | None = None,
        sync: bool = True,
        cat_results: str | int | None = None,
        launcher: str = "auto",
        tcp_port: int | str | None = None,
        slurm_kwargs: dict | None = None,
        backend: str = "gloo",
        rpc_timeout: float = 60.0,
        collector_kwargs: dict | None = None,
        exploration_type: Any = InteractionType.RANDOM,
        track_policy_version: bool = False,
        num_threads: int | None = None,
        max_worker_restarts: int = 0,
        elastic: bool = False,
        join_timeout: float = 300.0,
        update_after_each_batch: bool = False,
        update_at_each_batch: bool = False,
        max_weight_update_interval: int = -1,
        max_policy_lag: int | None = None,
        policy_lag_mode: str = "admit",
        weight_transport: str = "auto",
        collector_class: Any = "single",
        num_workers_per_collector: int = 1,
        inference: str = "worker",
        max_frames_per_traj: int | None = -1,
        init_random_frames: int | None = -1,
        reset_at_each_iter: bool = False,
        split_trajs: bool = False,
        postproc: Any = None,
        device: Any = None,
        storing_device: Any = None,
        env_device: Any = None,
        policy_device: Any = None,
        replay_buffer: Any = None,
        metrics: Any = None,
        create_env_kwargs: dict | list | None = None,
        policy_factory: Any = None,
        init_fn: Any = None,
        set_truncated: bool = False,
        reset_when_done: bool = True,
        track_traj_ids: bool = True,
        compile_policy: bool | dict | None = None,
        compact_obs: bool = False,
        pre_collect_hook: Any = None,
        post_collect_hook: Any = None,
        trajs_per_batch: int | None = None,
        replay_write_mode: str | None = None,
        traj_format: str | None = None,
        trajs_per_write: int | None = None,
        auto_register_policy_transforms: bool | None = None,
        use_buffers: bool | None = None,
        preemptive_threshold: float | None = None,
        extend_buffer: bool = True,
        trust_policy: bool | None = None,
        cudagraph_policy: bool | dict | None = None,
        weight_sync_schemes: dict | None = None,
        visible_devices: Any = None,
        tensorpipe_options: dict | None = None,
        weight_updater: Any = None,
        weight_recv_schemes: dict | None = None,
    ) -> None:
        self._start(create_env_fn, policy, options_of(locals()))

    # opens over the pool the launcher picks
    _start = MultiCollector._start


def options_of(arguments: Mapping[str, Any]) -> options.Options:
    """The option groups of ``RPCCollector``'s (or a distributed collector's) arguments by name;
    TorchRL's arguments these do not take are refused."""
    torchrl_args.not_here(visible_devices=arguments["visible_devices"],
                          tensorpipe_options=arguments["tensorpipe_options"],
                          weight_updater=arguments["weight_updater"],
                          weight_recv_schemes=arguments["weight_recv_schemes"])
    return options.Options.given(arguments)

