"""The per-VF diff of one managed GPU: which vGPUs go, which come, what stays, and why.

Minimal by design: a VF that already hosts its desired profile is never touched, whatever its
UUID; a profile change is a remove and a create of that one VF. A vGPU in use is never removed:
its removal is blocked, and so is everything that needs it gone (the replacement on its VF, the
GPU's SR-IOV disable, creates that would not fit beside it).

No change breaks what it cannot rebuild: when no create of a GPU can run (each waits for a
vGPU in use, or is blocked for a reason the caller gives: ``creates_blocked``), the
removals that would only make room for them are deferred with the same cause, so the GPU
keeps its working vGPUs until the change can be made whole. Removals the desired state wants
for their own sake (a type it still wants, fewer times; SR-IOV disabled) still run.
``partial`` (``apply --partial``) runs them all at once, giving capacity up early.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TypeVar

from reconciler.model import (
    UNKNOWN_HOLDER,
    VGPU,
    Gpu,
    HostAction,
    Interface,
    Noop,
    PciAddress,
    SriovDisable,
    SriovEnable,
    Vf,
    VgpuCreate,
    VgpuRemove,
)
from reconciler.model.cluster import kubevirt_selector
from reconciler.model.record import field, record, replace
from reconciler.plan.offer import Offer, TypeFacts
from reconciler.plan.uuids import vgpu_uuid

_S = TypeVar("_S", bound=HostAction)


def vf_order(step: HostAction) -> int:
    """A step's VF index; -1 for a GPU-level step (SR-IOV)."""
    return step.vf_index if isinstance(step, VgpuRemove | VgpuCreate) else -1


@record(frozen=True, slots=True)
class CreateBlocks:
    """Why vGPU creates must wait, from outside the GPU: every create (``every``: KubeVirt's
    sweep with no cluster to allow-list through), or the creates of a type (``by_selector``:
    the type's name as KubeVirt compares it, :func:`kubevirt_selector` → why: a type KubeVirt
    serves itself)."""

    every: str | None = None
    by_selector: Mapping[str, str] = field(default_factory=dict)

    def reason(self, type_name: str) -> str | None:
        """Why a create of ``type_name`` waits, None when it need not."""
        if self.every is not None:
            return self.every
        return self.by_selector.get(kubevirt_selector(type_name)) if self.by_selector else None

    def __bool__(self) -> bool:
        return self.every is not None or bool(self.by_selector)


@record(frozen=True, slots=True)
class GpuDiff:
    """One GPU's steps (actions not numbered yet: ``seq`` 0), each list in run order (kind,
    then VF index)."""

    actions: list[HostAction] = field(default_factory=list)
    blocked: list[HostAction] = field(default_factory=list)
    noops: list[Noop] = field(default_factory=list)


def diff_gpu(
    gpu: Gpu,
    slots: tuple[Vf, ...],
    *,
    sriov: bool,
    profiles: Mapping[int, str],
    offer: Offer,
    node: str,
    interface: Interface,
    partial: bool = False,
    creates_blocked: CreateBlocks | None = None,
) -> GpuDiff:
    """Steps that take ``gpu`` to ``profiles`` (VF index → profile; absent: no vGPU).
    ``interface``: the one its VFs show, or will once SR-IOV is on; it says how a new vGPU is
    named (an mdev UUID; on vfio, its VF's address). ``partial``: run the removals that only
    make room for creates that must wait (module docstring). ``creates_blocked``: why vGPUs
    may not be made on this GPU now (every create it names that could otherwise run is blocked
    with its reason)."""
    diff = GpuDiff()
    pf = gpu.address
    if not sriov:
        _disable(gpu, slots, diff)
        return diff
    if gpu.sriov_enabled:
        key = str(pf)
        noop = _enabled_noops.get(key)
        if noop is None:
            noop = Noop(key, "SR-IOV enabled as desired")
            if len(_enabled_noops) >= _FREE_NOOPS_LIMIT:
                _enabled_noops.clear()
            _enabled_noops[key] = noop
        diff.noops.append(noop)
    else:
        diff.actions.append(
            SriovEnable(
                target=str(pf),
                reason="SR-IOV is off; desired enabled",
                gpu=pf,
                num_vfs=gpu.total_vfs,
            )
        )

    creates: list[VgpuCreate] = []
    kept: list[str] = []  # types that stay as desired
    held: list[Vf] = []  # in-use vGPUs that should go but cannot
    enabled = gpu.sriov_enabled
    free_noops = _free_noops
    for vf in slots:
        want = profiles.get(vf.index)
        have = vf.vgpu
        if have is None and want is None and enabled:  # most VFs of a node: nothing to do
            entry = free_noops.get(id(vf))
            diff.noops.append(entry[1] if entry is not None and entry[0] is vf else _free_noop(vf))
            continue
        if have is None:
            if want is not None:
                address = str(vf.address)
                appears = "has no vGPU" if enabled else "appears when SR-IOV is enabled"
                creates.append(
                    _create(
                        pf,
                        address,
                        vf.index,
                        want,
                        _identity(interface, node, address),
                        reason=f"VF {address} {appears}; desired {want}",
                    )
                )
            # else a VF that does not exist yet, which needs no word (an existing one has had)
            continue
        if have.type_name == want:
            diff.noops.append(_kept_noop(vf, want))
            kept.append(want)
            continue
        address = str(vf.address)
        wanted = f"desired {want}" if want is not None else "no vGPU desired"
        remove = _remove(
            pf,
            address,
            vf.index,
            have,
            replaced_by=want,
            reason=f"VF {address} hosts {have.type_name}; {wanted}",
        )
        create = (
            None
            if want is None
            else _create(
                pf,
                address,
                vf.index,
                want,
                _identity(interface, node, address),
                reason=remove.reason,
                replaces=have.type_name,
            )
        )
        if have.in_use:
            diff.blocked.append(replace(remove, reason=f"VF {address} {_held(have)}; {wanted}"))
            held.append(vf)
            if create is not None:
                diff.blocked.append(replace(create, reason=_waits_for([vf])))
        else:
            diff.actions.append(remove)
            if create is not None:
                creates.append(create)

    run, waiting = _hold_back(creates, held, kept, offer)
    if creates_blocked and run:
        stopped = [(s, creates_blocked.reason(s.type_name)) for s in run]
        waiting = [*waiting, *(replace(s, reason=why) for s, why in stopped if why is not None)]
        run = [s for s, why in stopped if why is None]
    blocked_creates = [*waiting, *(s for s in diff.blocked if isinstance(s, VgpuCreate))]
    if blocked_creates and not run and not partial:
        _defer_room_making(diff, blocked_creates, wanted=frozenset(profiles.values()))
    # A replacement is marked only while both halves share a fate: a remove that runs while its
    # create waits is a plain remove (and counted as one), the waiting create a plain create.
    removing = {s.vf_index for s in diff.actions if isinstance(s, VgpuRemove)}
    split = {s.vf_index for s in waiting if s.replaces is not None and s.vf_index in removing}
    if split:
        diff.actions[:] = [_plain(s) if vf_order(s) in split else s for s in diff.actions]
        waiting = [_plain(s) if s.vf_index in split else s for s in waiting]
    diff.actions.extend(run)
    diff.blocked.extend(waiting)
    diff.blocked.sort(key=lambda s: (s.kind.order, vf_order(s)))
    return diff


