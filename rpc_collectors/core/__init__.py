"""What every layer uses: the errors a collector raises (:mod:`.errors`), a worker's traceback as
the user reads it (:mod:`.tracebacks`), the argument checks run before any process starts
(:mod:`.checks`; TorchRL's ``AsyncBatchedCollector`` arguments in :mod:`.batched_args`)
and warnings that point at the user's line (:mod:`.user_warnings`). Imports
nothing of the library.
"""
