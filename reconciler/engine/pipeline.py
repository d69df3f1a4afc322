"""One reconcile of one node: the single pipeline ``vgpuctl apply`` and ``vgpuctl watch`` both run.

observe → plan → lock → plan again under the lock → allow-list phase → host phase → observe the
host again → cluster phase → device plugins → verify.

- **Under the lock** the node is planned again: another process may have acted meanwhile. A
  promise (a saved plan's actions, :class:`~reconciler.engine.expect.Expected`) is checked
  against that fresh plan and the run refused, naming the difference, unless it does the same.
  ``review`` (the CLI's display and confirmation, watch's log) sees the plan that will run.
  A caller that took the lock before planning (``apply``) passes ``lock_held``: its first plan
  is then the one under the lock.
- **Allow-list phase**: the plan's ``kubevirt-allow``, the KubeVirt allow-list's additions,
  through the cluster executor and its mandate, before any host action: KubeVirt's
  virt-handler removes every mdev whose type is not allow-listed (docs/domain.md §10), so a
  type is listed before its first vGPU is created; first of all, the types it creates that
  the node's VGPUNodeState does not show are published there (its ``intent``). If it fails,
  nothing else runs. (Removals
  wait for the cluster phase, after the host phase: ``plan/cluster.py``.)
- **Host phase**: the host actions, through the host executor and its mandate.
- **The host again**: the cluster actions were rendered from the host as the host actions were
  predicted to leave it. With a cluster, the host is observed and compared with that
  prediction (``predicted.py``); if it differs the run stops there and says how, with no
  cluster write: the cluster actions shown are never silently re-planned. (Without one, the
  verification says whether the host is where it should be.)
- **Cluster phase**: exactly the plan's CR and KubeVirt writes, each carrying the
  resourceVersion it was planned from. A 409 on one object is the one place a write is planned
  again: that object is read again and re-planned (``replan_object``), the rewrite checked
  against the run's mandate (``ClusterMandate.check_rewrite``), and the outcome's message says
  so. Failing instead would turn every concurrent status write (Harvester's UI, another
  vgpuctl) into a failed apply, and the rewrite can do nothing the mandate does not allow.
  Events for the host actions follow.
- **Device plugins** (in-process runs only): told the host as observed after the host phase
  and the vGPUs the run removed, from the host executor's outcomes.
- **Verify**: plan again. A status is a mirror of the host, and a plan can only predict some
  of it (the type ids the driver lists once SR-IOV is on, which types remain creatable, who
  holds a vGPU now): status-only updates of our objects left by the verification are written
  then, as their own named outcomes (:attr:`Verification.refreshed`). Anything else left is
  "not converged".

**Rollout budget** (node agents with a cluster, ``spec.rollout.maxParallel`` given: the
desired node's ``max_parallel``): a plan with a host action runs only while this node holds one
of the fleet's rollout slots (``budget``, ``apply/slots.py``), taken under the lock after the
plan, held (renewed) through the host phase and released when the run ends, however it ends. A
plan with only cluster writes, or none, takes no slot. No free slot: the budget raises (a
transient error: the watch requeues) or, for ``apply``, waits; a node that waited plans again
before acting (the host may have changed meanwhile). The host executor asks the slot before
each host action: a slot not renewed for its renew deadline stops the run there.

A cluster that cannot be read stops the run before any host action. So does one where
Harvester's pcidevices-controller runs, or might (``observe/harvester.py``): every plan the run
acts on is checked first, and the run refused with ``ForeignControllerError`` before the lock,
a host write or a cluster write, even when there is nothing to do (the refusal is the news).
Failures of actions are outcomes in the result; refusals (another controller, a broken promise,
a mandate violated, the lock held) raise. The engine never prints and never exits.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence
from functools import partial

from reconciler.apply.cluster import execute_cluster, record_host_events
from reconciler.apply.executor import ApplyResult, Outcome, OutcomeStatus, execute
from reconciler.apply.journal import Journal
from reconciler.apply.lock import NodeLock
from reconciler.apply.mandate import ClusterMandate, HostMandate, InUse
from reconciler.engine.expect import Expected
from reconciler.engine.observe import Planned, observe_and_plan
from reconciler.engine.ports import DevicePlugins, NodePorts, RolloutBudget, RolloutSlot
from reconciler.engine.predicted import host_differences
from reconciler.model import (
    Action,
    ActionKind,
    ApplyError,
    CrUpdate,
    DesiredNode,
    ForeignControllerError,
    Inventory,
    ObserveError,
    PciAddress,
    Phase,
    Plan,
    ReconcilerError,
    VgpuRemove,
)
from reconciler.model.record import field, record, replace
from reconciler.observe.parse import NVIDIA_VENDOR_ID
from reconciler.plan.groups import resolve as resolve_groups

#: How many differences a stop on an unexpected host names before "… and N more".
DIFFERENCES_SHOWN = 5


@record(frozen=True, slots=True)
class RunSettings:
    #: Take over objects another controller manages (``--adopt``).
    adopt: bool = False
    #: Run the removals that only make room for creates that must wait (``--partial``).
    partial: bool = False
    #: How long the host executor waits for an action's effect to show.
    verify_timeout: float = 120.0
    #: What the node lock says holds it.
    command: str = "vgpuctl apply"


class Convergence(enum.StrEnum):
    """What a plan made after the run says."""

    CONVERGED = "converged"
    #: Only changes a VM blocks remain.
    BLOCKED = "blocked"
    NOT_CONVERGED = "not_converged"


@record(frozen=True, slots=True)
class HostMismatch:
    """The host after the host phase is not the one the cluster actions were planned for."""

    differences: tuple[str, ...]

    @property
    def message(self) -> str:
        shown = list(self.differences[:DIFFERENCES_SHOWN])
        if len(self.differences) > DIFFERENCES_SHOWN:
            shown.append(f"… and {len(self.differences) - DIFFERENCES_SHOWN} more")
        return (
            "the host after the host actions is not what the plan's cluster actions were planned "
            f"for: {'; '.join(shown)}. No cluster object was written; run again to plan from "
            "the host as it is (something else changed it meanwhile, or the driver did not do "
            "what it was asked)"
        )


@record(frozen=True, slots=True)
class PluginsTold:
    """What the device plugins were told, and whether they took it."""

    inventory: Inventory
    removed: frozenset[str]
    #: The plugins' own failure (never the run's): the caller reports it.
    error: Exception | None = None


@record(frozen=True, slots=True)
class Verification:
    """The node planned again after the run."""

    planned: Planned
    verdict: Convergence
    #: Status-only updates the verification found and wrote (None: none were needed).
    refreshed: ApplyResult | None = None

    @property
    def remaining(self) -> Plan:
        """What is left to do once the refreshed statuses are written."""
        plan = self.planned.plan
        if self.refreshed is not None and self.refreshed.ok:
            return replace(plan, actions=())
        return plan


@record(frozen=True, slots=True)
class Reconciled:
    """How one run of the pipeline went."""

    #: The plan the run acted on (made under the lock), or the one that found nothing to do.
    planned: Planned
    #: False: nothing to do, or ``review`` stopped the run before it acted.
    ran: bool
    seconds: float
    host: ApplyResult | None = None
    #: The allow-list phase (None: the plan had no kubevirt-allow).
    allow_list: ApplyResult | None = None
    #: The host as observed after the host phase (None: no host action, or unreadable).
    host_after: Inventory | None = None
    mismatch: HostMismatch | None = None
    cluster: ApplyResult | None = None
    plugins: PluginsTold | None = None
    verification: Verification | None = None

    @property
    def results(self) -> tuple[ApplyResult, ...]:
        refreshed = self.verification.refreshed if self.verification else None
        phases = (self.allow_list, self.host, self.cluster, refreshed)
        return tuple(r for r in phases if r is not None)

    @property
    def failed(self) -> Outcome | None:
        for result in self.results:
            if result.failed is not None:
                return result.failed
        return None

    @property
    def ok(self) -> bool:
        """Every action carried out (or found done), and the host as predicted."""
        return self.failed is None and self.mismatch is None

    @property
    def applied(self) -> int:
        """The plan's host and cluster actions carried out, or found already done."""
        results = tuple(r for r in (self.allow_list, self.host, self.cluster) if r is not None)
        return sum(
            1
            for r in results
            for o in r.outcomes
            if o.status in (OutcomeStatus.DONE, OutcomeStatus.NOOP)
        )

    @property
    def done(self) -> int:
        """Writes carried out (not found already done), refreshed statuses included."""
        return sum(o.status is OutcomeStatus.DONE for r in self.results for o in r.outcomes)

    @property
    def refreshes(self) -> tuple[Action, ...]:
        """The plan's device-plugin refreshes (profiles whose device set changes)."""
        return tuple(
            a for a in self.planned.plan.actions if a.kind is ActionKind.DEVICE_PLUGIN_REFRESH
        )

    @property
    def removed(self) -> frozenset[str]:
        """The vGPUs this run removed (or found removed), from the host executor's outcomes."""
        return removed_vgpus(self.host.outcomes) if self.host is not None else frozenset()


