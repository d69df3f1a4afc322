"""One reconcile of one node, shared by ``vgpuctl apply`` and the watch loop.

observe (host, then cluster) → plan → under the node lock: host actions, then the CR and
KubeVirt writes planned again from the host as it now is, then Events and device-plugin
refreshes. A cluster that cannot be read stops the reconcile before any host action: host
actions never run on the strength of cluster data that could not be read.

Both executors get a mandate (``mandate.py``) built here from the desired state and the
observation the plan came from: what the run may touch, checked by the executors themselves,
whatever plan they are handed.

The parts of a node (how to observe it, its driver, its cluster) come in as :class:`NodePorts`;
this module composes them and decides nothing about where they come from.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from reconciler.apply.cluster import EventSink, execute_cluster, record_host_events
from reconciler.apply.executor import ApplyResult, Outcome, OutcomeStatus, execute
from reconciler.apply.journal import Journal
from reconciler.apply.lock import NodeLock
from reconciler.apply.mandate import ClusterMandate, HostMandate, InUse
from reconciler.apply.ports import HostDriver
from reconciler.catalog import Catalog
from reconciler.model import Action, ActionKind, DesiredNode, Inventory, PciAddress, Plan
from reconciler.model.cluster import ClusterState
from reconciler.model.clusterapi import ClusterApi
from reconciler.observe.parse import NVIDIA_VENDOR_ID

#: The cluster writes, run by the cluster executor after the host actions.
CLUSTER_KINDS = frozenset(
    {ActionKind.CR_CREATE, ActionKind.CR_UPDATE, ActionKind.CR_DELETE, ActionKind.KUBEVIRT_UPDATE}
)


@dataclass(frozen=True, slots=True)
class NodePorts:
    """Everything a reconcile of one node needs from the outside world."""

    node: str
    catalog: Catalog
    state_dir: Path
    observe_host: Callable[[], Inventory]
    #: None: no cluster configured (node-local).
    observe_cluster: Callable[[], ClusterState | None]
    #: Without a cluster: the kubelet checkpoint's allocations (None when there is none).
    kubelet_uses: Callable[[], ClusterState | None]
    driver: Callable[[], HostDriver]
    #: Which process of the host holds the mdev ``uuid`` on ``vf`` now; None: none does.
    process_holder: Callable[[PciAddress, str], str | None]
    #: The kubelet checkpoint's vGPU allocations now: device ID → the pods it is given to.
    allocations: Callable[[], Mapping[str, frozenset[str]]]
    cluster_api: ClusterApi | None = None
    events: EventSink | None = None


@dataclass(frozen=True, slots=True)
class Planned:
    """One observation of the node (host, and cluster when configured) and its plan."""

    inventory: Inventory
    cluster: ClusterState | None
    plan: Plan
    #: The kubelet's vGPU allocations (device ID → pods) read just before the observation: an
    #: allocation found at the moment of acting that is not here was made since.
    allocations: Mapping[str, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))


def plan_for(ports: NodePorts, desired: DesiredNode, *, adopt: bool = False) -> Planned:
    """Observe the host and the cluster, then plan. A cluster that cannot be read raises here,
    before anything could act on the strength of what it did not say."""
    from reconciler.plan import plan_node
    from reconciler.plan.uses import mark_cluster_uses

    allocations = ports.allocations()
    inventory = ports.observe_host()
    cluster = ports.observe_cluster()
    planned_from = inventory
    if cluster is None:
        uses = ports.kubelet_uses()
        if uses is not None:
            planned_from = mark_cluster_uses(inventory, uses)
    plan = plan_node(desired, planned_from, catalog=ports.catalog, cluster=cluster, adopt=adopt)
    return Planned(inventory, cluster, plan, MappingProxyType(dict(allocations)))


@dataclass(frozen=True, slots=True)
class ApplyReport:
    host: ApplyResult
    cluster: ApplyResult | None
    #: The device-plugin refreshes the plan asked for (done by ``refresh`` when given).
    refreshes: tuple[Action, ...]
    seconds: float

    @property
    def failed(self) -> Outcome | None:
        return self.host.failed or (self.cluster.failed if self.cluster else None)

    @property
    def ok(self) -> bool:
        return self.failed is None

    @property
    def applied(self) -> int:
        """Host and cluster actions carried out, or found already done."""
        results = (self.host, self.cluster) if self.cluster else (self.host,)
        return sum(
            1
            for r in results
            for o in r.outcomes
            if o.status in (OutcomeStatus.DONE, OutcomeStatus.NOOP)
        )


def apply_plan(
    planned: Planned,
    desired: DesiredNode,
    ports: NodePorts,
    *,
    adopt: bool = False,
    verify_timeout: float = 120.0,
    on_outcome: Callable[[Outcome], None] | None = None,
    refresh: Callable[[Sequence[Action]], None] | None = None,
    command: str = "vgpuctl apply",
    locked: bool = False,
) -> ApplyReport:
    """Carry out ``planned.plan`` under the node lock (raises ``LockHeldError`` when another
    apply has it; ``locked``: the caller already holds it, having taken it before observing):
    host actions, then cluster writes re-planned from the host as it now is, then Events and
    device-plugin refreshes. Stops at the first failure.

    ``planned`` is the plan with the observation it was made from, and ``desired`` the desired
    state it was made for: together they are the executors' mandate (GPUs the desired state
    names, this node's own objects as observed, vGPUs nobody uses at the moment of acting),
    whatever the plan's actions say. Raises ``MandateError`` when an action is outside it."""
    started = time.monotonic()
    plan = planned.plan
    host_actions = tuple(a for a in plan.actions if a.kind.is_host)
    refreshes = tuple(a for a in plan.actions if a.kind is ActionKind.DEVICE_PLUGIN_REFRESH)
    managed = frozenset(g.address for g in desired.gpus)
    cluster_result: ApplyResult | None = None
    lock = nullcontext() if locked else NodeLock(ports.state_dir, plan.node, command=command)
    with lock:
        journal = Journal(ports.state_dir, plan.node)
        host_result = execute(
            replace(plan, actions=host_actions),
            driver=ports.driver(),
            journal=journal,
            verify_timeout=verify_timeout,
            on_outcome=on_outcome,
            mandate=HostMandate(
                managed=managed,
                nvidia=frozenset(
                    g.address for g in planned.inventory.gpus if g.vendor_id == NVIDIA_VENDOR_ID
                ),
                in_use=_in_use(ports, planned),
            ),
        )
        if host_result.ok and ports.cluster_api is not None:
            # CR statuses were planned from a prediction of the host; plan them again from
            # what the host now is, and from the cluster as it now is.
            cluster_planned = plan_for(ports, desired, adopt=adopt) if host_actions else planned
            cluster_result = _apply_cluster(
                cluster_planned, host_result, ports, managed=managed, adopt=adopt,
                on_outcome=on_outcome,
            )  # fmt: skip
        if host_result.ok and refresh is not None and refreshes:
            refresh(refreshes)
    return ApplyReport(host_result, cluster_result, refreshes, time.monotonic() - started)


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


