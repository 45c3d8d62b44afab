"""The public multi-worker collectors, each a choice of pool and default layout over the front:
``RPCCollector`` and the ``Multi*`` classes (:mod:`.multi`), TorchRL's ``DistributedCollector``
(:mod:`.distributed`), ``RayCollector`` (:mod:`.ray`, needs the ``ray`` extra, imported on first use by :mod:`.ray_extra`),
TorchRL's one-worker ``AsyncCollector`` (:mod:`.async_collector`),
``AsyncBatchedCollector`` (:mod:`.async_batched`), and what
``Collector(..., num_collectors=N, backend=...)`` builds (:mod:`.dispatch`).

May import :mod:`~rpc_collectors.front`, :mod:`~rpc_collectors.pools` and every layer below them.
"""
