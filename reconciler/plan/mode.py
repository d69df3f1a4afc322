"""A GPU's vGPU mode in the plan: the ``vgpu-mode`` step, or why the GPU's creates must wait.

NVIDIA's driver (docs/domain.md §4) sets the mode (``nvidia-smi vgpu -i <gpu> -shm 1``) only
while SR-IOV is on and the GPU hosts no vGPU, and ``sriov-manage`` resets it to equal-size.
The mode matters to vGPUs about to be made: a step runs after the GPU's removals and its SR-IOV
enable, before its first create (the action kinds' order). A GPU declared in mixed-size mode
with nothing to create is switched too when it hosts no vGPU (the switch can run); one whose
vGPUs stay is left as it is, and :func:`mode_gaps` says so (a note in the plan, drift for
``assert``): a declared mode the GPU is not in is never a silent "no changes". Where vGPUs
stay on the GPU (kept as desired, or in use) and creates wait, the switch cannot run: creates
that fit beside them in either mode (one framebuffer size) still run; the others are blocked,
with the switch, saying why. A mode that could not be read on a GPU hosting vGPUs
(``unknown``) is never guessed at. A GPU is put back in equal-size mode only when its mode is
known to be mixed-size and it has no vGPU left at that point.
"""

from __future__ import annotations

from reconciler.model import (
    DesiredNode,
    Gpu,
    Inventory,
    PciAddress,
    Plan,
    VgpuCreate,
    VgpuMode,
    VgpuModeSet,
    VgpuRemove,
)
from reconciler.model.record import record, replace
from reconciler.plan.diff import GpuDiff, vf_order
from reconciler.plan.offer import Offer

_SWITCH = {VgpuMode.EQUAL_SIZE: "-shm 0", VgpuMode.MIXED_SIZE: "-shm 1"}


def with_mode_step(gpu: Gpu, diff: GpuDiff, *, wanted: VgpuMode, offer: Offer) -> GpuDiff:
    """``diff`` with the vgpu-mode step ``gpu`` needs before its creates (if any), or with
    the creates that need it blocked."""
    creates = [a for a in diff.actions if isinstance(a, VgpuCreate)]
    making = bool(creates) or any(isinstance(a, VgpuCreate) for a in diff.blocked)
    if not making and wanted is not VgpuMode.MIXED_SIZE:
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
    if not making:
        # Nothing to make: switched where the switch can run (no vGPU stays, the mode known);
        # else left as it is, which mode_gaps reports.
        if stays or current is VgpuMode.UNKNOWN:
            return diff
        return replace(diff, actions=[*diff.actions, step])
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


@record(frozen=True, slots=True)
class ModeGap:
    """A GPU declared in mixed-size mode that the plan leaves in another mode (or whose mode
    could not be read): ``text`` for the plan's notes; ``drift`` when the mode was read."""

    gpu: PciAddress
    text: str
    drift: bool


def mode_gaps(
    plan: Plan, inventory: Inventory, desired: DesiredNode, *, read: frozenset[PciAddress]
) -> tuple[ModeGap, ...]:
    """The GPUs ``desired`` declares in mixed-size mode (SR-IOV on) that no step of ``plan``
    switches and that are not in that mode as ``inventory`` shows it. ``read``: the GPUs whose
    mode nvidia-smi told; any other mode is the driver's default, not a reading, and is said
    to be unknown rather than judged."""
    switched = {
        a.gpu
        for a in (*plan.actions, *(b.action for b in plan.blocked))
        if isinstance(a, VgpuModeSet)
    }
    by_address = {g.address: g for g in inventory.gpus}
    gaps: list[ModeGap] = []
    for want in desired.gpus:
        gpu = by_address.get(want.address)
        if (
            want.mode is not VgpuMode.MIXED_SIZE
            or not want.sriov
            or gpu is None
            or not gpu.sriov_enabled
            or gpu.address in switched
            or gpu.vgpu_mode is VgpuMode.MIXED_SIZE
        ):
            continue
        address = gpu.address
        if gpu.vgpu_mode is VgpuMode.UNKNOWN or address not in read:
            gaps.append(
                ModeGap(
                    address,
                    f"GPU {address}: desired mixed-size mode; its mode could not be read "
                    "(nvidia-smi -q did not say), so whether it is in that mode is not known",
                    drift=False,
                )
            )
            continue
        hosted = [vf for vf in gpu.vfs if vf.vgpu is not None]
        first = hosted[0]
        gaps.append(
            ModeGap(
                address,
                f"GPU {address}: desired mixed-size mode, it is {gpu.vgpu_mode} (nvidia-smi -q) "
                f"and stays so: it hosts {len(hosted)} vGPU{'s' * (len(hosted) != 1)} (the "
                f"first on {first.address}) and the driver sets the mode only while a GPU "
                "hosts none; nothing to create needs it, so no switch is planned",
                drift=True,
            )
            if hosted
            else ModeGap(
                address,
                f"GPU {address}: desired mixed-size mode, it is {gpu.vgpu_mode} (nvidia-smi -q)",
                drift=True,
            )
        )
    return tuple(gaps)


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