#: The word on a VF with no vGPU and none desired, by the VF (held: its id is not reused).
#: Parsing shares a fleet's equal free VFs, and planning words each of them node after node.
_FREE_NOOPS_LIMIT = 1 << 14
_free_noops: dict[int, tuple[Vf, Noop]] = {}
#: The word on a VF that hosts its desired type, by the VF's address (parsing shares equal
#: addresses) and the type.
_kept_noops: dict[tuple[int, str], tuple[PciAddress, Noop]] = {}
#: The word on a GPU whose SR-IOV is on as desired, by its address.
_enabled_noops: dict[str, Noop] = {}


def _kept_noop(vf: Vf, want: str) -> Noop:
    key = (id(vf.address), want)
    entry = _kept_noops.get(key)
    if entry is not None and entry[0] is vf.address:
        return entry[1]
    noop = Noop(str(vf.address), f"hosts {want} as desired")
    if type(want) is str:  # what equals it words the same
        if len(_kept_noops) >= _FREE_NOOPS_LIMIT:
            _kept_noops.clear()
        _kept_noops[key] = (vf.address, noop)
    return noop


def _free_noop(vf: Vf) -> Noop:
    noop = Noop(str(vf.address), "no vGPU, none desired")
    if len(_free_noops) >= _FREE_NOOPS_LIMIT:
        _free_noops.clear()
    _free_noops[id(vf)] = (vf, noop)
    return noop


def _disable(gpu: Gpu, slots: tuple[Vf, ...], diff: GpuDiff) -> None:
    pf = gpu.address
    if not gpu.sriov_enabled:
        diff.noops.append(Noop(str(pf), "SR-IOV disabled as desired"))
        return
    held: list[Vf] = []
    for vf in slots:
        have = vf.vgpu
        if have is None:
            continue  # the VF itself goes with SR-IOV
        address = str(vf.address)
        remove = _remove(
            pf,
            address,
            vf.index,
            have,
            replaced_by=None,
            reason=f"VF {address} hosts {have.type_name}; desired SR-IOV disabled",
        )
        if have.in_use:
            held.append(vf)
            diff.blocked.append(
                replace(
                    remove,
                    reason=f"VF {address} {_held(have)}; desired SR-IOV disabled",
                )
            )
        else:
            diff.actions.append(remove)
    disable = SriovDisable(
        target=str(pf),
        reason=f"SR-IOV is on ({gpu.num_vfs} VFs); desired disabled",
        gpu=pf,
    )
    if held:
        diff.blocked.append(replace(disable, reason=_waits_for(held)))
    else:
        diff.actions.append(disable)


def _remove(
    pf: PciAddress, address: str, index: int, have: VGPU, *, replaced_by: str | None, reason: str
) -> VgpuRemove:
    return VgpuRemove(
        target=address,
        reason=reason,
        gpu=pf,
        vf_index=index,
        type_name=have.type_name,
        uuid=have.uuid,
        replaced_by=replaced_by,
    )


