"""The worker both watch loops share: the node agent's (``loop.py``) and delegate mode's
(``delegate.py``).

One thread runs :meth:`Worker.run`: it reads the desired state when a burst of file events has
settled, rescans every interval (the desired files' fingerprint as a safety net for events that
never come, then the loop's own change sources), reconciles when the scheduler says one is due,
and otherwise sleeps until the next thing is. Other threads only announce file events, ask it to
stop and read the probes. A loop says what a rescan looks at (:meth:`Worker._look_for_drift`)
and what a reconcile is (:meth:`Worker._reconcile`).
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable
from typing import Any

from reconciler.model.record import field, record
from reconciler.watch.changes import DesiredChange, DesiredFiles
from reconciler.watch.endpoint import Verdict
from reconciler.watch.health import Health
from reconciler.watch.metrics import WatchMetrics
from reconciler.watch.scheduler import Scheduler, Trigger
from reconciler.watch.timing import Backoff

log = logging.getLogger("vgpuctl.watch")


@record(frozen=True, slots=True)
class WatchSettings:
    rescan_interval: float = 10.0
    debounce: float = 0.2
    adopt: bool = False
    #: Run the removals that only make room for creates that must wait (``--partial``).
    partial: bool = False
    verify_timeout: float = 120.0
    backoff: Backoff = field(default_factory=Backoff)
    #: After a permanent failure, the longest wait before trying again with no input changed.
    resync_interval: float = 300.0
    #: The longest one action may take (sriov-manage's timeout plus its verification): while
    #: a reconcile runs, /healthz tolerates that long without a sign of life.
    action_budget: float = 480.0

    def __post_init__(self) -> None:
        if not self.rescan_interval > 0:
            raise ValueError(f"the rescan interval must be positive: {self.rescan_interval}")
        if self.debounce < 0:
            raise ValueError(f"the debounce must not be negative: {self.debounce}")
        if not self.resync_interval > 0:
            raise ValueError(f"the resync interval must be positive: {self.resync_interval}")

    @property
    def stale_after(self) -> float:
        """Longest silence of an idle loop that /healthz still calls alive."""
        return max(3 * self.rescan_interval, 30.0)


class Worker(abc.ABC):
    """The loop's schedule; subclasses give what a rescan looks at and what a reconcile does."""

    settings: WatchSettings
    scheduler: Scheduler
    desired: DesiredFiles[Any]
    probes: Health
    metrics: WatchMetrics
    _clock: Callable[[], float]  # monotonic

    def _schedule(
        self, settings: WatchSettings, *, clock: Callable[[], float], rng: Callable[[], float]
    ) -> None:
        """Set the settings, the clock and the scheduler they make (first, in ``__init__``)."""
        self.settings = settings
        self._clock = clock
        self.scheduler = Scheduler(
            rescan_interval=settings.rescan_interval,
            debounce=settings.debounce,
            backoff=settings.backoff,
            resync_interval=settings.resync_interval,
            clock=clock,
            rng=rng,
        )

    def _health(self) -> Health:
        """The probes of :attr:`desired` (once it is set)."""
        return Health(
            desired=self.desired,
            stale_after=self.settings.stale_after,
            action_budget=self.settings.action_budget,
            clock=self._clock,
        )

    # -- from other threads --------------------------------------------------------------------

    def desired_changed(self) -> None:
        """A file event where the desired state lives (any thread)."""
        self.scheduler.desired_changed()

    def stop(self) -> None:
        """Finish the reconcile under way, if any, then make :meth:`run` return (any thread)."""
        self.scheduler.stop()

    @property
    def stopping(self) -> bool:
        return self.scheduler.stopping

    def health(self) -> Verdict:
        """Alive while the worker keeps ticking (or works through a reconcile's actions)."""
        return self.probes.alive()

    def readiness(self) -> Verdict:
        """Ready once a reconcile settled (converged, or only changes a VM blocks)."""
        return self.probes.readiness()

    # -- the worker ----------------------------------------------------------------------------

    def run(self) -> None:
        """Reconcile at start, then on every change, until :meth:`stop`."""
        with self.probes.running():
            self._run()

    @abc.abstractmethod
    def _started(self) -> None:
        """Log what is watched (the first line of :meth:`run`)."""

    def _stopped(self) -> None:
        log.info("stopping: no reconcile is running")

    def _run(self) -> None:
        self._started()
        self.desired.watch_again()
        self._guarded(self._check_desired)
        self.scheduler.rescanned()
        while not self.scheduler.stopping:
            self.probes.beat()
            if self.scheduler.desired_due():
                self.desired.watch_again()
                self._guarded(self._check_desired)
            if self.scheduler.rescan_due():
                self._guarded(self._rescan)
                # Counted from the end: a slow rescan never makes them pile up.
                self.scheduler.rescanned()
            if self.scheduler.reconcile_due():
                self._reconcile()
                continue  # look again at what fell due meanwhile, before sleeping
            self.scheduler.wait()
        self._stopped()

    def _guarded(self, step: Callable[[], None]) -> None:
        """Run a step of the loop; a bug in it is logged and counted, never the loop's end."""
        try:
            step()
        except Exception:
            self.metrics.errors.labels(kind="internal").inc()
            log.exception("internal error in the watch loop (it goes on)")

    def _check_desired(self) -> None:
        change = self.desired.check()
        if change is DesiredChange.UNSETTLED:
            self.scheduler.read_desired_soon()
        elif change is DesiredChange.FIRST:
            self.scheduler.want(Trigger.START)
        elif change is DesiredChange.CHANGED:
            self.scheduler.want(Trigger.DESIRED)

    def _rescan(self) -> None:
        started = self._clock()
        # Busy: a cluster that does not answer holds a rescan up to its request timeouts.
        self.probes.busy_since = started
        try:
            self.desired.watch_again()
            if not self.scheduler.desired_pending and self.desired.changed_unread():
                # No file event came (a filesystem without inotify, a watch that could not be
                # set): read it after the same quiet period as if one had.
                log.info("the desired state changed without a file event (noticed by the rescan)")
                self.scheduler.read_desired_soon()
            if self.desired.current is not None and self.scheduler.looks_for_drift:
                self._look_for_drift()
        finally:
            self.probes.busy_since = None
            self.metrics.rescan_duration.observe(self._clock() - started)

    @abc.abstractmethod
    def _look_for_drift(self) -> None:
        """Ask for a reconcile where an input changed (the loop's own change sources)."""

    @abc.abstractmethod
    def _reconcile(self) -> None:
        """One reconcile, the scheduler's triggers taken."""
