"""Delegate mode's engine: converge every node of a desired state through Harvester's objects,
the one pipeline ``apply --delegate harvester`` and ``watch --delegate harvester`` run
(docs/delegate.md).

:func:`plan_all` observes every node of the desired state from its ``SRIOVGPUDevice`` and
``VGPUDevice`` objects (six cluster-wide lists and one of the driver pods, whatever the number
of nodes) and plans each.
:func:`converge` applies such plans in rounds: a GPU's VF steps are planned ahead of its enable
where the catalogue knows where its VFs appear (``plan/delegate.py`` ``plan_ahead``: one round
then), else only once pcidevices-controller has made their ``VGPUDevice`` objects, so after
each round the nodes are read and planned again, until nothing is left to do, only steps a VM
blocks remain, a round changes nothing, or :data:`MAX_ROUNDS` rounds ran. When a GPU was
enabled and its objects are not there yet, it waits for them (bounded by the step timeout).

It writes nothing itself: each node's steps go through
:class:`~reconciler.apply.delegate.DelegateExecutor`, which asks ``guard`` before every write
(the watch's leadership: a replica that lost its Lease stops before its next write).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Mapping
from functools import partial

from reconciler.apply.delegate import (
    DEFAULT_POLL,
    DEFAULT_TIMEOUT,
    DelegateExecutor,
    poll_delays,
)
from reconciler.apply.executor import Outcome, OutcomeStatus
from reconciler.catalog import Catalog
from reconciler.model import Desired, Plan, ReconcilerError
from reconciler.model.clusterapi import ClusterApi
from reconciler.model.record import record
from reconciler.observe.delegate import devices_in_use, driver_not_ready, observe_harvester_nodes
from reconciler.observe.nodes import all_node_labels
from reconciler.plan.delegate import plan_delegate, waits_for_controller

#: At most this many rounds of apply (a GPU enable, then its VFs, then what a profile change
#: of another size needs): a run that still has work after them reports it.
MAX_ROUNDS = 6


@record(frozen=True, slots=True)
class DelegatePlans:
    """Every node of a desired state, planned; a node whose objects cannot be planned (an
    unreadable object, a GPU Harvester does not know) is in ``failures`` instead."""

    plans: tuple[Plan, ...]
    failures: Mapping[str, ReconcilerError]

    @property
    def steps(self) -> int:
        return sum(len(p.actions) for p in self.plans)

    @property
    def blocked(self) -> int:
        return sum(len(p.blocked) for p in self.plans)

    @property
    def waiting(self) -> bool:
        """A GPU is enabled and its VGPUDevice objects are not there yet."""
        return any(map(waits_for_controller, self.plans))


def plan_all(desired: Desired, api: ClusterApi, catalog: Catalog) -> DelegatePlans:
    """Every node of ``desired``, observed now and planned: its own entries' nodes, and the
    cluster's nodes its node groups select (the Nodes listed once, only when it has groups)."""
    labels = all_node_labels(api) if desired.groups else {}
    names = desired.selected(labels)
    observed = observe_harvester_nodes(api, names)
    plans: list[Plan] = []
    failures: dict[str, ReconcilerError] = {}
    for name in names:
        try:
            wanted = desired.node(name, labels.get(name, {}))
            if wanted is None:  # pragma: no cover - selected() names only the desired's nodes
                continue
            plans.append(plan_delegate(wanted, observed[name], catalog=catalog))
        except ReconcilerError as e:
            failures[name] = e
    return DelegatePlans(tuple(plans), failures)


class Result(enum.Enum):
    """How a :func:`converge` ended."""

    #: Every node matches the desired state.
    CONVERGED = "converged"
    #: Every step that could run ran; the rest wait for a VM to let its vGPU go, or for a
    #: node's NVIDIA driver pod to be ready.
    BLOCKED = "blocked"
    #: A step failed (its outcome says why: a webhook's denial, a wait that timed out, …).
    FAILED = "failed"
    #: A node could not be observed or planned (``plans.failures``).
    UNPLANNABLE = "unplannable"
    #: pcidevices-controller made no VGPUDevice objects for an enabled GPU in time.
    CONTROLLER_SILENT = "controller-silent"
    #: Steps are left after :data:`MAX_ROUNDS` rounds.
    NOT_CONVERGED = "not-converged"


