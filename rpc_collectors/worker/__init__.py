"""What runs in a worker process: the collector server (:mod:`.server`: the state that serves the
trainer's calls; the calls that observe it in :mod:`.observing`), the collector it serves, as
:mod:`.served_collector` declares it (a plain worker's in :mod:`.single`; node collectors of local
workers in :mod:`.node`, one policy per node in :mod:`.node_inference`, an async node's requests
under the trainer's admission in :mod:`.node_credits`), each transport's entry:
a torchrun/SLURM rank served over RPC (:mod:`.rpc_rank`) and a local worker process
(:mod:`.local_worker`, driven over the pipes of :mod:`.channel`), the fast, leak-free start of local
processes (:mod:`.spawner`), an env stepped for a batched-inference collector (:mod:`.env_steps`),
an ``Evaluator``'s evaluations run beside the collection (:mod:`.evaluations`), and torch's C++ log
threshold (:mod:`.cpp_log`).

May import :mod:`~rpc_collectors.single_process` and the layers below. A node runs a multi-worker
collector, a class of a higher layer: it is handed in with the node's spec, never imported; so is
an evaluation's run, with its recipe.
"""
