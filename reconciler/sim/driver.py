"""The emulated NVIDIA host driver: each operation changes the state and renders the tree delta.

Called with the host lock held, by the kernel writer (create/remove a vGPU), by the
``sriov-manage`` emulation (enable/disable VFs), by the ``nvidia-smi`` emulation (a GPU's
vGPU mode), and by host set-up (``build_host``, ``reboot``).
Refusals are ``OSError`` with the errno the real driver returns; the rules themselves are in
``rules.py``.
"""

from __future__ import annotations

import errno
import os

from reconciler.model import PciAddress
from reconciler.model.mode import VgpuMode
from reconciler.sim.rules import (
    SimModel,
    creatable,
    creatable_placements,
    create_refusal,
    model_vf_addresses,
    placements_text,
)
from reconciler.sim.state import GpuRecord, SimState, VfRecord, VgpuRecord
from reconciler.sim.tree import SysfsTree


def refusal(code: int, message: str) -> OSError:
    """An ``OSError`` whose subclass follows the errno (EEXIST → FileExistsError, …)."""
    return OSError(code, f"{os.strerror(code)}: {message}")


def enable_vfs(state: SimState, tree: SysfsTree, gpu: GpuRecord) -> bool:
    """All VFs at once (``sriov_totalvfs`` of them); False if the GPU already has VFs."""
    if gpu.vfs:
        return False
    model = state.model_of(gpu)
    addresses = [str(a) for a in model_vf_addresses(PciAddress.parse(gpu.address), model)]
    gpu.vfs = [VfRecord(a, state.allocate_group(a)) for a in addresses]
    tree.gpu_vfs(
        pf=gpu.address,
        root_port=gpu.root_port,
        model=model,
        vfs=[(v.address, v.iommu_group) for v in gpu.vfs],
        interface=gpu.interface,
        creatable=creatable(model, state.hosted(gpu), mode=gpu.vgpu_mode, mig=gpu.mig_mode),
    )
    return True


def disable_vfs(state: SimState, tree: SysfsTree, gpu: GpuRecord, *, force: bool = False) -> bool:
    """Remove every VF; the GPU's vGPUs go first. EBUSY if a VM holds one (unless ``force``).
    The GPU's vGPU mode is equal-size again (the driver's default).

    Returns False if the GPU had no VFs.
    """
    if not gpu.vfs:
        return False
    on_gpu = state.vgpus_on(gpu)
    held = [vid for vid in on_gpu if vid in state.held]
    if held and not force:
        vid = held[0]
        raise refusal(
            errno.EBUSY,
            f"vGPU {vid} on {state.vgpus[vid].vf} is in use by {state.held[vid]}",
        )
    for vid in on_gpu:
        remove_vgpu(state, tree, vid, force=force, refresh=False)
    tree.drop_gpu_vfs(
        pf=gpu.address, root_port=gpu.root_port, vfs=[(v.address, v.iommu_group) for v in gpu.vfs]
    )
    for v in gpu.vfs:
        state.free_group(v.iommu_group)
    gpu.vfs = []
    gpu.vgpu_mode = VgpuMode.EQUAL_SIZE
    return True


def set_vgpu_mode(state: SimState, tree: SysfsTree, gpu: GpuRecord, mode: VgpuMode) -> bool:
    """``nvidia-smi vgpu -i <GPU> -shm 0|1``: the GPU's vGPU mode. EPERM (with the reason)
    while its SR-IOV is off or while it hosts a vGPU, in either direction; False if it is in
    ``mode`` already (and hosts none)."""
    if mode not in (VgpuMode.EQUAL_SIZE, VgpuMode.MIXED_SIZE):
        raise refusal(errno.EINVAL, f"{mode} is not a mode a GPU can be set to")
    if not gpu.vfs:
        raise refusal(
            errno.EPERM,
            f"GPU {gpu.address} has SR-IOV off: its vGPU mode is set after 'sriov-manage -e'",
        )
    on_gpu = state.vgpus_on(gpu)
    if on_gpu:
        first = state.vgpus[on_gpu[0]].vf
        raise refusal(
            errno.EPERM,
            f"GPU {gpu.address} hosts {len(on_gpu)} vGPU{'s' if len(on_gpu) != 1 else ''} "
            f"(the first on {first}): its vGPU mode changes only while it hosts none",
        )
    if gpu.vgpu_mode is mode:
        return False
    model = state.model_of(gpu)
    before = creatable(model, state.hosted(gpu), mode=gpu.vgpu_mode, mig=gpu.mig_mode)
    gpu.vgpu_mode = mode
    _refresh(state, tree, gpu, model, before)
    if gpu.interface == "vfio":
        tree.vfio_placements(
            root_port=gpu.root_port,
            vfs=[v.address for v in gpu.vfs],
            text=_placements(state, gpu, model),
        )
    return True


