"""Single-process collection: environments (:mod:`.envs`, the gymnasium spaces they accept in
:mod:`.gym_spaces`), policies (:mod:`.policies`), stepping one env for a batch (:mod:`.rollout`,
timed by :mod:`.phase_clock`, its steps stacked by :mod:`.step_stacking`), trajectory ids and
splitting (:mod:`.trajectories`, :mod:`.whole_trajectories`), the ``stats()`` progress counters
(:mod:`.trajectory_progress`), private keys (:mod:`.private_keys`), TorchRL's batch edits and
``preemptive_threshold`` (:mod:`.batch_edits`, :mod:`.preemption`), a GymEnv rollout's recorded
steps (:mod:`.step_records`), the frames its envs stepped (:mod:`.step_count`) and where each
went (:mod:`.frame_ledger`), what a collector knows of each batch it hands out
(:mod:`.batch_record`), what ``metrics()`` measures as batches are handed out, what it answers
and where it writes them (:mod:`.run_meter`, :mod:`.collector_metrics`, :mod:`.metric_exports`,
and what its Prometheus targets expose, :mod:`.prometheus_exposition`), ``enable_profile``
(:mod:`.profiling`), TorchRL's ``get_distant_attr``/``map_fn`` (:mod:`.remote_calls`), what every
collector shares (:mod:`.base_collector`, its background thread in :mod:`.background`) and the
single-process ``Collector`` (:mod:`.collector`, set up from its options by
:mod:`.collector_setup`, with its dispatch hook :mod:`.dispatching` and what TorchRL shows of it
beyond collecting, :mod:`.collector_views`).

May import :mod:`~rpc_collectors.transport` and :mod:`~rpc_collectors.core`.
"""
