"""The collectors' options, one table: each group a frozen dataclass, each field TorchRL's name,
default and doc.

=================  ============================================================================
group              what its options say
=================  ============================================================================
:class:`Collect`   what each worker collects: its env, policy, devices and each step's record
:class:`Batches`   what the trainer hands out: batch size, run length, layout, the replay buffer
:class:`Run`       how the run is driven: sync rounds or first ready, layout of a sync round
:class:`Weights`   how weights move: when they are pushed, over what
:class:`Launch`    how workers are launched: where, how many, how long a wait may take
=================  ============================================================================

A field's default is that of TorchRL's ``Collector`` and ``Multi*`` classes where they take the
option, else ``RPCCollector``'s; where a class has its own default for an option (as TorchRL's class
of that name does), :data:`CLASS_DEFAULTS` says so, and :data:`OTHER_MEANING` names the classes
where TorchRL uses the name for another quantity. Every public constructor spells these options out
in its signature (``tests/core/test_options_table.py`` checks names, defaults and docs against this
table) and converts them into the groups, which check each option when they are built (the checks of
:mod:`rpc_collectors.core.checks`; an option that reads others of its group after them). Every
option is checked here but those of :data:`CHECKED_ELSEWHERE`, which need the envs, the launcher or
the collector; checks that read several groups are in one place, ``collectors.construction``'s
``_across``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from tensordict.nn import InteractionType

from rpc_collectors.core import checks, option_checks, torchrl_args

CAT_RESULTS = ("stack", 0, -1)
WEIGHT_TRANSPORTS = ("auto", "shm", "shared", "broadcast", "rpc")
# "mp": TorchRL's name for local; "submitit_delayed": TorchRL's, refused with what to use instead
LAUNCHERS = ("auto", "local", "torchrun", "slurm", "debug", "submitit", "mp", "submitit_delayed")
INFERENCE = ("worker", "node")
# max_policy_lag's ways (trainer/admission.py, trainer/continuity.py)
POLICY_LAG_MODES = ("admit", "drop")
G = TypeVar("G", bound="Group")


def option(default: Any, doc: str, check: Callable[[str, Any], Any] | None = None) -> Any:
    """A field of the table: its default, a one-line doc, and the check (name,
    value) -> value it passes."""
    return dataclasses.field(default=default, metadata={"doc": doc, "check": check})


def _cat_results(name: str, value: Any) -> Any:
    return None if value is None else checks.choice(name, value, CAT_RESULTS)


def _weight_transport(name: str, value: Any) -> str:
    return checks.choice(name, value, WEIGHT_TRANSPORTS)


def _policy_lag_mode(name: str, value: Any) -> str:
    return checks.choice(name, value, POLICY_LAG_MODES)


def _launcher(name: str, value: Any) -> str:
    if value not in LAUNCHERS:
        raise ValueError(f"{name}={value!r} is not known; accepted: "
                         f"{', '.join(map(repr, LAUNCHERS))}")
    return value


def _inference(name: str, value: Any) -> str:
    if not isinstance(value, str) or value not in INFERENCE:
        raise ValueError(f"{name}={value!r} is invalid; accepted: 'worker' (a policy in every "
                         "worker) or 'node' (one policy per node collector, with "
                         "collector_class='sync' or 'async')")
    return value


@dataclasses.dataclass(frozen=True)
class Group:
    """A group of options; building one checks each field that has a check."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            check = field.metadata["check"]
            if check is not None:
                self._set(field.name, check(field.name, getattr(self, field.name)))

    def _set(self, name: str, value: Any) -> None:
        """Field ``name`` of this frozen group, as its check returned it."""
        object.__setattr__(self, name, value)

    def arguments(self) -> dict[str, Any]:
        """The group's options by name (the values themselves, not copies)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def given(cls: type[G], arguments: Mapping[str, Any]) -> G:
        """The group of the options in ``arguments`` that it holds (others keep their defaults)."""
        return cls(
            **{f.name: arguments[f.name] for f in dataclasses.fields(cls) if f.name in arguments}
        )


@dataclasses.dataclass(frozen=True)
class Collect(Group):
    """What each worker collects (its :class:`~rpc_collectors.Collector`'s options)."""

    max_frames_per_traj: int | None = option(
        None, "truncate trajectories at this many steps; None or -1: no limit",
        option_checks.max_frames_per_traj
    )
    init_random_frames: int | None = option(
        None, "the first frames, up to this many, use random actions; None or -1: none",
        option_checks.init_random_frames
    )
    reset_at_each_iter: bool = option(False, "reset the env at the start of every batch",
                                      option_checks.boolean)
    exploration_type: Any = option(InteractionType.RANDOM,
                                   "TorchRL's ExplorationType around every policy call",
                                   option_checks.exploration_type)
    track_policy_version: bool = option(False, "batches carry the weights version of each step",
                                        option_checks.boolean)
    device: Any = option(None, "default of the three devices below", option_checks.device)
    storing_device: Any = option(None, "where batches are stored", option_checks.device)
    env_device: Any = option(None, "where the env runs", option_checks.device)
    policy_device: Any = option(None, "where the policy runs", option_checks.device)
    create_env_kwargs: dict | list | None = option(None, "keyword arguments for create_env_fn")
    policy_factory: Any = option(None, "builds the policy in each worker, instead of policy")
    init_fn: Any = option(None, "called in each worker process before its env and policy are built",
                          option_checks.optional_callable)
    set_truncated: bool = option(False, "mark the last step of every batch truncated",
                                 option_checks.boolean)
    reset_when_done: bool = option(True, "True only, as TorchRL", option_checks.reset_when_done)
    track_traj_ids: bool = option(True, "batches carry (\"collector\", \"traj_ids\")",
                                  option_checks.boolean)
    compile_policy: bool | dict | None = option(None, "True or torch.compile keyword arguments",
                                                option_checks.compile_policy)
    compact_obs: bool = option(False,
                               "drop (\"next\", observation) entries the next step's root holds",
                               option_checks.boolean)
    pre_collect_hook: Any = option(None, "called before each batch is collected",
                                   option_checks.optional_callable)
    post_collect_hook: Any = option(None, "called with each batch before it is handed out",
                                    option_checks.optional_callable)
    auto_register_policy_transforms: bool | None = option(
        None, "add the transforms a recurrent policy needs", option_checks.optional_boolean
    )
    use_buffers: bool | None = option(None, "stack steps into one dense TensorDict",
                                      option_checks.optional_boolean)
    trust_policy: bool | None = option(None, "a plain module called on TensorDicts, unchecked",
                                       option_checks.trust_policy)
    cudagraph_policy: bool | dict | None = option(None, "CUDA graphs: a pass-through without CUDA",
                                                  option_checks.cudagraph_policy)


@dataclasses.dataclass(frozen=True)
class Batches(Group):
    """What the trainer hands out. Each field is checked here; those that read earlier fields
    (``extend_buffer``, ``traj_format``, ``replay_write_mode``, ``trajs_per_write``) after the
    others; ``metrics`` by the collector, which opens its targets
    (``single_process.metric_exports``).

    Frames, one name per quantity along the whole path: ``frames_per_batch``, those of each batch
    handed out (``requested_frames_per_batch``, TorchRL's attribute and ``stats()`` key, keeps it as
    given, before it is rounded up over the envs or workers); ``frames_per_batch_worker``
    (TorchRL's), those of each worker's batch: sync, its share of a batch; async, a whole batch;
    TorchRL's list ``frames_per_batch`` gives each worker its own. A worker's ``Collector`` gets it
    as its ``frames_per_batch``. ``frames_per_env``: each env's share of a ``Collector``'s batch,
    the length of its time dim.
    """

    frames_per_batch: Any = option(dataclasses.MISSING,
                                   "frames per batch (required); a list: one per worker",
                                   option_checks.frames_per_batch)
    total_frames: int = option(-1, "frames in the whole run; -1: endless",
                               option_checks.total_frames)
    split_trajs: bool | None = option(None,
                                      "hand out [n_traj, T_max] padded trajectories; None is False",
                                      option_checks.split_trajs)
    postproc: Any = option(None, "applied to each batch before it is handed out",
                           option_checks.optional_callable)
    replay_buffer: Any = option(None, "batches go to its extend(); iteration yields None",
                                option_checks.replay_buffer)
    extend_buffer: bool = option(True, "False: the replay_buffer gets each step with add()",
                                 option_checks.boolean)
    trajs_per_batch: int | None = option(None, "hand out batches of this many whole trajectories",
                                         option_checks.optional_positive_int)
    traj_format: str | None = option(None, "whole trajectories \"padded\" or \"cat\"")
    replay_write_mode: str | None = option(
        None, "\"rollout\" or \"trajectory\" writes into the replay_buffer"
    )
    trajs_per_write: int | None = option(None, "whole trajectories per replay_buffer write")
    metrics: Any = option(
        None, "collector.metrics() kept (None, True) or off (False); targets: also written there"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.extend_buffer and self.replay_buffer is not None:
            option_checks.step_by_step_buffer(self.replay_buffer, self.postproc, self.split_trajs)
        self._set("traj_format", checks.traj_format(
            self.traj_format, self.trajs_per_batch, self.split_trajs, self.replay_buffer))
        self._set("replay_write_mode", torchrl_args.replay_write_mode(
            self.replay_write_mode, self.replay_buffer, self.trajs_per_batch))
        self._set("trajs_per_write", torchrl_args.trajs_per_write(
            self.trajs_per_write, self.replay_write_mode == "trajectory", self.replay_buffer))


@dataclasses.dataclass(frozen=True)
class Run(Group):
    """How a multi-worker run is driven."""

    sync: bool = option(True,
                        "True: rounds of every worker's batch; False: first ready first served",
                        option_checks.boolean)
    cat_results: str | int | None = option(
        None, "a sync round stacked (\"stack\") or concatenated (0, -1)", _cat_results
    )
    preemptive_threshold: float | None = option(
        None, "sync: the fraction of workers after which a round ends"
    )
    max_policy_lag: int | None = option(
        None, "async: no batch handed out more than this many weight versions behind")
    policy_lag_mode: str = option(
        "admit", "max_policy_lag's way: \"admit\" paces workers ahead, \"drop\" drops late batches",
        _policy_lag_mode)
    num_threads: int | None = option(None, "torch threads of the trainer while the collector runs",
                                     option_checks.optional_positive_int)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("preemptive_threshold",
                  option_checks.preemptive_threshold(self.preemptive_threshold, self.sync))
        self._set("max_policy_lag", option_checks.max_policy_lag(self.max_policy_lag, self.sync))

    @property
    def admits(self) -> bool:
        """Whether requests are admitted within ``max_policy_lag`` (async, ``"admit"``)."""
        return not self.sync and self.max_policy_lag is not None \
            and self.policy_lag_mode == "admit"


@dataclasses.dataclass(frozen=True)
class Weights(Group):
    """How weights move from the trainer to the workers."""

    update_after_each_batch: bool = option(
        False, "push the weights before each worker's next batch", option_checks.boolean
    )
    update_at_each_batch: bool = option(False, "TorchRL's name for update_after_each_batch",
                                        option_checks.boolean)
    max_weight_update_interval: int = option(
        -1, "push after this many batches with the same weights; -1: never",
        option_checks.update_interval
    )
    weight_transport: str = option(
        "auto", "\"auto\", \"shm\", \"shared\" (the trainer's policy memory), \"broadcast\" "
        "or \"rpc\"",
        _weight_transport)
    weight_sync_schemes: dict | None = option(
        None, "TorchRL's {\"policy\": scheme}: names the weight transport"
    )
    backend: str = option("gloo", "the weight process group's backend, \"gloo\" or \"nccl\"",
                          option_checks.backend)
    weight_updater: Any = option(
        None, "TorchRL's legacy WeightUpdaterBase, which update_policy_weights_ calls",
        torchrl_args.weight_updater
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        # RayWeightSyncScheme is the Ray collector's: construction checks which collector took it
        torchrl_args.weight_sync_schemes(self.weight_sync_schemes, self.weight_transport, ray=True)


@dataclasses.dataclass(frozen=True)
class Launch(Group):
    """How workers are launched and waited for."""

    num_collectors: int | None = option(None,
                                        "the number of workers when create_env_fn is not a list",
                                        option_checks.optional_positive_int)
    launcher: str = option(
        "auto", "\"auto\", \"local\"/\"mp\", \"torchrun\", \"slurm\", \"debug\" or \"submitit\"",
        _launcher
    )
    tcp_port: int | str | None = option(None,
                                        "the rendezvous (submitit) or weight store (local) port")
    slurm_kwargs: dict | None = option(
        None, "launcher=\"submitit\": the jobs' folder and executor parameters"
    )
    rpc_timeout: float = option(60.0, "seconds any single wait on a worker may take",
                                option_checks.timeout)
    collector_kwargs: dict | None = option(
        None, "extra keyword arguments for every worker's Collector", option_checks.optional_dict
    )
    max_worker_restarts: int = option(0, "failed workers replaced in the run before a WorkerError",
                                      option_checks.non_negative_int)
    elastic: bool = option(False,
                           "torchrun/SLURM: collectors may join and leave the running trainer",
                           option_checks.boolean)
    join_timeout: float = option(
        300.0, "elastic: seconds a round waits for a vacant slot to be taken", option_checks.timeout
    )
    collector_class: Any = option("single",
                                  "what each worker runs: \"single\", \"sync\" or \"async\"")
    num_workers_per_collector: int = option(1, "the local workers of each node collector")
    inference: str = option(
        "worker", "\"worker\" (a policy in every worker) or \"node\" (one per node)", _inference
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        checks.node_class(self.collector_class, self.num_workers_per_collector)


GROUPS: tuple[type[Group], ...] = (Collect, Batches, Run, Weights, Launch)
# the options the table does not check, and who does once it knows what they need
CHECKED_ELSEWHERE: dict[str, str] = {
    "create_env_kwargs": "the collector: one dict, or one per worker or env, "
                         "once their number is known",
    "policy_factory": "the collector: one factory, or one per worker, once their number is known",
    "metrics": "the collector, which opens the targets (single_process.metric_exports)",
    "tcp_port": "collectors.construction: what the port is for depends on the launcher",
    "slurm_kwargs": "collectors.construction: the collector jobs' executor, "
                    "for launcher='submitit' only",
}
TABLE: dict[str, dataclasses.Field] = {f.name: f for group in GROUPS
                                       for f in dataclasses.fields(group)}

# TorchRL's distributed classes spell "none" as -1 and False where its Collector says None
_DISTRIBUTED = {"max_frames_per_traj": -1, "init_random_frames": -1, "split_trajs": False}
# the classes whose TorchRL counterpart has its own default for an option of the table
CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "RPCCollector": _DISTRIBUTED,
    "MultiCollector": {"launcher": "local"},
    "MultiSyncCollector": {"launcher": "local"},
    "MultiAsyncCollector": {"launcher": "local"},
    "AsyncCollector": {"launcher": "local"},
    "DistributedCollector": {**_DISTRIBUTED, "sync": False, "launcher": "submitit"},
    "DistributedSyncCollector": {**_DISTRIBUTED, "launcher": "submitit"},
    "RayCollector": {**_DISTRIBUTED, "sync": False},
    "AsyncBatchedCollector": {"exploration_type": None},
}
# names that TorchRL's class uses for another quantity than the table's option of that name
OTHER_MEANING: dict[str, frozenset[str]] = {
    # its env backend; its policy server's device; its inference thread's torch threads
    "AsyncBatchedCollector": frozenset({"backend", "device", "num_threads"}),
}


def default(name: str, class_name: str) -> Any:
    """The default of option ``name`` in the public class named ``class_name``."""
    return CLASS_DEFAULTS.get(class_name, {}).get(name, TABLE[name].default)


def check(name: str, value: Any, shown: str | None = None) -> Any:
    """``value`` of option ``name`` checked as the table checks it (the message
    naming it ``shown``)."""
    checker = TABLE[name].metadata["check"]
    return value if checker is None else checker(shown or name, value)


def doc(name: str) -> str:
    """The one-line doc of option ``name``."""
    return TABLE[name].metadata["doc"]


@dataclasses.dataclass(frozen=True)
class Options:
    """Every group of a multi-worker collector's options."""

    collect: Collect
    batches: Batches
    run: Run
    weights: Weights
    launch: Launch

    @classmethod
    def given(cls, arguments: Mapping[str, Any]) -> Options:
        """The groups of the options in ``arguments`` (a constructor's
        ``locals()``; other names are ignored)."""
        return cls(Collect.given(arguments), Batches.given(arguments), Run.given(arguments),
                   Weights.given(arguments), Launch.given(arguments))
