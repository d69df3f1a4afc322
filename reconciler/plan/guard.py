"""Whether vgpuctl may act on a desired GPU at all, and the blocked steps when it may not.

Two kinds of GPU are listed in the desired state yet must not be acted on:

- **hands off**: the GPU is not ours to touch. A PF bound to another driver than ``nvidia``
  (``vfio-pci``: passed through whole to a VM, or reserved for one) would be unbound from it by
  ``sriov-manage -e`` (docs/domain.md §2) — a running VM would lose its GPU. A PF whose
  ``sriov_vf_device`` is 0 makes no vGPU VFs. Nothing is planned for it; one blocked entry
  says why (when the desired state asks for any change).
- **not drivable**: the GPU is ours, but vgpuctl cannot make or remove its vGPUs now. Its VFs
  expose no vGPU interface at all, or (NVIDIA's vendor-specific VFIO) a VF has a vGPU type
  whose id no list, no record and not the driver itself (``nvidia-smi vgpu -s -v``) names: its
  profile, and so its size, is unknown, and every rule of the GPU depends on it. Every change
  is planned as usual, then blocked with the reason: the plan shows what would change, and
  nothing runs.

Either way the plan is not ``applyable``, and the rest of the node is planned as usual.
"""

from __future__ import annotations

from reconciler.model import Gpu, Interface, Noop, unresolved_type_id
from reconciler.model.record import replace
from reconciler.plan.diff import GpuDiff, vf_order


def hands_off(gpu: Gpu) -> str | None:
    """Why vgpuctl must leave this GPU alone entirely (its SR-IOV too), or None."""
    if gpu.driver != "nvidia":
        bound = f"bound to {gpu.driver}" if gpu.driver else "bound to no driver"
        return (
            f"GPU {gpu.address} is {bound}, not nvidia: it is passed through whole to a VM, or "
            "reserved for one; vgpuctl never touches it (sriov-manage would unbind it)"
        )
    if not gpu.vgpu_vfs:
        return (
            f"GPU {gpu.address} has SR-IOV but its sriov_vf_device is 0: it makes no vGPU VFs, "
            "so it cannot host vGPUs"
        )
    return None


def not_drivable(gpu: Gpu) -> str | None:
    """Why vgpuctl cannot make or remove vGPUs on this GPU's VFs now, or None."""
    if not gpu.sriov_enabled:
        return None  # no VF yet: the interface shows once SR-IOV is on
    unknown = [
        (vf, type_id)
        for vf in gpu.vfs
        if vf.vgpu is not None and (type_id := unresolved_type_id(vf.vgpu.type_name)) is not None
    ]
    if unknown:
        vf, type_id = unknown[0]
        more = f" (and {len(unknown) - 1} more VFs)" if len(unknown) > 1 else ""
        return (
            f"GPU {gpu.address}: VF {vf.address}{more} has vGPU type {type_id}, which no VF's "
            "nvidia/creatable_vgpu_types lists any more, vgpuctl has no record of, and the "
            "driver did not name (nvidia-smi vgpu -s -v: see the notes): its profile and size "
            "are unknown, so nothing on this GPU is changed ('nvidia-smi vgpu -q' shows each "
            "vGPU's type name; once no VM uses it, writing 0 to "
            f"{vf.address}'s nvidia/current_vgpu_type by hand frees it)"
        )
    if gpu.interface is Interface.NONE and gpu.vfs:
        return (
            f"GPU {gpu.address}: its VFs expose no vGPU interface (no mdev_supported_types, no "
            "nvidia/creatable_vgpu_types): is the NVIDIA vGPU manager running?"
        )
    return None


def left_alone(gpu: Gpu, diff: GpuDiff, reason: str) -> GpuDiff:
    """A hands-off GPU's diff: nothing runs; one blocked entry when anything would change."""
    changes = [*diff.actions, *diff.blocked]
    if not changes:
        return GpuDiff(noops=[Noop(str(gpu.address), f"left alone as desired: {reason}")])
    first = min(changes, key=lambda s: s.kind.order)
    return GpuDiff(blocked=[replace(first, reason=reason)])


def blocked_all(diff: GpuDiff, reason: str) -> GpuDiff:
    """A GPU vgpuctl cannot drive: each change it would make, blocked with the reason."""
    blocked = [replace(s, reason=reason) for s in diff.actions] + list(diff.blocked)
    blocked.sort(key=lambda s: (s.kind.order, vf_order(s)))
    return GpuDiff(blocked=blocked, noops=list(diff.noops))
