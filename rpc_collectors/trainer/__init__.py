"""The trainer's side of a multi-worker collector, written once for every pool: what sync rounds,
async first-come, weight-update cadence, ``total_frames``, layouts, seeding and state mean
(:mod:`.collector_front`, which holds its parts: the request/wait loop and the sync and async
schedules in :mod:`.schedule`, the weight pusher in :mod:`.weight_pushes`, trajectory continuity
and ``max_policy_lag``'s drops in :mod:`.continuity`, its admission of requests in
:mod:`.admission`, its batch plane once laid out in
:mod:`.batch_slots`; each part is given the parts and options it uses, never the front; TorchRL's
views of the workers in :mod:`.worker_views` over :mod:`.torchrl_views`, and TorchRL's legacy
``weight_updater`` with its worker pipes in :mod:`.legacy_updater`), the plan it runs with
(:mod:`.plan`: its option groups and what was resolved from them), its state (:mod:`.saved_state`),
how it writes into a replay buffer (:mod:`.buffer_writes`), its one wait (:mod:`.waits`), the
roster of its workers and their restarts (:mod:`.roster`), what it does when a worker fails or
joins (:mod:`.recovery`; a node's own local restarts in :mod:`.node_restarts`), and what it owns
outside itself (:mod:`.lifetime`, :mod:`.threads`), and ``metrics()`` (:mod:`.front_metrics`).
A batched-inference collector's trainer side is here too: its inference loop
(:mod:`.inference_loop`), how long it waits for envs about to answer (:mod:`.patience`), the
envs it holds for ``max_policy_lag`` (:mod:`.batched_admission`), batch
assembly (:mod:`.transitions`), and its ``metrics()`` and trace window (:mod:`.batched_observing`).
A trace window of a few rounds: :mod:`.trace_window` (the trainer's spans kept by its clock, the
:class:`~rpc_collectors.single_process.run_meter.RunMeter`; the
workers' clock offsets in :mod:`.clock_offsets`, the Chrome trace file in :mod:`.timeline`).

Runs in the trainer's process: it never imports the worker side (:mod:`~rpc_collectors.worker`) or
:mod:`~rpc_collectors.cluster` (a contract in setup.cfg; the public layer builds what crosses to the
workers, :mod:`rpc_collectors.collectors.construction`), and never a pool: the front drives
any pool through the surface of :class:`~rpc_collectors.pools.pool.WorkerPool`, which is handed to
it.
"""
