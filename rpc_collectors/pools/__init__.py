"""Worker pools: how a multi-worker collector's workers exist. Each back-end is a module or folder
of its own, a full peer of the others: local processes (:mod:`.local`), collectors inside the
trainer's process (:mod:`.debug`), Ray actors (:mod:`.ray_actors`,
whose head is probed by :mod:`.ray_head`), and the ranks of a
torchrun/SLURM world, static, elastic or submitted as jobs (:mod:`.ranks`). The surface
they share is :mod:`.pool`.

May import :mod:`~rpc_collectors.cluster` and the layers below it; never the front, and no
back-end imports another (the rank pools build on one another inside :mod:`.ranks`).
"""