def reconcile(
    ports: NodePorts,
    desired: DesiredNode,
    *,
    settings: RunSettings | None = None,
    expected: Expected | None = None,
    review: Callable[[Planned], bool] | None = None,
    on_outcome: Callable[[Outcome], None] | None = None,
    plugins: DevicePlugins | None = None,
    lock_held: bool = False,
    budget: RolloutBudget | None = None,
) -> Reconciled:
    """Run the pipeline once for ``desired`` (see the module docstring).

    Without ``lock_held`` the node is observed and planned first, and the lock is taken only
    when there is something to do (raises ``LockHeldError`` when another process has it).
    ``review`` is called under the lock with the plan about to run (even an empty one); False
    stops the run there, with nothing done. Raises ``ApplyError`` when the fresh plan breaks
    ``expected``, ``MandateError`` when an action is outside what the run may touch, and the
    observer's and planner's errors. ``budget``: the fleet's rollout slots (see the module
    docstring); its ``acquire`` raises when no slot is free.
    """
    settings = settings or RunSettings()
    started = time.monotonic()
    if lock_held:
        run = _Run(ports, desired, settings, plugins, on_outcome, started, budget=budget)
        return run.locked(expected, review)
    try:
        first: Planned | None = observe_and_plan(
            ports, desired, adopt=settings.adopt, partial=settings.partial
        )
    except ObserveError:
        # Perhaps a process holding the lock is changing the host right now (VFs vanishing
        # mid-scan): look again under the lock, which says so if it is held.
        first = None
    if first is not None:
        refuse_if_another_controller(first)
    run = _Run(ports, desired, settings, plugins, on_outcome, started, budget=budget)
    if first is not None and not first.plan.actions and expected is None:
        return run.nothing_to_do(first)
    with NodeLock(ports.state_dir, ports.node, command=settings.command):
        return run.locked(expected, review)


