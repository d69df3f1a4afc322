"""A GPU's vGPU mode in the plan: the ``vgpu-mode`` step, or why the GPU's creates must wait.

NVIDIA's driver (docs/domain.md §4) sets the mode (``nvidia-smi vgpu -i <gpu> -shm 1``) only
while SR-IOV is on and the GPU hosts no vGPU, and ``sriov-manage`` resets it to equal-size.
The mode matters only to vGPUs about to be made, so a step is planned only for a GPU with
creates: after the GPU's removals and its SR-IOV enable, before its first create (the action
kinds' order). Where vGPUs stay on the GPU (kept as desired, or in use) the switch cannot run:
creates that fit beside them in either mode (one framebuffer size) still run; the others are
blocked, with the switch, saying why. A mode that could not be read on a GPU hosting vGPUs
(``unknown``) is never guessed at. A GPU is put back in equal-size mode only when its mode is
known to be mixed-size and it has no vGPU left at that point.
"""

from __future__ import annotations

from reconciler.model import Gpu, VgpuCreate, VgpuMode, VgpuModeSet, VgpuRemove
from reconciler.model.record import replace
from reconciler.plan.diff import GpuDiff, vf_order
from reconciler.plan.offer import Offer

_SWITCH = {VgpuMode.EQUAL_SIZE: "-shm 0", VgpuMode.MIXED_SIZE: "-shm 1"}


def with_mode_step(gpu: Gpu, diff: GpuDiff, *, wanted: VgpuMode, offer: Offer) -> GpuDiff:
    """``diff`` with the vgpu-mode step ``gpu`` needs before its creates (if any), or with
    the creates that need it blocked."""
    creates = [a for a in diff.actions if isinstance(a, VgpuCreate)]
    if not creates and not any(isinstance(a, VgpuCreate) for a in diff.blocked):
        return diff
    # SR-IOV off now: sriov-manage -e (planned) leaves the GPU in equal-size mode.
    current = gpu.vgpu_mode if gpu.sriov_enabled else VgpuMode.EQUAL_SIZE
    if current is wanted:
        return diff
    if wanted is VgpuMode.EQUAL_SIZE and current is VgpuMode.UNKNOWN:
        return diff  # what fits equal-size mode fits mixed-size mode: nothing to guard
    removed = {a.vf_index for a in diff.actions if isinstance(a, VgpuRemove)}
    stays = [vf for vf in gpu.vfs if vf.vgpu is not None and vf.index not in removed]
    address = gpu.address
    step = VgpuModeSet(
        target=str(address),
        reason=_reason(gpu, current, wanted),
        gpu=address,
        mode=wanted,
    )
    if not stays and creates:
        return replace(diff, actions=[*diff.actions, step])
    if not stays:
        # Every create of the GPU is blocked for another reason (KubeVirt's sweep, …): the
        # switch, needed only by them, waits with them.
        waits = replace(step, reason=f"{step.reason}; waits with the GPU's creates, all blocked")
        blocked = sorted([*diff.blocked, waits], key=lambda s: (s.kind.order, vf_order(s)))
        return replace(diff, blocked=blocked)
    if wanted is VgpuMode.EQUAL_SIZE:
        return diff  # the mode stays mixed-size while vGPUs stay; equal sizes fit it anyway
    # vGPUs stay: the switch cannot run. Creates of the one size they share run in either mode.
    sizes = {_size(offer, vf.vgpu.type_name) for vf in stays if vf.vgpu is not None}
    shared = next(iter(sizes)) if len(sizes) == 1 else None
    names = ", ".join(
        f"{vf.vgpu.type_name} on {vf.address}" for vf in stays[:3] if vf.vgpu is not None
    )
    more = f" and {len(stays) - 3} more" if len(stays) > 3 else ""
    why = (
        f"GPU {address} hosts vGPUs that stay ({names}{more}): the driver sets the vGPU mode "
        "only while a GPU hosts none"
    )
    waiting = [a for a in creates if shared is None or _size(offer, a.type_name) != shared]
    if not waiting and creates:
        return diff  # every create fits beside what stays
    held = {id(a) for a in waiting}
    # A replacement whose create waits is a plain remove now and a plain create later (as
    # diff.py splits one whose create waits for an in-use vGPU).
    split = {a.vf_index for a in waiting if a.replaces is not None}
    blocked_creates = [
        replace(a, reason=f"needs {wanted} mode on GPU {address}; {why}", replaces=None)
        for a in waiting
    ]
    actions = [
        replace(a, replaced_by=None) if isinstance(a, VgpuRemove) and a.vf_index in split else a
        for a in diff.actions
        if id(a) not in held
    ]
    blocked = sorted(
        [*diff.blocked, replace(step, reason=f"{_now(current, wanted)}; {why}"), *blocked_creates],
        key=lambda s: (s.kind.order, vf_order(s)),
    )
    return replace(diff, actions=actions, blocked=blocked)


def _reason(gpu: Gpu, current: VgpuMode, wanted: VgpuMode) -> str:
    if not gpu.sriov_enabled:
        return (
            f"desired {wanted}; the GPU will be in equal-size mode after sriov-manage -e "
            f"(nvidia-smi vgpu -i {gpu.address} {_SWITCH[wanted]}, before its first vGPU)"
        )
    return (
        f"{_now(current, wanted)} (nvidia-smi vgpu -i {gpu.address} {_SWITCH[wanted]}, "
        "before its first vGPU)"
    )


def _now(current: VgpuMode, wanted: VgpuMode) -> str:
    now = "its mode could not be read" if current is VgpuMode.UNKNOWN else f"it is {current}"
    return f"desired {wanted}, {now}"


def _size(offer: Offer, type_name: str) -> int | None:
    facts = offer.facts(type_name)
    return facts.framebuffer_mib if facts is not None else None
