"""The step plane: one shared-memory row and one doorbell per env, for inference off the env workers.

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
"""
from __future__ import annotations

import os
import selectors
import struct

from tensordict import TensorDict

from rpc_collectors.transport.data import SlotPool, SlotSpec
from rpc_collectors.transport.doorbell import Ends, _read_exactly, _write_all
from rpc_collectors.transport.layouts import BatchLayout

GO, READY, ERROR = b"g", b"r", b"e"
LENGTH = struct.Struct("<I")
WAKE = -1  # the selector's key of the pipe that interrupts a wait


class StepPlane:
    """Trainer side: the rows of ``num_envs`` envs (``rows``, a TensorDict ``[num_envs]`` of views
    into shared memory) and their doorbells."""

    def __init__(self, row: TensorDict, num_envs: int) -> None:
        """``row``: one env's row (its keys, shapes and dtypes; its values are not used)."""
        layout = BatchLayout.of(row)
        if layout is None:
            raise TypeError(f"an env's step holds entries that cannot go through shared memory: {row}")
        self.num_envs = num_envs
        self.pool = SlotPool(layout, num_envs, slots=1)
        self.rows = layout.view(self.pool.slots[0], num_envs)
        self._go: dict[int, int] = {}  # env -> write end of its go pipe
        self._ready: dict[int, int] = {}  # env -> read end of its ready pipe
        self._handed: dict[int, tuple[int, int]] = {}  # env -> the ends the worker opens, until it did
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, WAKE)

    def spec(self, env: int) -> SlotSpec:
        """What the worker of ``env`` maps and opens; new pipes each time (a replacement's)."""
        self.drop(env)
        go_r, go_w = os.pipe()
        ready_r, ready_w = os.pipe()
        self._go[env], self._ready[env], self._handed[env] = go_w, ready_r, (go_r, ready_w)
        return self.pool.spec(env, Ends.of(go_r, ready_w))

    def opened(self, env: int) -> None:
        """The worker of ``env`` holds its ends: close the trainer's copies and listen to it."""
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
                    ended[env] = _read_exactly(fd, LENGTH.unpack(_read_exactly(fd, LENGTH.size))[0]).decode()
                elif byte:
                    ready.append(env)
                else:
                    ended[env] = ""
            except (EOFError, OSError):
                ended[env] = ""
        for env in ended:
            self.drop(env)
        return ready, ended

    def wake(self) -> None:
        """End a :meth:`wait` in progress (or the next one) at once."""
        try:
            os.write(self._wake_w, b"w")
        except BlockingIOError:  # a wake-up is pending already
            pass

    def drop(self, env: int) -> None:
        """Stop listening to ``env`` and close its pipes (its worker sees the end of its go pipe)."""
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
    """Worker side: report an env's traceback on its ready pipe (the worker closes the pipe next)."""
    data = text.encode()
    _write_all(fd, ERROR + LENGTH.pack(len(data)) + data)
