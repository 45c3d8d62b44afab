"""Pools whose workers are ranks of an RPC group: the fixed ranks of a torchrun/SLURM world
(:mod:`.static`), collector processes that join and leave a running trainer (:mod:`.elastic_pool`,
built on the static pool), and collector jobs the trainer submits to SLURM (:mod:`.submitit`,
built on the elastic pool).
"""
