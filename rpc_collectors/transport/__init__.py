"""The planes that move things between the trainer and its workers, knowing nothing of collectors:
batches (:mod:`.data`, its slots and their hand-out; a worker joining its slots in
:mod:`.slot_joins`; :mod:`.doorbell`, across hosts :mod:`.socket_doorbell`; :mod:`.layouts`,
over :mod:`.shm`), weights (:mod:`.weights`, :mod:`.weight_sync`, over :mod:`.weight_channels`;
a call of ``update_policy_weights_`` checked whole in :mod:`.weight_updates`; the weights of
policies the workers build in :mod:`.factory_weights`), a node's local restarts on their way to
the trainer (:mod:`.local_restarts`), each env's step for batched inference (:mod:`.step_plane`),
the control plane's meeting point and membership (:mod:`.rendezvous`, :mod:`.membership`), and Unix
sockets that admit only the job's own processes (:mod:`.local_socket`).

May import :mod:`~rpc_collectors.core` only.
"""