def carry_out(
    ports: NodePorts,
    desired: DesiredNode,
    planned: Planned,
    *,
    settings: RunSettings | None = None,
    on_outcome: Callable[[Outcome], None] | None = None,
    plugins: DevicePlugins | None = None,
) -> Reconciled:
    """The acting half of :func:`reconcile`: host phase, the host checked against the
    prediction, cluster phase, device plugins, verification, for ``planned``, a plan the
    caller made under the node lock it holds. :func:`reconcile` is the way in; this is its
    second half on its own, for a caller (a test) that needs to hand the executors a plan.
    Whatever the plan says, the executors hold it to the mandate built here from ``desired``
    and the observation ``planned`` carries."""
    run = _Run(ports, desired, settings or RunSettings(), plugins, on_outcome, time.monotonic())
    return run.act(planned)


def refuse_if_another_controller(planned: Planned) -> None:
    """Raise ``ForeignControllerError`` when Harvester's pcidevices-controller runs, or the
    cluster would not say whether it does (see ``observe/harvester.py``)."""
    controller = planned.controller
    if controller is not None and controller.refuses:
        raise ForeignControllerError(
            f"refusing to change node {planned.plan.node}: {controller.reason}"
        )


def removed_vgpus(outcomes: Sequence[Outcome]) -> frozenset[str]:
    """The UUIDs of the vGPUs the host executor removed (or found already gone)."""
    removed = set()
    for outcome in outcomes:
        action = outcome.action
        if isinstance(action, VgpuRemove) and outcome.status in (
            OutcomeStatus.DONE,
            OutcomeStatus.NOOP,
        ):
            removed.add(action.uuid.lower())
    return frozenset(removed)


