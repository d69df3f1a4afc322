"""Observe one node (host, then cluster when configured) and plan it: the engine's first step,
and all that ``plan``, ``assert`` and the engine's re-plans under the lock and its verification
need. A cluster that cannot be read raises here, before anything could act on the strength of
what it did not say.

With a cluster, the observation also says whether Harvester's pcidevices-controller is running
(``observe/harvester.py``): the engine refuses to act while it is, or may be, and the plan says
so in its notes (first of them), so ``plan`` shows what ``apply`` would do. Without a cluster
nothing can tell: a host-local run is what the operator asked for, as for every other cluster
fact (docs/domain.md §6a).

Without a cluster, a plan that makes vGPUs asks whether KubeVirt runs on the host
(``observe/kubevirt.py``): its virt-handler removes every mdev its CR does not allow-list, and
only a cluster connection lets vgpuctl keep that list. The plan is then made again with every
create on an mdev GPU blocked, saying so and how out; with ``--unsafe-kubevirt-allow-listed``
the creates run and the plan's first note says on whose word.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from reconciler.engine.ports import NodePorts
from reconciler.model import (
    DesiredNode,
    Inventory,
    PciAddress,
    Plan,
    VgpuCreate,
    VgpuMode,
)
from reconciler.model.cluster import ClusterState
from reconciler.model.record import field, record, replace

if TYPE_CHECKING:
    from reconciler.observe.harvester import ControllerPresence


@record(frozen=True, slots=True)
class Planned:
    """One observation of the node (host, and cluster when configured) and its plan."""

    inventory: Inventory
    cluster: ClusterState | None
    plan: Plan
    #: The desired state planned, its node groups' entries made this host's GPUs (the node's
    #: own entry as it is): the GPUs the run may manage, and what a saved plan carries.
    desired: DesiredNode
    #: The kubelet's vGPU allocations (device ID → pods) read just before the observation: an
    #: allocation found at the moment of acting that is not here was made since.
    allocations: Mapping[str, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))
    #: Whether Harvester's pcidevices-controller runs (None: no cluster, so nothing can tell).
    controller: ControllerPresence | None = None
    #: GPUs declared in mixed-size mode that were read in another mode and that no step of the
    #: plan switches: drift for ``assert`` even when nothing else differs (also in the notes).
    mode_drift: tuple[str, ...] = ()


def observe_and_plan(
    ports: NodePorts, desired: DesiredNode, *, adopt: bool = False, partial: bool = False
) -> Planned:
    """Observe the host and the cluster, then plan (``adopt``, ``partial``: ``plan_node``'s)."""
    from reconciler.plan import plan_node, resolve_groups
    from reconciler.plan.uses import mark_cluster_uses

    allocations = ports.allocations()
    # Each VF's available types are shown only in the cluster's objects and the node summary:
    # without a cluster the scan leaves them out (most of its reads).
    inventory = ports.observe_host(availability=ports.cluster_api is not None)
    # A node group's GPU entries name GPUs by model or device ID: this host's are now known.
    desired = resolve_groups(desired, inventory)
    cluster = ports.observe_cluster()
    if cluster is not None and not inventory.vf_availability:
        # A cluster state from ports with no API client of their own: it is planned all the
        # same, so the host is read again with what its objects show.
        inventory = ports.observe_host(availability=True)
    controller = None
    if ports.cluster_api is not None:
        from reconciler.observe.harvester import observe_pcidevices_controller

        controller = observe_pcidevices_controller(ports.cluster_api)
    planned_from = inventory
    if cluster is None:
        uses = ports.kubelet_uses()
        if uses is not None:
            planned_from = mark_cluster_uses(inventory, uses)
    blocked_by: str | None = None  # why creates on mdev GPUs wait (KubeVirt's sweep)

    def plan_from(host: Inventory) -> Plan:
        return plan_node(
            desired,
            host,
            catalog=ports.catalog,
            cluster=cluster,
            adopt=adopt,
            partial=partial,
            mdev_creates_blocked=blocked_by,
            allow_list_grace=ports.allow_list_grace,
        )

    plan = plan_from(planned_from)
    kubevirt_note: str | None = None
    if ports.cluster_api is None and ports.kubevirt_host is not None and _makes_vgpus(plan):
        sighting = ports.kubevirt_host()
        if sighting is not None and ports.unsafe_kubevirt_allow_listed:
            kubevirt_note = sighting.unsafe_note
        elif sighting is not None:
            blocked_by = sighting.reason
            plan = plan_from(planned_from)
    asked = _mode_matters(inventory, desired)
    mode_drift: tuple[str, ...] = ()
    if asked:
        from reconciler.observe.vgpumode import ModeReading, with_vgpu_modes
        from reconciler.plan.mode import mode_gaps

        # The mode is read (one nvidia-smi call) only where the desired state declares
        # mixed-size mode on a GPU whose SR-IOV is on, and the node planned again with it: it
        # decides what vGPUs may be made, and a GPU in another mode is drift even when nothing
        # is to be made. An equal-size node never needs nvidia-smi.
        reading = (
            ports.vgpu_modes()
            if ports.vgpu_modes is not None
            else ModeReading(problem="no way to read it here")
        )
        inventory = with_vgpu_modes(inventory, asked, reading)
        planned_from = with_vgpu_modes(planned_from, asked, reading)
        plan = plan_from(planned_from)
        gaps = mode_gaps(plan, planned_from, desired, read=frozenset(reading.modes))
        mode_drift = tuple(g.text for g in gaps if g.drift)
        new_notes = [g.text for g in gaps if g.text not in plan.notes]
        if new_notes:
            plan = replace(plan, notes=(*plan.notes, *new_notes))
    if kubevirt_note is not None:
        plan = replace(plan, notes=(kubevirt_note, *plan.notes))
    if controller is not None:
        plan = with_refusal_note(plan, controller)
    return Planned(
        inventory,
        cluster,
        plan,
        desired,
        MappingProxyType(dict(allocations)),
        controller,
        mode_drift,
    )


def _makes_vgpus(plan: Plan) -> bool:
    """Whether ``plan`` makes (or would make, once unblocked) any vGPU."""
    return any(
        isinstance(a, VgpuCreate) for a in (*plan.actions, *(b.action for b in plan.blocked))
    )


def _mode_matters(inventory: Inventory, desired: DesiredNode) -> frozenset[PciAddress]:
    """The GPUs the desired state declares in mixed-size mode whose SR-IOV is on (a GPU whose
    SR-IOV is off is equal-size after ``sriov-manage -e``: nothing to read)."""
    mixed = {g.address for g in desired.gpus if g.mode is VgpuMode.MIXED_SIZE and g.sriov}
    if not mixed:
        return frozenset()
    return frozenset(g.address for g in inventory.gpus if g.address in mixed and g.sriov_enabled)


def with_refusal_note(plan: Plan, controller: ControllerPresence) -> Plan:
    """``plan``, with a first note that apply and watch would refuse to act on its node when
    ``controller`` says they must (else as it is)."""
    if not controller.refuses:
        return plan
    note = f"vgpuctl apply and watch refuse to act on this node: {controller.reason}"
    return replace(plan, notes=(note, *plan.notes))
