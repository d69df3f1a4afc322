"""The watch loop: keep one node converged on its desired state, one reconcile at a time.

:class:`WatchLoop` is a composition; each part has its own module:

- ``scheduler.py`` decides *when*: file events debounced, the periodic rescan, the reconcile's
  triggers, the retry after a failure (exponential backoff for a transient error; for a
  permanent one, the next change of an input or a long resync: the policy is in its
  docstring), and stopping;
- ``changes.py`` holds the change sources: the desired-state files (the last valid state
  stays in force while they are invalid), the host's and the cluster's fingerprints against
  their baselines;
- ``health.py`` answers ``/healthz`` and ``/readyz``; ``metrics.py`` holds the counters.

A single worker runs :meth:`WatchLoop.run`: it asks the scheduler what is due, does it, and
sleeps until the next thing is. Other threads only announce file events and ask it to stop.

A reconcile is one run of the engine (``reconciler.engine``), as for ``vgpuctl apply``:
observe → plan; when there is something to do, under the node lock: plan again (another process
may have acted meanwhile) → host actions → the host checked against the plan's prediction →
cluster writes → the embedded device plugins told → verify. A reconcile with nothing to do never
takes the lock.

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
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from reconciler.apply import Outcome, OutcomeStatus
from reconciler.catalog import Catalog
from reconciler.engine import DevicePlugins, NodePorts, Planned, Reconciled, RunSettings, reconcile
from reconciler.engine.pipeline import Convergence
from reconciler.model import (
    ApplyError,
    ClusterError,
    DesiredNode,
    Inventory,
    LockHeldError,
    ObserveError,
    Plan,
    PlanError,
    ReconcilerError,
)
from reconciler.watch.changes import ClusterDrift, DesiredChange, DesiredFiles, HostDrift
from reconciler.watch.endpoint import Verdict
from reconciler.watch.health import Health
from reconciler.watch.metrics import WatchMetrics
from reconciler.watch.scheduler import Retry, Scheduler, Trigger, is_transient
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


class _Failed(ReconcilerError):
    """A reconcile that ended without an exception of its own but did not succeed."""

    def __init__(self, kind: str, message: str, *, transient: bool = True) -> None:
        super().__init__(message)
        self.kind = kind
        self.transient = transient


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
        self._ports = ports
        self._plugins = plugins
        self._clock = clock
        self._wall_clock = wall_clock

        self.scheduler = Scheduler(
            rescan_interval=self.settings.rescan_interval,
            debounce=self.settings.debounce,
            backoff=self.settings.backoff,
            resync_interval=self.settings.resync_interval,
            clock=clock,
            rng=rng,
        )
        self.desired = DesiredFiles(
            source,
            node=node,
            catalog=catalog,
            metrics=self.metrics,
            events=lambda: self._ports().events,
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
            self._advertise_host()
        if self.cluster.drifted():
            self.scheduler.want(Trigger.CLUSTER)
        if self.probes.blocked and not self.scheduler.failing:
            self.scheduler.want(Trigger.BLOCKED)

    def _advertise_host(self) -> None:
        """Tell the device plugins at once what vanished (reported Unhealthy until it is back),
        before a reconcile that may take a while or fail."""
        if self._plugins is None:
            return
        try:
            inventory = self._ports().observe_host()
        except ReconcilerError:
            return  # the reconcile that follows reports it
        self._advertise(inventory)

    def _advertise(self, inventory: Inventory, removed: Iterable[str] = ()) -> None:
        if self._plugins is None:
            return
        try:
            self._plugins.update(inventory, removed_on_purpose=removed)
        except ReconcilerError as exc:
            self.metrics.errors.labels(kind="deviceplugin").inc()
            log.error("device plugins: %s", exc.message)
        except Exception:
            self.metrics.errors.labels(kind="deviceplugin").inc()
            log.exception("device plugins: update failed")

    def _retry(self, transient: bool | None) -> Retry:
        """Schedule the retry of the reconcile that just failed. ``transient`` None: as the
        exception being handled says (``_failed`` is called in an ``except`` clause)."""
        if transient is None:
            transient = is_transient(sys.exception())
        if not transient:
            # What the failed reconcile saw last is what must change for another try to
            # succeed: a rescan that finds the host or the cluster otherwise tries again.
            self._adopt_baselines((self.host.last, self.cluster.last))
        return self.scheduler.failed(transient=transient)

    # -- one reconcile -----------------------------------------------------------------------

    def _reconcile(self) -> None:
        desired = self.desired.current
        triggers = self.scheduler.take()
        if desired is None:
            return
        started = self._clock()
        self.probes.busy_since = started
        try:
            final, applied = self._converge(desired)
        except LockHeldError as exc:
            self._failed("lock", exc.message, started, triggers, level=logging.WARNING)
        except _Failed as exc:
            self._failed(exc.kind, exc.message, started, triggers)
        except PlanError as exc:
            self._failed("plan", "; ".join(exc.lines()), started, triggers)
        except ObserveError as exc:
            self._failed("observe", exc.message, started, triggers)
        except ClusterError as exc:
            self._failed("cluster", exc.message, started, triggers)
        except ApplyError as exc:
            self._failed("apply", exc.message, started, triggers)
        except ReconcilerError as exc:
            self._failed("internal", exc.message, started, triggers)
        except Exception as exc:
            log.exception("reconcile failed on an internal error")
            self._failed("internal", f"{type(exc).__name__}: {exc}", started, triggers)
        else:
            self._succeeded(final, applied, started, triggers)
        finally:
            self.probes.busy_since = None
            self.metrics.reconcile_duration.observe(self._clock() - started)

    def _converge(self, desired: DesiredNode) -> tuple[Plan, int]:
        """One run of the engine (``reconciler.engine``), which tells the device plugins
        itself. Returns what is left to do (blocked changes at most) and how many actions
        were carried out; raises when the node could not be converged."""
        ports = self._ports()
        # Fingerprints taken just before each host observation: those before the last one
        # (the one the run ends on) become the baselines a rescan compares with.
        taken: list[tuple[str, str | None]] = []
        observe_host = ports.observe_host

        def observe() -> Inventory:
            taken[:] = [self._fingerprints()]
            return observe_host()

        result = reconcile(
            replace(ports, observe_host=observe),
            desired,
            settings=RunSettings(
                adopt=self.settings.adopt,
                verify_timeout=self.settings.verify_timeout,
                command="vgpuctl watch",
            ),
            review=self._log_plan,
            on_outcome=self._outcome,
            plugins=self._plugins,
        )
        self._plugins_told(result)
        if not result.ran:
            return self._nothing_to_do(result.planned, taken[0])
        failed = result.failed
        if failed is not None:
            raise _Failed(
                "apply",
                f"{failed.action.kind.value} {failed.action.target}: {failed.message}",
                transient=failed.transient,
            )
        if result.mismatch is not None:
            # The host changed under the plan (another process, a driver that did otherwise):
            # transient, the next run plans from what the host now is.
            raise _Failed("apply", result.mismatch.message, transient=True)
        verification = result.verification
        if verification is None:  # pragma: no cover - a run that went well is verified
            raise _Failed("internal", "the run was not verified")
        remaining = verification.remaining
        if verification.verdict is Convergence.NOT_CONVERGED:
            kinds = ", ".join(f"{a.kind.value} {a.target}" for a in remaining.actions[:3])
            raise _Failed(
                "not_converged",
                f"after applying, a fresh plan still has {len(remaining.actions)} action(s): "
                f"{kinds}",
            )
        self._adopt_baselines(taken[0])
        return remaining, result.done

    def _nothing_to_do(
        self, planned: Planned, baselines: tuple[str, str | None]
    ) -> tuple[Plan, int]:
        self._adopt_baselines(baselines)
        return planned.plan, 0

    def _plugins_told(self, result: Reconciled) -> None:
        """Report the device plugins' own failure (the run goes on without them)."""
        error = result.plugins.error if result.plugins is not None else None
        if error is None:
            return
        self.metrics.errors.labels(kind="deviceplugin").inc()
        if isinstance(error, ReconcilerError):
            log.error("device plugins: %s", error.message)
        else:
            log.error("device plugins: update failed", exc_info=error)

    def _fingerprints(self) -> tuple[str, str | None]:
        """Taken before an observation: a change after it shows at the next rescan."""
        return self.host.take(), self.cluster.take()

    def _adopt_baselines(self, baselines: tuple[str | None, str | None]) -> None:
        self.host.adopt(baselines[0])
        self.cluster.adopt(baselines[1])

    def _log_plan(self, planned: Planned) -> bool:
        """The engine's review of the plan it is about to run: logged, never refused."""
        plan = planned.plan
        if not plan.actions:
            return True
        log.info(
            "applying %d action(s)",
            len(plan.actions),
            extra={"summary": plan.summary.to_json()},
        )
        for action in plan.actions:
            log.info(
                "plan: %s %s: %s",
                action.kind.value,
                action.target,
                action.reason,
                extra={"kind": action.kind.value, "target": action.target},
            )
        return True

    def _outcome(self, outcome: Outcome) -> None:
        self.probes.beat()
        action = outcome.action
        if outcome.status is OutcomeStatus.DONE:
            self.metrics.actions_applied.labels(kind=action.kind.value).inc()
        level = logging.ERROR if outcome.status is OutcomeStatus.FAILED else logging.INFO
        log.log(
            level,
            "%s %s %s: %s",
            outcome.status.value,
            action.kind.value,
            action.target,
            outcome.message,
            extra={
                "kind": action.kind.value,
                "target": action.target,
                "status": outcome.status.value,
                "seconds": round(outcome.seconds, 3),
            },
        )

    def _succeeded(self, plan: Plan, applied: int, started: float, triggers: str) -> None:
        seconds = self._clock() - started
        blocked = tuple(f"{b.kind.value} {b.target}: {b.reason}" for b in plan.blocked)
        converged = not plan.has_changes
        result = "converged" if converged else "blocked"
        self.metrics.reconciles.labels(result=result).inc()
        self.metrics.blocked_actions.set(len(blocked))
        self.metrics.converged.set(1 if converged else 0)
        self.metrics.last_success.set(self._wall_clock())
        changed = self.probes.settled(blocked, converged=converged) or applied > 0
        self.scheduler.succeeded()
        fields = {
            "reason": triggers,
            "result": result,
            "applied": applied,
            "seconds": round(seconds, 3),
        }
        if not changed:
            log.debug("reconciled: nothing changed", extra=fields)
            return
        if converged:
            log.info("converged: the node matches the desired state", extra=fields)
            return
        log.warning(
            "%d change(s) blocked; the rest is applied (planned again at every rescan)",
            len(blocked),
            extra=fields,
        )
        for line in blocked:
            log.warning("blocked: %s", line)

    def _failed(
        self,
        kind: str,
        message: str,
        started: float,
        triggers: str,
        *,
        level: int = logging.ERROR,
        transient: bool | None = None,
    ) -> None:
        retry = self._retry(transient)
        self.probes.failed(message)
        self.metrics.reconciles.labels(result="failed").inc()
        self.metrics.errors.labels(kind=kind).inc()
        self.metrics.converged.set(0)
        log.log(
            level,
            "reconcile failed: %s; %s",
            message,
            retry.when,
            extra={
                "reason": triggers,
                "error": kind,
                "transient": retry.transient,
                "failures": retry.failures,
                "retry_in": round(retry.delay, 2),
                "seconds": round(self._clock() - started, 3),
            },
        )
