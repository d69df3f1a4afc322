"""One reconcile of one node, shared by ``vgpuctl apply`` and the watch loop.

observe (host, then cluster) → plan → under the node lock: host actions, then the CR and
KubeVirt writes planned again from the host as it now is, then Events and device-plugin
refreshes. A cluster that cannot be read stops the reconcile before any host action: host
actions never run on the strength of cluster data that could not be read.

The parts of a node (how to observe it, its driver, its cluster) come in as :class:`NodePorts`;
this module composes them and decides nothing about where they come from.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

from reconciler.apply.cluster import EventSink, execute_cluster, record_host_events
from reconciler.apply.executor import ApplyResult, Outcome, OutcomeStatus, execute
from reconciler.apply.journal import Journal
from reconciler.apply.lock import NodeLock
from reconciler.apply.ports import HostDriver
from reconciler.catalog import Catalog
from reconciler.model import Action, ActionKind, DesiredNode, Inventory, Plan
from reconciler.model.cluster import ClusterState
from reconciler.model.clusterapi import ClusterApi

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
    cluster_api: ClusterApi | None = None
    events: EventSink | None = None


@dataclass(frozen=True, slots=True)
class Planned:
    """One observation of the node (host, and cluster when configured) and its plan."""

    inventory: Inventory
    cluster: ClusterState | None
    plan: Plan


def plan_for(ports: NodePorts, desired: DesiredNode, *, adopt: bool = False) -> Planned:
    """Observe the host and the cluster, then plan. A cluster that cannot be read raises here,
    before anything could act on the strength of what it did not say."""
    from reconciler.plan import plan_node
    from reconciler.plan.uses import mark_cluster_uses

    inventory = ports.observe_host()
    cluster = ports.observe_cluster()
    planned_from = inventory
    if cluster is None:
        uses = ports.kubelet_uses()
        if uses is not None:
            planned_from = mark_cluster_uses(inventory, uses)
    plan = plan_node(desired, planned_from, catalog=ports.catalog, cluster=cluster, adopt=adopt)
    return Planned(inventory, cluster, plan)


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
    plan: Plan,
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
    """Carry out ``plan`` under the node lock (raises ``LockHeldError`` when another apply has
    it; ``locked``: the caller already holds it, having taken it before observing): host
    actions, then cluster writes re-planned from the host as it now is, then Events and
    device-plugin refreshes. Stops at the first failure."""
    started = time.monotonic()
    host_actions = tuple(a for a in plan.actions if a.kind.is_host)
    refreshes = tuple(a for a in plan.actions if a.kind is ActionKind.DEVICE_PLUGIN_REFRESH)
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
        )
        if host_result.ok and ports.cluster_api is not None:
            # CR statuses were planned from a prediction of the host; plan them again from
            # what the host now is, and from the cluster as it now is.
            cluster_plan = plan_for(ports, desired, adopt=adopt).plan if host_actions else plan
            cluster_result = _apply_cluster(
                cluster_plan, host_result, ports, adopt=adopt, on_outcome=on_outcome
            )
        if host_result.ok and refresh is not None and refreshes:
            refresh(refreshes)
    return ApplyReport(host_result, cluster_result, refreshes, time.monotonic() - started)


def _apply_cluster(
    plan: Plan,
    host_result: ApplyResult,
    ports: NodePorts,
    *,
    adopt: bool,
    on_outcome: Callable[[Outcome], None] | None,
) -> ApplyResult:
    from functools import partial

    from reconciler.plan import replan_object

    api = ports.cluster_api
    if api is None:  # pragma: no cover - the caller checked
        raise ValueError("no cluster")
    result = execute_cluster(
        [a for a in plan.actions if a.kind in CLUSTER_KINDS],
        api=api,
        events=ports.events,
        replan=partial(replan_object, adopt=adopt),
        node=plan.node,
        run_id=host_result.run_id,
        on_outcome=on_outcome,
    )
    if ports.events is not None:
        record_host_events(
            host_result.outcomes, node=plan.node, events=ports.events, blocked=plan.blocked
        )
    return result
