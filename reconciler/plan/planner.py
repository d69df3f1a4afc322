"""plan_node: one node's desired state and observed inventory in, an ordered Plan out.

Pure and deterministic: no I/O, no clock, no randomness; the same inputs give the same plan,
action for action. The desired GPUs are the managed ones; any other GPU is left as it is. The
checks in :mod:`reconciler.plan.check` run first over every managed GPU, and if any fails the
plan is refused with all the problems at once.
"""

from __future__ import annotations

from collections.abc import Mapping

from reconciler.catalog import Catalog
from reconciler.model import (
    Action,
    Blocked,
    DesiredGpu,
    DesiredNode,
    Interface,
    Inventory,
    Noop,
    PciAddress,
    Plan,
    PlanError,
    Problem,
    Vf,
)
from reconciler.plan.assign import assign_counts
from reconciler.plan.check import Want, check_gpu, located, vf_slots
from reconciler.plan.diff import Step, diff_gpu
from reconciler.plan.offer import Offer, gpu_label, offer_for


def plan_node(node: DesiredNode | None, inventory: Inventory, *, catalog: Catalog) -> Plan:
    """The plan that takes ``inventory`` to ``node``'s desired state.

    ``node`` None manages nothing: every GPU is reported unmanaged (whether that is an error is
    the caller's call). Raises :class:`PlanError` carrying every problem found.
    """
    by_address = {g.address: g for g in inventory.gpus}
    managed: dict[PciAddress, tuple[DesiredGpu, tuple[Vf, ...], Offer, tuple[Want, ...]]] = {}
    problems: list[Problem] = []
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
            problems.append(located(_not_on_host(desired, inventory, catalog), desired.location))
            continue
        offer = offer_for(gpu, catalog)
        slots = vf_slots(gpu)
        check = check_gpu(desired, gpu, slots, offer, inventory=inventory, catalog=catalog)
        problems.extend(check.problems)
        notes.extend(check.notes)
        managed[gpu.address] = (desired, slots, offer, check.wants)
    if problems:
        raise PlanError(
            f"the desired state of node {inventory.node} cannot be reached on this host "
            f"({len(problems)} problem{'s' * (len(problems) != 1)})",
            sorted(problems, key=_reading_order),
        )

    actions: list[Step] = []
    blocked: list[Step] = []
    noops: list[Noop] = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.address):
        entry = managed.get(gpu.address)
        if entry is None:
            label = gpu_label(gpu, catalog)
            noops.append(
                Noop(
                    str(gpu.address), f"{label} is not in the desired state: unmanaged, left as is"
                )
            )
            continue
        desired, slots, offer, wants = entry
        diff = diff_gpu(
            gpu,
            slots,
            sriov=desired.sriov,
            profiles=_profiles(desired, slots, wants),
            offer=offer,
            node=inventory.node,
        )
        actions.extend(diff.actions)
        blocked.extend(diff.blocked)
        noops.extend(diff.noops)
    # Stable sorts: within a kind, GPU address then VF index, as each GPU's diff produced them.
    actions.sort(key=lambda s: s.kind.order)
    blocked.sort(key=lambda s: s.kind.order)
    return Plan(
        node=inventory.node,
        interface=_interface(inventory),
        observed_fingerprint=inventory.fingerprint(),
        actions=tuple(
            Action(seq=i, kind=s.kind, target=s.target, reason=s.reason, params=s.params)
            for i, s in enumerate(actions, start=1)
        ),
        blocked=tuple(Blocked(s.kind, s.target, s.reason, s.params) for s in blocked),
        noops=tuple(noops),
        notes=tuple(notes),
    )


def _profiles(
    desired: DesiredGpu, slots: tuple[Vf, ...], wants: tuple[Want, ...]
) -> Mapping[int, str]:
    if desired.profiles:
        return assign_counts(slots, {w.profile: w.count for w in wants})
    return {w.vf.index: w.profile for w in wants if w.vf is not None}


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