def _apply_cluster(
    planned: Planned,
    host_result: ApplyResult,
    ports: NodePorts,
    *,
    managed: frozenset[PciAddress],
    adopt: bool,
    on_outcome: Callable[[Outcome], None] | None,
) -> ApplyResult:
    from functools import partial

    from reconciler.plan import replan_object

    plan = planned.plan
    api = ports.cluster_api
    if api is None:  # pragma: no cover - the caller checked
        raise ValueError("no cluster")
    actions = [a for a in plan.actions if a.kind in CLUSTER_KINDS]
    result = execute_cluster(
        actions,
        api=api,
        events=ports.events,
        replan=partial(replan_object, adopt=adopt),
        node=plan.node,
        run_id=host_result.run_id,
        on_outcome=on_outcome,
        mandate=_cluster_mandate(planned, plan.node, managed=managed, adopt=adopt),
    )
    if ports.events is not None:
        record_host_events(
            host_result.outcomes, node=plan.node, events=ports.events, blocked=plan.blocked
        )
    return result


def _cluster_mandate(
    planned: Planned, node: str, *, managed: frozenset[PciAddress], adopt: bool
) -> ClusterMandate:
    if planned.cluster is None:
        # Planned without a cluster: no object and no KubeVirt CR may be written.
        return ClusterMandate(node=node, managed=managed, adopt=adopt)
    return ClusterMandate.observed(planned.cluster, managed=managed, adopt=adopt)
