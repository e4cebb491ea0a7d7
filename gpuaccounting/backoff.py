"""The one backoff rule of every retry loop: capped exponential with full jitter, the wait after the n-th
failure in a row uniform in [0, min(cap, base * 2**n)], so clients that failed together spread out; a
success resets the run."""

from __future__ import annotations

import random
from collections.abc import Callable


class Backoff:
    """Counts the failures in a row and turns them into delays; not thread-safe (one per retry loop)."""

    def __init__(self, base: float, cap: float, rng: Callable[[], float] = random.random) -> None:
        """`rng` answers in [0, 1); tests pass a fixed one to read the bound."""
        if not 0 < base <= cap:
            raise ValueError(f"backoff needs 0 < base <= cap, got base={base} cap={cap}")
        self.base, self.cap = base, cap
        self._rng = rng
        self._bound = base

    def next_delay(self) -> float:
        """The wait before the next attempt, counting one more failure."""
        bound = self._bound
        # Doubling stops at the cap, so a long outage never overflows the float.
        self._bound = min(self.cap, bound * 2)
        return self._rng() * bound

    def reset(self) -> None:
        """An attempt succeeded: the next failure waits at most `base` again."""
        self._bound = self.base
