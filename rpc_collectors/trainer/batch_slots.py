"""A collector front's batch plane once it is laid out, and what the front's parts ask of it.

:class:`BatchSlots` owns the front's :class:`~rpc_collectors.transport.data.BatchPlane` (None until
the workers are up): it asks a worker to map a shared buffer, gives the process that now serves a
worker its slots (a replacement its predecessor's, an elastic newcomer its own). No room for a
shared-memory buffer (``OSError``) ends the run.
"""
from __future__ import annotations

from typing import Any, Callable

from rpc_collectors.core.errors import Failure
from rpc_collectors.trainer.lifetime import Resources, weak_method
from rpc_collectors.trainer.roster import Roster
from rpc_collectors.trainer.waits import Waits
from rpc_collectors.transport.data import BatchPlane
from rpc_collectors.transport.rendezvous import host_id


class BatchSlots:
    """The batch plane of one front, over ``roster``'s workers reached through ``waits``.

    ``fail(error)`` shuts the front down and hands back the error to raise.
    """

    def __init__(self, roster: Roster, waits: Waits, elastic: bool,
                 fail: Callable[[BaseException], BaseException]):
        self.roster, self.waits, self.elastic, self.fail = roster, waits, elastic, fail
        self.plane: BatchPlane | None = None

    def open(self, local: list[bool], resources: Resources, **layout: Any) -> None:
        """Lay out the plane for workers on this host (``local``) or elsewhere; ``layout``: as
        :class:`BatchPlane` takes it. ``resources`` closes it with the front (and holds no reference
        to the front: the plane's callback is weak)."""
        self.plane = resources.batches = BatchPlane(local, weak_method(self._join), **layout)

    def _join(self, worker_id: int, spec: Any) -> bool:
        """Ask a worker to map a shared batch buffer; False if it cannot (a failure shows at its
        next request)."""
        # without restarts a failure raises its WorkerError here
        recover = not self.roster.budget and not self.elastic
        try:
            return self.waits.gather({worker_id: self.waits.deferred.join_batches(worker_id, spec)},
                                     recover=recover)[0]
        except Failure:
            return False

    def rejoin(self, worker_id: int) -> None:
        """Give the process now serving ``worker_id`` its batch slots: a replacement maps its
        predecessor's, an elastic newcomer gets its own with its first batch."""
        if self.plane is None:
            return
        if self.elastic:
            self.plane.admit(worker_id, self.roster[worker_id].info["host_id"] == host_id())
            return
        try:
            self.plane.rejoin(worker_id)
        except OSError as err:
            # no room for a shared-memory buffer ends the run
            raise self.fail(err) from None
