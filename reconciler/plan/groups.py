"""Which GPU of a node each node-group entry configures: known once the host is observed.

:meth:`~reconciler.model.Desired.node` gives a node that no entry of its own names the GPU
entries of every group that selects it (``DesiredNode.matched``); :func:`resolve` matches them
against the node's GPUs and makes each matched GPU a desired GPU at its address, as if the node
listed it. A GPU that entries of several groups (or one group twice) match takes their layout
when they agree; when they do not, the node cannot be planned and the error names both entries
(the other nodes of a fleet are planned all the same).
"""

from __future__ import annotations

from reconciler.model import DesiredGpu, DesiredNode, GroupGpu, Inventory, PlanError, Problem


def resolve(node: DesiredNode, inventory: Inventory) -> DesiredNode:
    """``node`` with its group entries made desired GPUs of ``inventory``'s GPUs (``node``
    itself when no group selects it). Raises :class:`PlanError` naming both entries for each
    GPU two entries give different layouts."""
    if not node.matched:
        return node
    gpus: list[DesiredGpu] = list(node.gpus)
    problems: list[Problem] = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.address):
        entries = [entry for entry in node.matched if entry.match.matches(gpu)]
        if not entries:
            continue
        first = entries[0]
        for other in entries[1:]:
            if other.layout != first.layout:
                problems.append(_conflict(node.name, gpu.address, first, other))
                break
        else:
            gpus.append(first.at(gpu.address))
    if problems:
        count = len(problems)
        raise PlanError(
            f"node groups give {count} GPU{'s' * (count != 1)} of node {node.name} two layouts",
            problems,
        )
    return DesiredNode(node.name, tuple(gpus), node.location)


def _conflict(node: str, address: object, first: GroupGpu, other: GroupGpu) -> Problem:
    message = (
        f"GPU {address} of node {node} is matched by node group '{other.group}' "
        f"({other.match}) and by node group '{first.group}' ({first.match}"
        f"{f', {first.location}' if first.location else ''}), which give it different "
        "layouts: a GPU has one layout; make the entries agree, or narrow a group's selector "
        "or match"
    )
    if other.location is None:
        return Problem(message)
    return Problem(message, other.location.file, other.location.line, other.location.column)
