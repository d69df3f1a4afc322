"""Delegate mode's engine: converge every node of a desired state through Harvester's objects,
the one pipeline ``apply --delegate harvester`` and ``watch --delegate harvester`` run
(docs/delegate.md).

:func:`plan_all` observes every node of the desired state from its ``SRIOVGPUDevice`` and
``VGPUDevice`` objects (six cluster-wide lists and one of the driver pods, whatever the number
of nodes) and plans each.
:func:`converge` applies such plans node by node, several nodes at once: pcidevices-controller
runs on every node and acts on its own node's objects only, so the nodes are independent, and a
bounded pool of workers (``ThreadPoolExecutor``, at most the rollout's ``maxParallel``; no
thread per node beyond it) each carries one node through all its rounds, its steps in the
order the plan gives them. A node's rounds: a GPU's VF steps are planned ahead of its enable
where the catalogue knows where its VFs appear (``plan/delegate.py`` ``plan_ahead``: one round
then), else only once pcidevices-controller has made their ``VGPUDevice`` objects, so after
each round the node is read (its own objects, ``observe_harvester_node``) and planned again,
until nothing is left to do, only steps a VM blocks remain, a round changes nothing, or
:data:`MAX_ROUNDS` rounds ran. When a GPU was enabled and its objects are not there yet, it
waits for them (bounded by the step timeout).

The rollout policy (:class:`~reconciler.model.desired.Rollout`: ``spec.rollout`` or the
command line's flags; :func:`pace` fills in the defaults): the first ``canary`` nodes (the
plans' order, nodes with steps only) run first, alone, and if any of them fails nothing else
is started; after them no new node is started once more than ``maxFailedNodes`` nodes failed,
while the ones under way finish. A node whose remaining steps a VM blocks is not a failure.
The nodes not started are reported (:attr:`Converged.not_started`).

It writes nothing itself: each node's steps go through
:class:`~reconciler.apply.delegate.DelegateExecutor`, which asks ``guard`` before every write
(the watch's leadership: a replica that lost its Lease stops before its next write), from
every worker; once it raised, no node is started. The requests' rate is bounded by whoever
passes ``api`` (``apply/throttle.py``, shared by every worker: the ``kubernetes`` client's
urllib3 pool is thread-safe, and the adapter keeps no per-request state).
"""

from __future__ import annotations

import enum
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from functools import partial
from types import MappingProxyType