@record
class _Run:
    ports: NodePorts
    desired: DesiredNode
    settings: RunSettings
    plugins: DevicePlugins | None
    on_outcome: Callable[[Outcome], None] | None
    started: float
    #: resourceVersion planned from → the one this run's own write of that object made (the
    #: allow-list phase's KubeVirt write, then the cluster phase's removals planned from the
    #: same version): the cluster executor's way to tell its own write from someone else's.
    versions: dict[str, str] = field(default_factory=dict)
    budget: RolloutBudget | None = None
    #: The rollout slot held while the host changes (None: none needed, or none yet).
    slot: RolloutSlot | None = None

    def locked(
        self, expected: Expected | None, review: Callable[[Planned], bool] | None
    ) -> Reconciled:
        planned = observe_and_plan(
            self.ports, self.desired, adopt=self.settings.adopt, partial=self.settings.partial
        )
        refuse_if_another_controller(planned)
        max_parallel = self.desired.max_parallel
        if (
            self.budget is None
            or max_parallel is None
            or self.ports.cluster_api is None
            or not any(a.kind.is_host for a in planned.plan.actions)
        ):
            return self._decide(planned, expected, review)
        try:
            self.slot = self.budget.acquire(max_parallel)
            if self.slot.waited:
                # The host (or the cluster) may have changed while this node waited.
                planned = observe_and_plan(
                    self.ports,
                    self.desired,
                    adopt=self.settings.adopt,
                    partial=self.settings.partial,
                )
                refuse_if_another_controller(planned)
            return self._decide(planned, expected, review)
        finally:
            if self.slot is not None:
                self.slot.release()

    def _decide(
        self,
        planned: Planned,
        expected: Expected | None,
        review: Callable[[Planned], bool] | None,
    ) -> Reconciled:
        if expected is not None:
            expected.check(planned.plan, adopt=self.settings.adopt)
        if review is not None and not review(planned):
            return Reconciled(planned, ran=False, seconds=self._seconds())
        if not planned.plan.actions:
            return self.nothing_to_do(planned)
        return self.act(planned)

    def nothing_to_do(self, planned: Planned) -> Reconciled:
        told = self._tell_plugins(planned.inventory, frozenset())
        return Reconciled(planned, ran=False, seconds=self._seconds(), plugins=told)

    def act(self, planned: Planned) -> Reconciled:
        refuse_if_another_controller(planned)
        ports, plan = self.ports, planned.plan
        # The mandate is the run's own desired state (its node groups' entries made the GPUs
        # of the host they match), whatever the plan says.
        desired = resolve_groups(self.desired, planned.inventory)
        managed = frozenset(g.address for g in desired.gpus)
        allow_actions = [a for a in plan.actions if a.phase is Phase.ALLOW_LIST]
        allowed = None
        if allow_actions:
            # Before any host action, or the types it creates are swept as they appear. A
            # plan made without a cluster has none (its mandate would refuse one).
            allowed = self._write_cluster(allow_actions, planned, managed, run_id="")
            if not allowed.ok:
                return Reconciled(planned, ran=True, seconds=self._seconds(), allow_list=allowed)
        host_actions = tuple(a for a in plan.actions if a.kind.is_host)
        host = execute(
            replace(plan, actions=host_actions),
            driver=ports.driver(),
            journal=Journal(ports.state_dir, plan.node),
            verify_timeout=self.settings.verify_timeout,
            on_outcome=self.on_outcome,
            mandate=HostMandate(
                managed=managed,
                nvidia=frozenset(
                    g.address for g in planned.inventory.gpus if g.vendor_id == NVIDIA_VENDOR_ID
                ),
                in_use=_in_use(ports, planned),
            ),
            guard=None if self.slot is None else self.slot.guard,
        )
        removed = removed_vgpus(host.outcomes)
        after: Inventory | None = planned.inventory
        if host_actions:
            after = self._observe_after(host.ok)
        mismatch = None
        if host.ok and after is not None and host_actions and ports.cluster_api is not None:
            # Without a cluster there is nothing planned from the prediction to protect: the
            # verification says whether the host is where it should be.
            mismatch = self._check_prediction(planned, host_actions, after, managed)
        cluster = None
        if host.ok and mismatch is None and ports.cluster_api is not None:
            cluster = self._cluster_phase(planned, host, managed)
        told = self._tell_plugins(after, removed) if after is not None else None
        verification = None
        if host.ok and mismatch is None and (cluster is None or cluster.ok):
            verification = self._verify(managed, last_seq=plan.actions[-1].seq)
        return Reconciled(
            planned,
            ran=True,
            seconds=self._seconds(),
            host=host,
            allow_list=allowed,
            host_after=after if host_actions else None,
            mismatch=mismatch,
            cluster=cluster,
            plugins=told,
            verification=verification,
        )

    def _observe_after(self, host_ok: bool) -> Inventory | None:
        """The host after the host phase. Unreadable after a failed phase: the failure is what
        the run reports (and the plugins are not told)."""
        try:
            return self.ports.observe_host(availability=self.ports.cluster_api is not None)
        except ReconcilerError:
            if host_ok:
                raise
            return None

    def _check_prediction(
        self,
        planned: Planned,
        host_actions: Sequence[Action],
        after: Inventory,
        managed: frozenset[PciAddress],
    ) -> HostMismatch | None:
        from reconciler.plan import predict_inventory

        predicted = predict_inventory(planned.inventory, host_actions, catalog=self.ports.catalog)
        differences = host_differences(predicted, after, managed=managed)
        return HostMismatch(differences) if differences else None

    def _cluster_phase(
        self, planned: Planned, host: ApplyResult, managed: frozenset[PciAddress]
    ) -> ApplyResult:
        plan = planned.plan
        result = self._write_cluster(
            [a for a in plan.actions if a.phase is Phase.CLUSTER], planned, managed, host.run_id
        )
        if self.ports.events is not None:
            record_host_events(
                host.outcomes, node=plan.node, events=self.ports.events, blocked=plan.blocked
            )
        return result

    def _write_cluster(
        self,
        actions: Sequence[Action],
        planned: Planned,
        managed: frozenset[PciAddress],
        run_id: str,
    ) -> ApplyResult:
        from reconciler.plan import replan_object

        api = self.ports.cluster_api
        if api is None:
            raise ApplyError("the plan writes to the cluster, and the run has none")
        node = planned.plan.node
        adopt = self.settings.adopt
        return execute_cluster(
            actions,
            api=api,
            events=self.ports.events,
            replan=partial(replan_object, adopt=adopt),
            node=node,
            run_id=run_id,
            on_outcome=self.on_outcome,
            mandate=_cluster_mandate(planned, node, managed=managed, adopt=adopt),
            versions=self.versions,
        )

    def _tell_plugins(self, inventory: Inventory, removed: frozenset[str]) -> PluginsTold | None:
        if self.plugins is None:
            return None
        try:
            self.plugins.update(inventory, removed_on_purpose=removed)
        except Exception as exc:  # the plugins' failure is reported, never the run's
            return PluginsTold(inventory, removed, exc)
        return PluginsTold(inventory, removed)

    def _verify(self, managed: frozenset[PciAddress], *, last_seq: int) -> Verification:
        after = observe_and_plan(
            self.ports, self.desired, adopt=self.settings.adopt, partial=self.settings.partial
        )
        actions = after.plan.actions
        refreshed = None
        if actions and self.ports.cluster_api is not None and all(map(_status_only, actions)):
            # Renumbered after the plan's own, so progress lines never repeat a number.
            numbered = [replace(a, seq=last_seq + i) for i, a in enumerate(actions, start=1)]
            refreshed = self._write_cluster(numbered, after, managed, run_id="")
            if refreshed.ok:
                actions = ()
        if actions:
            verdict = Convergence.NOT_CONVERGED
        elif after.plan.blocked:
            verdict = Convergence.BLOCKED
        else:
            verdict = Convergence.CONVERGED
        return Verification(after, verdict, refreshed)

    def _seconds(self) -> float:
        return time.monotonic() - self.started


