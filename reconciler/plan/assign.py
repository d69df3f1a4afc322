"""The count form (``profiles: {NVIDIA L40S-8Q: 6}``): which VFs host which profile.

Deterministic and minimal: VFs that already host a wanted profile keep it (in-use ones first,
then the lowest indexes); the rest of each count goes to the lowest free VFs, preferring VFs
with no vGPU, then VFs whose vGPU must go anyway (a new vGPU is made before the old one goes).
Profiles are served in name order, so the result depends only on the observed VFs and the
counts, never on the order they were read in.

While a VM holds a vGPU that must go, the change cannot finish in one run, and what runs now
(removals) turns VFs whose vGPU must go into VFs with no vGPU. The free VFs are then taken in
index order whether or not their vGPU is gone yet, so the VFs a plan names for its waiting
creates are the ones the next plan names too, before and after those removals (issue 29: what
``plan`` names is what ``apply`` does or reports).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from operator import attrgetter

from reconciler.model import DesiredGpu, Vf, VfKey


def vf_profiles(desired: DesiredGpu, slots: Iterable[Vf]) -> dict[int, str]:
    """VF index → profile the desired GPU asks for on ``slots`` (its VFs, or where they will be).

    The one place both forms resolve: the per-VF form by VF address or index, the count form by
    :func:`assign_counts`. The host planner diffs against it and the CR renderer writes it into
    ``spec.vGPUTypeName``, so the two never disagree. Keys naming no VF are skipped here (the
    planner's checks report them).
    """
    if not desired.sriov:
        return {}
    if desired.profiles:
        counts = {name: n for name, n in desired.profiles.items() if n > 0}
        return assign_counts(slots, counts)
    by_key: dict[VfKey, int] = {}
    for vf in slots:
        by_key[vf.index] = vf.index
        by_key[vf.address] = vf.index
    chosen: dict[int, str] = {}
    for key, profile in (desired.vgpus or {}).items():
        index = by_key.get(key)
        if index is not None:
            chosen.setdefault(index, profile)
    return chosen


def assign_counts(vfs: Iterable[Vf], counts: Mapping[str, int]) -> dict[int, str]:
    """VF index → profile for ``counts``. The caller has checked the counts fit the VFs."""
    ordered = sorted(vfs, key=_by_index)
    chosen: dict[int, str] = {}
    hosting: dict[str, list[Vf]] = {}
    for vf in ordered:
        if vf.vgpu is not None and vf.vgpu.type_name in counts:
            hosting.setdefault(vf.vgpu.type_name, []).append(vf)
    missing: list[str] = []
    for name in sorted(counts):
        keep = sorted(hosting.get(name, ()), key=_keep_order)[: max(counts[name], 0)]
        chosen.update((vf.index, name) for vf in keep)
        missing.extend([name] * (counts[name] - len(keep)))
    if not missing:
        return chosen
    # The free VFs in fill order: each kind in index order, those with no vGPU first, then those
    # whose vGPU must go anyway; an in-use VF comes last (a create there waits until its VM lets
    # go). With an in-use vGPU to go, the first two kinds are one, in index order (module
    # docstring).
    empty: list[Vf] = []
    surplus: list[Vf] = []
    held: list[Vf] = []
    for vf in ordered:
        if vf.index not in chosen:
            have = vf.vgpu
            (empty if have is None else held if have.in_use else surplus).append(vf)
    free = [*sorted([*empty, *surplus], key=_by_index), *held] if held else [*empty, *surplus]
    chosen.update((vf.index, name) for vf, name in zip(free, missing, strict=False))
    return chosen


def _keep_order(vf: Vf) -> tuple[bool, int]:
    # A surplus must be removed; an in-use vGPU cannot be, so it is kept before any other.
    return (not (vf.vgpu is not None and vf.vgpu.in_use), vf.index)


_by_index = attrgetter("index")
