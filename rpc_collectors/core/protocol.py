"""Every message between the trainer and its workers, whatever carries it (pipes, RPC, Ray, or a
plain call in the trainer's own process in the debug launcher).

* :class:`WorkerSpec`: what a worker builds its collector from (a node's with its
  :class:`NodeSpec`), sent pickled in :data:`CREATE`; the worker answers with a :class:`WorkerInfo`.
* :class:`WorkerCalls`: the calls a worker serves then, one typed method each. The trainer makes
  them through it; a worker runs them through :func:`serve`, which refuses any other name.
* The answers to ``collect``: a batch (a ``TensorDict``), :class:`Ready` (the batch is in a
  shared-memory slot) or :class:`Noted` (a node's answer, either of those, with its
  :class:`LocalRestart` and :class:`Dropped` records). A worker with batch slots is asked
  ``collect`` by its doorbell instead (:mod:`~rpc_collectors.transport.doorbell`: slot and version
  packed, :class:`Ready` answered in a few bytes); :mod:`~rpc_collectors.transport.local_restarts`
  puts a node's records on an answer and takes them off.
* The answer to ``trace``: a :class:`ProcessSpans` for each process the worker speaks for.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, TypedDict, TypeVar

from rpc_collectors.core import pickling

KILL_WAIT = 1.0
"""Seconds from SIGKILL to a killed worker's reported exit, at most: the spawner reaps within it,
and the trainer waits as long for a node's local workers to be gone, before shutdown goes on without
them."""

CREATE = "create"
"""The first call a worker serves: ``create(spec, worker_id, num_workers, traj_id_start)``, with the
pickled :class:`WorkerSpec`; it answers its :class:`WorkerInfo`. A pool sends it
(``WorkerPool.create``)."""


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker builds its collector from: the env factory, the policy (None: the worker
    builds its own, or acts at random), the ``Collector`` keywords plus the worker's private ones
    (warning filters, ``init_fn``, ``preemptible``), and a node's layout (None: a plain worker)."""

    create_env_fn: Any
    policy: Any
    options: dict
    node: Any = None

    def dumps(self) -> bytes:
        """This spec as the bytes a pool sends
        (:func:`~rpc_collectors.core.pickling.dumps`: closures and lambdas travel too)."""
        return pickling.dumps(self)

    @classmethod
    def loads(cls, data: bytes) -> WorkerSpec:
        """The spec that :meth:`dumps` gave ``data``."""
        spec = pickling.loads(data)
        if not isinstance(spec, cls):
            raise TypeError(
                f"a worker spec must be a pickled WorkerSpec, got a pickled {type(spec).__name__}"
            )
        return spec


@dataclass(frozen=True)
class NodeSpec:
    """What a node runs: ``num_workers`` local workers, sync or async, restarted
    up to ``max_worker_restarts``."""

    # the multi-worker collector each node runs (MultiCollector), given by the public class
    collector: type
    sync: bool
    num_workers: int
    # "local", or "debug" under the debug launcher: the local workers live in the node too
    launcher: str
    max_worker_restarts: int
    # the trainer's; the node's own waits take a share of it (worker.node)
    rpc_timeout: float
    # "node": one policy in the node, called by its local workers
    inference: str = "worker"
    # async under the trainer's admission: one local batch per request (worker.node_credits)
    credits: bool = False
    # async under a sync trainer: a round holds only the newest weights the node passed on
    fresh: bool = False


class WorkerInfo(TypedDict, total=False):
    """A worker's answer to :data:`CREATE`: who serves it (rank, host name, address, pid, machine
    id), its number of envs and torch threads; a node adds its local workers' pids and its
    inference mode, a Ray actor its id."""

    rank: int
    host: str
    address: str | None
    pid: int
    host_id: str
    envs: int
    threads: int
    local_pids: list[int]
    inference: str | None
    actor_id: str


@dataclass(frozen=True)
class LocalRestart:
    """The node replaced its local worker ``worker``, which ``reason``; the
    replacement's ``pid``."""

    worker: int
    reason: str
    pid: int | None


