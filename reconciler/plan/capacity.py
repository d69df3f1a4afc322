"""The vGPUs a node will have once its desired state has landed (``vgpuctl capacity
--desired``). Pure.

The layout is the planner's own (:func:`~reconciler.plan.planner.plan_node`): the node groups'
entries resolved on the host (``plan.groups.resolve``), each desired GPU's names spelt as the
host spells them (``plan.offer.host_spelling``), its VFs (``plan.check.vf_slots``: where they
will be while SR-IOV is off) given their profiles by ``plan.assign.vf_profiles`` — the VFs the
node summary's ``wanted`` counts. A GPU the desired state does not name is left as it is
(unmanaged), so it keeps its vGPUs. A vGPU a VF has now and keeps (same profile) is the same
vGPU after the change: who holds it still does; any other vGPU is new, held by nobody.
"""

from __future__ import annotations

from reconciler.catalog import Catalog
from reconciler.model import VGPU, DesiredNode, Inventory
from reconciler.model.record import record
from reconciler.plan.assign import vf_profiles
from reconciler.plan.check import vf_slots
from reconciler.plan.groups import resolve
from reconciler.plan.offer import host_spelling, offer_for


@record(frozen=True, slots=True)
class PlannedVgpu:
    """A vGPU of the landed layout: its profile, and the vGPU observed now that it is (None:
    one the change creates)."""

    type_name: str
    kept: VGPU | None = None


def planned_vgpus(
    node: DesiredNode | None, inventory: Inventory, *, catalog: Catalog
) -> tuple[PlannedVgpu, ...]:
    """Every vGPU ``inventory``'s host will have once ``node``'s desired state has landed (the
    module's description), GPU by GPU in address order, VF by VF in index order."""
    desired = {} if node is None else {g.address: g for g in resolve(node, inventory).gpus}
    out: list[PlannedVgpu] = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.address):
        entry = desired.get(gpu.address)
        if entry is None:
            out.extend(
                PlannedVgpu(vf.vgpu.type_name, vf.vgpu)
                for vf in sorted(gpu.vfs, key=lambda v: v.index)
                if vf.vgpu is not None
            )
            continue
        slots = vf_slots(gpu)
        profiles = vf_profiles(host_spelling(entry, gpu, offer_for(gpu, catalog)), slots)
        for vf in slots:
            name = profiles.get(vf.index)
            if name is None:
                continue
            now = vf.vgpu if gpu.sriov_enabled else None
            out.append(
                PlannedVgpu(name, now if now is not None and now.type_name == name else None)
            )
    return tuple(out)
