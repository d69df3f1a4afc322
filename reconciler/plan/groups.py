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
    AbsentError,
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
    #: The groups an entry of which matched a GPU of the node (or may: undecided).
    answered: set[str] = set()
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
                answered.add(entry.group)
            elif match.matches_identity(gpu.address, gpu.model, gpu.device_id):
                entries.append(entry)
                answered.add(entry.group)
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
    unanswered = _unanswered(node, gpus, answered)
    if unanswered:
        count = len(unanswered)
        raise AbsentError(
            f"{count} node group{'s' * (count != 1)} that select{'s' * (count == 1)} node "
            f"{node.name} match{'es' * (count == 1)} none of its GPUs",
            unanswered,
        )
    return DesiredNode(node.name, tuple(resolved), node.location)


def _unanswered(
    node: DesiredNode, gpus: Sequence[GpuIdentity], answered: set[str]
) -> list[Problem]:
    """One problem for each group that selects ``node`` and none of whose entries matches any
    of its GPUs: what it wanted, and what the node has. Left unplanned, such a node would be
    called converged while nothing the group wants is there (its GPU's driver did not load,
    the node is not one the group meant)."""
    wanted: dict[str, list[GroupGpu]] = {}
    for entry in node.matched:
        if entry.group not in answered:
            wanted.setdefault(entry.group, []).append(entry)
    if not wanted:
        return []
    here = ", ".join(
        f"{g.address}" + (f" ({g.model})" if g.model else "")
        for g in sorted(gpus, key=lambda g: g.address)
    )
    has = f"its GPUs are {here}" if here else "no NVIDIA SR-IOV GPU is seen on it"
    problems = []
    for group, entries in wanted.items():
        wants = "; ".join(f"GPUs {e.match}" for e in entries)
        problems.append(
            _located(
                f"node group '{group}' selects node {node.name}, and none of its GPU entries "
                f"matches a GPU there (it wants {wants}): {has}. Narrow the group's selector, "
                "or see why the GPU is missing (vgpuctl doctor)",
                entries[0],
            )
        )
    return problems


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
