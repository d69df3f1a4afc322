"""One reconcile of the watch loop: the engine run, and what the loop reports of it.

:class:`ReconcileRunner` runs the engine (``reconciler.engine``) once, as ``vgpuctl apply``
does: observe → plan; when there is something to do, under the node lock: plan again (another
process may have acted meanwhile) → host actions → the host checked against the plan's
prediction → cluster writes → the embedded device plugins told → verify. A reconcile with
nothing to do never takes the lock.

Around the run it keeps the books:

- logs: the plan before it runs, each action's outcome, then the result (converged, blocked
  with the changes a VM holds up, or failed with the retry the scheduler set; a refusal to act
  while Harvester's pcidevices-controller runs is a failure of kind ``refused``);
- metrics: reconciles by result, actions applied, errors by kind, the duration, the converged
  and blocked gauges, the last success;
- the probes (``health.py``): busy while it runs, a beat at each action, settled or failed;
- the rollout budget (``apply/slots.py``: ``spec.rollout.maxParallel`` with a cluster): a run
  with host changes and no free slot does nothing and is tried again within seconds (not a
  failure: no backoff), said in the log, the readiness probe and
  ``vgpuctl_rollout_slot_waiting``;
- the scheduler (``scheduler.py``): a success, or a failure and its retry (a transient error
  with backoff; a permanent one waits for a change of an input or the resync);
- the drift baselines (``changes.py``): the host's and the cluster's fingerprints taken just
  before the run's last host observation are adopted when it succeeds, and when it fails
  permanently what the failed run saw last (so a change of either brings the next try).

It never decides *when*: the loop calls :meth:`ReconcileRunner.run` when the scheduler says a
reconcile is due.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from reconciler.apply import Outcome, OutcomeStatus
from reconciler.apply.cluster import EVENT_MESSAGE_MAX
from reconciler.apply.lease import DEFAULT_DURATION, DEFAULT_RETRY_PERIOD
from reconciler.apply.slots import SlotUnavailableError
from reconciler.engine import NodePorts, Planned, RunSettings, reconcile
from reconciler.engine.pipeline import Convergence
from reconciler.model import (
    AbsentError,
    ApplyError,
    ClusterError,
    DesiredNode,
    ForeignControllerError,
    Inventory,
    LockHeldError,
    ObserveError,
    Plan,
    PlanError,
    ReconcilerError,
)
from reconciler.model.cluster import NODE_STATE_KIND
from reconciler.model.record import replace
from reconciler.watch.advertising import Advertising
from reconciler.watch.changes import ClusterDrift, HostDrift
from reconciler.watch.health import Health
from reconciler.watch.metrics import WatchMetrics
from reconciler.watch.scheduler import Scheduler, Trigger, is_transient

if TYPE_CHECKING:
    from reconciler.apply.slots import NodeBudget

log = logging.getLogger("vgpuctl.watch")

#: The host's and the cluster's fingerprints (the latter None without a cluster).
_Fingerprints = tuple[str | None, str | None]


class _Failed(ReconcilerError):
    """A reconcile that ended without an exception of its own but did not succeed."""

    def __init__(self, kind: str, message: str, *, transient: bool = True) -> None:
        super().__init__(message)
        self.kind = kind
        self.transient = transient


class ReconcileRunner:
    """Runs one reconcile at a time and reports it. See the module docstring."""

    def __init__(
        self,
        *,
        ports: Callable[[], NodePorts],
        settings: RunSettings,
        scheduler: Scheduler,
        host: HostDrift,
        cluster: ClusterDrift,
        probes: Health,
        advertising: Advertising,
        metrics: WatchMetrics,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        budget: NodeBudget | None = None,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._ports = ports
        self._budget = budget
        self._rng = rng
        #: Runs in a row that found no free rollout slot, and what the last one said.
        self._slot_waits = 0
        self._slot_said = ""
        self._slot_waiting = None
        if budget is not None:
            from prometheus_client import Gauge

            self._slot_waiting = Gauge(
                "vgpuctl_rollout_slot_waiting",
                "1 while this node has host changes to make and waits for a rollout slot "
                "(spec.rollout.maxParallel: every slot held by other nodes), else 0.",
                registry=metrics.registry,
            )
            self._slot_waiting.set(0)
        self._settings = settings
        self._scheduler = scheduler
        self._host = host
        self._cluster = cluster
        self._probes = probes
        self._advertising = advertising
        self._metrics = metrics
        self._clock = clock
        #: The desired state the last run planned, node groups' entries made this host's GPUs
        #: (None: no run yet).
        self.planned_for: DesiredNode | None = None
        self.report = Reporting(
            scheduler=scheduler,
            probes=probes,
            metrics=metrics,
            adopt_last=lambda: self._adopt_baselines((host.last, cluster.last)),
            clock=clock,
            wall_clock=wall_clock,
        )

    def run(self, desired: DesiredNode, triggers: str) -> None:
        """Converge the node on ``desired`` (``triggers``: why, for the logs). Never raises:
        a failure is reported and its retry scheduled."""
        started = self._clock()
        self._probes.busy_since = started
        waiting = False
        try:
            final, applied = self._converge(desired)
        except SlotUnavailableError as exc:
            waiting = True
            self._wait_for_slot(exc, triggers)
        except LockHeldError as exc:
            self.report.failed("lock", exc.message, exc, started, triggers, level=logging.WARNING)
        except _Failed as exc:
            self.report.failed(exc.kind, exc.message, exc, started, triggers)
        except ForeignControllerError as exc:
            # Harvester's pcidevices-controller runs (or may): nothing was changed. Permanent:
            # tried again when an input changes or at the resync (an Addon disabled).
            self.report.failed("refused", exc.message, exc, started, triggers)
        except AbsentError as exc:
            # What the desired state wants is not on the host: not converged, and said on the
            # node's summary object, where no GPU object may exist to carry it.
            self.report.failed("plan", "; ".join(exc.lines()), exc, started, triggers)
            self._record_absent(desired.name, exc)
        except PlanError as exc:
            self.report.failed("plan", "; ".join(exc.lines()), exc, started, triggers)
        except ObserveError as exc:
            self.report.failed("observe", exc.message, exc, started, triggers)
        except ClusterError as exc:
            self.report.failed("cluster", exc.message, exc, started, triggers)
        except ApplyError as exc:
            self.report.failed("apply", exc.message, exc, started, triggers)
        except ReconcilerError as exc:
            self.report.failed("internal", exc.message, exc, started, triggers)
        except Exception as exc:
            log.exception("reconcile failed on an internal error")
            message = f"{type(exc).__name__}: {exc}"
            self.report.failed("internal", message, exc, started, triggers)
        else:
            self.report.succeeded(
                blocked_lines(final), converged=not final.has_changes, applied=applied,
                started=started, triggers=triggers,
            )  # fmt: skip
        finally:
            self._probes.busy_since = None
            self._metrics.reconcile_duration.observe(self._clock() - started)
            if not waiting:
                self._slot_waits, self._slot_said = 0, ""
                if self._slot_waiting is not None:
                    self._slot_waiting.set(0)

    def _wait_for_slot(self, error: SlotUnavailableError, triggers: str) -> None:
        """No rollout slot is free: nothing was changed. Tried again after a short pause that
        grows with the waits in a row up to a lease duration (jittered: the waiting nodes do
        not all ask at once), never the failure backoff's minute."""
        period, longest = DEFAULT_RETRY_PERIOD, DEFAULT_DURATION
        if self._budget is not None:  # (only a budget raises it)
            period, longest = self._budget.slots.retry_period, self._budget.slots.duration
        self._slot_waits += 1
        pause = min(period * self._slot_waits, longest)
        delay = pause * (0.5 + self._rng() / 2)
        self._scheduler.want(Trigger.SLOT, at=self._clock() + delay)
        self._probes.wait_for_slot(error.message)
        if self._slot_waiting is not None:
            self._slot_waiting.set(1)
        level = logging.INFO if error.message != self._slot_said else logging.DEBUG
        self._slot_said = error.message
        log.log(
            level,
            "%s: nothing changed; trying again in %.1f s",
            error.message,
            delay,
            extra={"reason": triggers, "holders": list(error.busy.holders)},
        )

    def _record_absent(self, node: str, error: AbsentError) -> None:
        """A Warning Event ``DesiredGpuAbsent`` on the node's VGPUNodeState, naming what the
        desired state wants and the node lacks (no cluster: the log alone says it)."""
        try:
            events = self._ports().events
        except ReconcilerError as exc:
            log.warning("cannot record the missing GPUs as an Event: %s", exc.message)
            return
        if events is None:
            return
        lines = error.lines()
        more = f" (and {len(lines) - 1} more in the agent's log)" if len(lines) > 1 else ""
        events.event(
            NODE_STATE_KIND,
            node,
            reason="DesiredGpuAbsent",
            message=f"not converged: {lines[0]}{more}"[:EVENT_MESSAGE_MAX],
            type="Warning",
        )

    # -- the engine's run --------------------------------------------------------------------

    def _converge(self, desired: DesiredNode) -> tuple[Plan, int]:
        """One run of the engine, which tells the device plugins itself. Returns what is left
        to do (blocked changes at most) and how many actions were carried out; raises when
        the node could not be converged."""
        ports = self._ports()
        # Fingerprints taken just before each host observation: those before the last one
        # (the one the run ends on) become the baselines a rescan compares with.
        taken: list[_Fingerprints] = []
        observe_host = ports.observe_host

        def observe(*, availability: bool = True) -> Inventory:
            # Taken before the observation: a change after it shows at the next rescan.
            taken[:] = [(self._host.take(), self._cluster.take())]
            return observe_host(availability=availability)

        result = reconcile(
            replace(ports, observe_host=observe),
            desired,
            settings=self._settings,
            review=self._review,
            on_outcome=self.report.outcome,
            plugins=self._advertising.plugins,
            budget=self._budget,
        )
        self._advertising.engine_told(result)
        self.planned_for = result.planned.desired
        if not result.ran:
            self._adopt_baselines(taken[0])
            return result.planned.plan, 0
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

    def _adopt_baselines(self, baselines: _Fingerprints) -> None:
        self._host.adopt(baselines[0])
        self._cluster.adopt(baselines[1])

    def _review(self, planned: Planned) -> bool:
        """The engine's review of the plan it is about to run: logged, never refused."""
        self.report.plan((planned.plan,))
        return True


