"""Who uses which vGPU, per the cluster: applied to the inventory before host planning. Pure.

The host sees a vGPU in use only while a process holds its VFIO device; the cluster knows more:
the kubelet's allocations (a pod may be starting) and the running VMIs. A vGPU allocated in the
kubelet checkpoint is in use by the VM named there. A running VMI whose allocation is unknown
(no checkpoint entry) requests a resource: every vGPU of that profile on the node may be the
one it has, so all of them count as in use. The host planner then blocks their removal, naming
the VM, as it does for a hold it sees itself.
"""

from __future__ import annotations

from reconciler.model import VGPU, Inventory
from reconciler.model.cluster import ClusterState, resource_name
from reconciler.model.record import replace


def mark_cluster_uses(inventory: Inventory, cluster: ClusterState) -> Inventory:
    """``inventory`` with the vGPUs the cluster says are used marked ``in_use``, with a holder."""
    if not cluster.device_uses and not cluster.vmi_resources:
        return inventory
    vmis_by_resource: dict[str, list[str]] = {}
    for vmi in sorted(cluster.vmi_resources):
        for resource in cluster.vmi_resources[vmi]:
            vmis_by_resource.setdefault(resource, []).append(vmi)
    changed = False
    gpus = []
    for gpu in inventory.gpus:
        vfs = []
        for vf in gpu.vfs:
            marked = _marked(vf.vgpu, cluster, vmis_by_resource) if vf.vgpu is not None else None
            changed = changed or marked is not None
            vfs.append(vf if marked is None else replace(vf, vgpu=marked))
        gpus.append(replace(gpu, vfs=tuple(vfs)))
    return replace(inventory, gpus=tuple(gpus)) if changed else inventory


def cluster_holder(cluster: ClusterState, uuid: str, type_name: str) -> str | None:
    """Who uses the vGPU ``uuid`` of ``type_name`` per ``cluster``: the pod or VM the kubelet
    allocated it to, or the VMs whose allocation is unknown that request its profile; None:
    nobody. The executor asks this again right before it removes a vGPU."""
    use = cluster.device_uses.get(uuid)
    if use is not None:
        return use.holder or f"pod (resource {use.resource_name})"
    wanted = resource_name(type_name)
    vmis = sorted(vmi for vmi, resources in cluster.vmi_resources.items() if wanted in resources)
    if not vmis:
        return None
    who = f"VM {vmis[0]}" if len(vmis) == 1 else "VMs " + ", ".join(vmis)
    return f"{who} (allocation unknown)"


def _marked(
    vgpu: VGPU, cluster: ClusterState, vmis_by_resource: dict[str, list[str]]
) -> VGPU | None:
    use = cluster.device_uses.get(vgpu.uuid)
    if use is not None:
        # The VM's name says more than the host's "process 1234": it wins.
        return replace(vgpu, in_use=True, holder=use.holder or vgpu.holder)
    if vgpu.in_use:
        return None
    vmis = vmis_by_resource.get(resource_name(vgpu.type_name))
    if not vmis:
        return None
    who = f"VM {vmis[0]}" if len(vmis) == 1 else "VMs " + ", ".join(vmis)
    return replace(vgpu, in_use=True, holder=f"{who} (allocation unknown)")
