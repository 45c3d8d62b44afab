"""The planes that move things between the trainer and its workers, knowing nothing of collectors:
batches (:mod:`.data`, :mod:`.doorbell`, :mod:`.layouts`, over :mod:`.shm`), weights
(:mod:`.weights`, :mod:`.weight_sync`), and the control plane's meeting point and membership
(:mod:`.rendezvous`, :mod:`.membership`).

May import :mod:`~rpc_collectors.core` only.
"""
