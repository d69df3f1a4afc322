"""Mixed-size placement at plan time: can the vGPUs a GPU's plan creates all be placed?

In mixed-size mode a vGPU begins at one of its type's placement IDs and occupies as many slots
as the type's placement size (docs/domain.md §4), so vGPUs whose sizes sum within the
framebuffer can still be refused: no set of free, non-overlapping placements holds them. The
facts are the host's (:class:`~reconciler.model.placement.PlacementFacts`: each type's size and
creatable IDs now, each hosted vGPU's ID), never a size assumed here. A layout no set of
placements holds is refused at plan time, naming the slot conflict; which placement the driver
picks for each create is not known, so a layout that fits only some ways may still meet a
refusal at apply time, which apply reports.

Where the host shows no facts (no ``nvidia/creatable_placements``: every real host we know of),
or shows them in a way that cannot be used, or the plan removes vGPUs first (what their slots
free is not shown), the layout is planned as before and a note says placement was not checked.
"""

from __future__ import annotations

from collections.abc import Iterable

from reconciler.model import Gpu, HostAction, VgpuCreate, VgpuRemove
from reconciler.model.placement import PlacementFacts, TypePlacements
from reconciler.model.record import record

#: The most placements tried before giving up on a layout as "not checked".
SEARCH_LIMIT = 200_000


@record(frozen=True, slots=True)
class PlacementCheck:
    """A refusal (the layout cannot be placed), or a note (it was not checked), or neither."""

    problem: str | None = None
    note: str | None = None


def check_placement(gpu: Gpu, steps: Iterable[HostAction], *, label: str) -> PlacementCheck:
    """Judge the creates among ``steps`` (a GPU's actions and blocked steps) against the
    placement facts of ``gpu`` (which is wanted in mixed-size mode)."""
    steps = tuple(steps)
    creates = [s for s in steps if isinstance(s, VgpuCreate)]
    if not creates:
        return PlacementCheck()
    facts = gpu.placements
    if facts is None:
        return PlacementCheck(
            note=f"{label}: placement not checked (the host shows no placement facts)"
        )
    if facts.unusable is not None:
        return PlacementCheck(note=f"{label}: placement not checked ({facts.unusable})")
    if any(isinstance(s, VgpuRemove) for s in steps):
        return PlacementCheck(
            note=f"{label}: placement not checked (vGPUs are removed first, and the host shows "
            "only the placements creatable now)"
        )
    wanted: list[tuple[VgpuCreate, TypePlacements]] = []
    for create in creates:
        t = facts.of(create.type_name)
        if t is None:
            return PlacementCheck(
                note=f"{label}: placement not checked (the host shows no placements of "
                f"{create.type_name})"
            )
        wanted.append((create, t))
    # Largest first: the hardest to place decides soonest.
    wanted.sort(key=lambda w: (-w[1].size, w[0].vf_index))
    found = _search([t for _, t in wanted])
    if found is None:
        return PlacementCheck(
            note=f"{label}: placement not checked (more than {SEARCH_LIMIT} placements to try)"
        )
    if found:
        return PlacementCheck()
    return PlacementCheck(problem=f"{label} (mixed-size mode): {_conflict(wanted, facts)}")


def _search(types: list[TypePlacements]) -> bool | None:
    """Whether each of ``types`` (one per create) can begin at one of its creatable IDs with no
    two occupying a slot twice; None when the search gave up."""
    budget = SEARCH_LIMIT
    taken: list[range] = []

    def place(i: int) -> bool | None:
        nonlocal budget
        if i == len(types):
            return True
        t = types[i]
        for start in t.creatable:
            budget -= 1
            if budget < 0:
                return None
            here = range(start, start + t.size)
            if any(_overlap(here, other) for other in taken):
                continue
            taken.append(here)
            done = place(i + 1)
            taken.pop()
            if done is not False:
                return done
        return False

    return place(0)


def _overlap(a: range, b: range) -> bool:
    return a.start < b.stop and b.start < a.stop


def _conflict(wanted: list[tuple[VgpuCreate, TypePlacements]], facts: PlacementFacts) -> str:
    """The slot conflict, told by placing the creates largest first at their lowest free ID:
    the first that finds none, each of its IDs with what holds its slots."""
    holders: list[tuple[range, str]] = [
        (slots, f"the {h.type_name} the GPU hosts ({_span(slots)})")
        for h in facts.hosted
        if (slots := h.slots) is not None
    ]
    for create, t in wanted:
        free = [
            start
            for start in t.creatable
            if not any(_overlap(range(start, start + t.size), held) for held, _ in holders)
        ]
        if free:
            slots = range(free[0], free[0] + t.size)
            name = f"the {create.type_name} for VF {create.target}"
            holders.append((slots, f"{name} ({_span(slots)})"))
            continue
        clashes = []
        for start in t.creatable:
            here = range(start, start + t.size)
            who = next(name for held, name in holders if _overlap(here, held))
            clashes.append(f"{start} overlaps {who}")
        where = "; ".join(clashes) if clashes else "the host shows none creatable"
        return (
            f"the vGPUs to create cannot all be placed: {create.type_name} for VF "
            f"{create.target} occupies {t.size} placement slots, and every placement it may "
            f"begin at is taken ({where}); the sizes may fit the framebuffer, but the driver "
            "places a vGPU only at a free placement (fragmentation)"
        )
    return "the vGPUs to create cannot all be placed"  # the search and this walk disagree


def _span(slots: range) -> str:
    return f"slots {slots.start}-{slots.stop - 1}"
