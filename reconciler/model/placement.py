"""A GPU's mixed-size placement facts, as the host shows them (docs/domain.md §4).

In mixed-size mode the driver gives each vGPU type a placement size (the slots one vGPU of it
occupies) and each vGPU a placement ID (where it begins); NVML answers, per type, the size and
the IDs creatable now (``nvmlDeviceGetVgpuTypeCreatablePlacements``). Nothing here is assumed:
each fact is one the host printed, and a GPU whose host printed none has no facts (``None`` on
:class:`~reconciler.model.Gpu`), so its layouts are planned without a placement check, saying so.
"""

from __future__ import annotations

from reconciler.model.record import record


@record(frozen=True, slots=True)
class TypePlacements:
    """One type's placements: the slots a vGPU of it occupies, and where one can begin now."""

    name: str
    size: int
    creatable: tuple[int, ...] = ()


@record(frozen=True, slots=True)
class HostedPlacement:
    """Where a vGPU the GPU hosts sits: its VF, type, placement ID, and its type's size (None:
    the host shows no size for it)."""

    vf_index: int
    type_name: str
    start: int
    size: int | None = None

    @property
    def slots(self) -> range | None:
        return None if self.size is None else range(self.start, self.start + self.size)


@record(frozen=True, slots=True)
class PlacementFacts:
    """What the host shows of a GPU's placements; ``unusable`` says why a layout cannot be
    judged by them (a hosted vGPU's placement unreadable, a line not understood), else None."""

    types: tuple[TypePlacements, ...] = ()
    hosted: tuple[HostedPlacement, ...] = ()
    unusable: str | None = None

    def of(self, type_name: str) -> TypePlacements | None:
        for t in self.types:
            if t.name == type_name:
                return t
        return None
