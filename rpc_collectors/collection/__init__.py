"""Single-process collection: environments (:mod:`.envs`), policies (:mod:`.policies`), stepping
one env for a batch (:mod:`.rollout`), trajectory ids and splitting (:mod:`.trajectories`,
:mod:`.whole_trajectories`), the ``stats()`` progress counters (:mod:`.trajectory_progress`), private
keys (:mod:`.private_keys`), TorchRL's batch edits and ``preemptive_threshold`` (:mod:`.batch_edits`,
:mod:`.preemption`), what every collector shares (:mod:`.base`) and the single-process
``Collector`` (:mod:`.collector`, with its dispatch hook :mod:`.dispatching`).

May import :mod:`~rpc_collectors.planes` and :mod:`~rpc_collectors.core`.
"""
