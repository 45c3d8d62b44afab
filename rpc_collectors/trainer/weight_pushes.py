"""How a collector front pushes policy weights to its workers.

The weight plane (:class:`~rpc_collectors.transport.weight_sync.WeightPlane`) is laid out from the
trainer's policy when the front opens, or, when the workers build their policies
(``policy_factory``), from the first weights pushed. A push bumps the trainer's version
(``pushed_version``) and sends the flat buffer to all workers (one broadcast or shared memory) or
to some; each worker applies it before its next batch, never in the middle of one.
:class:`WeightPusher` is the front's part that does this and owns what it needs: the plane, the
version of the newest weights, the push in flight and, with ``policy_factory``, the weights given
last.
The version each worker was sent, and the batches it delivered since, are in its roster record
(:class:`~rpc_collectors.trainer.roster.WorkerRecord`), which the pusher updates with each push.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Callable

import torch
from tensordict import TensorDictBase
from torch import nn

from rpc_collectors.core import worker_checks
from rpc_collectors.core.protocol import WorkerCalls
from rpc_collectors.single_process.policies import run_device
from rpc_collectors.single_process.run_meter import RunMeter
from rpc_collectors.trainer.lifetime import Resources
from rpc_collectors.trainer.roster import WorkerRecord
from rpc_collectors.transport import factory_weights
from rpc_collectors.transport.rendezvous import host_id
from rpc_collectors.transport.weight_sync import WeightPlane, choose_transport
from rpc_collectors.transport.weight_updates import whole_update

# "shared" weights are one memory: a push reaches every worker or none
SHARED_BY_ALL = (
    "update_policy_weights_: the workers' policies are one memory with the trainer's "
    "(SharedMemWeightSyncScheme, weight_transport='shared'), so weights cannot go to some workers "
    "only; accepted: weights for all workers (no worker_ids, no per-worker dict), or "
    "weight_transport='shm'")


class WeightPusher:
    """The weight pushes of one collector front to the workers of ``pool`` (records in ``roster``).

    ``deferred``: the workers' calls (:mod:`~rpc_collectors.core.protocol`), each sent by
    ``gather``; ``no_push`` (TorchRL's ``NoWeightSyncScheme``): no plane, a push does nothing;
    ``refill``: a replaced or newly joined worker gets the weights its slot holds; the plane, once
    laid out, is released with ``resources``; ``meter`` counts the pushes, times their
    acknowledgements and their phases (pause, transfer, acknowledge, and the workers' apply that
    their answers tell) and keeps their spans (``"push"``, ``"push wait"``, and the phases' own
    row) in a trace window.

    ``version`` is the newest weights' version (each worker acknowledges its own:
    :meth:`worker_versions`); ``given`` (``policy_factory``) the weights pushed last, which a push
    without weights sends; ``_push`` the push in progress: its calls and their futures.
    """

    def __init__(
        self, policy: Any, pool: Any, roster: Sequence[WorkerRecord], deferred: WorkerCalls,
        gather: Callable[..., list], *, transport: str, factory: bool, no_push: bool,
        policy_device: Any, backend: str, elastic: bool,
        rpc_timeout: float, refill: bool, resources: Resources, meter: RunMeter | None = None,
    ) -> None:
        self.policy, self.pool, self.roster = policy, pool, roster
        self.deferred, self.gather = deferred, gather
        self.transport, self.factory, self.no_push = transport, factory, no_push
        self.policy_device, self.backend, self.elastic = policy_device, backend, elastic
        self.rpc_timeout, self.refill = rpc_timeout, refill
        self.resources, self.meter = resources, meter if meter is not None else RunMeter(on=False)
        self.plane: WeightPlane | None = None
        self.version = 0
        self.given: Any = None
        self.lock = threading.RLock()
        self._push: dict[int, Any] = {}
        self._pushed: dict[int, torch.futures.Future] = {}

    @property
    def num_workers(self) -> int:
        return len(self.roster)

    def _serving(self) -> list[int]:
        return [i for i, record in enumerate(self.roster) if record.serving]

    def open(self, given: Any = None) -> None:
        """The weight plane, for the trainer's policy or (``policy_factory``) the ``given``
        weights."""
        module = self.policy if isinstance(self.policy, nn.Module) else given
        if module is None or self.no_push:
            return
        if self.factory:
            # the workers' policies must hold what the trainer will push
            signatures = self.gather({i: self.deferred.weights_signature(i)
                                      for i in self._serving()})
            factory_weights.check_workers(dict(zip(self._serving(), signatures)), module)
        same_host = all(record.info is not None and record.info["host_id"] == host_id()
                        for record in self.roster)
        kind = choose_transport(
            self.transport, same_host, self.backend, self.elastic, self.pool.in_process,
            self.pool.process_groups,
        )
        rdv = self.pool.weight_rendezvous() if kind == "broadcast" else None
        self.plane = self.resources.sender = WeightPlane(
            module, kind, self.num_workers, self.rpc_timeout, refill=self.refill,
            backend=self.backend, rdv=rdv,
        )
        # every worker holds version 0 of these weights, no batch delivered since
        for record in self.roster:
            record.sent_weights(0)
        joins = {i: self.deferred.join_weights(i, self.plane.spec)
                 for i in range(self.num_workers) if self.roster[i].info}
        futures = {i: call() for i, call in joins.items()}
        self.plane.sender.connect()
        self.gather(joins, futures)
        self.plane.sender.joined()

    def worker_versions(self) -> list[int | None]:
        """The weights version each worker acknowledged (0 before any push; None while a push to
        it is in flight, or where its slot has no worker)."""
        in_flight = {i for i, fut in self._pushed.items() if not fut.done()}
        return [record.weights_version if record.serving and i not in in_flight else None
                for i, record in enumerate(self.roster)]

    def acknowledged(self) -> int | None:
        """The version every serving worker acknowledged; None while they differ or a push is in
        flight."""
        versions = self.worker_versions()
        acknowledged = {versions[i] for i in self._serving()}
        return acknowledged.pop() if len(acknowledged) == 1 else None

    def update(self, policy_or_weights: Any, worker_ids: Any, non_blocking: bool) -> None:
        """``update_policy_weights_``: the whole update checked first, then pushed as one new
        version."""
        if self.no_push:
            return
        listed = isinstance(self.policy_device, list)
        devices = self.policy_device if listed else [self.policy_device]
        # where the workers run their policy
        device = [run_device(self.policy, d) for d in devices]
        device = device if listed else device[0]
        layout = self.plane.sender.flat.signature if self.plane is not None else None
        update = whole_update(policy_or_weights, worker_ids, layout, self.num_workers, device)
        per_worker = worker_checks.per_worker_weights(policy_or_weights, worker_ids)
        first = next(iter(update.values()))
        self._open_given(first, remember=not per_worker)
        if self.plane.spec.kind == "shared" and (per_worker or len(update) < self.num_workers):
            raise ValueError(SHARED_BY_ALL)
        if not per_worker:
            serving = [i for i in update if self.roster[i].serving]
            self.push(serving, first, non_blocking, slots=list(update))
            return
        # each of those workers gets its own, all as one new version
        with self.lock:
            self.finish()
            version, started = self.version + 1, self.meter.span_start()
            began = self.meter.push_clock()
            receive = self.plane.push_own(update, version, self._serving())
            self._start(receive, version, non_blocking, started, (began, self.meter.push_clock()))

    def _open_given(self, source: TensorDictBase | None, remember: bool = True) -> None:
        """``policy_factory``: lay the weight plane out from the first weights pushed (checked
        against every worker's policy); they, or later ones, are what a push without weights
        sends."""
        if self.plane is None:
            if not self.factory:
                raise TypeError(factory_weights.NOT_A_MODULE)
            if source is None:
                raise TypeError(factory_weights.NO_WEIGHTS)
            with self.lock:
                self.open(given=source)
        keep = remember and self.factory and source is not None
        if keep and not isinstance(self.policy, nn.Module):
            self.given = source

    def push_version(self, version: int, source: TensorDictBase | None = None) -> None:
        """Push the policy's weights (or ``source``) to every worker as ``version`` (a node
        passing on its trainer's)."""
        self._open_given(source)
        self.push(self._serving(), source, version=version)

    def push(
        self, worker_ids: list[int], source: Any = None, non_blocking: bool = False,
        version: int | None = None, slots: list[int] | None = None,
    ) -> None:
        """Push the trainer's weights (or ``source``) to ``worker_ids`` as ``version`` (default: a
        new one); ``slots`` (default: ``worker_ids``) hold them from now on."""
        with self.lock:
            self.finish()
            source = self.given if source is None else source
            version = self.version + 1 if version is None else version
            started = self.meter.span_start()
            began = self.meter.push_clock()
            tensors = self.plane.tensors(source)
            # with "shm" the copy into the slot is the transfer, else a pause before it
            checked = self.meter.push_clock() if self.plane.packs_in_place else 0
            self.plane.pack(source, tensors)
            packed = checked or self.meter.push_clock()
            receive = self.plane.send(worker_ids, version, slots)
            self._start(receive, version, non_blocking, started, (began, packed))

    def rejoin(self, worker_id: int) -> tuple | None:
        """``receive_weights`` arguments that give the new process serving ``worker_id`` what its
        slot holds (None: nothing was pushed, it keeps its policy's own, version 0); its next
        batch is collected with them."""
        held = self.plane.rejoin(worker_id)
        self.roster[worker_id].sent_weights(0 if held is None else held[0])
        return held

    def _start(self, receive: dict[int, tuple], version: int, non_blocking: bool,
               started: int, packing: tuple[int, int]) -> None:
        """Send each worker its ``receive_weights`` arguments; ``version`` is the trainer's from
        now on (``started``: when the push began, for its span; ``packing``: the meter's
        :meth:`~rpc_collectors.single_process.run_meter.RunMeter.push_clock` as its pause began
        and as its transfer did, for its phases)."""
        self.version = version
        for worker_id in receive:
            self.roster[worker_id].sent_weights(version)
        size = sum(nbytes for _, nbytes, _, _ in self.plane.sender.flat.layout)
        metered = self.meter.pushed(size)
        self._push = {i: self.deferred.receive_weights(i, *args) for i, args in receive.items()}
        self._pushed = {i: call() for i, call in self._push.items()}
        times = (*packing, self.meter.push_clock())
        futures = list(self._pushed.values())
        acknowledged = torch.futures.collect_all(futures)
        acknowledged.then(
            lambda _: self.meter.acknowledged(metered, times, receipts_of(futures)))
        self.meter.span_end("push", started, version=version, workers=len(receive))
        if not non_blocking:
            self.finish()

    def finish(self) -> None:
        """Wait until the previous weight push reached its workers."""
        push, self._push = self._push, {}
        if push:
            waited = self.meter.span_start()
            self.gather(push, self._pushed)
            self.plane.sender.wait()
            self.meter.span_end("push wait", waited, workers=len(push))


def receipts_of(futures: list[torch.futures.Future]) -> list:
    """The answers of the acknowledged ``futures`` (each worker's
    :data:`~rpc_collectors.transport.weight_sync.Receipt`); a failed one has none."""
    receipts = []
    for fut in futures:
        try:
            receipts.append(fut.value())
        except Exception:
            # its failure is the gather's to report
            continue
    return receipts