from reconciler.apply.delegate import (
    DEFAULT_POLL,
    DEFAULT_TIMEOUT,
    DelegateExecutor,
    poll_delays,
)
from reconciler.apply.executor import Outcome, OutcomeStatus
from reconciler.catalog import Catalog
from reconciler.engine.rollout import (
    NodeEnded,
    NodeStarted,
    NodeState,
    NodeWaiting,
    RolloutEnded,
    RolloutEvent,
    RolloutStarted,
    StepEnded,
    StepStarted,
    applied,
)
from reconciler.model import Action, Desired, Plan, ReconcilerError
from reconciler.model.clusterapi import ClusterApi
from reconciler.model.desired import Rollout
from reconciler.model.record import field, record
from reconciler.observe.delegate import (
    devices_in_use,
    driver_not_ready,
    observe_harvester_node,
    observe_harvester_nodes,
)
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
    #: Each node's labels as read when it was planned (only when the desired state has node
    #: groups): a later round plans the node against the same groups.
    labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

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
    return DelegatePlans(tuple(plans), failures, labels)


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
    #: The failed step's outcome (``Result.FAILED``: the first failed node's, in node order).
    failed: Outcome | None = None
    #: Each node that ran, in the plans' node order.
    nodes: tuple[NodeRun, ...] = ()
    #: The nodes with steps that were not started (the rollout stopped first).
    not_started: tuple[str, ...] = ()
    #: Why the rollout stopped starting nodes ("" when it did not).
    stopped: str = ""
    #: The policy the rollout ran under.
    pace: Pace | None = None

    @property
    def failed_nodes(self) -> tuple[str, ...]:
        return tuple(r.node for r in self.nodes if r.failed_node)

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
    on_node: Callable[[NodeRun], None] | None = None,
    on_event: Callable[[RolloutEvent], None] | None = None,
    policy: Rollout | None = None,
    hold: bool | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Converged:
    """Apply ``desired`` through pcidevices-controller, node by node under ``policy``
    (module docstring; the default policy: :func:`pace`).

    ``first``: the plans already shown (the user confirmed them), else planned here.
    ``guard`` is called before every write, from every worker, and raises to stop the run
    there (no node is started after it did).
    ``on_round(plan, n)`` is told before a node's steps of round ``n`` run, ``on_outcome`` of
    each step's outcome and ``on_node`` of each node's end: with one worker as they happen;
    with several, a node's calls are held until it ends and then made together, one node at a
    time, so what is said of two nodes never interleaves. ``hold`` False: always as they happen,
    from the workers' threads (the watch: each log line is whole and names its object, and
    each outcome is a heartbeat ``/healthz`` must see when it happens).
    ``on_event`` is told of every turn of the rollout (``engine/rollout.py``) as it happens,
    whatever ``hold``, one event at a time.
    """
    plans = first if first is not None else plan_all(desired, api, catalog)
    emit = _Events(on_event, clock)
    if plans.failures:
        unplannable = Converged(Result.UNPLANNABLE, plans, ())
        emit(partial(RolloutEnded, result=unplannable.result.value, message=unplannable.message))
        return unplannable
    work = [p for p in plans.plans if p.actions]
    rollout = pace(policy, len(work))
    workers = min(rollout.parallel, len(work)) or 1
    live = workers == 1 if hold is None else not hold
    say = _Say(live, on_outcome, on_round, on_node)
    stop = _Stop(guard)
    node_labels = dict(plans.labels)
    canaries = {p.node for p in work[: rollout.canary]}
    emit(
        partial(
            RolloutStarted,
            nodes=tuple((p.node, len(p.actions)) for p in work),
            parallel=workers,
            canary=min(rollout.canary, len(work)),
            max_failed_nodes=rollout.max_failed_nodes,
        )
    )

    def run(plan: Plan) -> NodeRun:
        told = say.node()
        began = clock()
        emit(partial(NodeStarted, node=plan.node, canary=plan.node in canaries))
        done = _Node(
            desired,
            api,
            catalog,
            labels=node_labels.get(plan.node, {}),
            timeout=timeout,
            poll=poll,
            guard=stop.guard,
            on_outcome=told.outcome,
            on_round=told.round,
            clock=clock,
            sleep=sleep,
            emit=emit,
        ).converge(plan)
        ended = partial(
            NodeEnded,
            node=done.node,
            result=done.result.value,
            state=done.state,
            seconds=clock() - began,
            applied=applied(done.outcomes),
            message=done.message,
        )
        # After the node's held calls, with them: a log's line for the node follows its steps'.
        told.end(done, then=partial(emit, ended))
        return done

    runs: dict[str, NodeRun] = {}
    stopped = ""
    canary, rest = work[: rollout.canary], work[rollout.canary :]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vgpuctl-node") as pool:
        if canary:
            for done in _bounded(pool, run, canary, workers, lambda: False):
                runs[done.node] = done
            failed = [n for n in canary if runs[n.node].failed_node]
            if stop.raised:
                stopped = "the run was stopped"
            elif failed:
                stopped = (
                    f"the canary node{'s' * (len(canary) != 1)} "
                    f"{', '.join(n.node for n in canary)}: {failed[0].node} failed"
                )
        if not stopped:

            def halt() -> bool:
                return stop.raised or _failures(runs) > rollout.max_failed_nodes

            for done in _bounded(pool, run, rest, workers, halt):
                runs[done.node] = done
            if stop.raised:
                stopped = "the run was stopped"
            elif _failures(runs) > rollout.max_failed_nodes:
                stopped = (
                    f"{_failures(runs)} nodes failed, more than --max-failed-nodes "
                    f"{rollout.max_failed_nodes}"
                )
    ended = _gather(plans, runs, rollout, stopped)
    emit(
        partial(
            RolloutEnded,
            result=ended.result.value,
            message=ended.message,
            stopped=stopped,
            not_started=ended.not_started,
        )
    )
    return ended


