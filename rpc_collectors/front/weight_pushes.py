"""How a collector front pushes policy weights to its workers.

The weight plane (:class:`~rpc_collectors.planes.weight_sync.WeightPlane`) is laid out from the
trainer's policy when the front opens, or, when the workers build their policies
(``policy_factory``), from the first weights pushed. A push bumps ``pushed_version`` and sends
the flat buffer to all workers (one broadcast or shared memory) or to some; each worker applies
it before its next batch, never in the middle of one. :class:`WeightPushes` is the front's part
that does this; it uses the front's workers, roster, waits and lock.
"""
from __future__ import annotations

from typing import Any

from tensordict import TensorDictBase
from torch import nn

from rpc_collectors.collection.policies import run_device
from rpc_collectors.core import worker_checks
from rpc_collectors.planes import factory_weights
from rpc_collectors.planes.rendezvous import host_id
from rpc_collectors.planes.weight_sync import WeightPlane, choose_transport
from rpc_collectors.planes.weight_updates import whole_update
from rpc_collectors.planes.weights import one_source


class WeightPushes:
    """The weight pushes of :class:`~rpc_collectors.front.collector_front.CollectorFront`."""

    def _init_weights(self, transport: str, given: Any = None) -> None:
        """The weight plane, for the trainer's policy or (``policy_factory``) the ``given`` weights."""
        module = self.policy if isinstance(self.policy, nn.Module) else given
        if module is None or self._no_push:
            return
        if self._factory:  # the workers' policies must hold what the trainer will push
            signatures = self.gather({i: self.deferred.weights_signature(i) for i in self._serving()})
            factory_weights.check_workers(dict(zip(self._serving(), signatures)), module)
        same_host = all(info is not None and info["host_id"] == host_id() for info in self.infos)
        kind = choose_transport(
            transport, same_host, self.backend, self.elastic, self.workers.in_process, self.workers.process_groups,
        )
        rdv = self.workers.weight_rendezvous() if kind == "broadcast" else None
        self.weights = self._resources.sender = WeightPlane(
            module, kind, self.num_workers, self.rpc_timeout, refill=self.restarts.budget > 0 or self.elastic,
            backend=self.backend, rdv=rdv,
        )
        joins = {i: self.deferred.join_weights(i, self.weights.spec) for i in range(self.num_workers) if self.roster[i].info}
        futures = {i: call() for i, call in joins.items()}
        self.weights.sender.connect()
        self.gather(joins, futures)
        self.weights.sender.joined()

    @property
    def policy_version(self) -> int | None:
        """TorchRL's acknowledged version: the weights version every serving worker acknowledged
        (a vacant slot of an elastic collector does not count); None while they differ (after a
        push to some of them) or a push is in flight (``non_blocking``). The version that chose
        each frame is its ``("collector", "policy_version")``."""
        serving, versions = set(self._serving()), self.worker_policy_versions()
        acknowledged = {versions[i] for i in serving}
        return acknowledged.pop() if len(acknowledged) == 1 else None

    def worker_policy_versions(self) -> list[int | None]:
        """TorchRL's: the weights version each worker acknowledged (0 before any push; None
        while a push to it is in flight, or where its slot has no worker)."""
        serving = set(self._serving())
        if self.weights is None:  # nothing was pushed
            return [0 if i in serving else None for i in range(self.num_workers)]
        return self.weights.worker_versions(serving, {i for i, fut in self._pushed.items() if not fut.done()})

    def _newest_version(self) -> int:
        return self.pushed_version

    def init_updater(self, *args: Any, **kwargs: Any) -> None:
        """The weight plane is set up by the constructor; nothing is left to prepare (arguments ignored)."""

    def update_policy_weights_(
        self, policy_or_weights: Any = None, *, worker_ids: Any = None, non_blocking: bool = False,
        weights: Any = None, policy: Any = None,
    ) -> None:
        """Push new weights to all workers (one broadcast) or to ``worker_ids`` (0-based ids, or
        TorchRL's form: the ``torch.device`` the workers' policy runs on).

        ``policy_or_weights`` (or TorchRL's ``weights=``/``policy=``): an ``nn.Module``, a
        TensorDict of weights or a state dict, or TorchRL's per-worker form ``{worker_id: weights}``
        (each of those workers gets its own; without ``worker_ids``); None pushes the tensors the policy given to the
        constructor holds at this call (also after its parameters were replaced), or, when the
        workers build their policies (``policy_factory``), the weights given last. The trainer's
        version (``pushed_version``) goes up by one; each worker applies the weights before its next batch,
        never in the middle of one. With ``non_blocking=True`` this returns once the weights
        are copied out of the policy, and the transfer completes in the background.
        """
        policy_or_weights = one_source(policy_or_weights, weights, policy)
        self.require_running()
        if self._no_push:
            return
        devices = self._policy_device if isinstance(self._policy_device, list) else [self._policy_device]
        device = [run_device(self.policy, d) for d in devices]  # where the workers run their policy
        device = device if isinstance(self._policy_device, list) else device[0]
        layout = self.weights.sender.flat.signature if self.weights is not None else None
        update = whole_update(policy_or_weights, worker_ids, layout, self.num_workers, device)
        per_worker = worker_checks.per_worker_weights(policy_or_weights, worker_ids)
        first = next(iter(update.values()))
        self._open_given(first, remember=not per_worker)
        if not per_worker:
            self._push_weights([i for i in update if self.workers.serves(i)], first, non_blocking, slots=list(update))
            return
        with self._lock:  # each of those workers gets its own, all as one new version
            self._finish_push()
            version = self.pushed_version + 1
            self._start_push(self.weights.push_own(update, version, self._serving()), version, non_blocking)

    def _open_given(self, source: TensorDictBase | None, remember: bool = True) -> None:
        """``policy_factory``: lay the weight plane out from the first weights pushed (checked
        against every worker's policy); they, or later ones, are what a push without weights sends."""
        if self.weights is None:
            if not self._factory:
                raise TypeError(factory_weights.NOT_A_MODULE)
            if source is None:
                raise TypeError(factory_weights.NO_WEIGHTS)
            with self._lock:
                self._init_weights(self._transport, given=source)
        if remember and self._factory and source is not None and not isinstance(self.policy, nn.Module):
            self._given = source

    def push_version(self, version: int, source: TensorDictBase | None = None) -> None:
        """Push the policy's weights (or ``source``) to every worker as ``version`` (a node passing on its trainer's)."""
        self.require_running()
        self._open_given(source)
        self._push_weights(self._serving(), source, version=version)

    def _push_weights(
        self, worker_ids: list[int], source: Any = None, non_blocking: bool = False, version: int | None = None,
        slots: list[int] | None = None,
    ) -> None:
        """Push the trainer's weights (or ``source``) to ``worker_ids`` as ``version`` (default: a new
        one); ``slots`` (default: ``worker_ids``) hold them from now on."""
        with self._lock:
            self._finish_push()
            source = self._given if source is None else source
            version = self.pushed_version + 1 if version is None else version
            self._start_push(self.weights.push(worker_ids, source, version, slots), version, non_blocking)

    def _start_push(self, receive: dict[int, tuple], version: int, non_blocking: bool) -> None:
        """Send each worker its ``receive_weights`` arguments; ``version`` is the trainer's from now on."""
        self.pushed_version = version
        self._push = {i: self.deferred.receive_weights(i, *args) for i, args in receive.items()}
        self._pushed = {i: call() for i, call in self._push.items()}
        if not non_blocking:
            self._finish_push()

    def _finish_push(self) -> None:
        """Wait until the previous weight push reached its workers."""
        push, self._push = self._push, {}
        if push:
            self.gather(push, self._pushed)
            self.weights.sender.wait()
