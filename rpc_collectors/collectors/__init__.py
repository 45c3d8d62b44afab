"""The public multi-worker collectors, each a choice of pool and default layout over the front:
``RPCCollector`` (:mod:`.rpc`) and the ``Multi*`` classes (:mod:`.multi`), which open over the pool
their launcher picks (:mod:`.opening`) with their arguments checked into the front's plan
(:mod:`.construction`), ``AsyncCollector``
(:mod:`.async_collector`), TorchRL's ``DistributedCollector``
(:mod:`.distributed_collector`), ``RayCollector`` (:mod:`.ray`, needs the ``ray`` extra;
:mod:`.ray_extra` imports it on demand), ``AsyncBatchedCollector`` (:mod:`.async_batched`,
started by :mod:`.batched_startup`), and what ``Collector(..., num_collectors=N, backend=...)``
builds (:mod:`.dispatch`).

TorchRL's ``Evaluator`` (:mod:`.evaluator`, exported here as in ``torchrl.collectors``) runs on
those collectors: its arguments (:mod:`.evaluation_options`), where its rollouts run
(:mod:`.evaluation_runs`), the env and policy it evaluates (:mod:`.evaluation_envs`) and the
metrics it reports (:mod:`.evaluation_metrics`).

May import :mod:`~rpc_collectors.trainer`, :mod:`~rpc_collectors.pools` and every layer below them.
"""
from typing import Any

__all__ = ["Evaluator"]


def __getattr__(name: str) -> Any:
    """``Evaluator``, imported when first asked for: the package itself imports none of its modules,
    which import one another through it."""
    if name == "Evaluator":
        from rpc_collectors.collectors.evaluator import Evaluator

        return Evaluator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
