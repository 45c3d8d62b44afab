"""The planes that move things between the trainer and its workers, knowing nothing of collectors:
batches (:mod:`.data`, :mod:`.doorbell`, :mod:`.layouts`, over :mod:`.shm`), weights
(:mod:`.weights`, :mod:`.weight_sync`), each env's step for batched inference
(:mod:`.step_plane`), and the control plane's meeting point and membership
(:mod:`.rendezvous`, :mod:`.membership`).

May import :mod:`~rpc_collectors.core` only.
"""
