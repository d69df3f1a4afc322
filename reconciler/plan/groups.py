"""Which GPU of a node each node-group entry configures: known once the host is observed.

:meth:`~reconciler.model.Desired.node` gives a node that no entry of its own names the GPU
entries of every group that selects it (``DesiredNode.matched``); :func:`resolve` matches them
against the node's GPUs and makes each matched GPU a desired GPU at its address, as if the node
listed it. A GPU that entries of several groups (or one group twice) match takes their layout
when they agree; when they do not, the node cannot be planned and the error names both entries
(the other nodes of a fleet are planned all the same). :func:`resolve_on` does the same for
GPUs known only by their identities (delegate mode: Harvester's objects), where a model the
identities cannot decide is an error, never a guess.
"""

from __future__ import annotations

from collections.abc import Sequence

from reconciler.model import (
    DesiredGpu,
    DesiredNode,
    GroupGpu,
    Inventory,
    PciAddress,
    PlanError,
    Problem,
)
from reconciler.model.record import record


@record(frozen=True, slots=True)
class GpuIdentity:
    """What a node-group entry can match a GPU by."""

    address: PciAddress
    #: The catalogue's names for its PCI ids: one on a host (subsystem ids decide), none when
    #: the catalogue does not know them, and two where only vendor and device ID are known
    #: (a Harvester ``PCIDevice``: the A2 and the A16 share 10de:25b6).
    models: frozenset[str]
    #: The PF's PCI device ID ("" where nothing says it).
    device_id: str

    @property
    def model(self) -> str | None:
        return next(iter(self.models)) if len(self.models) == 1 else None


def resolve(node: DesiredNode, inventory: Inventory) -> DesiredNode:
    """``node`` with its group entries made desired GPUs of ``inventory``'s GPUs (``node``
    itself when no group selects it). Raises :class:`PlanError` naming both entries for each
    GPU two entries give different layouts."""
    if not node.matched:
        return node
    return resolve_on(
        node,
        [
            GpuIdentity(g.address, frozenset({g.model} if g.model else ()), g.device_id)
            for g in inventory.gpus
        ],
    )


def resolve_on(node: DesiredNode, gpus: Sequence[GpuIdentity]) -> DesiredNode:
    """:func:`resolve` against GPUs known by their identities alone."""
    if not node.matched:
        return node
    resolved: list[DesiredGpu] = list(node.gpus)
    problems: list[Problem] = []
    for gpu in sorted(gpus, key=lambda g: g.address):
        entries: list[GroupGpu] = []
        for entry in node.matched:
            match = entry.match
            if (
                gpu.model is None
                and match.model in gpu.models
                and match.matches_identity(gpu.address, match.model, gpu.device_id)
            ):
                # It may be that model or another: no guess either way.
                problems.append(_undecided(node.name, gpu, entry))
            elif match.matches_identity(gpu.address, gpu.model, gpu.device_id):
                entries.append(entry)
        if not entries:
            continue
        first = entries[0]
        for other in entries[1:]:
            if other.layout != first.layout:
                problems.append(_conflict(node.name, gpu.address, first, other))
                break
        else:
            resolved.append(first.at(gpu.address))
    if problems:
        count = len(problems)
        raise PlanError(
            f"node groups give {count} GPU{'s' * (count != 1)} of node {node.name} two layouts",
            problems,
        )
    return DesiredNode(node.name, tuple(resolved), node.location)


def _undecided(node: str, gpu: GpuIdentity, entry: GroupGpu) -> Problem:
    models = " or ".join(sorted(gpu.models))
    return _located(
        f"GPU {gpu.address} of node {node} may be {models} (PCI device {gpu.device_id}): node "
        f"group '{entry.group}' matches {entry.match.model} by model, which cannot tell them "
        "apart here; match it by deviceId or address",
        entry,
    )


def _located(message: str, entry: GroupGpu) -> Problem:
    if entry.location is None:
        return Problem(message)
    return Problem(message, entry.location.file, entry.location.line, entry.location.column)


def _conflict(node: str, address: object, first: GroupGpu, other: GroupGpu) -> Problem:
    message = (
        f"GPU {address} of node {node} is matched by node group '{other.group}' "
        f"({other.match}) and by node group '{first.group}' ({first.match}"
        f"{f', {first.location}' if first.location else ''}), which give it different "
        "layouts: a GPU has one layout; make the entries agree, or narrow a group's selector "
        "or match"
    )
    return _located(message, other)
