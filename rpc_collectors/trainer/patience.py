"""How long the inference loop waits, before a forward pass, for envs in flight that are about to
answer.

A forward pass costs a part that does not grow with its envs (each weight read once, the call's
own work) and a part per env, so one pass over the envs of two costs less than the two passes. The
loop keeps, per env, a moving average of the time from its action going out to its answer, and
one of a forward pass's time. Once some envs are ready, it waits for the envs in flight whose
answers are due within a quarter of a forward pass, for at most that long: envs that step fast
join the pass (a no-work env answers within a fraction of a pass), envs that step slowly are not
waited for, and a wait in vain costs at most a quarter of a pass. Until an env has answered once,
and until a pass has run, nothing is waited for.
"""
from __future__ import annotations

import math

# of a forward pass: the longest wait for envs about to answer
SHARE = 0.25
# of the newest time in each moving average
WEIGHT = 0.1


class Patience:
    """The times of ``num_envs`` envs' answers and of the forward passes (``time.monotonic()``
    seconds).

    ``sent[e]``: when env ``e``'s action went out; ``answer[e]``: its mean time from its action
    to its answer (inf: none yet); ``forward``: a forward pass's mean time (0: none yet).
    """

    def __init__(self, num_envs: int) -> None:
        self.sent = [0.0] * num_envs
        self.answer = [math.inf] * num_envs
        self.forward = 0.0

    def went(self, envs: list[int], now: float) -> None:
        """The actions of ``envs`` went out at ``now``."""
        for env in envs:
            self.sent[env] = now

    def answered(self, envs: list[int], now: float) -> None:
        """``envs``, whose actions went out, answered at ``now``."""
        for env in envs:
            took, mean = now - self.sent[env], self.answer[env]
            self.answer[env] = took if mean == math.inf else mean + WEIGHT * (took - mean)

    def passed(self, seconds: float) -> None:
        """A forward pass took ``seconds``."""
        forward = self.forward
        self.forward = seconds if not forward else forward + WEIGHT * (seconds - forward)

    def deadline(self, now: float) -> float:
        """Until when a forward pass about to run at ``now`` may wait for envs about to answer."""
        return now + SHARE * self.forward

    def due(self, acting: list[bool], deadline: float) -> bool:
        """Whether an env in flight (``acting[env]``) is due to answer by ``deadline``."""
        sent, answer = self.sent, self.answer
        return any(flying and sent[env] + answer[env] <= deadline
                   for env, flying in enumerate(acting))
