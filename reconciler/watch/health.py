"""What ``/healthz`` and ``/readyz`` say about the watch loop, from what its worker publishes.

The worker writes (:meth:`Health.beat`, :attr:`Health.busy_since`, :meth:`Health.settled`,
:meth:`Health.failed`); the HTTP thread reads (:meth:`Health.alive`, :meth:`Health.readiness`).
Each is a plain attribute write or read, atomic in Python: a probe never waits for a reconcile.

- alive: the worker is running and showed a sign of life (a tick of its loop, an action's
  outcome) within ``stale_after`` seconds, or within ``action_budget`` while it is busy (one
  action may legitimately take that long);
- ready: a reconcile settled the node once (converged, or only changes a VM blocks remain);
  failing afterwards leaves it ready, with the failure as its reason; so does waiting for a
  rollout slot (``waiting for a rollout slot (2 of 2 held by: node-a, node-b)``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from reconciler.watch.endpoint import Verdict


class DesiredStatus(Protocol):
    """The desired state as readiness reports it (``changes.DesiredFiles``)."""

    @property
    def current(self) -> object | None: ...

    @property
    def invalid(self) -> tuple[str, ...]: ...


class Health:
    """The loop's liveness and readiness. See the module docstring."""

    def __init__(
        self,
        *,
        desired: DesiredStatus,
        stale_after: float,
        action_budget: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._desired = desired
        self._stale_after = stale_after
        self._action_budget = action_budget
        self._clock = clock
        self._running = False
        self._heartbeat = clock()
        #: When the work under way started (a reconcile, a rescan); None while idle.
        self.busy_since: float | None = None
        self._ready = False
        self._converged = False
        self._last_error: str | None = None
        #: The changes the last successful reconcile found blocked, one line each.
        self.blocked: tuple[str, ...] = ()
        #: Why the last reconcile did not act: no rollout slot was free (None: it was not so).
        self.waiting: str | None = None

    # -- written by the worker -----------------------------------------------------------------

    @contextmanager
    def running(self) -> Iterator[None]:
        """The worker runs for the duration of the block."""
        self._running = True
        try:
            yield
        finally:
            self._running = False

    def beat(self) -> None:
        """A sign of life."""
        self._heartbeat = self._clock()

    def settled(self, blocked: tuple[str, ...], *, converged: bool) -> bool:
        """A reconcile ended without failing, leaving ``blocked`` changes. Returns whether that
        says something new (another blocked set, the end of a failure, the first settling)."""
        news = blocked != self.blocked or self._last_error is not None or not self._ready
        self._last_error = None
        self.waiting = None
        self.blocked = blocked
        self._converged = converged
        self._ready = True
        return news

    def failed(self, message: str) -> None:
        """A reconcile failed with ``message``."""
        self._last_error = message
        self._converged = False
        self.waiting = None

    def wait_for_slot(self, message: str) -> None:
        """A reconcile found changes to make and no free rollout slot: nothing was done, and
        it is tried again soon (``message`` says who holds the slots)."""
        self.waiting = message
        self._converged = False

    # -- read by the probes (any thread) -------------------------------------------------------

    def alive(self) -> Verdict:
        """Alive while the worker keeps ticking (or works through a reconcile's actions)."""
        if not self._running:
            return Verdict(False, "the watch loop is not running")
        silent = self._clock() - self._heartbeat
        limit = self._stale_after
        if self.busy_since is not None:
            limit = max(limit, self._action_budget)
        if silent > limit:
            return Verdict(
                False, f"stalled: no sign of life for {silent:.0f} s (limit {limit:.0f} s)"
            )
        return Verdict(True, f"alive: last sign of life {silent:.1f} s ago")

    def readiness(self) -> Verdict:
        """Ready once a reconcile settled the node (converged, or only changes a VM blocks)."""
        if self._ready:
            return Verdict(True, f"ready: {self._state()}")
        if self.waiting is not None:
            return Verdict(False, f"not converged yet: {self.waiting}")
        if self._desired.current is None:
            if self._desired.invalid:
                return Verdict(False, f"no valid desired state yet: {self._desired.invalid[0]}")
            return Verdict(False, "no desired state read yet")
        if self._last_error is not None:
            return Verdict(False, f"not converged yet: {self._last_error}")
        return Verdict(False, "waiting for the first reconcile")

    def _state(self) -> str:
        if self.waiting is not None:
            return self.waiting
        if self._last_error is not None:
            return f"the last reconcile failed: {self._last_error}"
        if self.blocked:
            n = len(self.blocked)
            return f"{n} change{'s' * (n != 1)} blocked: {self.blocked[0]}"
        if self._desired.invalid:
            return (
                "converged on the last valid desired state; now invalid: "
                f"{self._desired.invalid[0]}"
            )
        return "converged" if self._converged else "reconciling"
