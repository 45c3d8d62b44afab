"""What every layer uses: the collectors' options, one table of groups (:mod:`.options`, each
option's own check in :mod:`.option_checks`), the errors a collector raises (:mod:`.errors`), a
worker's traceback as the user reads it (:mod:`.tracebacks`), the argument checks run before any
process starts (:mod:`.checks`; a multi-worker collector's own in :mod:`.worker_checks`; the
collector ranks one trainer may have over RPC, its open files among them, in
:mod:`.rank_limits`; TorchRL's ``AsyncBatchedCollector`` arguments in :mod:`.batched_args`;
TorchRL arguments whose meaning here is another setting, or none, in :mod:`.torchrl_args`),
warnings that point at the user's line (:mod:`.user_warnings`), the warning filters a worker runs
under (:mod:`.worker_warnings`) and the wait on a future that keeps nobody alive
(:mod:`.futures`), every message between the trainer and its workers (:mod:`.protocol`), user code
as bytes for another process (:mod:`.pickling`), and what ``collector.metrics()`` answers
(:mod:`.metrics`). Imports nothing of the library.
"""
