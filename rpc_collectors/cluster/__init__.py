"""The cluster: SLURM submission through submitit (:mod:`.slurm`), collector jobs the trainer
submits itself (:mod:`.jobs`, with :mod:`.job_guard` cancelling them if the trainer dies), and the
rendezvous of elastic collector processes that join a running trainer (:mod:`.elastic`).

May import :mod:`~rpc_collectors.worker` (a collector job runs a worker server) and the layers below.
"""
