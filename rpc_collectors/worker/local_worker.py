"""A local worker process: the spawner starts it (:func:`local_main`), and it serves the trainer's
calls as its :mod:`~rpc_collectors.worker.channel` delivers them (:class:`LocalServer`)."""
from __future__ import annotations

from typing import Any

import torch

from rpc_collectors.core import protocol
from rpc_collectors.single_process import step_count
from rpc_collectors.transport import doorbell
from rpc_collectors.transport.shm import SharedBytes
from rpc_collectors.worker import channel
from rpc_collectors.worker.server import WorkerState
from rpc_collectors.worker.spawner import name_process


class LocalServer:
    """A local worker process's calls, as its channel delivers them: ``create`` builds its state."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.state: WorkerState | None = None

    def handle(self, method: str, args: tuple) -> Any:
        if method == protocol.CREATE:
            spec, worker_id, num_workers, traj_id_start = args
            spec = spec.read() if isinstance(spec, SharedBytes) else spec
            self.state = WorkerState(spec, worker_id, num_workers, self.rank, traj_id_start,
                                     "127.0.0.1")
            return self.state.info()
        if self.state is None:
            raise RuntimeError(f"collector worker {self.rank - 1} has no collector yet")
        return protocol.serve(self.state, method, args)

    def interrupt(self) -> None:
        if self.state is not None:
            self.state.interrupt()

    def close(self) -> None:
        if self.state is not None:
            self.state.close()


def local_main(rank: int, steps: list[int] | None, *ends: Any) -> int:
    """Entry point of a local worker process started by the spawner: count its steps into the word
    ``steps`` names (:func:`~rpc_collectors.single_process.step_count.attach`; None: a node, whose
    local workers count their own) and serve the trainer's channel (``ends``: the fields of its
    :class:`~rpc_collectors.transport.doorbell.Ends`) until it closes."""
    torch.set_num_threads(1)
    if steps is not None:
        step_count.attach(steps)
    name_process(f"rpc-worker{rank - 1}")
    server = LocalServer(rank)
    channel.run_channel(doorbell.Ends(*ends), server.handle, server.close, server.interrupt)
    return 0
