"""The inference loop of a batched-inference collector: one thread in the trainer's process that
runs the policy on the largest batch of ready observations and hands out full batches.

Each turn it sleeps until some env is ready (:meth:`StepPlane.wait`), waits up to ``timeout`` s
for ``min_batch_size`` ready envs, then for the envs in flight about to answer
(:class:`~rpc_collectors.trainer.patience.Patience`), records the transitions the ready envs
completed, all at once (:class:`~rpc_collectors.trainer.transitions.Transitions`), then acts:
it gathers the ready envs' observations (at most ``max_batch_size`` per forward pass), calls the
policy once under the collector's lock, writes the actions into the envs' rows and rings them;
while they step it moves the transitions due into the batch and stages what chose the actions
(:meth:`Transitions.stage`). The policy is the trainer's own
object: weights the trainer changes are used by the next forward pass, which is stamped with the
collector's ``policy_version`` at that moment.

Full batches wait in a queue of ``prefetch``; when it is full the loop waits, and so do the
envs. A worker whose env ended (the worker died, or its env raised) is handed to ``on_failure``,
an exception of the policy put in ``errors``; the loop never raises. The envs of a worker that
``on_failure`` replaced have their streams cut there (:meth:`Transitions.cut`), after the
transitions their worker completed before it ended were recorded.

The loop counts its forward passes and the envs they acted for, and marks a phase clock
(:mod:`~rpc_collectors.single_process.phase_clock`, a :class:`StoppedClock` that reads no time
with ``metrics=False``): ``idle`` after each wait for ready envs, ``write`` after recording what
they completed and after staging a pass, ``policy`` after each forward pass
(:class:`~rpc_collectors.core.metrics.InferenceMetrics`).
While a trace window is open the collector's clock (its
:class:`~rpc_collectors.single_process.run_meter.RunMeter`) keeps each ``wait`` and ``forward``
span.

The loop's thread runs the policy with ``threads`` torch threads
(:func:`~rpc_collectors.trainer.threads.inference_threads`) and gradients off, both set in that
thread only: the thread that starts the loop keeps its own.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

import torch
from tensordict.nn import set_interaction_type

from rpc_collectors.single_process.phase_clock import PhaseClock, StoppedClock
from rpc_collectors.single_process.run_meter import RunMeter
from rpc_collectors.trainer import batched_admission
from rpc_collectors.trainer.batched_admission import Pacing
from rpc_collectors.trainer.patience import Patience
from rpc_collectors.trainer.transitions import Transitions
from rpc_collectors.transport.step_plane import StepPlane

# seconds between checks of the stop flag while nothing happens
POLL = 0.5


class Stopped(Exception):
    """Internal: the loop was asked to stop while it waited."""


class InferenceLoop:
    """The loop's thread and what it shares with the collector.

    ``errors`` holds what ended the loop, for the user; ``acting[e]``: an action is in flight
    for env ``e``, its answer completes a transition; ``waiting``: the ready envs not acted for
    yet; ``completed``: the envs whose transitions completed, not recorded yet; ``passes`` and
    ``acted`` count the forward passes and the envs they acted for; ``_index`` is the last
    pass's envs and their index tensor.

    Args:
        plane: the envs' rows and doorbells, and which worker steps each env.
        transitions: where completed transitions go.
        policy: ``policy(inputs, batch_size) -> {key: tensor}`` (a
            :class:`~rpc_collectors.single_process.policies.StepPolicy`).
        lock: held around each forward pass; the collector holds it to change weights.
        version: returns the weights version of the policy now.
        on_failure: ``on_failure(worker, traceback) -> bool``, called in the loop for a worker
            whose envs ended: True if the worker was replaced (its envs answer again), False to
            stop the loop (``on_failure`` put the error in ``errors``).
        max_batch_size, min_batch_size, timeout: batching of the forward pass, as TorchRL's server.
        exploration_type: the interaction type set around each forward pass.
        prefetch: full batches that may wait.
        threads: the torch threads of the loop's thread.
        meter: the collector's clock, which keeps its spans while a trace window is open; where
            its metrics are on (``meter.on``), the loop's phase clock reads time from its
            thread's start.
        pacing: ``max_policy_lag``'s figures (None: no bound): the ready envs whose acts would
            break it wait in ``paused`` (:mod:`~rpc_collectors.trainer.batched_admission`).
    """

    def __init__(
        self, plane: StepPlane, transitions: Transitions, policy: Callable, lock: threading.Lock,
        version: Callable[[], int], on_failure: Callable[[int, str], bool], *, max_batch_size: int,
        min_batch_size: int, timeout: float, exploration_type: Any, prefetch: int, threads: int,
        meter: RunMeter, pacing: Pacing | None = None,
    ) -> None:
        self.plane, self.transitions, self.policy, self.lock = plane, transitions, policy, lock
        self.version, self.on_failure = version, on_failure
        self.max_batch_size, self.min_batch_size = max_batch_size, min_batch_size
        self.timeout = timeout
        self.exploration_type, self.threads = exploration_type, threads
        self._threads_set = threading.Event()
        self.batches: queue.Queue = queue.Queue(prefetch)
        self.errors: queue.SimpleQueue = queue.SimpleQueue()
        self.acting = [False] * plane.num_envs
        self.waiting: list[int] = []
        self.pacing = pacing
        self.paused: list[int] = []
        self.completed: list[int] = []
        self.stop = threading.Event()
        self.meter = meter
        self.clock: PhaseClock = StoppedClock()
        self.passes = self.acted = 0
        self.patience = Patience(plane.num_envs)
        self._index: tuple[list[int], torch.Tensor] = ([], torch.empty(0, dtype=torch.int64))
        self.thread = threading.Thread(target=self._run, name="rpc-collectors-inference",
                                       daemon=True)

    def start(self) -> None:
        """Start the loop, once. The calling thread's torch threads stay as they were, and so
        does the count threads started later begin with (torch keeps one for them)."""
        if not self.thread.is_alive() and not self.stop.is_set():
            own = torch.get_num_threads()
            self.thread.start()
            self._threads_set.wait(5.0)
            torch.set_num_threads(own)

    def close(self, timeout: float) -> None:
        """Stop the loop; wait up to ``timeout`` s for its thread."""
        self.stop.set()
        self.plane.wake()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def put(self, item: Any) -> None:
        """Queue a batch for the user, waiting while the queue is full."""
        while True:
            if self.stop.is_set():
                raise Stopped
            try:
                self.batches.put(item, timeout=POLL)
                return
            except queue.Full:
                continue

    def _run(self) -> None:
        try:
            torch.set_num_threads(self.threads)
            torch.set_grad_enabled(False)
            if self.meter.on:
                self.clock = PhaseClock()
            self._threads_set.set()
            while not self.stop.is_set():
                if torch.get_num_threads() != self.threads:
                    # another thread set torch's count since
                    torch.set_num_threads(self.threads)
                self._turn(POLL)
        except Stopped:
            pass
        except BaseException as err:
            # the policy raised (or the loop failed): the user gets it once
            self.errors.put(err)
        finally:
            # the loop never starts again
            self.stop.set()

    def _turn(self, wait: float) -> None:
        self._poll(0 if self.waiting else wait)
        if 0 < len(self.waiting) < self.min_batch_size:
            # TorchRL's min_batch_size: wait a little for more
            deadline = time.monotonic() + self.timeout
            while (len(self.waiting) < self.min_batch_size
                   and (left := deadline - time.monotonic()) > 0):
                self._poll(left)
        if self.waiting:
            self._gather()
        self._record()
        if self.pacing is not None:
            self._pace()
        # rows in order: a pass of consecutive envs moves each key in one copy
        self.waiting.sort()
        while self.waiting:
            envs = self.waiting[:self.max_batch_size]
            self.waiting = self.waiting[self.max_batch_size:]
            self._act(envs)

    def _pace(self) -> None:
        """Keep the ready envs whose acts keep ``max_policy_lag``; the others wait in ``paused``
        for a step, a take or an update (each wakes the loop), and the due transitions join the
        batch now."""
        ready = self.waiting + self.paused
        if not ready:
            return
        args = (self.transitions, self.acting, ready, self.pacing)
        chosen = set(batched_admission.admitted(*args) or batched_admission.unstalled(*args))
        self.waiting = [env for env in ready if env in chosen]
        self.paused = [env for env in ready if env not in chosen]
        if self.paused:
            for batch in self.transitions.release():
                self.put(batch)

    def _gather(self) -> None:
        """Wait, while the forward pass has room, for the envs in flight about to answer
        (:class:`Patience`)."""
        now = time.monotonic()
        deadline = self.patience.deadline(now)
        while (len(self.waiting) < self.max_batch_size and now < deadline
               and self.patience.due(self.acting, deadline)):
            self._poll(deadline - now)
            now = time.monotonic()

    def _poll(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for envs; hand the workers of those that ended to
        ``on_failure``."""
        began = self.meter.span_start()
        ready, ended = self.plane.wait(timeout)
        self.clock.mark("idle")
        self.meter.span_end("wait", began, ready=len(ready))
        self._answered(ready)
        if not ended:
            return
        # an env answers before its worker's end: its step lies in its row
        self._record()
        for worker, text in self.plane.ended_workers(ended).items():
            envs = self.plane.envs_of(worker)
            for env in envs:
                self.acting[env] = False
            self.waiting = [e for e in self.waiting if e not in envs]
            self.paused = [e for e in self.paused if e not in envs]
            if not self.on_failure(worker, text):
                raise Stopped
            # the replacement starts from resets
            for env in envs:
                for batch in self.transitions.cut(env):
                    self.put(batch)
            # waiting for its envs again
            self.clock.mark("idle")

    def _answered(self, ready: list[int]) -> None:
        """``ready`` wait for actions now; the transitions they completed are recorded before any
        is acted for."""
        completed = [env for env in ready if self.acting[env]]
        self.patience.answered(completed, time.monotonic())
        self.completed.extend(completed)
        for env in ready:
            self.acting[env] = False
        self.waiting.extend(ready)

    def _record(self) -> None:
        """Record the transitions completed since the last call, all at once."""
        if self.completed:
            completed, self.completed = sorted(self.completed), []
            self.transitions.record(completed)
        self.clock.mark("write")

    def _act(self, envs: list[int]) -> None:
        began = self.meter.span_start()
        # passes mostly act for the same envs
        if self._index[0] != envs:
            self._index = (envs, torch.tensor(envs, dtype=torch.int64))
        index = self._index[1]
        rows = self.plane.rows
        inputs = {key: rows.get(key).index_select(0, index) for key in self.transitions.obs_keys}
        start = time.monotonic()
        with self.lock, set_interaction_type(self.exploration_type):
            outputs = self.policy(inputs, torch.Size([len(envs)]))
            version = self.version()
        self.patience.passed(time.monotonic() - start)
        # before any action goes out
        self.transitions.check(outputs, len(envs))
        action = rows.get("action")
        chosen = outputs["action"].reshape(len(envs), *action.shape[1:])
        action.index_copy_(0, index, chosen.to(action.device, action.dtype))
        for env in envs:
            self.acting[env] = True
        self.patience.went(envs, time.monotonic())
        gone = self.plane.go(envs)
        # its worker died: the wait reports it
        for env in gone:
            self.acting[env] = False
        self.passes, self.acted = self.passes + 1, self.acted + len(envs)
        self.clock.mark("policy")
        self.meter.span_end("forward", began, envs=len(envs))
        # while the envs step
        for batch in self.transitions.stage(envs, inputs, outputs, version):
            self.put(batch)
        self.clock.mark("write")
