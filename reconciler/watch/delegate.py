"""Delegate mode's watch: keep every node of the desired state converged through Harvester's
objects, from one replica at a time (``vgpuctl watch --delegate harvester``; docs/delegate.md).

:class:`DelegateWatchLoop` is the node agent's loop (``loop.py``) with three parts swapped:

- the desired state is every node's (``DesiredFiles`` over the whole file or directory);
- a reconcile is delegate mode's engine (``reconciler.engine.delegate``: plan every node, write
  specs round after round, wait for pcidevices-controller), the pipeline ``apply --delegate
  harvester`` runs; no host, no device plugin, no KubeVirt CR;
- only the leader acts (``leader.py``: a ``coordination.k8s.io`` Lease): a standby reads the
  desired state and follows the cluster, so that it can take over at once, but plans and
  writes nothing; every write is preceded by a check that this replica still leads.

The scheduler, the retry policy, the probes and the metrics are the node agent's. What starts a
reconcile: the desired state changing (file events, debounced; the rescan as a safety net);
Harvester's SRIOVGPUDevices and VGPUDevices changing (list then watch, ``clusterwatch.py``:
compared at each rescan with no request); steps a VM blocks (planned again at every rescan);
winning the Lease; a failure's retry.

The rollout (``engine/rollout.py``'s events): ``vgpuctl_rollout_nodes{state}`` counts its
nodes by state as it goes, ``vgpuctl_rollout_node_results_total{result}`` each node's end, and
``/readyz`` says how far it got. The leader is not ready from the moment a rollout has more
failed nodes than its ``maxFailedNodes`` (or a canary failed: it starts no other node) until a
later reconcile ends within the budget (a rollout that does, or nothing left to do); otherwise
the node agent's rule holds (:meth:`DelegateWatchLoop.readiness`).

Events: a step that failed is a Warning Event on its object (a webhook's denial in its words),
and a step newly blocked by a VM is one too, so ``kubectl describe vgpudevice …`` tells why.

Stopping (SIGTERM): the run stops before its next write (a step under way finishes its waits,
bounded by ``--timeout``), then the Lease is released; the next leader plans from what it
observes, so nothing is lost between two steps.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from reconciler.apply import EventSink, Outcome, OutcomeStatus
from reconciler.apply.cluster import EVENT_MESSAGE_MAX
from reconciler.apply.delegate import DEFAULT_POLL, DEFAULT_TIMEOUT
from reconciler.apply.throttle import RateLimitedApi, TokenBucket
from reconciler.catalog import Catalog
from reconciler.engine.delegate import Converged, Result, converge, plan_all
from reconciler.engine.rollout import (
    NodeEnded,
    NodeState,
    RolloutEnded,
    RolloutEvent,
    RolloutTally,
    Tally,
)
from reconciler.model import ActionKind, Desired, Plan, ReconcilerError
from reconciler.model.cluster import SRIOV_GPU_KIND, VGPU_KIND
from reconciler.model.clusterapi import ClusterApi
from reconciler.model.desired import Rollout
from reconciler.plan.delegate import WAITING
from reconciler.watch.changes import ClusterDrift, DesiredFiles
from reconciler.watch.endpoint import Verdict
from reconciler.watch.leader import Leadership
from reconciler.watch.metrics import WatchMetrics
from reconciler.watch.reconcile import Reporting, blocked_lines
from reconciler.watch.scheduler import Scheduler, Trigger
from reconciler.watch.source import DesiredSource
from reconciler.watch.worker import WatchSettings, Worker

log = logging.getLogger("vgpuctl.watch")


class DelegateWatchLoop(Worker):
    """Runs delegate reconciles while this replica leads, until stopped. See the module
    docstring."""

    def __init__(
        self,
        *,
        source: DesiredSource,
        catalog: Catalog,
        api: ClusterApi,
        leadership: Callable[[Scheduler], Leadership],
        cluster_signature: Callable[[], str] | None,
        metrics: WatchMetrics,
        settings: WatchSettings | None = None,
        step_timeout: float = DEFAULT_TIMEOUT,
        poll: float = DEFAULT_POLL,
        events: EventSink | None = None,
        refresh_watches: Callable[[], None] | None = None,
        rollout: Rollout | None = None,
        bucket: TokenBucket | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.source = source
        self.catalog = catalog
        self.api = api
        self.metrics = metrics
        self.step_timeout = step_timeout
        self.poll = poll
        self.events = events
        #: The command line's rollout flags: each one given wins over ``spec.rollout``.
        self.rollout = rollout or Rollout()
        #: The rate limit on a reconcile's requests (the Lease's renewals are not held up by
        #: it: a rollout that saturates it must not cost the leadership).
        self.rollout_api: ClusterApi = api if bucket is None else RateLimitedApi(api, bucket)
        self._schedule(
            settings or WatchSettings(action_budget=step_timeout + 60.0), clock=clock, rng=rng
        )
        self.leadership = leadership(self.scheduler)
        self.desired: DesiredFiles[Desired] = DesiredFiles(
            source,
            load=lambda src: src.load_all(catalog=catalog),
            metrics=metrics,
            refresh_watches=refresh_watches,
        )
        self.cluster = ClusterDrift(
            cluster_signature, metrics=metrics, what="Harvester's SRIOVGPUDevices or VGPUDevices"
        )
        self.probes = self._health()
        #: The current rollout's nodes by state (or the last one's).
        self.rollout_tally = RolloutTally()
        #: Why the leader is not ready: a rollout went beyond its failure budget ("" when none
        #: did since a reconcile last ended within it).
        self.over_budget = ""
        self.report = Reporting(
            scheduler=self.scheduler,
            probes=self.probes,
            metrics=metrics,
            adopt_last=lambda: self.cluster.adopt(self.cluster.last),
            clock=clock,
            wall_clock=wall_clock,
            subject="every node matches",
        )

    def readiness(self) -> Verdict:
        """A standby is ready (it serves its purpose: taking over) while it can read the Lease;
        the leader once a reconcile settled the nodes, as the node agent."""
        if not self.leadership.leading():
            if not self.leadership.looked:
                return Verdict(False, "starting: the Lease has not been read yet")
            failure = self.leadership.failure
            if failure is not None:  # a standby that cannot read the Lease cannot take over
                return Verdict(False, f"cannot read or renew the Lease: {failure}")
            holder = self.leadership.holder
            return Verdict(True, f"standby: {holder or 'no replica'} holds the Lease")
        verdict = self.probes.readiness()
        t = self.rollout_tally.snapshot()
        if t.started_at is None:
            return verdict
        rollout = f"rollout: {_counts(t)}"
        if self.over_budget:
            return Verdict(
                False, f"rollout stopped: {self.over_budget}; {verdict.reason}; {rollout}"
            )
        return Verdict(verdict.ok, f"{verdict.reason}; {rollout}")

    def _rollout_event(self, event: RolloutEvent) -> None:
        """The rollout's state in the metrics and readiness (the module docstring)."""
        self.rollout_tally.add(event)
        t = self.rollout_tally.snapshot()
        gauge = self.metrics.rollout_nodes
        if gauge is not None:
            for state, n in t.counts.items():
                gauge.labels(state=state.value).set(n)
        if isinstance(event, NodeEnded):
            self.probes.beat()
            if self.metrics.node_results is not None:
                self.metrics.node_results.labels(result=event.result).inc()
        if t.over_budget and not self.over_budget:
            self.over_budget = _budget_text(t)
        elif isinstance(event, RolloutEnded) and not t.over_budget:
            self.over_budget = ""

    # -- the worker's hooks (worker.py) --------------------------------------------------------

    def _started(self) -> None:
        log.info(
            "watching %s for every node it names, through pcidevices-controller",
            self.source.path,
            extra={"rescan_interval": self.settings.rescan_interval},
        )

    def _look_for_drift(self) -> None:
        if not self.leadership.leading():
            return  # a standby plans nothing: becoming leader looks at everything
        if self.cluster.drifted():
            self.scheduler.want(Trigger.CLUSTER)
        if self.probes.blocked and not self.scheduler.failing:
            self.scheduler.want(Trigger.BLOCKED)

    # -- one reconcile -------------------------------------------------------------------------

    def _reconcile(self) -> None:
        triggers = self.scheduler.take()
        desired = self.desired.current
        if desired is None:
            return
        if not self.leadership.leading():
            log.debug("standing by: not reconciling (%s)", triggers)
            return
        started = self._clock()
        self.probes.busy_since = started
        try:
            self._converge(desired, started, triggers)
        except ReconcilerError as exc:
            kind = "lease" if not self.leadership.leading() else "cluster"
            self.report.failed(kind, exc.message, exc, started, triggers)
        except Exception as exc:
            log.exception("reconcile failed on an internal error")
            message = f"{type(exc).__name__}: {exc}"
            self.report.failed("internal", message, exc, started, triggers)
        finally:
            self.probes.busy_since = None
            self.metrics.reconcile_duration.observe(self._clock() - started)

    def _converge(self, desired: Desired, started: float, triggers: str) -> None:
        # Taken before the first observation: our own writes and the controller's status
        # updates show at the next rescan, and cost one more (no-op) plan; no change is missed.
        self.cluster.take()
        planned = plan_all(desired, self.api, self.catalog)
        if planned.failures or planned.steps:
            self.report.plan(planned.plans)
            done = converge(
                desired,
                self.rollout_api,
                self.catalog,
                first=planned,
                timeout=self.step_timeout,
                poll=self.poll,
                guard=self._guard,
                on_outcome=self._outcome,
                policy=self.rollout.over(desired.rollout),
                hold=False,
                on_event=self._rollout_event,
            )
        else:
            done = Converged(Result.BLOCKED if planned.blocked else Result.CONVERGED, planned, ())
            self.over_budget = ""
        self._report(done, started, triggers)

    def _guard(self) -> None:
        """Before every write: this replica still leads, and is not stopping (a SIGTERM stops
        the run between two steps, so the pod exits in time and the next leader carries on)."""
        self.leadership.guard()
        if self.scheduler.stopping:
            raise _Stopping("stopping: the next leader carries on from here")

    def _report(self, done: Converged, started: float, triggers: str) -> None:
        match done.result:
            case Result.CONVERGED | Result.BLOCKED:
                blocked = tuple(line for p in done.plans.plans for line in blocked_lines(p))
                self._blocked_events(done.plans.plans, blocked)
                self.cluster.adopt(self.cluster.last)
                self.report.succeeded(
                    blocked,
                    converged=done.result is Result.CONVERGED,
                    applied=done.applied,
                    started=started,
                    triggers=triggers,
                )
            case Result.FAILED if self.scheduler.stopping:
                log.info(
                    "stopped between two steps (asked to stop); the next leader carries on",
                    extra={"reason": triggers, "applied": done.applied},
                )
            case Result.FAILED if not self.leadership.leading():
                log.warning(
                    "lost the Lease during the reconcile: stopped before the next write; the "
                    "new leader carries on",
                    extra={"reason": triggers},
                )
                self.scheduler.succeeded()
            case Result.FAILED:
                failed = done.failed
                if failed is not None:
                    self._event(failed.action.kind, failed.action.target, "StepFailed",
                                failed.message)  # fmt: skip
                error = _Failed(done.message, transient=failed is not None and failed.transient)
                self.report.failed("apply", done.message, error, started, triggers)
            case Result.UNPLANNABLE:
                self.report.failed("plan", done.message, _Failed(done.message), started, triggers)
            case Result.CONTROLLER_SILENT | Result.NOT_CONVERGED:
                error = _Failed(done.message, transient=True)
                self.report.failed("not_converged", done.message, error, started, triggers)

    def _outcome(self, outcome: Outcome) -> None:
        if self.scheduler.stopping and outcome.status is OutcomeStatus.FAILED:
            action = outcome.action
            log.info("not run (stopping): %s %s", action.kind.value, action.target)
            return
        self.report.outcome(outcome)

    def _blocked_events(self, plans: tuple[Plan, ...], lines: tuple[str, ...]) -> None:
        """A Warning Event per step a VM blocks, when the blocked set is news."""
        if lines == self.probes.blocked:
            return
        for plan in plans:
            for b in plan.blocked:
                if b.reason == WAITING:
                    continue  # pcidevices-controller's objects are on their way: no warning
                self._event(b.kind, b.target, "Blocked", b.reason)

    def _event(self, kind: ActionKind, target: str, reason: str, message: str) -> None:
        if self.events is None:
            return
        object_kind = SRIOV_GPU_KIND if kind.value.startswith("sriovgpudevice") else VGPU_KIND
        self.events.event(
            object_kind, target, reason=reason, message=message[:EVENT_MESSAGE_MAX],
            type="Warning",
        )  # fmt: skip


def _counts(t: Tally) -> str:
    c = t.counts
    return ", ".join(f"{n} {state.value.replace('_', ' ')}" for state, n in c.items())


def _budget_text(t: Tally) -> str:
    if t.canary_failed:
        return "a canary node failed"
    failed = t.counts[NodeState.FAILED]
    nodes = "node" if failed == 1 else "nodes"
    return f"{failed} {nodes} failed, more than maxFailedNodes {t.max_failed_nodes}"


class _Stopping(ReconcilerError):
    transient = True


class _Failed(ReconcilerError):
    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient
