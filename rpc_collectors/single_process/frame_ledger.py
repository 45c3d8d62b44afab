"""Where every frame a collector's envs stepped went: its :class:`Ledger`.

Invariant, owned here: ``stepped = delivered + dropped + lost + pending``
(:class:`~rpc_collectors.core.metrics.FrameAccount`), at any moment and after ``shutdown()``:

* ``stepped``: what the rollouts counted (:mod:`.step_count`): of the processes that ended, of
  those serving now, and of the run this one resumed;
* ``delivered``: the frames handed out; ``dropped``: frames taken in and not handed out
  (a multi-worker collector's :mod:`~rpc_collectors.trainer.continuity`);
* ``lost``: frames a process stepped that none of its answers brought in: the unfinished batch of
  a worker that died (and its answers not taken in yet), and what a stopped run had pending when
  it saved the state this run resumed from;
* ``pending``: the rest: stepped by a serving worker and not in an answer yet, or taken in and not
  handed out yet (a batch held for its weights, an answer of a round in progress); after
  ``shutdown()``, what was pending then, never to be handed out.

A process whose steps the trainer cannot read once it is gone (a rank, a Ray actor) counts as
having stepped what its answers brought in: the steps of its unfinished batch are in neither
``stepped`` nor ``lost``.
"""
from __future__ import annotations

from rpc_collectors.core.metrics import FrameAccount


class Ledger:
    """The frames of a collector's ``num_workers`` worker ids, across their processes."""

    def __init__(self, num_workers: int = 1) -> None:
        # frames taken in from each worker id's answers, all its processes
        self.taken = [0] * num_workers
        # taken[i] when the process serving i now started
        self._since = [0] * num_workers
        # stepped by processes that ended (each worker id's, and all of them with the run this one
        # resumed)
        self.ended_by = [0] * num_workers
        self.ended = 0
        self.lost = 0

    def took(self, worker_id: int, frames: int) -> None:
        """An answer of ``worker_id``'s process brought ``frames`` in."""
        self.taken[worker_id] += frames

    def in_answers(self, worker_id: int) -> int:
        """Frames the process serving ``worker_id`` now brought in."""
        return self.taken[worker_id] - self._since[worker_id]

    def process_ended(self, worker_id: int, stepped: int | None) -> None:
        """The process that served ``worker_id`` is gone (replaced, or it left), having stepped
        ``stepped`` frames (None: not known; counted as what it brought in); none of its answers
        is taken in from here on."""
        brought = self.in_answers(worker_id)
        stepped = brought if stepped is None else stepped
        self.ended += stepped
        self.ended_by[worker_id] += stepped
        self.lost += stepped - brought
        self._since[worker_id] = self.taken[worker_id]

    def unmatched_end(self, stepped: int) -> None:
        """A process whose answers are not told apart from the others' (an env worker of a batched
        collector) ended, having stepped ``stepped`` frames: those no batch holds stay pending."""
        self.ended += stepped

    def account(self, serving: int, delivered: int, dropped: int) -> FrameAccount:
        """The account, with ``serving`` frames stepped by the processes serving now."""
        stepped = self.ended + serving
        return FrameAccount(stepped, delivered, dropped, self.lost,
                            stepped - delivered - dropped - self.lost)

    @staticmethod
    def state(account: FrameAccount) -> dict:
        """What a resumed run continues from: the ``account`` at the save."""
        return {"stepped": account.stepped, "lost": account.lost, "pending": account.pending}

    def load(self, state: dict, forgotten: int) -> None:
        """Continue from a saved collector ``state`` (its frames, drops and :meth:`state`), which
        replaces the ``forgotten`` frames this run delivered and dropped so far; the saved run's
        pending frames are lost to its stop."""
        saved = state.get("accounts")
        if saved is None:
            # a state saved before accounts were kept: nothing pending, nothing lost
            dropped = state.get("dropped") or {"frames": 0}
            saved = {"stepped": int(state["frames"]) + int(dropped["frames"]), "lost": 0,
                     "pending": 0}
        self.ended += int(saved["stepped"]) - forgotten
        self.lost += int(saved["lost"]) + int(saved["pending"])
