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
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from reconciler.catalog import Catalog
from reconciler.engine import DevicePlugins, NodePorts, RunSettings
from reconciler.watch.advertising import Advertising
from reconciler.watch.changes import ClusterDrift, DesiredFiles, HostDrift
from reconciler.watch.metrics import WatchMetrics
from reconciler.watch.reconcile import ReconcileRunner
from reconciler.watch.scheduler import Trigger
from reconciler.watch.source import DesiredSource
from reconciler.watch.worker import WatchSettings, Worker

if TYPE_CHECKING:
    from reconciler.apply.slots import NodeBudget

log = logging.getLogger("vgpuctl.watch")

__all__ = ["WatchLoop", "WatchSettings"]  # the settings are the worker's, shared by both loops


class WatchLoop(Worker):
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
        node_labels: Callable[[], Mapping[str, str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
        budget: NodeBudget | None = None,
    ) -> None:
        self.source = source
        self.node = node
        self.catalog = catalog
        self.metrics = metrics or WatchMetrics()
        self._schedule(settings or WatchSettings(), clock=clock, rng=rng)
        self.desired = DesiredFiles.for_node(
            source,
            node=node,
            catalog=catalog,
            metrics=self.metrics,
            events=lambda: ports().events,
            refresh_watches=refresh_watches,
            labels=node_labels,
            planned_for=lambda: self.reconciles.planned_for,
        )
        self.host = HostDrift(host_signature, metrics=self.metrics)
        self.cluster = ClusterDrift(cluster_signature, metrics=self.metrics)
        self.probes = self._health()
        self.advertising = Advertising(plugins, ports=ports, metrics=self.metrics)
        self.reconciles = ReconcileRunner(
            ports=ports,
            settings=RunSettings(
                adopt=self.settings.adopt,
                partial=self.settings.partial,
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
            budget=budget,
            rng=rng,
        )

    # -- the worker's hooks (worker.py) -----------------------------------------------------

    def _started(self) -> None:
        log.info(
            "watching %s for node %s",
            self.source.path,
            self.node,
            extra={
                "rescan_interval": self.settings.rescan_interval,
                "debounce": self.settings.debounce,
            },
        )

    def _stopped(self) -> None:
        log.info("stopping: no reconcile is running; the node lock is free")

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
