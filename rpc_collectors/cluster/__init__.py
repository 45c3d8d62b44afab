"""The cluster: SLURM submission through submitit (:mod:`.submission`, what a task finds out about
its host in :mod:`.task_hosts`; one job of a trainer group and collector groups, SLURM's
heterogeneous jobs, in :mod:`.het_jobs`), collector jobs the trainer
submits itself (:mod:`.jobs`, with :mod:`.job_guard` cancelling them if the trainer dies), and the
rendezvous of elastic collector processes that join a running trainer (:mod:`.elastic`), and runs
longer than an allocation: a run's checkpoint (:mod:`.checkpoint`, :mod:`.run_checkpoint`) and
the requeue at the time limit or on preemption (:mod:`.requeue`, counting a run's starts in
:mod:`.run_starts`); a SLURM task's Python starts with the job's stop signals
blocked (:mod:`.task_start`).

May import :mod:`~rpc_collectors.worker` (a collector job runs a worker
server) and the layers below.
"""
