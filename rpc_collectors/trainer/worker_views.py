"""TorchRL's views of a collector front's workers, and its options under TorchRL's attribute names.

What TorchRL's multi-worker collectors show of their workers: ``get_distant_attr``, ``map_fn``, the
collect hooks that run in every worker, ``stats(workers=...)``, the weight sync schemes, and the
options (``num_workers``, ``sync``, ...) read from the front's
:class:`~rpc_collectors.trainer.plan.Plan` (:class:`Planned`). Each function here is a method of
:class:`~rpc_collectors.trainer.collector_front.CollectorFront`, which names it in its class body
(``front``: the collector it is called on); they read the front's plan and parts.
"""
from __future__ import annotations

from typing import Any

from rpc_collectors.core import checks
from rpc_collectors.single_process import remote_calls
from rpc_collectors.single_process.base_collector import BaseCollector
from rpc_collectors.trainer import torchrl_views


class Planned:
    """An attribute of the front that reads its plan, where the option has its one home."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, front: Any, owner: type | None = None) -> Any:
        return self if front is None else getattr(front.plan, self.name)


def get_distant_attr(front: Any, attr: str) -> list:
    """TorchRL's: each worker's collector's attribute at the dotted path ``attr``, in worker
    order (``"worker_idx"``: the worker ids; ``"replay_buffer..."``: the trainer's buffer, which
    the workers share)."""
    front.require_running()
    serving = front.roster.serving()
    if torchrl_views.in_trainer(attr, front.replay_buffer):
        return [remote_calls.attribute(front, attr) for _ in serving]
    return front.waits.gather({i: front.waits.deferred.get_distant_attr(i, attr) for i in serving})


def map_fn(front: Any, method_name: str, list_of_args: list | None = None,
           list_of_kwargs: list | None = None) -> list:
    """TorchRL's: each worker's collector's ``method_name`` (a dotted path) called with its
    entry of ``list_of_args``/``list_of_kwargs`` (one per worker; None: no arguments); the
    results in worker order."""
    args, kwargs = remote_calls.entries(list_of_args, list_of_kwargs, front.plan.num_workers)
    front.require_running()
    serving = front.roster.serving()
    if torchrl_views.in_trainer(method_name, front.replay_buffer):
        return [remote_calls.attribute(front, method_name)(*args[i], **kwargs[i]) for i in serving]
    deferred = front.waits.deferred
    return front.waits.gather(
        {i: deferred.map_fn(i, method_name, args[i], kwargs[i]) for i in serving})


def fake_tensordict(front: Any) -> Any:
    """Not implemented, as in TorchRL: each worker's batch has its own layout (``Collector`` has
    it)."""
    raise NotImplementedError(
        f"{type(front).__name__}.fake_tensordict is not implemented, as in TorchRL; "
        "accepted: Collector(...).fake_tensordict() with one of the workers' envs")


def start_profile(front: Any, config: Any) -> None:
    raise ValueError(
        f"enable_profile(workers={config.workers!r}) on {type(front).__name__}: profiling "
        "inside worker processes is not supported; accepted: enable_profile on a "
        "single-process Collector")


def hook(name: str, doc: str) -> property:
    """The collect hook ``name``, as TorchRL's property: setting it sets it in every worker."""
    def get(front: Any) -> Any:
        return (front._hooks or {}).get(name)

    def set_(front: Any, value: Any) -> None:
        value = checks.optional_callable(name, value)
        front._hooks = {**(front._hooks or {}), name: value}
        if front.plan is None:
            # the constructor: the workers get it with their options
            return
        front.require_running()
        specs = front.plan.specs
        specs[:], pickled = torchrl_views.with_hook(specs, name, value)
        front.waits.gather({
            i: front.waits.deferred.set_hook(i, name, pickled) for i in front.roster.serving()})

    return property(get, set_, doc=doc)


def weight_sync_schemes(front: Any) -> dict:
    """``{"policy": scheme}``: TorchRL's scheme for how weights travel here
    (:func:`.torchrl_views.weight_schemes`)."""
    given = front.plan.options.weights.weight_sync_schemes
    return torchrl_views.weight_schemes(given, front.plan.no_push, front.pusher.plane,
                                        front.pusher.transport, front._ray_actors)


def stats(front: Any, workers: str = "aggregate") -> dict[str, int | bool]:
    """TorchRL's progress snapshot (see :meth:`BaseCollector.stats
    <rpc_collectors.single_process.base_collector.BaseCollector.stats>`), with ``"workers"`` and
    ``"workers_alive"``. ``workers="per_worker"`` or ``"both"`` adds ``"worker_<i>/frames"``
    and ``"worker_<i>/batches"``: what each worker delivered to this collector (counted
    here, without a call to the workers); ``"per_worker"`` leaves the aggregate entries out."""
    torchrl_views.check_workers_view(workers)
    alive = 0 if front._closing else sum(
        record.serving and record.dead is None for record in front.roster)
    given = BaseCollector.stats(front) if workers != "per_worker" else {}
    return torchrl_views.worker_stats(
        given, workers, alive, front._worker_totals, front.plan.num_workers)