@dataclass(frozen=True)
class Dropped:
    """The frames and batches of its local workers a node dropped itself since its last answer."""

    frames: int = 0
    batches: int = 0


@dataclass(frozen=True)
class Ready:
    """A worker's answer to ``collect``: its batch is in ``slot`` (shared memory, or its bytes
    follow this answer on a doorbell's connection)."""

    slot: int


@dataclass(frozen=True)
class Noted:
    """A node's answer to ``collect`` (a batch returned directly, or :class:`Ready`), with its
    restarts and drops since its last answer."""

    answer: Any
    restarts: tuple[LocalRestart, ...]
    dropped: Dropped = Dropped()


@dataclass(frozen=True)
class ProcessSpans:
    """One process's spans of a trace window, on the clock of the process that sends them (its
    ``time.monotonic_ns()``, or its own corrected by ``offset_ns``, known within ``error_ns``).
    ``path`` says whose: ``()`` the sender itself, ``(i, ...)`` what its worker ``i`` sent;
    ``threads``: each thread's spans ``(name, start_ns, end_ns)`` or ``(name, start_ns, end_ns,
    args)``, oldest first."""

    path: tuple[int, ...]
    host: str
    pid: int
    threads: dict[str, list[tuple]]
    offset_ns: int = 0
    error_ns: int = 0

    def moved(self, worker_id: int, offset_ns: int, error_ns: int) -> ProcessSpans:
        """These spans as the front of worker ``worker_id`` holds them: under its id, on its clock
        (``offset_ns``: the worker's clock minus the front's, known within ``error_ns``)."""
        threads = {name: [(s[0], s[1] - offset_ns, s[2] - offset_ns, *s[3:]) for s in spans]
                   for name, spans in self.threads.items()}
        return ProcessSpans((worker_id, *self.path), self.host, self.pid, threads,
                            self.offset_ns + offset_ns, self.error_ns + error_ns)


R = TypeVar("R")


