"""Evaluations a collector worker runs beside its own collection (an ``Evaluator`` with
``backend="worker"``), each in the thread of the call that asks for it, on the worker's cores.

Each call brings the evaluation's recipe (pickled: what builds its env, its policy and the
single-process collector that runs it,
:class:`~rpc_collectors.collectors.evaluation_runs.RunRecipe`) and the weights to load. The
worker builds the run once and keeps it while the same recipe comes; evaluations run one at a
time. When the process closes, the evaluation in progress ends at its next step and no other
starts.
"""
from __future__ import annotations

import threading
from typing import Any

from tensordict import TensorDictBase

from rpc_collectors.core import pickling

CLOSING = "the worker is closing: no evaluation runs in it"


class Evaluations:
    """The evaluation run a worker keeps (built by the first call of its recipe)."""

    def __init__(self) -> None:
        # one evaluation at a time
        self._serial = threading.Lock()
        # guards the state below (never held while an evaluation runs)
        self._lock = threading.Lock()
        self._recipe: bytes | None = None
        self._run: Any = None
        # the run of the evaluation in progress
        self._active: Any = None
        self._closing = False

    def run(self, recipe: bytes, weights: TensorDictBase | None,
            dump_step: int | None) -> tuple[TensorDictBase, float]:
        """Whole episodes with ``weights`` (None: those loaded), as ``recipe``'s run collects them,
        and the seconds they took; the env's recorders dumped at ``dump_step`` (None: not)."""
        with self._serial:
            with self._lock:
                run, replaced = (self._run, None) if recipe == self._recipe else (None, self._run)
                if replaced is not None:
                    self._run = self._recipe = None
            if replaced is not None:
                replaced.shutdown()
            if run is None:
                run = pickling.loads(recipe).open()
            with self._lock:
                closing = self._closing
                if not closing:
                    self._recipe, self._run, self._active = recipe, run, run
            if closing:
                run.shutdown()
                raise RuntimeError(CLOSING)
            try:
                return run.run(weights, dump_step)
            finally:
                with self._lock:
                    self._active, stopped = None, self._run is not run
                if stopped:
                    run.shutdown()

    def stop(self) -> None:
        """The evaluation in progress raises at its next step (its ``Evaluator`` shut down); the
        next call builds its run again."""
        with self._lock:
            run, self._run, self._recipe = self._run, None, None
            # in progress: it shuts its run down as it ends
            active = run is not None and self._active is run
        if run is not None:
            run.interrupt()
            if not active:
                run.shutdown()

    def interrupt(self) -> None:
        """The process is closing: the evaluation in progress raises, and no other starts."""
        with self._lock:
            self._closing = True
        self.stop()

    def close(self) -> None:
        self.interrupt()