def _status_only(action: Action) -> bool:
    """An update of one of our objects' status alone: a mirror of the host, nothing decided."""
    if not isinstance(action, CrUpdate):
        return False
    return (
        not action.spec_changed
        and not action.drift
        and not action.adopt
        and all(c.path.startswith("status") for c in action.changes)
    )


def _in_use(ports: NodePorts, planned: Planned) -> InUse:
    """Who uses a vGPU at the moment of acting: a process of the host (asked now), the pod the
    kubelet allocated it to since the plan's observation (its checkpoint, read now), or, per the
    cluster as observed for the plan, a VM (the cluster's own view of a pod that was already
    there: a finished pod's stale allocation, which the plan rightly ignored, stays ignored)."""
    from reconciler.plan.uses import cluster_holder

    def in_use(vf: PciAddress, uuid: str, type_name: str) -> str | None:
        holder = ports.process_holder(vf, uuid)
        if holder is not None:
            return holder
        if planned.cluster is not None:
            holder = cluster_holder(planned.cluster, uuid, type_name)
            if holder is not None:
                return holder
        pods = ports.allocations().get(uuid, frozenset())
        if planned.cluster is not None:
            pods = pods - planned.allocations.get(uuid, frozenset())
        if pods:
            return f"pod {min(pods)} (allocated by the kubelet)"
        return None

    return in_use


def _cluster_mandate(
    planned: Planned, node: str, *, managed: frozenset[PciAddress], adopt: bool
) -> ClusterMandate:
    if planned.cluster is None:
        # Planned without a cluster: no object and no KubeVirt CR may be written.
        return ClusterMandate(node=node, managed=managed, adopt=adopt)
    return ClusterMandate.observed(
        planned.cluster, managed=managed, adopt=adopt, inventory=planned.inventory
    )