def set_mig_mode(state: SimState, tree: SysfsTree, gpu: GpuRecord, on: bool) -> bool:
    """``nvidia-smi -i <GPU> -mig 0|1``: the GPU's MIG mode, at once (a real GPU may need a
    reset before the mode is current: not modelled). EINVAL for a model without MIG; EPERM
    while it hosts a vGPU (the GPU is in use); False if it is in that mode already. In MIG
    mode its VFs offer no time-sliced type (:func:`rules.creatable`)."""
    model = state.model_of(gpu)
    if not model.mig:
        raise refusal(errno.EINVAL, f"GPU {gpu.address} ({model.name}) does not support MIG")
    on_gpu = state.vgpus_on(gpu)
    if on_gpu:
        raise refusal(
            errno.EPERM,
            f"GPU {gpu.address} hosts {len(on_gpu)} vGPU{'s' if len(on_gpu) != 1 else ''}: "
            "its MIG mode changes only while it is not in use",
        )
    if gpu.mig_mode is on:
        return False
    before = creatable(model, state.hosted(gpu), mode=gpu.vgpu_mode, mig=gpu.mig_mode)
    gpu.mig_mode = on
    _refresh(state, tree, gpu, model, before)
    return True


def create_vgpu(state: SimState, tree: SysfsTree, *, vf: str, type_name: str, vgpu_id: str) -> None:
    """Create a vGPU of ``type_name`` on ``vf``; ``vgpu_id`` is the mdev UUID (vfio: the VF).

    EEXIST for a UUID already in use; EINVAL when the type is not creatable there now
    (``available_instances`` 0): the errno the NVIDIA driver's create returns.
    """
    gpu = state.vf_owner(vf)
    if gpu is None:
        raise refusal(errno.ENODEV, f"{vf} is not an enabled VF of a simulated GPU")
    if vgpu_id in state.vgpus:
        raise refusal(errno.EEXIST, f"a vGPU with UUID {vgpu_id} already exists")
    model = state.model_of(gpu)
    hosted = state.hosted(gpu)
    placed = tuple(state.placed(gpu).values())
    reason = create_refusal(
        model, hosted, vf, type_name, mode=gpu.vgpu_mode, placed=placed, mig=gpu.mig_mode
    )
    if reason is not None:
        raise refusal(errno.EINVAL, reason)
    vgpu_type = model.type_named(type_name)
    if vgpu_type is None:  # create_refusal has said so already; this keeps the types exact
        raise refusal(errno.EINVAL, f"no vGPU type {type_name!r}")
    before = creatable(model, hosted, mode=gpu.vgpu_mode, placed=placed, mig=gpu.mig_mode)
    # Mixed-size mode: the lowest creatable placement (rules.py's model of the driver's choice).
    placement = (
        creatable_placements(model, vgpu_type, placed)[0]
        if gpu.vgpu_mode is VgpuMode.MIXED_SIZE
        else None
    )
    if gpu.interface == "mdev":
        group = state.allocate_group(vgpu_id)
        cdev = state.allocate_cdev(vgpu_id)
        state.vgpus[vgpu_id] = VgpuRecord(vf, type_name, group, cdev, placement)
        tree.mdev(
            vf=vf,
            root_port=gpu.root_port,
            uuid=vgpu_id,
            vgpu_type=vgpu_type,
            group=group,
            cdev=cdev,
        )
    else:
        # A configured VF is handed to the VM whole: it keeps its own IOMMU group.
        state.vgpus[vgpu_id] = VgpuRecord(vf, type_name, _vf_group(gpu, vf), None, placement)
        tree.vfio_current(vf=vf, root_port=gpu.root_port, type_id=vgpu_type.type_id)
    _refresh(state, tree, gpu, model, before)


def begin_removal(state: SimState, tree: SysfsTree, vgpu_id: str) -> None:
    """A removal of a vGPU a VM holds has started: the kernel undoes what it can (its links
    vanish) and waits for the VM; :func:`remove_vgpu` finishes it once the VM lets go."""
    rec = state.vgpus.get(vgpu_id)
    gpu = state.vf_owner(rec.vf) if rec is not None else None
    if rec is None or gpu is None:
        raise refusal(errno.ENODEV, f"no vGPU {vgpu_id}")
    state.removing.add(vgpu_id)
    if gpu.interface == "mdev":
        tree.detach_mdev(
            vf=rec.vf,
            root_port=gpu.root_port,
            uuid=vgpu_id,
            vgpu_type=state.model_of(gpu).type_named(rec.type),
            cdev=rec.cdev,
        )
        state.free_cdev(rec.cdev)
        rec.cdev = None