def _bounded(
    pool: ThreadPoolExecutor,
    run: Callable[[Plan], NodeRun],
    plans: Sequence[Plan],
    workers: int,
    halt: Callable[[], bool],
) -> Iterator[NodeRun]:
    """Runs ``plans`` in order, at most ``workers`` at a time, starting none once ``halt()``;
    yields each node's run as it ends (the ones under way always finish)."""
    waiting = list(reversed(plans))
    running: set[Future[NodeRun]] = set()
    while waiting or running:
        while waiting and len(running) < workers and not halt():
            running.add(pool.submit(run, waiting.pop()))
        if not running:
            return
        finished, running = wait(running, return_when=FIRST_COMPLETED)
        for future in finished:
            yield future.result()


def _failures(runs: Mapping[str, NodeRun]) -> int:
    return sum(r.failed_node for r in runs.values())


def _gather(
    plans: DelegatePlans, runs: Mapping[str, NodeRun], rollout: Pace, stopped: str
) -> Converged:
    """One result for the whole rollout, each node's part in the plans' node order."""
    order = [p.node for p in plans.plans]
    last = tuple(runs[p.node].plan if p.node in runs else p for p in plans.plans)
    failures: dict[str, ReconcilerError] = {}
    for n in order:
        error = runs[n].error if n in runs else None
        if error is not None:
            failures[n] = error
    outcomes = tuple(o for n in order if n in runs for o in runs[n].outcomes)
    nodes = tuple(runs[n] for n in order if n in runs)
    not_started = tuple(p.node for p in plans.plans if p.actions and p.node not in runs)
    now = DelegatePlans(last, MappingProxyType(failures), plans.labels)
    done = partial(
        Converged,
        plans=now,
        outcomes=outcomes,
        nodes=nodes,
        not_started=not_started,
        stopped=stopped,
        pace=rollout,
    )
    results = {r.result for r in nodes}
    if Result.FAILED in results:
        failed = next(r for r in nodes if r.result is Result.FAILED)
        return done(Result.FAILED, failed=failed.failed)
    for result in (Result.UNPLANNABLE, Result.CONTROLLER_SILENT, Result.NOT_CONVERGED):
        if result in results:
            return done(result)
    if not_started:  # pragma: no cover - only a failure or a stop leaves nodes unstarted
        return done(Result.NOT_CONVERGED)
    if now.blocked:
        return done(Result.BLOCKED)
    return done(Result.CONVERGED)


@record(frozen=True, slots=True)
class NodeRun:
    """How one node's rounds ended (:class:`Result`, as :func:`converge`'s for one node)."""

    node: str
    result: Result
    #: The node's last plan: what is left.
    plan: Plan
    outcomes: tuple[Outcome, ...]
    #: The failed step's outcome (``Result.FAILED``).
    failed: Outcome | None = None
    #: Why the node could not be planned again (``Result.UNPLANNABLE``).
    error: ReconcilerError | None = None

    @property
    def failed_node(self) -> bool:
        """Counts as a failed node for the rollout: anything but converged or blocked (steps a
        VM blocks are no failure, and hold nothing up)."""
        return self.result not in (Result.CONVERGED, Result.BLOCKED)

    @property
    def state(self) -> NodeState:
        """Where the node ended, as a rollout's tally counts it (``engine/rollout.py``)."""
        if self.result is Result.CONVERGED:
            return NodeState.DONE
        return NodeState.BLOCKED if self.result is Result.BLOCKED else NodeState.FAILED

    @property
    def message(self) -> str:
        """One line: why the node failed, or what blocks it ("" when it converged)."""
        match self.result:
            case Result.CONVERGED:
                return ""
            case Result.BLOCKED:
                n = len(self.plan.blocked)
                first = self.plan.blocked[0] if self.plan.blocked else None
                why = f": {first.kind.value} {first.target}: {first.reason}" if first else ""
                return f"{n} blocked step{'s' * (n != 1)}{why}"
            case Result.FAILED:
                f = self.failed
                return "a step failed" if f is None else (
                    f"{f.action.kind.value} {f.action.target}: {f.message}"
                )  # fmt: skip
            case Result.UNPLANNABLE:
                return self.error.message if self.error is not None else "could not be planned"
            case Result.CONTROLLER_SILENT:
                return "pcidevices-controller made no VGPUDevices in time"
            case Result.NOT_CONVERGED:
                n = len(self.plan.actions)
                return f"{n} step{'s' * (n != 1)} left after {MAX_ROUNDS} rounds"