class WorkerCalls(Generic[R]):
    """The calls a worker serves once created, as the trainer makes them.

    ``send(worker_id, name, *args)`` carries a call to its worker (a pool's ``call``, which
    returns a future of the answer, or the front's deferred call); each method returns what
    ``send`` returns. Each method's docstring names its arguments and its answer.
    """

    def __init__(self, send: Callable[..., R]) -> None:
        self._send = send

    def collect(self, worker_id: int, min_version: int, slot: int | None = None) -> R:
        """The next batch, collected with weights of at least ``min_version``: written into
        shared-memory ``slot`` (answer :class:`Ready`), or returned (a ``TensorDict``; a node's:
        :class:`Noted` when it has restarts or drops to tell)."""
        return self._send(worker_id, "collect", min_version, slot)

    def preempt(self, worker_id: int, batch: int) -> R:
        """End the ``batch``-th batch asked of the worker at its next step
        (TorchRL's preemption)."""
        return self._send(worker_id, "preempt", batch)

    def cut(self, worker_id: int, batch: int) -> R:
        """The trainer dropped the worker's ``batch``-th batch: its trajectories in progress end."""
        return self._send(worker_id, "cut", batch)

    def join_batches(self, worker_id: int, spec: Any) -> R:
        """Write batches into the trainer's slots (a ``SlotSpec``); answers False if it cannot."""
        return self._send(worker_id, "join_batches", spec)

    def weights_signature(self, worker_id: int) -> R:
        """What the worker's policy holds (names, shapes, dtypes); None: a node taking any."""
        return self._send(worker_id, "weights_signature")

    def join_weights(self, worker_id: int, spec: Any) -> R:
        """Receive weights as a ``TransportSpec`` says (a broadcast group, shared memory, or
        payloads carried by the calls)."""
        return self._send(worker_id, "join_weights", spec)

    def receive_weights(self, worker_id: int, version: int, mode: str, payload: Any = None) -> R:
        """Weights ``version`` are on their way (``mode``: how), the flat tensor in ``payload``
        where the call carries them; the worker applies them before its next batch."""
        return self._send(worker_id, "receive_weights", version, mode, payload)

    def set_seed(self, worker_id: int, seed: int) -> R:
        """Seed torch and the worker's envs with ``seed``; answers the next seed (TorchRL's)."""
        return self._send(worker_id, "set_seed", seed)

    def state_dict(self, worker_id: int) -> R:
        """The worker's collector's state (its newest pushed weights applied first)."""
        return self._send(worker_id, "state_dict")

    def load_state_dict(self, worker_id: int, state: dict) -> R:
        """Load what :meth:`state_dict` answered."""
        return self._send(worker_id, "load_state_dict", state)

    def get_distant_attr(self, worker_id: int, attr: str) -> R:
        """TorchRL's ``get_distant_attr``: the worker's collector's attribute at the dotted path
        ``attr``."""
        return self._send(worker_id, "get_distant_attr", attr)

    def map_fn(self, worker_id: int, method: str, args: tuple, kwargs: dict) -> R:
        """TorchRL's ``map_fn``: the worker's collector's ``method`` (a dotted path) called with
        ``args`` and ``kwargs``."""
        return self._send(worker_id, "map_fn", method, args, kwargs)

    def set_hook(self, worker_id: int, name: str, hook: bytes) -> R:
        """Set the collector's ``pre_collect_hook`` or ``post_collect_hook`` (``hook``
        cloudpickled)."""
        return self._send(worker_id, "set_hook", name, hook)

    def phases(self, worker_id: int) -> R:
        """The worker's frames, batches and time in each phase: a tuple of ``WorkerPhases``
        (:mod:`~rpc_collectors.core.metrics`), one per process (a node: one per local worker)."""
        return self._send(worker_id, "phases")

    def step_row(self, worker_id: int) -> R:
        """An env worker's row of a step plane (``AsyncBatchedCollector``), for the trainer to
        lay out."""
        return self._send(worker_id, "step_row")

    def join_steps(self, worker_id: int, group: Any) -> R:
        """Step the worker's envs with the actions the trainer writes into their rows of the step
        plane (a ``StepGroup``)."""
        return self._send(worker_id, "join_steps", group)

    def clock(self, worker_id: int) -> R:
        """The worker's ``time.monotonic_ns()`` now (the trainer measures its clock's offset)."""
        return self._send(worker_id, "clock")

    def evaluate(self, worker_id: int, recipe: bytes, weights: Any, dump_step: int | None) -> R:
        """Whole episodes with ``weights`` (None: those loaded) as the pickled ``recipe`` (an
        ``Evaluator``'s ``RunRecipe``) builds them, beside the worker's own collection, its env's
        recorders dumped at ``dump_step`` (None: not); answers the batch and the seconds it took."""
        return self._send(worker_id, "evaluate", recipe, weights, dump_step)

    def stop_evaluation(self, worker_id: int) -> R:
        """End the evaluation in progress (its ``Evaluator`` shut down) at its next step."""
        return self._send(worker_id, "stop_evaluation")

    def trace(self, worker_id: int, keep: int | None) -> R:
        """Open a trace window keeping at most ``keep`` spans per thread (answers None), or close it
        (``keep`` None): answers a :class:`ProcessSpans` for the worker and each of a node's local
        workers, on the worker's clock."""
        return self._send(worker_id, "trace", keep)


CALLS: frozenset[str] = frozenset(name for name in vars(WorkerCalls) if not name.startswith("_"))
"""The names of the calls a worker serves (:class:`WorkerCalls`' methods)."""


def serve(state: Any, name: str, args: tuple) -> Any:
    """Run the call ``name`` with ``args`` on a worker's ``state``; a name that
    :class:`WorkerCalls` does not declare is refused."""
    if name not in CALLS:
        raise ValueError(f"a worker serves no call {name!r}; accepted: {sorted(CALLS)}")
    return getattr(state, name)(*args)