def _identity(interface: Interface, node: str, address: str) -> str:
    """How the vGPU to make on VF ``address`` is named: on NVIDIA's vendor-specific VFIO the
    VF is the vGPU, so its address (no UUID is invented); an mdev gets vgpuctl's stable UUID."""
    return address if interface is Interface.VFIO else vgpu_uuid(node, address)


def _create(
    pf: PciAddress,
    address: str,
    index: int,
    profile: str,
    uuid: str,
    *,
    reason: str,
    replaces: str | None = None,
) -> VgpuCreate:
    return VgpuCreate(
        target=address,
        reason=reason,
        gpu=pf,
        vf_index=index,
        type_name=profile,
        uuid=uuid,
        replaces=replaces,
    )


def _plain(step: _S) -> _S:
    """``step`` as a plain remove or create (not half of a replacement)."""
    if isinstance(step, VgpuRemove):
        return replace(step, replaced_by=None)
    if isinstance(step, VgpuCreate):
        return replace(step, replaces=None)
    return step


def _held(vgpu: VGPU) -> str:
    """What a VF's in-use vGPU is, for the reason of a blocked step: ``hosts X, in use by Y``."""
    if vgpu.removing:
        return (
            f"has vGPU {vgpu.uuid} being removed: the kernel waits for whatever holds it "
            "(probably a VM vgpuctl cannot see) to let go"
        )
    unknown = f"{UNKNOWN_HOLDER}: "
    if vgpu.holder.startswith(unknown):
        return f"hosts {vgpu.type_name}, counted as in use: {vgpu.holder.removeprefix(unknown)}"
    if vgpu.holder:
        return f"hosts {vgpu.type_name}, in use by {vgpu.holder}"
    return f"hosts {vgpu.type_name}, in use (holder unknown)"


def _waits_for(vfs: Iterable[Vf]) -> str:
    names = ", ".join(
        f"vGPU {vf.vgpu.uuid} on {vf.address} (a removal under way)"
        if vf.vgpu.removing
        else f"{vf.vgpu.type_name} on {vf.address} (in use)"
        for vf in vfs
        if vf.vgpu is not None
    )
    return f"waits for {names} to be removed"


def _defer_room_making(diff: GpuDiff, waiting: list[VgpuCreate], *, wanted: frozenset[str]) -> None:
    """Move each removal of ``diff.actions`` that only makes room for the ``waiting`` creates
    (every create of the GPU) to ``diff.blocked``, with their cause.

    A removal is for its own sake, and stays, when nothing replaces it on its VF and the GPU
    still wants its type (the desired state wants fewer of it); any other removal makes room
    for the new layout: the replacement on its VF, or the capacity a new type needs."""
    causes = dict.fromkeys(s.reason for s in waiting)
    types = ", ".join(sorted({s.type_name for s in waiting}))
    because = f"deferred: it only makes room for {types}, which {'; '.join(causes)}"
    kept: list[HostAction] = []
    for step in diff.actions:
        if isinstance(step, VgpuRemove) and not (
            step.replaced_by is None and step.type_name in wanted
        ):
            diff.blocked.append(
                replace(
                    step,
                    reason=f"{step.reason}; {because} (apply --partial removes it now)",
                )
            )
        else:
            kept.append(step)
    diff.actions[:] = kept


def _hold_back(
    creates: list[VgpuCreate], held: list[Vf], kept: list[str], offer: Offer
) -> tuple[list[VgpuCreate], list[VgpuCreate]]:
    """Split creates into those that fit beside the in-use vGPUs that stay, and the rest.

    The desired state itself was checked; what can break it is a vGPU that should have been
    removed but is in use: creates of another framebuffer size, or beyond the size's maximum
    counting it, must wait for it.
    """
    if not held:
        return creates, []
    stays: list[tuple[Vf, TypeFacts]] = []
    for vf in held:
        facts = offer.facts(vf.vgpu.type_name) if vf.vgpu is not None else None
        if facts is not None:  # a type nothing describes cannot be reasoned about
            stays.append((vf, facts))
    present = [f for f in (offer.facts(name) for name in kept) if f is not None]
    present += [f for _, f in stays]
    per_size = Counter(f.framebuffer_mib for f in present)
    run: list[VgpuCreate] = []
    waiting: list[VgpuCreate] = []
    for step in creates:
        facts = offer.facts(step.type_name)
        if facts is None:
            run.append(step)
            continue
        size = facts.framebuffer_mib
        blockers = [vf for vf, f in stays if f.framebuffer_mib != size]
        if not blockers:
            limits = [
                f.max_instance
                for f in (facts, *present)
                if f.framebuffer_mib == size and f.max_instance is not None
            ]
            if limits and per_size[size] >= min(limits):
                blockers = [vf for vf, _ in stays]
        if blockers:
            waiting.append(replace(step, reason=_waits_for(blockers)))
        else:
            run.append(step)
            per_size[size] += 1
    return run, waiting
