"""plan_node: one node's desired state and observed inventory in, an ordered Plan out.

Pure and deterministic: no I/O, no clock, no randomness; the same inputs give the same plan,
action for action. The desired GPUs are the managed ones; any other GPU is left as it is. The
checks in :mod:`reconciler.plan.check` run first over every managed GPU, and if any fails the
plan is refused with all the problems at once.

With a cluster, the vGPUs it says are used count as in use before the host is planned, and the
cluster actions follow the host's: the node's CRs rendered from the host as the host actions
will leave it (:mod:`reconciler.plan.predict`), diffed against the stored ones, then the KubeVirt
allow-list's removals (:mod:`reconciler.plan.cluster`). Its additions come first of all, before
the host actions: a type is allow-listed before its first vGPU is created. An unmanaged GPU
whose objects vgpuctl wrote keeps them, rendered from what the host has
(:func:`reconciler.plan.render.kept_unmanaged`): they are updated, never deleted while the GPU
and its VFs are on the host, and its vGPUs' types count as configured here; the plan says so in
one note per such GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from reconciler.catalog import Catalog
from reconciler.model import (
    AbsentError,
    Action,
    Blocked,
    DesiredGpu,
    DesiredNode,
    HostAction,
    Interface,
    Inventory,
    Noop,
    Observation,
    PciAddress,
    Plan,
    PlanError,
    Problem,
    Vf,
    VgpuCreate,
    VgpuMode,
)
from reconciler.model.cluster import ClusterState, is_type_name
from reconciler.model.plan import Drift
from reconciler.model.record import field, record
from reconciler.model.retiring import DEFAULT_ALLOW_LIST_GRACE
from reconciler.plan.assign import vf_profiles
from reconciler.plan.check import Want, check_gpu, located, vf_slots
from reconciler.plan.diff import CreateBlocks, diff_gpu
from reconciler.plan.groups import resolve
from reconciler.plan.guard import blocked_all, hands_off, left_alone, not_drivable
from reconciler.plan.mode import with_mode_step
from reconciler.plan.offer import Offer, gpu_label, host_spelling, offer_for
from reconciler.plan.placement import check_placement
from reconciler.plan.predict import likely_interface, predict_inventory
from reconciler.plan.refresh import refresh_steps
from reconciler.plan.uses import mark_cluster_uses

#: Plan note of a plan made without a cluster (node-local).
NO_CLUSTER = "cluster actions skipped: no cluster configured"


def plan_node(
    node: DesiredNode | None,
    inventory: Inventory,
    *,
    catalog: Catalog,
    cluster: ClusterState | None = None,
    adopt: bool = False,
    partial: bool = False,
    mdev_creates_blocked: str | None = None,
    allow_list_grace: float = DEFAULT_ALLOW_LIST_GRACE,
) -> Plan:
    """The plan that takes ``inventory`` (and, when given, ``cluster``) to ``node``'s desired
    state.

    ``node`` None manages nothing: every GPU is reported unmanaged (whether that is an error is
    the caller's call). ``cluster`` None plans the host only and says so in a note. ``adopt``
    lets the plan take over CRs another controller manages. ``partial`` runs the removals that
    only make room for creates that must wait (``plan.diff``; by default they wait too).
    ``mdev_creates_blocked``: why no vGPU may be made on a GPU whose VFs use (or, SR-IOV off,
    will likely use) the mdev interface: each such create is blocked with it (KubeVirt's
    virt-handler would remove it: ``observe/kubevirt.py``), and the removals that only make
    room for them wait too. With a cluster, so are the creates of a type KubeVirt serves
    itself (``plan.cluster.served_by_kubevirt_blocks``). ``allow_list_grace``: how long
    (seconds) an owned KubeVirt allow-list entry no node keeps stays marked retiring before a
    run removes it (``model.retiring``; 0 removes it at once, unsafe with several nodes).
    Raises :class:`PlanError` carrying every problem found.
    """
    if cluster is not None and not inventory.vf_availability:
        # The cluster's objects and the node summary show each VF's creatable types: a scan
        # that left them out (Inventory.vf_availability) cannot be planned against a cluster.
        raise PlanError(
            f"the host of node {inventory.node} was scanned without each VF's available types, "
            "which its cluster objects show: scan it with them to plan the cluster"
        )
    if cluster is not None and cluster.node != inventory.node:
        raise PlanError(
            f"the cluster state is for node {cluster.node}, the host was observed as node "
            f"{inventory.node}"
        )
    if node is not None:
        # Node groups' entries become the GPUs of this host they match.
        node = resolve(node, inventory)
    # The fingerprint is the host's own: a saved plan is checked against a fresh host observation,
    # which knows nothing of the cluster's uses. Computed when read (Observation).
    observed = inventory
    if cluster is not None:
        inventory = mark_cluster_uses(inventory, cluster)
    served: Mapping[str, str] = {}
    if cluster is not None and cluster.kubevirt is not None:
        from reconciler.plan.cluster import served_by_kubevirt_blocks

        served = served_by_kubevirt_blocks(cluster.kubevirt)
    blocks = CreateBlocks(every=mdev_creates_blocked, by_selector=served)
    host = _plan_host(node, inventory, catalog=catalog, partial=partial, mdev_blocks=blocks)
    actions: list[Action] = [s.numbered(i) for i, s in enumerate(host.actions, start=1)]
    noops = list(host.noops)
    # What the observation itself had to say (holders it could not see, a removal under way,
    # a list it could not read) comes first: the reader of a plan needs it most.
    notes = [*observed.notes, *host.notes, *_group_notes(node)]
    drift: list[Drift] = []
    # Without a cluster, the predicted host serves only the device plugins' refresh: its vGPUs.
    predicted = predict_inventory(inventory, actions, catalog=catalog, vgpus_only=cluster is None)
    if cluster is None:
        notes.append(NO_CLUSTER)
    else:
        # The cluster half, imported here: a plan with no cluster renders no object.
        from reconciler.plan.cluster import plan_cluster, plan_node_state
        from reconciler.plan.nodestate import render_node_state
        from reconciler.plan.render import kept_unmanaged, render_with

        # A GPU the desired state does not name keeps the objects vgpuctl wrote for it, as the
        # host has it: published beside the managed GPUs, its layout taken as its assignment.
        kept = kept_unmanaged(inventory.node, predicted, host.managed, cluster)
        published = {**host.managed, **{a: entry for a, (entry, _) in kept.items()}}
        assignments = {**host.assignments, **{a: layout for a, (_, layout) in kept.items()}}
        configured = {p for profiles in assignments.values() for p in profiles.values() if p}
        cluster_plan = plan_cluster(
            render_with(
                inventory.node,
                published.values(),
                predicted,
                assignments,
                stored=cluster.vgpu_devices,
            ),
            cluster,
            desired=published,
            inventory=predicted,
            configured=configured,
            adopt=adopt,
            unmanaged=frozenset(kept),
            observed=inventory,
            grace=allow_list_grace,
            created=_mdev_created(actions, predicted),
            wanted_counts=_wanted(host.assignments),
        )
        node_state = plan_node_state(
            render_node_state(
                inventory.node,
                desired=node,
                predicted=predicted,
                managed=frozenset(host.managed),
                assignments=host.assignments,
                blocked=host.blocked,
                degraded=host.degraded,
                changes=[*cluster_plan.before_host, *actions, *cluster_plan.actions],
                stored=cluster.node_state,
            ),
            cluster.node_state,
        )
        steps = list(cluster_plan.actions)
        if isinstance(node_state, Noop):
            noops_after = [node_state]
        else:
            noops_after = []
            steps.append(node_state)
            steps.sort(key=lambda s: s.kind.order)  # stable: the node state last of its kind
        actions.extend(s.numbered(i) for i, s in enumerate(steps, start=len(actions) + 1))
        if cluster_plan.before_host:
            # The allow-list's additions run before every host action: renumbered after them.
            first: list[Action] = list(cluster_plan.before_host)
            actions = [s.numbered(i) for i, s in enumerate([*first, *actions], start=1)]
        noops.extend(cluster_plan.noops)
        noops.extend(noops_after)
        drift.extend(cluster_plan.drift)
        unmanaged = [
            f"{gpu_label(g, catalog)} is not in the desired state: unmanaged; its objects "
            "describe what the host has"
            for g in sorted(predicted.gpus, key=lambda g: g.address)
            if g.address in kept
        ]
        for note in (*cluster.notes, *unmanaged, *cluster_plan.notes):
            if note not in notes:
                notes.append(note)
    # Last of all: the device plugins learn the device sets the host now has.
    actions.extend(
        s.numbered(i)
        for i, s in enumerate(refresh_steps(host.actions, predicted), start=len(actions) + 1)
    )
    return Plan(
        node=observed.node,
        interface=_interface(observed),
        observed=Observation(observed),
        actions=tuple(actions),
        blocked=tuple(Blocked(s) for s in host.blocked),
        noops=tuple(noops),
        notes=tuple(notes),
        drift=tuple(drift),
    )


def _wanted(assignments: Mapping[PciAddress, Mapping[int, str]]) -> dict[str, int]:
    """Profile → VFs the desired state gives it (the node summary's ``wanted``)."""
    out: dict[str, int] = {}
    for profiles in assignments.values():
        for name in profiles.values():
            out[name] = out.get(name, 0) + 1
    return out


def _mdev_created(actions: Sequence[Action], predicted: Inventory) -> frozenset[str]:
    """The types of the vGPUs ``actions`` create on GPUs that are not on NVIDIA's vfio
    interface (as predicted): mdevs, which virt-handler sweeps unless allow-listed."""
    out = set()
    for action in actions:
        if isinstance(action, VgpuCreate) and is_type_name(action.type_name):
            gpu = predicted.gpu(action.gpu)
            interface = Interface.NONE if gpu is None else gpu.interface
            if interface is Interface.NONE:
                interface = likely_interface(predicted)  # as configured_here has it
            if interface is not Interface.VFIO:
                out.add(action.type_name)
    return frozenset(out)


def _group_notes(node: DesiredNode | None) -> list[str]:
    """Which node group's entry configures which GPUs (one line per entry), for a node that
    node groups configure."""
    by_entry: dict[tuple[str, str], list[str]] = {}
    for gpu in node.gpus if node is not None else ():
        if gpu.group is not None:
            where = f" ({gpu.location})" if gpu.location else ""
            by_entry.setdefault((gpu.group, where), []).append(str(gpu.address))
    return [
        f"node group '{group}'{where} configures GPU{'s' * (len(gpus) != 1)} {', '.join(gpus)}"
        for (group, where), gpus in by_entry.items()
    ]


@record(frozen=True, slots=True)
class _HostPlan:
    actions: list[HostAction] = field(default_factory=list)
    blocked: list[HostAction] = field(default_factory=list)
    noops: list[Noop] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: The managed GPUs on the host, and the VF index → profile each is planned to.
    managed: dict[PciAddress, DesiredGpu] = field(default_factory=dict)
    assignments: dict[PciAddress, Mapping[int, str]] = field(default_factory=dict)
    #: Why managed GPUs cannot be driven (left alone, or no usable vGPU interface).
    degraded: list[str] = field(default_factory=list)


def _plan_host(
    node: DesiredNode | None,
    inventory: Inventory,
    *,
    catalog: Catalog,
    partial: bool = False,
    mdev_blocks: CreateBlocks | None = None,
) -> _HostPlan:
    by_address = {g.address: g for g in inventory.gpus}
    managed: dict[PciAddress, tuple[DesiredGpu, tuple[Vf, ...], Offer, tuple[Want, ...]]] = {}
    problems: list[Problem] = []
    #: Desired GPUs the host does not have: drift when they are all that is wrong.
    absent: list[Problem] = []
    notes: list[str] = []
    seen: dict[PciAddress, DesiredGpu] = {}
    for desired in node.gpus if node is not None else ():
        first = seen.setdefault(desired.address, desired)
        if first is not desired:
            where = f" (first at {first.location})" if first.location else ""
            problems.append(
                located(f"GPU {desired.address} is listed twice{where}", desired.location)
            )
            continue
        gpu = by_address.get(desired.address)
        if gpu is None:
            absent.append(located(_not_on_host(desired, inventory, catalog), desired.location))
            continue
        offer = offer_for(gpu, catalog)
        spelt = host_spelling(desired, gpu, offer)
        slots = vf_slots(gpu)
        # A GPU vgpuctl may not (or cannot) act on gets its changes blocked, not checked
        # against what it offers: only what the desired entry says of itself is checked.
        actionable = hands_off(gpu) is None and not_drivable(gpu) is None
        check = check_gpu(
            spelt,
            gpu,
            slots,
            offer,
            inventory=inventory,
            catalog=catalog,
            constraints=actionable,
        )
        problems.extend(check.problems)
        notes.extend(check.notes)
        managed[gpu.address] = (spelt, slots, offer, check.wants)
    if problems or absent:
        count = len(problems) + len(absent)
        # Only GPUs missing: the host has drifted from what is wanted (AbsentError).
        error = PlanError if problems else AbsentError
        raise error(
            f"the desired state of node {inventory.node} cannot be reached on this host "
            f"({count} problem{'s' * (count != 1)})",
            sorted([*problems, *absent], key=_reading_order),
        )

    plan = _HostPlan()
    #: Mixed-size layouts no set of the host's placements holds (plan/placement.py).
    unplaceable: list[Problem] = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.address):
        entry = managed.get(gpu.address)
        if entry is None:
            label = gpu_label(gpu, catalog)
            plan.noops.append(
                Noop(
                    str(gpu.address), f"{label} is not in the desired state: unmanaged, left as is"
                )
            )
            continue
        desired, slots, offer, _ = entry
        profiles = vf_profiles(desired, slots)
        plan.managed[gpu.address] = desired
        plan.assignments[gpu.address] = profiles
        interface = (
            gpu.interface if gpu.interface is not Interface.NONE else likely_interface(inventory)
        )
        diff = diff_gpu(
            gpu,
            slots,
            sriov=desired.sriov,
            profiles=profiles,
            offer=offer,
            node=inventory.node,
            interface=interface,
            partial=partial,
            creates_blocked=mdev_blocks if interface is Interface.MDEV else None,
        )
        if desired.sriov:
            diff = with_mode_step(gpu, diff, wanted=desired.mode, offer=offer)
            # Only a GPU vgpuctl acts on: another one's changes are blocked whole below.
            drivable = hands_off(gpu) is None and not_drivable(gpu) is None
            if desired.mode is VgpuMode.MIXED_SIZE and drivable:
                placed = check_placement(gpu, (*diff.actions, *diff.blocked), label=offer.label)
                if placed.problem is not None:
                    unplaceable.append(located(placed.problem, desired.location))
                if placed.note is not None:
                    plan.notes.append(placed.note)
        if (reason := hands_off(gpu)) is not None:
            diff = left_alone(gpu, diff, reason)
            plan.degraded.append(reason)
        elif (reason := not_drivable(gpu)) is not None:
            diff = blocked_all(diff, reason)
            plan.degraded.append(reason)
        plan.actions.extend(diff.actions)
        plan.blocked.extend(diff.blocked)
        plan.noops.extend(diff.noops)
    if unplaceable:
        count = len(unplaceable)
        raise PlanError(
            f"the desired state of node {inventory.node} cannot be reached on this host "
            f"({count} problem{'s' * (count != 1)})",
            sorted(unplaceable, key=_reading_order),
        )
    # Stable sorts: within a kind, GPU address then VF index, as each GPU's diff produced them.
    plan.actions.sort(key=lambda s: s.kind.order)
    plan.blocked.sort(key=lambda s: s.kind.order)
    plan.notes.extend(notes)
    return plan


def _not_on_host(desired: DesiredGpu, inventory: Inventory, catalog: Catalog) -> str:
    here = ", ".join(
        gpu_label(g, catalog).removeprefix("GPU ")
        for g in sorted(inventory.gpus, key=lambda g: g.address)
    )
    return f"GPU {desired.address} is not on node {inventory.node}: " + (
        f"its GPUs are {here}" if here else "it has no NVIDIA SR-IOV GPUs"
    )


def _interface(inventory: Inventory) -> str:
    """The node's vGPU interface: mdev if any GPU uses it, else vfio, else none (no VFs)."""
    used = {g.interface for g in inventory.gpus}
    for interface in (Interface.MDEV, Interface.VFIO):
        if interface in used:
            return interface.value
    return Interface.NONE.value


def _reading_order(problem: Problem) -> tuple[bool, str, int, int]:
    # Like a compiler: by file, line, column; problems without a place last, in found order.
    return (problem.file is None, problem.file or "", problem.line or 0, problem.column or 0)
