"""The debug launcher's pool: every collector lives in the trainer's process, called directly,
so a debugger steps from the trainer's loop into an env's ``step``."""
from __future__ import annotations

import contextlib
import os
import socket
import traceback
from typing import Any, Callable

import torch

from rpc_collectors.core import protocol
from rpc_collectors.pools.pool import WorkerPool, traceback_failure
from rpc_collectors.worker import server as worker


class DebugPool(WorkerPool):
    """``num_workers`` collectors in this process; a call runs at once and returns a done future."""

    replaceable = True
    in_process = True

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self.states: dict[int, worker.WorkerState] = {}
        # what each collector stepped, read as close() dropped it
        self._final: dict[int, int] = {}

    @staticmethod
    def _done(fn: Callable[[], Any]) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        try:
            fut.set_result(fn())
        except Exception:
            # delivered through the future with its traceback, as from a process
            fut.set_exception(RuntimeError(traceback.format_exc()))
        return fut

    def create(self, worker_id: int, spec: bytes,
               traj_id_start: int | None = None) -> torch.futures.Future:
        def build() -> dict:
            self.states[worker_id] = worker.WorkerState(spec, worker_id, self.num_workers,
                                                        worker_id + 1, traj_id_start,
                                                           in_process=True)
            return self.states[worker_id].info()

        return self._done(build)

    def call(self, worker_id: int, method: str, *args: Any) -> torch.futures.Future:
        return self._done(lambda: protocol.serve(self.states[worker_id], method, args))

    def failure(self, worker_id: int, err: BaseException) -> tuple[str, str]:
        return traceback_failure(err) or (f"raised an error: {err}", "")

    def replace(self, worker_id: int) -> int | None:
        """Drop ``worker_id``'s collector (its env may be broken);
        :meth:`create` builds a fresh one. Returns the frames the old one stepped."""
        stepped = self.stepped(worker_id)
        state = self.states.pop(worker_id, None)
        if state is not None:
            with contextlib.suppress(Exception):
                state.close()
        return stepped

    def stepped(self, worker_id: int) -> int | None:
        """What its collector's rollout counted (None: a node, whose local workers count)."""
        state = self.states.get(worker_id)
        if state is None:
            return self._final.get(worker_id)
        rollout = getattr(state.collector, "rollout", None)
        return None if rollout is None else rollout.counted.value

    def identity(self, worker_id: int) -> dict:
        return {"host": f"{socket.gethostname()}, in the trainer process (debug launcher)",
                "pid": os.getpid()}

    def close(self, timeout: float = 2.0) -> None:
        for worker_id, state in self.states.items():
            stepped = self.stepped(worker_id)
            if stepped is not None:
                self._final[worker_id] = stepped
            state.close()
        self.states.clear()
