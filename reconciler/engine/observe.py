"""Observe one node (host, then cluster when configured) and plan it: the engine's first step,
and all that ``plan``, ``assert`` and the engine's re-plans under the lock and its verification
need. A cluster that cannot be read raises here, before anything could act on the strength of
what it did not say.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from reconciler.engine.ports import NodePorts
from reconciler.model import DesiredNode, Inventory, Plan
from reconciler.model.cluster import ClusterState


@dataclass(frozen=True, slots=True)
class Planned:
    """One observation of the node (host, and cluster when configured) and its plan."""

    inventory: Inventory
    cluster: ClusterState | None
    plan: Plan
    #: The kubelet's vGPU allocations (device ID → pods) read just before the observation: an
    #: allocation found at the moment of acting that is not here was made since.
    allocations: Mapping[str, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))


def observe_and_plan(ports: NodePorts, desired: DesiredNode, *, adopt: bool = False) -> Planned:
    """Observe the host and the cluster, then plan."""
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
