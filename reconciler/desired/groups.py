"""Offline checks across node groups: what can be known of ``spec.nodeGroups`` without nodes.

Part of ``desired``'s fourth stage. Which nodes a group selects is the cluster's to say (names
and labels), and which GPUs its entries match is the host's (models, device IDs, addresses), so
most overlaps can only be found when a node is planned (``plan.groups``). Two cases need no
node at all, and ``vgpuctl validate`` reports them:

- two groups of one name (messages and ``validate --explain`` name groups by it);
- two entries that match GPUs alike under selectors that select the same nodes, whatever the
  nodes are, and give them different layouts: every node either selects gets both.
"""

from __future__ import annotations

from collections.abc import Sequence

from reconciler.desired.normalise import GpuEntry, GroupEntry
from reconciler.desired.source import problem_at
from reconciler.model import GpuMatch, GroupGpu, Problem, SourceLocation


def group_problems(groups: Sequence[GroupEntry]) -> list[Problem]:
    """The problems of ``groups`` (every file's, in file order) that show without nodes."""
    problems: list[Problem] = []
    named: dict[str, GroupEntry] = {}
    for group in groups:
        first = named.setdefault(group.group.name, group)
        if first is not group:
            problems.append(
                problem_at(
                    group.location,
                    f"node group '{group.group.name}' is already defined at "
                    f"{where(first.location)}: group names are unique",
                )
            )
    # Entries that certainly meet on every node their groups select: same selector, same match.
    alike: dict[tuple[object, GpuMatch], tuple[GroupEntry, GpuEntry, GroupGpu]] = {}
    for group in groups:
        for entry in group.gpus:
            gpu = entry.gpu
            if not isinstance(gpu, GroupGpu):  # a group's GPUs always are
                continue
            key = (group.group.selector.key, gpu.match)
            seen = alike.setdefault(key, (group, entry, gpu))
            if seen[2] is gpu or seen[2].layout == gpu.layout:
                continue
            other_group, other_entry, _ = seen
            whose = (
                "this group"
                if other_group is group
                else f"node group '{other_group.group.name}', which selects the same nodes,"
            )
            problems.append(
                problem_at(
                    entry.location,
                    f"node group '{group.group.name}' gives the GPUs {gpu.match} a layout "
                    f"other than {whose} gives them at {where(other_entry.location)}: a GPU "
                    "has one layout; make the two entries agree or keep one",
                )
            )
    return problems


def where(location: SourceLocation) -> str:
    """``file:line:col``, or the file alone where there is no line (a data document)."""
    return str(location) if location.line else location.file
