"""``max_policy_lag`` by admission (``policy_lag_mode="admit"``): no batch is collected that could
not be handed out within the bound, so none is dropped for its lag.

A batch's lag is the number of weight versions the trainer pushed between the weights that chose
its oldest step and its hand-out. The trainer pushes at most once per batch it takes (its loop:
take a batch, train, ``update_policy_weights_``), so a batch in flight (asked, not handed out) can
see at most one push per batch handed out before it. :class:`Admission` holds every batch in
flight with the oldest weights version it may be collected with (``w``: the version last sent to
its worker when asked; the batch's own once it came) and keeps one invariant, for ``V`` the
trainer's version and the batches in flight sorted by ``w`` (oldest first, then as asked):

    for every k >= 1:  (V - w_k) + (k - 1) <= max_policy_lag

that is, even if every batch before it were handed out first, each followed by a push, the k-th
would still be within the bound. Its one owner keeps it in two places:

* a request is asked only if the invariant holds with it (:meth:`admits`); otherwise it waits
  until a hand-out makes room, so the workers that are ahead are paced, not discarded;
* a batch that came is handed out only if the invariant holds for the others after one more
  push (:meth:`may_hand_out`), and after every earlier batch of its worker (a worker's stream
  stays in order); otherwise it is held (copied out of its slot) until it may. The oldest batch in
  flight may always be handed out, so the trainer waits at most for it.

A push that is not the one following a hand-out (a second push between two batches) breaks the
invariant's premise; a batch beyond the bound then is still dropped (:mod:`.continuity`), and
counted, as in ``policy_lag_mode="drop"``.
"""
from __future__ import annotations

import dataclasses
import itertools

from tensordict import TensorDictBase


@dataclasses.dataclass
class InFlight:
    """A batch asked of ``worker_id`` (``seq``: the order it was asked in), collected with weights
    of version ``w`` or newer; ``batch``: its copy once it came and was held."""

    worker_id: int
    w: int
    seq: int
    came: bool = False
    batch: TensorDictBase | None = None


class Admission:
    """The batches in flight of one async collector front, within ``bound`` versions."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.flight: list[InFlight] = []
        self._seq = itertools.count()

    def _fits(self, entries: list[InFlight], version: int) -> bool:
        ordered = sorted(entries, key=lambda e: (e.w, e.seq))
        return all(version - e.w + k <= self.bound for k, e in enumerate(ordered))

    def admits(self, w: int, version: int) -> bool:
        """Whether a batch collected with weights ``w`` may be asked at trainer version
        ``version``."""
        return self._fits([*self.flight, InFlight(-1, w, next(self._seq))], version)

    def asked(self, worker_id: int, w: int) -> None:
        self.flight.append(InFlight(worker_id, w, next(self._seq)))

    def came(self, worker_id: int, w: int | None) -> InFlight:
        """The oldest unanswered batch of ``worker_id`` came, collected with ``w`` (None: its
        batch names no version)."""
        entry = next(e for e in self.flight if e.worker_id == worker_id and not e.came)
        entry.came = True
        if w is not None:
            entry.w = max(entry.w, w)
        return entry

    def may_hand_out(self, entry: InFlight, version: int) -> bool:
        """Whether ``entry`` may be handed out now: no earlier batch of its worker is held, and the
        others stay within the bound after one more push."""
        earlier = any(e.worker_id == entry.worker_id and e.seq < entry.seq for e in self.flight)
        return not earlier and self._fits([e for e in self.flight if e is not entry], version + 1)

    def hold(self, entry: InFlight, batch: TensorDictBase) -> None:
        """Keep a copy of ``entry``'s batch (its slot is the worker's again) until it may go."""
        entry.batch = batch.clone()

    def next_held(self, version: int) -> InFlight | None:
        """The oldest held batch that may be handed out now, if any."""
        held = sorted((e for e in self.flight if e.batch is not None), key=lambda e: (e.w, e.seq))
        return next((e for e in held if self.may_hand_out(e, version)), None)

    def gone(self, entry: InFlight) -> None:
        """``entry`` was handed out or dropped."""
        self.flight.remove(entry)

    def forget(self, worker_id: int) -> None:
        """The unanswered requests of ``worker_id`` are gone (it failed, and its replacement is
        asked again; or it left)."""
        self.flight = [e for e in self.flight if e.worker_id != worker_id or e.came]

