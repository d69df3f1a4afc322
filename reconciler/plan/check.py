"""Plan-time checks: can a desired GPU be reached on this host at all?

Resolves each desired entry against the observed GPU (VF keys to VFs) and judges the state it
asks for by the driver's placement rules (:mod:`reconciler.rules`: profiles the GPU offers,
equal-size mode, the per-size maximum, MIG-backed profiles, one vGPU per VF) against the
driver's offer, with the sentences ``validate`` uses against the catalogue's. Removes run before
creates, so only the resulting state matters, not the way there. Every problem is collected,
located in the desired file when known, so an impossible desired state fails at ``plan`` with
all its reasons rather than half-way through ``apply``.
"""

from __future__ import annotations

from operator import attrgetter

from reconciler.catalog import Catalog
from reconciler.model import (
    DesiredGpu,
    Gpu,
    Inventory,
    Problem,
    SourceLocation,
    Vf,
    VfKey,
    VgpuMode,
)
from reconciler.model.record import record
from reconciler.plan.offer import Offer
from reconciler.rules import Request, index_out_of_range, named_twice, violations


@record(frozen=True, slots=True)
class Want:
    """One desired entry: a profile on a named VF (per-VF form) or a count (count form)."""

    profile: str
    count: int
    vf: Vf | None  # the VF named; None in the count form, where the planner picks VFs
    location: SourceLocation | None


@record(frozen=True, slots=True)
class GpuCheck:
    wants: tuple[Want, ...]
    problems: tuple[Problem, ...]
    notes: tuple[str, ...]


def located(message: str, location: SourceLocation | None) -> Problem:
    if location is None:
        return Problem(message)
    return Problem(message, location.file, location.line, location.column)


def vf_slots(gpu: Gpu) -> tuple[Vf, ...]:
    """The GPU's VFs; while SR-IOV is off, the VFs enabling it will make, where they will appear.

    The kernel places VF ``i`` at the PF's routing id + offset + i × stride; the executor
    re-resolves the VF by index after enabling, so a wrong prediction cannot misdirect a write.
    """
    if gpu.sriov_enabled:
        # Index order whatever order the VFs were read in: the plan's order must not depend on it.
        return tuple(sorted(gpu.vfs, key=attrgetter("index")))
    return tuple(Vf(gpu.predicted_vf_address(i), i) for i in range(gpu.total_vfs))


def check_gpu(
    desired: DesiredGpu,
    gpu: Gpu,
    slots: tuple[Vf, ...],
    offer: Offer,
    *,
    inventory: Inventory,
    catalog: Catalog,
    constraints: bool = True,
) -> GpuCheck:
    """Check one desired GPU against the observed one; ``constraints`` False skips what the GPU
    offers (profiles, sizes, maxima): for a GPU whose changes are blocked anyway."""
    problems: list[Problem] = []
    notes: list[str] = []
    label = offer.label
    if desired.model is not None:
        entry = catalog.model(desired.model)
        wanted = entry.name if entry is not None else desired.model
        if offer.model is None:
            notes.append(
                f"{label}: desired model {desired.model} not checked: "
                "the catalogue does not know these PCI ids"
            )
        elif not _same_model(wanted, offer.model, catalog):
            problems.append(
                located(
                    f"GPU {gpu.address} is an {offer.model}, not the desired {desired.model}",
                    desired.location,
                )
            )
    # The loader enforces the next two; re-checked because the planner is also an API.
    if desired.vgpus and desired.profiles:
        problems.append(located(f"{label}: give vgpus or profiles, not both", desired.location))
    if not desired.sriov:
        if desired.vgpus or desired.profiles:
            problems.append(
                located(f"{label}: vGPUs are desired but sriov is disabled", desired.location)
            )
        return GpuCheck((), tuple(problems), tuple(notes))
    if gpu.total_vfs == 0 and constraints:
        problems.append(
            located(
                f"{label} has no SR-IOV VFs (sriov_totalvfs is 0): it cannot host vGPUs",
                desired.location,
            )
        )
        return GpuCheck((), tuple(problems), tuple(notes))

    if desired.vgpus:
        wants, found = _named_vfs(
            desired, slots, gpu=gpu, inventory=inventory, label=label, model=offer.model
        )
        problems.extend(found)
    else:
        wants = tuple(
            Want(name, count, None, desired.location_of(name))
            for name, count in sorted((desired.profiles or {}).items())
            if count > 0
        )
    if not constraints:
        return GpuCheck(wants, tuple(problems), tuple(notes))
    if wants and not offer.complete:
        when = (
            "the driver lists none"
            if gpu.sriov_enabled
            else "SR-IOV is off; plan again once it is enabled"
        )
        notes.append(
            f"{label}: the catalogue does not know this GPU, so its profiles are not checked "
            f"({when})"
        )
    problems.extend(_constraints(desired, wants, gpu, slots, offer))
    return GpuCheck(wants, tuple(problems), tuple(notes))


