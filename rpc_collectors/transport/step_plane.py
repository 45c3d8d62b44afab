"""The step plane: one shared-memory row and one doorbell per env, for
inference off the env workers.

Each env owns a row of one shared buffer (a :class:`~rpc_collectors.transport.data.SlotPool` of
one slot with a row per env): its current observation and the transition its last step gave,
written by the env's worker, and the action the trainer chose for it. Its doorbell is a pair
of pipes opened as a batch doorbell's are (:class:`~rpc_collectors.transport.doorbell.Ends`):
the trainer writes one byte to say "your action is in the row", the worker one byte to say
"the row holds the step's result and your next observation": that byte is the env's ready
flag, and nothing is pickled per step. An env that raised sends ``ERROR``, the length of its
traceback and the traceback, then closes its end; a worker that died closes it too.

The trainer waits on every env's ready pipe at once (:meth:`StepPlane.wait`), so it sleeps
until the first env is ready and then takes every env that is ready together.

An env worker hosts ``envs_per_worker`` consecutive envs (TorchRL's grouping: worker ``w`` the
envs ``w * k`` to ``w * k + k - 1``, the last worker the rest); the plane owns that grouping
(:meth:`StepPlane.envs_of`, :meth:`StepPlane.worker_of`) and hands each worker its envs' specs
at once (:class:`StepGroup`): a worker's envs start, end and are replaced together.
"""
from __future__ import annotations

import os
import selectors
import struct
from dataclasses import dataclass

from tensordict import TensorDict

from rpc_collectors.transport.data import SlotPool, SlotSpec
from rpc_collectors.transport.doorbell import Ends, _read_exactly, _write_all
from rpc_collectors.transport.layouts import BatchLayout

GO, READY, ERROR = b"g", b"r", b"e"
LENGTH = struct.Struct("<I")
# the selector's key of the pipe that interrupts a wait
WAKE = -1


@dataclass
class StepGroup:
    """What one env worker steps: the specs of its envs' rows (its first env is the one it was
    built with), the worker specs (:class:`~rpc_collectors.core.protocol.WorkerSpec` bytes) of its
    other envs, and the seed of its first env (its env ``i`` gets ``seed + i``; None: unseeded)."""

    rows: list[SlotSpec]
    others: list[bytes]
    seed: int | None = None


class StepPlane:
    """Trainer side: the rows of ``num_envs`` envs (``rows``, a TensorDict ``[num_envs]`` of views
    into shared memory) and their doorbells, ``envs_per_worker`` envs to a worker."""

    def __init__(self, row: TensorDict, num_envs: int, envs_per_worker: int = 1) -> None:
        """``row``: one env's row (its keys, shapes and dtypes; its values are not used)."""
        layout = BatchLayout.of(row)
        if layout is None:
            raise TypeError("an env's step holds entries that cannot go through shared memory: "
                            f"{row}")
        self.num_envs, self.envs_per_worker = num_envs, envs_per_worker
        self.num_workers = -(-num_envs // envs_per_worker)
        self.pool = SlotPool(layout, num_envs, slots=1)
        self.rows = layout.view(self.pool.slots[0], num_envs)
        # env -> write end of its go pipe
        self._go: dict[int, int] = {}
        # env -> read end of its ready pipe
        self._ready: dict[int, int] = {}
        # env -> the ends the worker opens, until it did
        self._handed: dict[int, tuple[int, int]] = {}
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, WAKE)

    def envs_of(self, worker: int) -> range:
        """The envs that ``worker`` steps."""
        return range(worker * self.envs_per_worker,
                     min(self.num_envs, (worker + 1) * self.envs_per_worker))

    def worker_of(self, env: int) -> int:
        """The worker that steps ``env``."""
        return env // self.envs_per_worker

    def specs(self, worker: int) -> list[SlotSpec]:
        """What ``worker`` maps and opens for each of its envs; new pipes each
        time (a replacement's)."""
        return [self._spec(env) for env in self.envs_of(worker)]

    def _spec(self, env: int) -> SlotSpec:
        self.drop(env)
        go_r, go_w = os.pipe()
        ready_r, ready_w = os.pipe()
        self._go[env], self._ready[env], self._handed[env] = go_w, ready_r, (go_r, ready_w)
        return self.pool.spec(env, Ends.of(go_r, ready_w))

    def opened(self, worker: int) -> None:
        """``worker`` holds its envs' ends: close the trainer's copies and listen to its envs."""
        for env in self.envs_of(worker):
            for fd in self._handed.pop(env):
                os.close(fd)
            self._selector.register(self._ready[env], selectors.EVENT_READ, env)

    def go(self, envs: list[int]) -> list[int]:
        """Ring each env of ``envs``: its action is in its row. Returns those whose pipe is gone."""
        gone = []
        for env in envs:
            try:
                _write_all(self._go[env], GO)
            except OSError:
                gone.append(env)
        return gone

    def wait(self, timeout: float | None) -> tuple[list[int], dict[int, str]]:
        """Envs whose row is ready, and envs that ended (env -> the traceback it sent, or "").

        Returns after ``timeout`` s with nothing, or at once after :meth:`wake`."""
        ready, ended = [], {}
        for key, _ in self._selector.select(timeout):
            if key.data == WAKE:
                os.read(self._wake_r, 4096)
                continue
            env, fd = key.data, key.fd
            try:
                byte = os.read(fd, 1)
                if byte == ERROR:
                    ended[env] = _read_exactly(fd,
                                               LENGTH.unpack(_read_exactly(fd, LENGTH.size))[
                                                   0]).decode()
                elif byte:
                    ready.append(env)
                else:
                    ended[env] = ""
            except (EOFError, OSError):
                ended[env] = ""
        for env in ended:
            self.drop(env)
        return ready, ended

    def ended_workers(self, ended: dict[int, str]) -> dict[int, str]:
        """The workers of the envs in ``ended`` (a :meth:`wait`'s), each with the first
        traceback one of its envs sent ("" if none did)."""
        workers: dict[int, str] = {}
        for env, text in ended.items():
            worker = self.worker_of(env)
            workers[worker] = workers.get(worker) or text
        return workers

    def wake(self) -> None:
        """End a :meth:`wait` in progress (or the next one) at once."""
        try:
            os.write(self._wake_w, b"w")
        except BlockingIOError:
            # a wake-up is pending already
            pass

    def drop(self, env: int) -> None:
        """Stop listening to ``env`` and close its pipes (its worker sees
        the end of its go pipe)."""
        ready = self._ready.pop(env, None)
        if ready is not None:
            if ready in self._selector.get_map():
                self._selector.unregister(ready)
            os.close(ready)
        go = self._go.pop(env, None)
        if go is not None:
            os.close(go)
        for fd in self._handed.pop(env, ()):
            os.close(fd)

    def close(self) -> None:
        """Close every doorbell (each worker's step loop ends) and the buffer's descriptor."""
        for env in list(self._go):
            self.drop(env)
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self.pool.close()


def send_error(fd: int, text: str) -> None:
    """Worker side: report an env's traceback on its ready pipe (the worker
    closes the pipe next)."""
    data = text.encode()
    _write_all(fd, ERROR + LENGTH.pack(len(data)) + data)
