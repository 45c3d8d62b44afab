"""What TorchRL's multi-worker collectors show of themselves, computed from what this one does:
``stats()`` with its worker views, and the attributes TorchRL's own tests read
(``_weight_sync_schemes``: the scheme that describes how weights travel here)."""
from __future__ import annotations

from typing import Any

from rpc_collectors.core import torchrl_args

WORKER_VIEWS = ("aggregate", "per_worker", "both")


class TorchRLViews:
    """TorchRL's ``stats(workers=...)`` and ``_weight_sync_schemes`` of
    :class:`~rpc_collectors.front.collector_front.CollectorFront`."""

    _schemes_given: Any = None  # TorchRL's weight_sync_schemes, as given to the constructor
    _ray_actors = False  # RayCollector: the "rpc" transport is one ray.put (TorchRL's RayWeightSyncScheme)

    @property
    def _weight_sync_schemes(self) -> dict:
        """``{"policy": scheme}``: the TorchRL scheme given to the constructor, or TorchRL's scheme
        for the transport the weights take here (shared memory by default on one host:
        ``SharedMemWeightSyncScheme``, as TorchRL's default); empty without torchrl."""
        if self._no_push:
            transport = torchrl_args.NO_PUSH
        elif self.weights is not None:
            transport = self.weights.spec.kind.split("-")[0]  # "shm-copy" is shared memory too
        else:  # policy_factory before the first push: the transport asked for ("auto": none chosen yet)
            transport = self._transport
        return torchrl_args.scheme_objects(self._schemes_given, transport, ray=self._ray_actors)

    def stats(self, workers: str = "aggregate") -> dict[str, int | bool]:
        """TorchRL's progress snapshot (see :meth:`BaseCollector.stats
        <rpc_collectors.collection.base.BaseCollector.stats>`), with ``"workers"`` and
        ``"workers_alive"``. ``workers="per_worker"`` or ``"both"`` adds ``"worker_<i>/frames"``
        and ``"worker_<i>/batches"``: what each worker delivered to this collector (counted
        here, without a call to the workers); ``"per_worker"`` leaves the aggregate entries out."""
        if workers not in WORKER_VIEWS:
            raise ValueError(f"workers={workers!r} is invalid: workers must be one of 'aggregate', 'per_worker' or 'both'")
        stats = super().stats() if workers != "per_worker" else {}
        stats["workers"] = int(self.num_workers)
        stats["workers_alive"] = 0 if self._closing else sum(
            self.workers.serves(i) and self.roster[i].dead is None for i in range(self.num_workers)
        )
        if workers != "aggregate":
            for i in range(self.num_workers):
                frames, batches = self._worker_totals.get(i, (0, 0))
                stats[f"worker_{i}/frames"], stats[f"worker_{i}/batches"] = int(frames), int(batches)
        return stats