def _same_model(wanted: str, observed: str, catalog: Catalog) -> bool:
    entry = catalog.model(observed)
    observed = entry.name if entry is not None else observed
    return wanted.casefold() == observed.casefold()


def _named_vfs(
    desired: DesiredGpu,
    slots: tuple[Vf, ...],
    *,
    gpu: Gpu,
    inventory: Inventory,
    label: str,
    model: str | None,
) -> tuple[tuple[Want, ...], list[Problem]]:
    problems: list[Problem] = []
    by_index = {vf.index: vf for vf in slots}
    by_address = {vf.address: vf for vf in slots}
    named: dict[int, VfKey] = {}
    wants: list[Want] = []
    for key, profile in (desired.vgpus or {}).items():
        location = desired.location_of(key)
        vf = by_index.get(key) if isinstance(key, int) else by_address.get(key)
        if vf is None:
            problems.append(
                located(_not_a_vf(key, gpu, slots, inventory, label, model=model), location)
            )
            continue
        if vf.index in named:
            first = named[vf.index]
            as_index, as_address = (first, key) if isinstance(first, int) else (key, first)
            twice = named_twice(
                gpu.address,
                vf.address,
                vf.index,
                desired.location_of(as_index),
                desired.location_of(as_address),
            )
            problems.append(located(str(twice), twice.location))
            continue
        named[vf.index] = key
        wants.append(Want(profile, 1, vf, location))
    # VF order, not file order: "the first over the limit" then means the highest VFs.
    return tuple(sorted(wants, key=lambda w: w.vf.index if w.vf is not None else -1)), problems


def _key_text(key: VfKey) -> str:
    return f"index {key}" if isinstance(key, int) else str(key)


def _not_a_vf(
    key: VfKey,
    gpu: Gpu,
    slots: tuple[Vf, ...],
    inventory: Inventory,
    label: str,
    *,
    model: str | None,
) -> str:
    if not slots:
        return f"{_key_text(key)} is not a VF of {label}: it has no VFs"
    if isinstance(key, int):
        return str(index_out_of_range(gpu.address, model, key, len(slots), None))
    for other in inventory.gpus:
        if other.address != gpu.address and any(vf.address == key for vf in vf_slots(other)):
            return f"{key} is a VF of GPU {other.address}, not of {gpu.address}"
    return f"{key} is not a VF of {label}: its VFs are {slots[0].address} … {slots[-1].address}"


def _constraints(
    desired: DesiredGpu, wants: tuple[Want, ...], gpu: Gpu, slots: tuple[Vf, ...], offer: Offer
) -> list[Problem]:
    """The driver's rules (:mod:`reconciler.rules`) over the entries in the order written."""
    written = wants
    if len(wants) > 1:
        order = {id(w): i for i, w in enumerate(wants)}
        written = tuple(sorted(wants, key=lambda w: _written_order(desired, w, order[id(w)])))
    requests = [
        Request(w.profile, w.count, w.vf.address if w.vf else None, w.location) for w in written
    ]
    found = violations(
        gpu.address,
        offer,
        requests,
        # A type a VF already hosts is offered even if the driver stopped listing it (vfio does).
        hosted=(vf.vgpu.type_name for vf in gpu.vfs if vf.vgpu is not None),
        mixed_size=desired.mode is VgpuMode.MIXED_SIZE,
    )
    return [located(str(v), v.location) for v in found]


def _written_order(desired: DesiredGpu, want: Want, fallback: int) -> tuple[int, int, int]:
    """Where ``want`` was written, so both commands judge the entries in the same order."""
    location = want.location
    if location is None or location is desired.location:
        return (0, 0, fallback)
    return (location.line, location.column, fallback)