@record(frozen=True, slots=True)
class Converged:
    """What :func:`converge` did and where it left the nodes."""

    result: Result
    #: The last plans: what is left (blocked steps, steps after a failure, …).
    plans: DelegatePlans
    #: Every outcome of every round, in order.
    outcomes: tuple[Outcome, ...]
    #: The failed step's outcome (``Result.FAILED``).
    failed: Outcome | None = None

    @property
    def applied(self) -> int:
        return sum(o.status is OutcomeStatus.DONE for o in self.outcomes)

    @property
    def message(self) -> str:
        """One line: the result, as the CLI and the watch report it."""
        plans = self.plans
        match self.result:
            case Result.CONVERGED:
                return "converged: every node matches the desired state"
            case Result.BLOCKED:
                n = plans.blocked
                return f"converged but for {n} blocked step{'s' * (n != 1)} (plan says why)"
            case Result.FAILED:
                f = self.failed
                return "a step failed" if f is None else (
                    f"{f.action.kind.value} {f.action.target}: {f.message}"
                )  # fmt: skip
            case Result.UNPLANNABLE:
                return "; ".join(
                    f"node {node}: {error.message}" for node, error in plans.failures.items()
                )
            case Result.CONTROLLER_SILENT:
                return "pcidevices-controller made no VGPUDevices in time"
            case Result.NOT_CONVERGED:
                n = plans.steps
                return f"{n} step{'s' * (n != 1)} left after {MAX_ROUNDS} rounds"


def converge(
    desired: Desired,
    api: ClusterApi,
    catalog: Catalog,
    *,
    first: DelegatePlans | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    poll: float = DEFAULT_POLL,
    guard: Callable[[], None] | None = None,
    on_outcome: Callable[[Outcome], None] | None = None,
    on_round: Callable[[Plan, int], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Converged:
    """Apply ``desired`` through pcidevices-controller, round after round (module docstring).

    ``first``: the plans already shown (the user confirmed them), else planned here.
    ``guard`` is called before every write and raises to stop the run there.
    ``on_round(plan, n)`` is told before a node's steps of round ``n`` run.
    """
    plans = first if first is not None else plan_all(desired, api, catalog)
    outcomes: list[Outcome] = []
    for round_number in range(1, MAX_ROUNDS + 1):
        if plans.failures:
            return Converged(Result.UNPLANNABLE, plans, tuple(outcomes))
        ran = 0
        for plan in plans.plans:
            if not plan.actions:
                continue
            if on_round is not None:
                on_round(plan, round_number)
            executor = DelegateExecutor(
                api,
                used_by=partial(devices_in_use, api, plan.node),
                timeout=timeout,
                poll=poll,
                clock=clock,
                sleep=sleep,
                on_outcome=on_outcome,
                guard=guard,
                driver=partial(driver_not_ready, api, plan.node),
            )
            result = executor.run(plan)
            outcomes.extend(result.outcomes)
            ran += len(result.outcomes)
            if result.failed is not None:
                return Converged(Result.FAILED, plans, tuple(outcomes), result.failed)
        plans = plan_all(desired, api, catalog)
        if not plans.failures and plans.steps == 0 and plans.waiting:
            wait = _Wait(timeout, poll, clock, sleep)
            plans = wait.for_controller(desired, api, catalog)
        if plans.failures or plans.steps == 0 or ran == 0:
            break
    if plans.failures:
        return Converged(Result.UNPLANNABLE, plans, tuple(outcomes))
    if plans.waiting:
        return Converged(Result.CONTROLLER_SILENT, plans, tuple(outcomes))
    if plans.steps:
        return Converged(Result.NOT_CONVERGED, plans, tuple(outcomes))
    if plans.blocked:
        return Converged(Result.BLOCKED, plans, tuple(outcomes))
    return Converged(Result.CONVERGED, plans, tuple(outcomes))


@record(frozen=True, slots=True)
class _Wait:
    timeout: float
    poll: float
    clock: Callable[[], float]
    sleep: Callable[[float], None]

    def for_controller(self, desired: Desired, api: ClusterApi, catalog: Catalog) -> DelegatePlans:
        """Plans again until no GPU waits for pcidevices-controller's objects, or the timeout."""
        deadline = self.clock() + self.timeout
        for delay in poll_delays(self.poll):
            plans = plan_all(desired, api, catalog)
            if plans.failures or not plans.waiting or self.clock() >= deadline:
                return plans
            self.sleep(delay)
        raise AssertionError("unreachable: poll_delays never ends")  # pragma: no cover
