"""The watch loop: keep one node converged on its desired state, one reconcile at a time.

:class:`WatchLoop` is a composition, mostly wiring; each part has its own module:

- ``scheduler.py`` decides *when*: file events debounced, the periodic rescan, the reconcile's
  triggers, the retry after a failure (exponential backoff for a transient error; for a
  permanent one, the next change of an input or a long resync: the policy is in its
  docstring), and stopping;
- ``changes.py`` holds the change sources: the desired-state files (the last valid state
  stays in force while they are invalid), the host's and the cluster's fingerprints against
  their baselines;
- ``reconcile.py`` runs one reconcile (the engine, as for ``vgpuctl apply``) and reports it:
  the plan and each outcome logged, the metrics of a run, success or failure told to the
  scheduler, the probes and the drift baselines;
- ``advertising.py`` tells the embedded device plugins what the host offers between
  reconciles (the engine tells them during one);
- ``health.py`` answers ``/healthz`` and ``/readyz``; ``metrics.py`` holds the counters.

A single worker runs :meth:`WatchLoop.run`: it asks the scheduler what is due, does it, and
sleeps until the next thing is. Other threads only announce file events and ask it to stop.

What starts a reconcile, and what it costs when nothing changed:

- desired state: a file event (debounced) or, as a safety net for events that never come, a
  changed content fingerprint at a rescan. An invalid desired state is reported (log with
  ``file:line:col``, ``vgpuctl_desired_state_valid`` 0, an Event when a cluster is configured)
  and the last valid one stays in force;
- host drift: at each rescan, the host signature (``signature.py``: a few reads) against the one
  taken just before the last reconcile's final observation; only a difference costs a full
  observation. A change is told to the device plugins at once (what vanished is advertised
  Unhealthy before a reconcile that may take a while);
- cluster drift: likewise the resourceVersions of our objects (three list calls);
- blocked changes (a VM holds a vGPU that should go): every rescan plans again, since the hold
  may have ended in ways no signature sees (a VMI stopped);
- failures: a transient one is retried with exponential backoff and jitter, and meanwhile
  drift is not looked for (the retry looks at everything); a permanent one is tried again when
  the desired state, the host or the cluster changes, or after ``resync_interval``.

Stopping (:meth:`WatchLoop.stop`) never interrupts a reconcile: the engine runs to its end
or its own failure, the node lock is released, then :meth:`run` returns.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from reconciler.catalog import Catalog
from reconciler.engine import DevicePlugins, NodePorts, RunSettings
from reconciler.watch.advertising import Advertising
from reconciler.watch.changes import ClusterDrift, DesiredChange, DesiredFiles, HostDrift
from reconciler.watch.endpoint import Verdict
from reconciler.watch.health import Health
from reconciler.watch.metrics import WatchMetrics
from reconciler.watch.reconcile import ReconcileRunner
from reconciler.watch.scheduler import Scheduler, Trigger
from reconciler.watch.source import DesiredSource
from reconciler.watch.timing import Backoff

log = logging.getLogger("vgpuctl.watch")


@dataclass(frozen=True, slots=True)
class WatchSettings:
    rescan_interval: float = 10.0
    debounce: float = 0.2
    adopt: bool = False
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


class WatchLoop:
    """Runs reconciles for one node until stopped. See the module docstring."""

    def __init__(
        self,
        *,
        source: DesiredSource,
        node: str,
        catalog: Catalog,
        ports: Callable[[], NodePorts],
        host_signature: Callable[[], str],
        cluster_signature: Callable[[], str] | None = None,
        plugins: DevicePlugins | None = None,
        metrics: WatchMetrics | None = None,
        settings: WatchSettings | None = None,
        refresh_watches: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.source = source
        self.node = node
        self.catalog = catalog
        self.metrics = metrics or WatchMetrics()
        self.settings = settings or WatchSettings()
        self._clock = clock

        self.scheduler = Scheduler(
            rescan_interval=self.settings.rescan_interval,
            debounce=self.settings.debounce,
            backoff=self.settings.backoff,
            resync_interval=self.settings.resync_interval,
            clock=clock,
            rng=rng,
        )
        self.desired = DesiredFiles.for_node(
            source,
            node=node,
            catalog=catalog,
            metrics=self.metrics,
            events=lambda: ports().events,
            refresh_watches=refresh_watches,
        )
        self.host = HostDrift(host_signature, metrics=self.metrics)
        self.cluster = ClusterDrift(cluster_signature, metrics=self.metrics)
        self.probes = Health(
            desired=self.desired,
            stale_after=self.settings.stale_after,
            action_budget=self.settings.action_budget,
            clock=clock,
        )
        self.advertising = Advertising(plugins, ports=ports, metrics=self.metrics)
        self.reconciles = ReconcileRunner(
            ports=ports,
            settings=RunSettings(
                adopt=self.settings.adopt,
                verify_timeout=self.settings.verify_timeout,
                command="vgpuctl watch",
            ),
            scheduler=self.scheduler,
            host=self.host,
            cluster=self.cluster,
            probes=self.probes,
            advertising=self.advertising,
            metrics=self.metrics,
            clock=clock,
            wall_clock=wall_clock,
        )

    # -- inputs from other threads -----------------------------------------------------------

    def desired_changed(self) -> None:
        """A file event where the desired state lives (any thread)."""
        self.scheduler.desired_changed()

    def stop(self) -> None:
        """Finish the reconcile under way, if any, then make :meth:`run` return (any thread)."""
        self.scheduler.stop()

    @property
    def stopping(self) -> bool:
        return self.scheduler.stopping

    # -- probes (any thread) -----------------------------------------------------------------

    def health(self) -> Verdict:
        """Alive while the worker keeps ticking (or works through a reconcile's actions)."""
        return self.probes.alive()

    def readiness(self) -> Verdict:
        """Ready once a reconcile settled the node (converged, or only changes a VM blocks)."""
        return self.probes.readiness()

    # -- the worker --------------------------------------------------------------------------

    def run(self) -> None:
        """Reconcile at start, then on every change, until :meth:`stop`."""
        with self.probes.running():
            self._run()

    def _run(self) -> None:
        log.info(
            "watching %s for node %s",
            self.source.path,
            self.node,
            extra={
                "rescan_interval": self.settings.rescan_interval,
                "debounce": self.settings.debounce,
            },
        )
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
        log.info("stopping: no reconcile is running; the node lock is free")

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

    # -- rescans -----------------------------------------------------------------------------

    def _rescan(self) -> None:
        started = self._clock()
        # Busy: a cluster that does not answer holds a rescan up to its request timeouts.
        self.probes.busy_since = started
        try:
            self._rescan_now()
        finally:
            self.probes.busy_since = None
            self.metrics.rescan_duration.observe(self._clock() - started)

    def _rescan_now(self) -> None:
        self.desired.watch_again()
        if not self.scheduler.desired_pending and self.desired.changed_unread():
            # No file event came (a filesystem without inotify, a watch that could not be
            # set): read it after the same quiet period as if one had.
            log.info("the desired state changed without a file event (noticed by the rescan)")
            self.scheduler.read_desired_soon()
        if self.desired.current is not None and self.scheduler.looks_for_drift:
            self._look_for_drift()

    def _look_for_drift(self) -> None:
        if self.host.drifted():
            self.scheduler.want(Trigger.HOST)
            self.advertising.host_changed()
        if self.cluster.drifted():
            self.scheduler.want(Trigger.CLUSTER)
        if self.probes.blocked and not self.scheduler.failing:
            self.scheduler.want(Trigger.BLOCKED)

    # -- one reconcile -----------------------------------------------------------------------

    def _reconcile(self) -> None:
        desired = self.desired.current
        triggers = self.scheduler.take()
        if desired is not None:
            self.reconciles.run(desired, triggers)
