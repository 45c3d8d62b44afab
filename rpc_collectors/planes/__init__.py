"""The planes that move things between the trainer and its workers, knowing nothing of collectors:
batches (:mod:`.data`, :mod:`.doorbell`, :mod:`.layouts`, over :mod:`.shm`), weights
(:mod:`.weights`, :mod:`.weight_sync`), each env's step for batched inference
(:mod:`.step_plane`), the control plane's meeting point and membership
(:mod:`.rendezvous`, :mod:`.membership`), and Unix sockets that admit only the job's own
processes (:mod:`.local_socket`).

May import :mod:`~rpc_collectors.core` only.
"""