def blocked_lines(plan: Plan) -> tuple[str, ...]:
    """A plan's blocked changes, one line each (the log, the readiness probe)."""
    return tuple(f"{b.kind.value} {b.target}: {b.reason}" for b in plan.blocked)


class Reporting:
    """What the loop reports of a reconcile, whoever ran it (the node engine, or delegate
    mode's rounds): log lines, metrics, the probes, and the scheduler told of a success or a
    failure (with its retry)."""

    def __init__(
        self,
        *,
        scheduler: Scheduler,
        probes: Health,
        metrics: WatchMetrics,
        adopt_last: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        subject: str = "the node matches",
    ) -> None:
        self._scheduler = scheduler
        self._probes = probes
        self._metrics = metrics
        self._adopt_last = adopt_last
        self._clock = clock
        self._wall_clock = wall_clock
        self._subject = subject

    def plan(self, plans: Sequence[Plan]) -> None:
        """The plans about to run, logged (a plan without actions says nothing)."""
        for plan in plans:
            if not plan.actions:
                continue
            log.info(
                "applying %d action(s)",
                len(plan.actions),
                extra={"node": plan.node, "summary": plan.summary.to_json()},
            )
            for action in plan.actions:
                log.info(
                    "plan: %s %s: %s",
                    action.kind.value,
                    action.target,
                    action.reason,
                    extra={"kind": action.kind.value, "target": action.target},
                )

    def outcome(self, outcome: Outcome) -> None:
        self._probes.beat()
        action = outcome.action
        if outcome.status is OutcomeStatus.DONE:
            self._metrics.actions_applied.labels(kind=action.kind.value).inc()
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

    def succeeded(
        self,
        blocked: tuple[str, ...],
        *,
        converged: bool,
        applied: int,
        started: float,
        triggers: str,
    ) -> None:
        """A reconcile ended without failing, leaving ``blocked`` changes."""
        seconds = self._clock() - started
        result = "converged" if converged else "blocked"
        self._metrics.reconciles.labels(result=result).inc()
        self._metrics.blocked_actions.set(len(blocked))
        self._metrics.converged.set(1 if converged else 0)
        self._metrics.last_success.set(self._wall_clock())
        changed = self._probes.settled(blocked, converged=converged) or applied > 0
        self._scheduler.succeeded()
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
            log.info("converged: %s the desired state", self._subject, extra=fields)
            return
        log.warning(
            "%d change(s) blocked; the rest is applied (planned again at every rescan)",
            len(blocked),
            extra=fields,
        )
        for line in blocked:
            log.warning("blocked: %s", line)

    def failed(
        self,
        kind: str,
        message: str,
        error: Exception,
        started: float,
        triggers: str,
        *,
        level: int = logging.ERROR,
    ) -> None:
        """Report a failed reconcile and schedule its retry, as ``error`` says (transient or
        permanent: ``scheduler.is_transient``)."""
        transient = is_transient(error)
        if not transient:
            # What the failed reconcile saw last is what must change for another try to
            # succeed: a rescan that finds the host or the cluster otherwise tries again.
            self._adopt_last()
        retry = self._scheduler.failed(transient=transient)
        self._probes.failed(message)
        self._metrics.reconciles.labels(result="failed").inc()
        self._metrics.errors.labels(kind=kind).inc()
        self._metrics.converged.set(0)
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
