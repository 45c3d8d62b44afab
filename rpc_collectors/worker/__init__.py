"""What runs in a worker process: the collector server and the calls the trainer makes to it
(:mod:`.server`; the calls that observe it in :mod:`.observing`), node collectors of local workers
(:mod:`.node`, one policy per node in :mod:`.node_inference`), the fast, leak-free start of local
processes (:mod:`.spawner`), the pipes a local worker is driven over (:mod:`.channel`), an env
stepped for a batched-inference collector (:mod:`.env_steps`), and torch's C++ log threshold
(:mod:`.cpp_log`).

May import :mod:`~rpc_collectors.single_process` and the layers below. A node runs a multi-worker
collector, a class of a higher layer: it is handed in with the node's spec, never imported.
"""