def remove_vgpu(
    state: SimState, tree: SysfsTree, vgpu_id: str, *, force: bool = False, refresh: bool = True
) -> None:
    """Remove a vGPU; EBUSY while a VM holds it (unless ``force``: a power cycle). The mdev
    ``remove`` write does not come here while the vGPU is held: it blocks first (kernel.py);
    what does is NVIDIA's ``current_vgpu_type`` (its behaviour under a VM is not public)."""
    rec = state.vgpus.get(vgpu_id)
    if rec is None:
        raise refusal(errno.ENODEV, f"no vGPU {vgpu_id}")
    if vgpu_id in state.held and not force:
        raise refusal(errno.EBUSY, f"vGPU {vgpu_id} is in use by {state.held[vgpu_id]}")
    gpu = state.vf_owner(rec.vf)
    if gpu is None:  # a vGPU always sits on an enabled VF; a state file edited by hand may not
        raise refusal(errno.ENODEV, f"vGPU {vgpu_id} sits on {rec.vf}, which is no enabled VF")
    model = state.model_of(gpu)
    before = creatable(
        model,
        state.hosted(gpu),
        mode=gpu.vgpu_mode,
        placed=state.placed(gpu).values(),
        mig=gpu.mig_mode,
    )
    del state.vgpus[vgpu_id]
    state.held.pop(vgpu_id, None)
    state.hidden.discard(vgpu_id)
    state.by_process.pop(vgpu_id, None)
    state.removing.discard(vgpu_id)
    if gpu.interface == "mdev":
        tree.drop_mdev(
            vf=rec.vf,
            root_port=gpu.root_port,
            uuid=vgpu_id,
            vgpu_type=model.type_named(rec.type),
            group=rec.iommu_group,
            cdev=rec.cdev,
        )
        state.free_group(rec.iommu_group)
        state.free_cdev(rec.cdev)
    else:
        tree.vfio_current(vf=rec.vf, root_port=gpu.root_port, type_id=0)
    if refresh:
        _refresh(state, tree, gpu, model, before)


def _refresh(
    state: SimState,
    tree: SysfsTree,
    gpu: GpuRecord,
    model: SimModel,
    before: dict[str, frozenset[str]],
) -> None:
    tree.update_creatable(
        root_port=gpu.root_port,
        model=model,
        interface=gpu.interface,
        before=before,
        after=creatable(
            model,
            state.hosted(gpu),
            mode=gpu.vgpu_mode,
            placed=state.placed(gpu).values(),
            mig=gpu.mig_mode,
        ),
    )
    if gpu.interface == "vfio":
        placed = state.placed(gpu)
        for v in gpu.vfs:
            at = placed.get(v.address)
            tree.vfio_placement_id(
                vf=v.address, root_port=gpu.root_port, placement=None if at is None else at[1]
            )
        if gpu.vgpu_mode is VgpuMode.MIXED_SIZE:
            tree.vfio_placements(
                root_port=gpu.root_port,
                vfs=[v.address for v in gpu.vfs],
                text=_placements(state, gpu, model),
            )


def _placements(state: SimState, gpu: GpuRecord, model: SimModel) -> str | None:
    """The ``nvidia/creatable_placements`` text of a GPU in mixed-size mode; None otherwise."""
    if gpu.vgpu_mode is not VgpuMode.MIXED_SIZE:
        return None
    return placements_text(model, state.placed(gpu).values())


def _vf_group(gpu: GpuRecord, vf: str) -> int:
    for v in gpu.vfs:
        if v.address == vf:
            return v.iommu_group
    raise refusal(errno.ENODEV, f"{vf} is not a VF of {gpu.address}")


def power_cycle(state: SimState, tree: SysfsTree) -> None:
    """A reboot: every VF and vGPU gone, every GPU equal-size and out of MIG mode, holds and
    faults cleared; PFs and the rest unchanged."""
    for gpu in state.gpus:
        disable_vfs(state, tree, gpu, force=True)
        gpu.vgpu_mode = VgpuMode.EQUAL_SIZE
        gpu.mig_mode = False
    state.vgpus.clear()
    state.held.clear()
    state.hidden.clear()
    state.by_process.clear()
    state.removing.clear()
    state.faults.writes = 0
    state.faults.sriov_manage = None
    state.faults.crash_after = None
