"""What TorchRL's multi-worker collectors show of themselves, computed from what this one does:
``stats()`` with its worker views, the attributes TorchRL's own tests read
(``_weight_sync_schemes``: the scheme that describes how weights travel here), and its calls on
each worker: ``get_distant_attr``, ``map_fn`` (a worker's ``replay_buffer`` is the trainer's)
and the collect-hook setters."""
from __future__ import annotations

import dataclasses
from typing import Any

import cloudpickle

from rpc_collectors.collection import remote_calls
from rpc_collectors.core import checks, torchrl_args
from rpc_collectors.core.protocol import WorkerSpec

HOOKS = ("pre_collect_hook", "post_collect_hook")

WORKER_VIEWS = ("aggregate", "per_worker", "both")


class TorchRLViews:
    """TorchRL's ``stats(workers=...)``, ``_weight_sync_schemes``, ``get_distant_attr``, ``map_fn`` and
    hook setters of :class:`~rpc_collectors.front.collector_front.CollectorFront`."""

    _schemes_given: Any = None  # TorchRL's weight_sync_schemes, as given to the constructor
    _ray_actors = False  # RayCollector: the "rpc" transport is one ray.put (TorchRL's RayWeightSyncScheme)
    _runs_post_hook = False  # the collect hooks run in the workers
    _hooks: dict | None = None  # the workers' collect hooks, as given to the constructor or set since

    def get_distant_attr(self, attr: str) -> list:
        """TorchRL's: each worker's collector's attribute at the dotted path ``attr``, in worker order
        (``"worker_idx"``: the worker ids; ``"replay_buffer..."``: see :meth:`_in_trainer`)."""
        self.require_running()
        if self._in_trainer(attr):
            return [remote_calls.attribute(self, attr) for _ in self._serving()]
        return self.gather({i: self.deferred.get_distant_attr(i, attr) for i in self._serving()})

    def map_fn(self, method_name: str, list_of_args: list | None = None, list_of_kwargs: list | None = None) -> list:
        """TorchRL's: each worker's collector's ``method_name`` (a dotted path) called with its entry of
        ``list_of_args``/``list_of_kwargs`` (one per worker; None: no arguments); the results in worker order."""
        args, kwargs = remote_calls.entries(list_of_args, list_of_kwargs, self.num_workers)
        self.require_running()
        if self._in_trainer(method_name):
            return [remote_calls.attribute(self, method_name)(*args[i], **kwargs[i]) for i in self._serving()]
        return self.gather({i: self.deferred.map_fn(i, method_name, args[i], kwargs[i]) for i in self._serving()})

    def fake_tensordict(self) -> Any:
        """Not implemented, as in TorchRL: each worker's batch has its own layout (a single-process
        ``Collector`` has it)."""
        raise NotImplementedError(f"{type(self).__name__}.fake_tensordict is not implemented, as in TorchRL; "
                                  "accepted: Collector(...).fake_tensordict() with one of the workers' envs")

    @property
    def interruptor(self) -> None:
        """TorchRL's shared flag that stops a sync round's other workers: None, as TorchRL's is without
        preemption; with it, the trainer stops them by a call, so no flag exists either."""
        return None

    def _in_trainer(self, path: str) -> bool:
        """Whether ``path`` is the replay buffer's: the workers' frames go into the one buffer the
        trainer writes, so each worker's ``replay_buffer`` is that buffer (TorchRL's workers share theirs)."""
        return isinstance(path, str) and path.split(".")[0] == "replay_buffer" and self.replay_buffer is not None

    def _start_profile(self, config: Any) -> None:
        raise ValueError(
            f"enable_profile(workers={config.workers!r}) on {type(self).__name__}: profiling inside worker processes "
            "is not supported; accepted: enable_profile on a single-process Collector"
        )

    @property
    def pre_collect_hook(self) -> Any:
        """Called in each worker before each batch; setting it sets it in every worker (as TorchRL's setter)."""
        return (self._hooks or {}).get("pre_collect_hook")

    @pre_collect_hook.setter
    def pre_collect_hook(self, hook: Any) -> None:
        self._set_hook("pre_collect_hook", hook)

    @property
    def post_collect_hook(self) -> Any:
        """Called in each worker with each of its batches; setting it sets it in every worker."""
        return (self._hooks or {}).get("post_collect_hook")

    @post_collect_hook.setter
    def post_collect_hook(self, hook: Any) -> None:
        self._set_hook("post_collect_hook", hook)

    def _set_hook(self, name: str, hook: Any) -> None:
        hook = checks.optional_callable(name, hook)
        self._hooks = {**(self._hooks or {}), name: hook}
        if getattr(self, "specs", None) is None:  # the constructor: the workers get it with their options
            return
        self.require_running()
        for i, spec in enumerate(self.specs):  # a replaced worker is built with it too
            loaded = WorkerSpec.loads(spec)
            self.specs[i] = dataclasses.replace(loaded, options={**loaded.options, name: hook}).dumps()
        pickled = cloudpickle.dumps(hook)  # a closure travels as the worker's options do
        self.gather({i: self.deferred.set_hook(i, name, pickled) for i in self._serving()})

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