@record
class _Node:
    """One worker's node: its rounds, each its plan's steps then its plan made again."""

    desired: Desired
    api: ClusterApi
    catalog: Catalog
    labels: Mapping[str, str]
    timeout: float
    poll: float
    guard: Callable[[], None]
    on_outcome: Callable[[Outcome], None]
    on_round: Callable[[Plan, int], None]
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    emit: _Events

    def converge(self, plan: Plan) -> NodeRun:
        outcomes: list[Outcome] = []
        node = plan.node

        def step_started(round_number: int, action: Action) -> None:
            self.emit(partial(StepStarted, node=node, action=action, round=round_number))

        def step_ended(outcome: Outcome) -> None:
            self.emit(partial(StepEnded, node=node, outcome=outcome))
            self.on_outcome(outcome)

        for round_number in range(1, MAX_ROUNDS + 1):
            self.on_round(plan, round_number)
            executor = DelegateExecutor(
                self.api,
                used_by=partial(devices_in_use, self.api, node),
                timeout=self.timeout,
                poll=self.poll,
                clock=self.clock,
                sleep=self.sleep,
                on_outcome=step_ended,
                on_step=partial(step_started, round_number),
                guard=self.guard,
                driver=partial(driver_not_ready, self.api, node),
            )
            result = executor.run(plan)
            outcomes.extend(result.outcomes)
            if result.failed is not None:
                return NodeRun(node, Result.FAILED, plan, tuple(outcomes), result.failed)
            try:
                plan = self.plan(node)
                if not plan.actions and waits_for_controller(plan):
                    plan = self.wait_for_controller(node)
            except ReconcilerError as e:
                return NodeRun(node, Result.UNPLANNABLE, plan, tuple(outcomes), error=e)
            if not plan.actions or not result.outcomes:
                break
        if waits_for_controller(plan):
            return NodeRun(node, Result.CONTROLLER_SILENT, plan, tuple(outcomes))
        if plan.actions:
            return NodeRun(node, Result.NOT_CONVERGED, plan, tuple(outcomes))
        if plan.blocked:
            return NodeRun(node, Result.BLOCKED, plan, tuple(outcomes))
        return NodeRun(node, Result.CONVERGED, plan, tuple(outcomes))

    def plan(self, node: str) -> Plan:
        """The node observed now (its objects only) and planned."""
        wanted = self.desired.node(node, self.labels)
        if wanted is None:  # pragma: no cover - the node was planned from this desired state
            raise ReconcilerError(f"node {node} is no longer in the desired state")
        observed = observe_harvester_node(self.api, node)
        return plan_delegate(wanted, observed, catalog=self.catalog)

    def wait_for_controller(self, node: str) -> Plan:
        """Plans again until no GPU waits for pcidevices-controller's objects, or the timeout."""
        deadline = self.clock() + self.timeout
        self.emit(
            partial(
                NodeWaiting,
                node=node,
                reason="waiting for pcidevices-controller to make the VGPUDevice objects",
            )
        )
        for delay in poll_delays(self.poll):
            plan = self.plan(node)
            if not waits_for_controller(plan) or self.clock() >= deadline:
                return plan
            self.sleep(delay)
        raise AssertionError("unreachable: poll_delays never ends")  # pragma: no cover


