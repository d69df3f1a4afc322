"""When the watch loop acts: debouncing bursts of file events, and backing off after errors.

Pure: both take the time as an argument (a monotonic clock reading), so the loop's pacing is
tested without sleeping.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from reconciler.model.record import record


@record(frozen=True, slots=True)
class Backoff:
    """Delays before retrying a failed reconcile: exponential, capped, jittered.

    The ceiling for the ``n``-th failure in a row is ``initial * factor**(n-1)``, at most
    ``cap``. The delay is drawn between ``(1 - jitter)`` and 1 times the ceiling, so nodes that
    failed together (an API server outage) do not all retry in the same second, and no retry
    comes sooner than half the ceiling with the default jitter.
    """

    initial: float = 1.0
    cap: float = 60.0
    factor: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.cap < self.initial or self.factor < 1:
            raise ValueError(f"backoff needs 0 < initial <= cap and factor >= 1: {self}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"backoff jitter must be within [0, 1]: {self.jitter}")

    def ceiling(self, failures: int) -> float:
        """The longest delay after ``failures`` failures in a row (``failures`` >= 1)."""
        exponent = max(failures - 1, 0)
        # Compare exponents, not values: factor**exponent overflows long before it matters.
        if self.factor > 1 and exponent * math.log(self.factor) >= math.log(
            self.cap / self.initial
        ):
            return self.cap
        return float(min(self.cap, self.initial * self.factor**exponent))

    def delay(self, failures: int, *, rng: Callable[[], float] = random.random) -> float:
        """The delay before the next try; ``rng`` returns a float in [0, 1)."""
        ceiling = self.ceiling(failures)
        return ceiling * (1 - self.jitter) + ceiling * self.jitter * rng()


class Debounce:
    """Turns a burst of events into one action: due ``quiet`` seconds after the last event,
    and never later than ``max_wait`` seconds after the first one, so a file rewritten without
    pause still gets read.

    Editors and git-sync produce several events per change (write a temporary file, rename it,
    touch the directory); reading after the first would often see half of the change.
    """

    __slots__ = ("_first", "_last", "max_wait", "quiet")

    def __init__(self, quiet: float, *, max_wait: float | None = None) -> None:
        if quiet < 0:
            raise ValueError(f"debounce must not be negative: {quiet}")
        self.quiet = quiet
        self.max_wait = max(quiet, max_wait if max_wait is not None else 10 * quiet)
        self._first: float | None = None
        self._last: float | None = None

    def poke(self, now: float) -> None:
        """An event arrived at ``now``."""
        if self._first is None:
            self._first = now
        self._last = now

    @property
    def pending(self) -> bool:
        return self._first is not None

    @property
    def deadline(self) -> float | None:
        """When the burst is due (None: no event pending)."""
        if self._first is None or self._last is None:
            return None
        return min(self._last + self.quiet, self._first + self.max_wait)

    def take(self, now: float) -> bool:
        """True once the pending burst is due (and forget it); False while it is not."""
        deadline = self.deadline
        if deadline is None or now < deadline:
            return False
        self._first = self._last = None
        return True
