"""The watch loop: keep one node converged on its desired state, one reconcile at a time.

A single worker runs :meth:`WatchLoop.run`; everything else only puts items on its queue (the
desired-state files changed, stop). The worker sleeps on that queue until the next thing is
due: a debounced desired-state change, the periodic rescan, or a retry. A reconcile is the
shared engine's (``reconciler.apply.reconcile``): observe → plan; when there is something to
do, under the node lock: observe and plan again (another process may have acted meanwhile) →
``apply_plan`` → observe again to check convergence. A reconcile with nothing to do never takes
the lock.

What starts a reconcile, and what it costs when nothing changed:

- desired state: a file event (debounced) or, as a safety net for events that never come, a
  changed content fingerprint at a rescan. An invalid desired state is reported (log with
  ``file:line:col``, ``vgpuctl_desired_state_valid`` 0, an Event when a cluster is configured)
  and the last valid one stays in force;
- host drift: at each rescan, the host signature (``signature.py``: a few reads) against the one
  taken just before the last reconcile's final observation; only a difference costs a full
  observation;
- cluster drift: likewise the resourceVersions of our objects (three list calls);
- blocked changes (a VM holds a vGPU that should go): every rescan plans again, since the hold
  may have ended in ways no signature sees (a VMI stopped);
- failures: retried with exponential backoff and jitter; meanwhile drift is not looked for
  (the retry looks at everything).

Stopping (:meth:`WatchLoop.stop`) never interrupts a reconcile: ``apply_plan`` runs to its end
or its own failure, the node lock is released, then :meth:`run` returns.
"""

from __future__ import annotations

import enum
import logging
import math
import queue
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from reconciler.apply import NodeLock, Outcome, OutcomeStatus
from reconciler.apply.reconcile import NodePorts, Planned, apply_plan, plan_for
from reconciler.catalog import Catalog
from reconciler.model import (
    ApplyError,
    ClusterError,
    DesiredNode,
    Inventory,
    LockHeldError,
    ObserveError,
    Plan,
    PlanError,
    Problem,
    ReconcilerError,
    ValidationError,
    VgpuRemove,
)
from reconciler.model.cluster import SRIOV_GPU_KIND, object_name
from reconciler.watch.endpoint import Verdict
from reconciler.watch.metrics import WatchMetrics
from reconciler.watch.source import DesiredSource
from reconciler.watch.timing import Backoff, Debounce

log = logging.getLogger("vgpuctl.watch")

#: Kubernetes truncates longer Event messages.
_EVENT_MESSAGE_MAX = 1024


class DevicePlugins(Protocol):
    """The node's device plugins (``reconciler.deviceplugin.PluginManager``), as the loop
    drives them: the CLI composes the real one, grpc and all."""

    def update(self, inventory: Inventory, *, removed_on_purpose: Iterable[str] = ()) -> None: ...


class Trigger(enum.StrEnum):
    """Why a reconcile runs (the ``reason`` field of its log lines)."""

    START = "start"
    DESIRED = "desired"
    HOST = "host"
    CLUSTER = "cluster"
    BLOCKED = "blocked"
    RETRY = "retry"


@dataclass(frozen=True, slots=True)
class WatchSettings:
    rescan_interval: float = 10.0
    debounce: float = 0.2
    adopt: bool = False
    verify_timeout: float = 120.0
    backoff: Backoff = field(default_factory=Backoff)
    #: The longest one action may take (sriov-manage's timeout plus its verification): while
    #: a reconcile runs, /healthz tolerates that long without a sign of life.
    action_budget: float = 480.0

    def __post_init__(self) -> None:
        if not self.rescan_interval > 0:
            raise ValueError(f"the rescan interval must be positive: {self.rescan_interval}")
        if self.debounce < 0:
            raise ValueError(f"the debounce must not be negative: {self.debounce}")

    @property
    def stale_after(self) -> float:
        """Longest silence of an idle loop that /healthz still calls alive."""
        return max(3 * self.rescan_interval, 30.0)