@record(frozen=True, slots=True)
class Pace:
    """A rollout policy made whole (:func:`pace`)."""

    parallel: int
    canary: int
    max_failed_nodes: int


#: The share of the nodes to change that may change at once when nothing says how many: a
#: Deployment's rolling update allows 25 % of its pods unavailable by default
#: (``maxUnavailable``), the same share of a fleet's nodes here.
DEFAULT_PARALLEL_SHARE = 0.25


def pace(policy: Rollout | None, nodes: int) -> Pace:
    """``policy`` (a command line's flags over the desired state's ``spec.rollout``) with a
    default for each field not given: a quarter of the ``nodes`` to change at once (at least
    one, :data:`DEFAULT_PARALLEL_SHARE`), no canary, no failed node tolerated (the first
    failure stops new nodes, as a run before rollouts stopped at it)."""
    policy = policy or Rollout()
    parallel = policy.max_parallel
    if parallel is None:
        parallel = max(1, math.ceil(nodes * DEFAULT_PARALLEL_SHARE))
    return Pace(
        parallel=max(1, parallel),
        canary=max(0, policy.canary or 0),
        max_failed_nodes=max(0, policy.max_failed_nodes or 0),
    )


class _Stop:
    """The guard every worker asks before a write; remembers that it raised (the watch lost its
    Lease or is stopping), so that no node is started after."""

    def __init__(self, guard: Callable[[], None] | None) -> None:
        self._guard = guard
        self._raised = threading.Event()

    @property
    def raised(self) -> bool:
        return self._raised.is_set()

    def guard(self) -> None:
        if self._guard is None:
            return
        try:
            self._guard()
        except BaseException:
            self._raised.set()
            raise


class _Events:
    """``converge``'s ``on_event``: each event stamped with the clock and told one at a time
    (the workers' events never overlap), or nothing when no one listens."""

    def __init__(
        self, on_event: Callable[[RolloutEvent], None] | None, clock: Callable[[], float]
    ) -> None:
        self.on_event = on_event
        self.clock = clock
        self.lock = threading.Lock()

    def __call__(self, make: Callable[..., RolloutEvent]) -> None:
        if self.on_event is None:
            return
        with self.lock:
            self.on_event(make(at=self.clock()))


class _Say:
    """What :func:`converge` tells its caller, live with one worker, else a node at a time."""

    def __init__(
        self,
        live: bool,
        on_outcome: Callable[[Outcome], None] | None,
        on_round: Callable[[Plan, int], None] | None,
        on_node: Callable[[NodeRun], None] | None,
    ) -> None:
        self.live = live
        self.on_outcome = on_outcome
        self.on_round = on_round
        self.on_node = on_node
        self.lock = threading.Lock()

    def node(self) -> _Told:
        return _Told(self)


class _Told:
    """One node's calls: made at once (live), or held until the node ends."""

    def __init__(self, say: _Say) -> None:
        self.say = say
        self.held: list[Callable[[], None]] = []

    def _call(self, call: Callable[[], None]) -> None:
        if self.say.live:
            call()
        else:
            self.held.append(call)

    def outcome(self, outcome: Outcome) -> None:
        if self.say.on_outcome is not None:
            self._call(partial(self.say.on_outcome, outcome))

    def round(self, plan: Plan, number: int) -> None:
        if self.say.on_round is not None:
            self._call(partial(self.say.on_round, plan, number))

    def end(self, run: NodeRun, *, then: Callable[[], None] | None = None) -> None:
        """The node ended: its held calls are made, then ``then``, together."""
        if self.say.on_node is not None:
            self._call(partial(self.say.on_node, run))
        with self.say.lock:
            for call in self.held:
                call()
            if then is not None:
                then()
        self.held.clear()