class _Failed(Exception):
    """A reconcile that ended without an exception of its own but did not succeed."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


_DESIRED_EVENT = "desired"
_WAKE = "wake"


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
        self._host_signature = host_signature
        self._cluster_signature = cluster_signature
        self._plugins = plugins
        self._refresh_watches = refresh_watches
        self._clock = clock
        self._wall_clock = wall_clock
        self._rng = rng

        self._queue: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._debounce = Debounce(self.settings.debounce)

        # The desired state in force (None: no valid one yet) and what was last read.
        self._desired: DesiredNode | None = None
        self._desired_fingerprint: str | None = None
        self._invalid: tuple[str, ...] = ()
        # What the next reconcile is for, and when it is due (None: nothing to do).
        self._pending: set[Trigger] = set()
        self._due: float | None = None
        self._failures = 0
        # Fingerprints taken just before the last successful reconcile's final observation.
        self._host_baseline: str | None = None
        self._cluster_baseline: str | None = None
        self._cluster_unreachable = False
        self._blocked: tuple[str, ...] = ()

        # Read by the HTTP threads (plain attribute reads: each is atomic).
        self._running = False
        self._heartbeat = clock()
        self._busy_since: float | None = None
        self._ready = False
        self._converged = False
        self._last_error: str | None = None

    # -- inputs from other threads -----------------------------------------------------------

    def desired_changed(self) -> None:
        """A file event where the desired state lives (any thread)."""
        self._queue.put(_DESIRED_EVENT)

    def stop(self) -> None:
        """Finish the reconcile under way, if any, then make :meth:`run` return (any thread)."""
        self._stopping.set()
        self._queue.put(_WAKE)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    # -- probes (any thread) -----------------------------------------------------------------

    def health(self) -> Verdict:
        """Alive while the worker keeps ticking (or works through a reconcile's actions)."""
        if not self._running:
            return Verdict(False, "the watch loop is not running")
        silent = self._clock() - self._heartbeat
        limit = self.settings.stale_after
        if self._busy_since is not None:
            limit = max(limit, self.settings.action_budget)
        if silent > limit:
            return Verdict(
                False, f"stalled: no sign of life for {silent:.0f} s (limit {limit:.0f} s)"
            )
        return Verdict(True, f"alive: last sign of life {silent:.1f} s ago")

    def readiness(self) -> Verdict:
        """Ready once a reconcile settled the node (converged, or only changes a VM blocks)."""
        if self._ready:
            return Verdict(True, f"ready: {self._state()}")
        if self._desired is None:
            if self._invalid:
                return Verdict(False, f"no valid desired state yet: {self._invalid[0]}")
            return Verdict(False, "no desired state read yet")
        if self._last_error is not None:
            return Verdict(False, f"not converged yet: {self._last_error}")
        return Verdict(False, "waiting for the first reconcile")

    def _state(self) -> str:
        if self._last_error is not None:
            return f"the last reconcile failed: {self._last_error}"
        if self._blocked:
            n = len(self._blocked)
            return f"{n} change{'s' * (n != 1)} blocked: {self._blocked[0]}"
        if self._invalid:
            return f"converged on the last valid desired state; now invalid: {self._invalid[0]}"
        return "converged" if self._converged else "reconciling"

    # -- the worker --------------------------------------------------------------------------

    def run(self) -> None:
        """Reconcile at start, then on every change, until :meth:`stop`."""
        self._running = True
        try:
            self._run()
        finally:
            self._running = False

    def _run(self) -> None:
        interval = self.settings.rescan_interval
        log.info(
            "watching %s for node %s",
            self.source.path,
            self.node,
            extra={"rescan_interval": interval, "debounce": self.settings.debounce},
        )
        self._watch_again()
        self._guarded(self._check_desired)
        next_rescan = self._clock() + interval
        while not self._stopping.is_set():
            now = self._clock()
            self._heartbeat = now
            if self._debounce.take(now):
                self._watch_again()
                self._guarded(self._check_desired)
            if now >= next_rescan:
                self._guarded(self._rescan)
                # Counted from the end: a slow rescan never makes them pile up.
                next_rescan = self._clock() + interval
            if self._due is not None and self._clock() >= self._due:
                self._reconcile()
                continue  # look again at what fell due meanwhile, before sleeping
            wake = min(
                next_rescan,
                math.inf if self._debounce.deadline is None else self._debounce.deadline,
                math.inf if self._due is None else self._due,
            )
            try:
                item = self._queue.get(timeout=max(0.0, wake - self._clock()))
            except queue.Empty:
                continue
            while True:
                if item == _DESIRED_EVENT:
                    self._debounce.poke(self._clock())
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
        log.info("stopping: no reconcile is running; the node lock is free")

    def _guarded(self, step: Callable[[], None]) -> None:
        """Run a step of the loop; a bug in it is logged and counted, never the loop's end."""
        try:
            step()
        except Exception:
            self.metrics.errors.labels(kind="internal").inc()
            log.exception("internal error in the watch loop (it goes on)")

    def _want(self, trigger: Trigger, *, at: float | None = None) -> None:
        """Ask for a reconcile at ``at`` (now by default)."""
        when = self._clock() if at is None else at
        self._pending.add(trigger)
        self._due = when if self._due is None else min(self._due, when)

    def _watch_again(self) -> None:
        if self._refresh_watches is None:
            return
        try:
            self._refresh_watches()
        except Exception:
            log.exception(
                "cannot watch %s for changes (the rescan still notices them)", self.source.path
            )

    # -- the desired state -------------------------------------------------------------------

    def _check_desired(self) -> None:
        """Read the desired state again if its content changed."""
        fingerprint = self.source.fingerprint()
        if fingerprint == self._desired_fingerprint:
            return
        self._desired_fingerprint = fingerprint
        try:
            node = self.source.load(catalog=self.catalog, node=self.node)
        except ValidationError as exc:
            if self.source.fingerprint() != fingerprint:
                # Changed while we read it: a writer is not done (not every writer renames a
                # finished file into place). Read it again once it has been quiet.
                self._desired_fingerprint = None
                self._debounce.poke(self._clock())
                return
            self._report_invalid(exc.problems or (Problem(exc.message),))
            return
        except Exception as exc:  # a loader bug must not take the loop down
            log.exception("cannot load the desired state from %s", self.source.path)
            self._report_invalid((Problem(f"internal error: {type(exc).__name__}: {exc}"),))
            return
        first = self._desired is None
        if self._invalid:
            log.info("the desired state in %s is valid again", self.source.path)
        self._invalid = ()
        self.metrics.desired_valid.set(1)
        if node is None:
            log.warning(
                "node %s is not in the desired state in %s: no GPU of this node is managed",
                self.node,
                self.source.path,
            )
            node = DesiredNode(self.node)
        if not first:
            self.metrics.drift.labels(source="desired").inc()
            log.info("the desired state changed", extra={"path": str(self.source.path)})
        self._desired = node
        self._want(Trigger.START if first else Trigger.DESIRED)

    def _report_invalid(self, problems: tuple[Problem, ...]) -> None:
        self._invalid = tuple(str(p) for p in problems)
        self.metrics.desired_valid.set(0)
        self.metrics.errors.labels(kind="validation").inc()
        for problem in problems:
            log.error(
                "invalid desired state: %s",
                problem,
                extra={"file": problem.file, "line": problem.line, "column": problem.column},
            )
        if self._desired is None:
            log.error("no valid desired state yet: nothing is changed until it is fixed")
        else:
            log.warning("the last valid desired state stays in force until this is fixed")
        self._record_invalid_event(problems)

    def _record_invalid_event(self, problems: tuple[Problem, ...]) -> None:
        """A Warning Event on each SRIOVGPUDevice of the node (``kubectl describe`` shows it)."""
        if self._desired is None or not self._desired.gpus:
            return  # no object of ours is known to carry it
        try:
            events = self._ports().events
        except ReconcilerError as exc:
            log.warning("cannot record the invalid desired state as an Event: %s", exc.message)
            return
        if events is None:
            return
        # The loader lists at most 20 problems per file and counts the rest: the log has them.
        more = (
            f" (and {len(problems) - 1} more lines in the agent's log)" if len(problems) > 1 else ""
        )
        message = (
            f"desired state invalid: {problems[0]}{more}; the last valid desired state stays "
            "in force"
        )[:_EVENT_MESSAGE_MAX]
        for gpu in self._desired.gpus:
            events.event(
                SRIOV_GPU_KIND,
                object_name(self.node, str(gpu.address)),
                reason="InvalidDesiredState",
                message=message,
                type="Warning",
            )

    # -- rescans -----------------------------------------------------------------------------

    def _rescan(self) -> None:
        started = self._clock()
        # Busy: a cluster that does not answer holds a rescan up to its request timeouts.
        self._busy_since = started
        try:
            self._rescan_now()
        finally:
            self._busy_since = None
            self.metrics.rescan_duration.observe(self._clock() - started)

    def _rescan_now(self) -> None:
        self._watch_again()
        if self.source.fingerprint() != self._desired_fingerprint and not self._debounce.pending:
            # No file event came (a filesystem without inotify, a watch that could not be
            # set): read it after the same quiet period as if one had.
            log.info("the desired state changed without a file event (noticed by the rescan)")
            self._debounce.poke(self._clock())
        if self._desired is not None and self._failures == 0:
            self._look_for_drift()

    def _look_for_drift(self) -> None:
        host = self._host_signature()
        if host != self._host_baseline:
            self.metrics.drift.labels(source="host").inc()
            log.info("the host changed: reconciling", extra={"reason": "host"})
            self._want(Trigger.HOST)
            self._advertise_host()
        if self._cluster_signature is not None:
            cluster = self._cluster_fingerprint()
            if cluster is not None and cluster != self._cluster_baseline:
                self.metrics.drift.labels(source="cluster").inc()
                log.info("our cluster objects changed: reconciling", extra={"reason": "cluster"})
                self._want(Trigger.CLUSTER)
        if self._blocked:
            self._want(Trigger.BLOCKED)

    def _cluster_fingerprint(self) -> str | None:
        if self._cluster_signature is None:
            return None
        try:
            fingerprint = self._cluster_signature()
        except ReconcilerError as exc:
            if not self._cluster_unreachable:
                log.warning("cannot read our cluster objects: %s", exc.message)
                self.metrics.errors.labels(kind="cluster").inc()
            self._cluster_unreachable = True
            return None
        if self._cluster_unreachable:
            log.info("the cluster answers again")
        self._cluster_unreachable = False
        return fingerprint

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

    # -- one reconcile -----------------------------------------------------------------------

    def _reconcile(self) -> None:
        desired = self._desired
        triggers = ",".join(sorted(self._pending))
        self._pending.clear()
        self._due = None
        if desired is None:
            return
        started = self._clock()
        self._busy_since = started
        removed: set[str] = set()
        try:
            final, applied = self._converge(desired, removed)
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
            self._succeeded(final.plan, applied, started, triggers)
        finally:
            self._busy_since = None
            self.metrics.reconcile_duration.observe(self._clock() - started)

    def _converge(self, desired: DesiredNode, removed: set[str]) -> tuple[Planned, int]:
        """Observe, plan, apply, observe again. Returns the final observation and how many
        actions were carried out; raises when the node could not be converged."""
        ports = self._ports()
        baselines = self._fingerprints()
        try:
            first: Planned | None = plan_for(ports, desired, adopt=self.settings.adopt)
        except ObserveError:
            # Perhaps an apply holding the lock is changing the host right now (VFs vanishing
            # mid-scan): look again under the lock, which says so if it is held.
            first = None
        if first is not None and not first.plan.actions:
            return self._nothing_to_do(first, baselines)
        with NodeLock(ports.state_dir, self.node, command="vgpuctl watch"):
            # Planned again under the lock: an apply that held it may have changed the host
            # since (or been changing it while we looked); act only on what is true now.
            baselines = self._fingerprints()
            planned = plan_for(ports, desired, adopt=self.settings.adopt)
            if not planned.plan.actions:
                return self._nothing_to_do(planned, baselines)
            self._log_plan(planned.plan)
            report = apply_plan(
                planned,
                desired,
                ports,
                adopt=self.settings.adopt,
                verify_timeout=self.settings.verify_timeout,
                on_outcome=self._outcome,
                command="vgpuctl watch",
                locked=True,
            )
        results = (report.host, report.cluster) if report.cluster else (report.host,)
        outcomes = [o for r in results for o in r.outcomes]
        removed.update(
            o.action.uuid.lower()
            for o in outcomes
            if isinstance(o.action, VgpuRemove)
            and o.status in (OutcomeStatus.DONE, OutcomeStatus.NOOP)
        )
        removed.discard("")
        applied = sum(o.status is OutcomeStatus.DONE for o in outcomes)
        baselines = self._fingerprints()
        failed = report.failed
        if failed is not None:
            self._advertise_after_failure(ports, removed)
            raise _Failed(
                "apply", f"{failed.action.kind.value} {failed.action.target}: {failed.message}"
            )
        after = plan_for(ports, desired, adopt=self.settings.adopt)
        self._advertise(after.inventory, removed)
        if after.plan.actions:
            kinds = ", ".join(f"{a.kind.value} {a.target}" for a in after.plan.actions[:3])
            raise _Failed(
                "not_converged",
                f"after applying, a fresh plan still has {len(after.plan.actions)} action(s): "
                f"{kinds}",
            )
        self._adopt_baselines(baselines)
        return after, applied

    def _nothing_to_do(
        self, planned: Planned, baselines: tuple[str, str | None]
    ) -> tuple[Planned, int]:
        self._adopt_baselines(baselines)
        self._advertise(planned.inventory)
        return planned, 0

    def _advertise_after_failure(self, ports: NodePorts, removed: set[str]) -> None:
        if self._plugins is None:
            return
        try:
            inventory = ports.observe_host()
        except ReconcilerError:
            return
        self._advertise(inventory, removed)

    def _fingerprints(self) -> tuple[str, str | None]:
        """Taken before an observation: a change after it shows at the next rescan."""
        return self._host_signature(), self._cluster_fingerprint()

    def _adopt_baselines(self, baselines: tuple[str, str | None]) -> None:
        self._host_baseline, self._cluster_baseline = baselines

    def _log_plan(self, plan: Plan) -> None:
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

    def _outcome(self, outcome: Outcome) -> None:
        self._heartbeat = self._clock()
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
        changed = (
            applied > 0
            or blocked != self._blocked
            or self._last_error is not None
            or not self._ready
        )
        self._failures = 0
        self._last_error = None
        self._blocked = blocked
        self._converged = converged
        self._ready = True
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
    ) -> None:
        self._failures += 1
        delay = self.settings.backoff.delay(self._failures, rng=self._rng)
        self._want(Trigger.RETRY, at=self._clock() + delay)
        self._last_error = message
        self._converged = False
        self.metrics.reconciles.labels(result="failed").inc()
        self.metrics.errors.labels(kind=kind).inc()
        self.metrics.converged.set(0)
        log.log(
            level,
            "reconcile failed: %s; retrying in %s s",
            message,
            round(delay, 2),
            extra={
                "reason": triggers,
                "error": kind,
                "failures": self._failures,
                "retry_in": round(delay, 2),
                "seconds": round(self._clock() - started, 3),
            },
        )
