"""The desired state after loading and normalising: per node, per GPU, per VF.

Produced by ``desired`` from YAML (``schemas/desired-state.schema.json``). Profile names are
already long, spelt as the catalogue spells them (``NVIDIA A2-4Q``, ``GRID A100-4C``; the host's
spelling wins at plan time); VF keys are an address or an index. Every entry carries where it
was written, so a plan-time error can name the file, line and column.

Node groups (``spec.nodeGroups``) configure many nodes at once: a :class:`NodeGroup` selects
nodes by name globs and labels and its GPUs by model, PCI device ID or address, or all of
them. Which groups apply to a node is :meth:`Desired.node`'s to say (a node's own entry
replaces every group);
which GPU of the node each group entry configures is known only once the host is observed
(``plan.groups.resolve``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fnmatch import translate
from types import MappingProxyType
from typing import TYPE_CHECKING

from reconciler.model.address import PciAddress
from reconciler.model.errors import UsageError
from reconciler.model.mode import VgpuMode
from reconciler.model.record import field, record, replace

if TYPE_CHECKING:
    from reconciler.model.inventory import Gpu

#: A VF named by its PCI address or by its index (0..N-1) under the GPU.
VfKey = PciAddress | int


@record(frozen=True, slots=True)
class SourceLocation:
    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


_EMPTY: Mapping[object, object] = MappingProxyType({})


@record(frozen=True, slots=True)
class DesiredGpu:
    """One managed GPU. Exactly one of ``vgpus`` / ``profiles`` is set when SR-IOV is on."""

    address: PciAddress
    sriov: bool
    model: str | None = None
    #: Per-VF form: VF key → long profile name.
    vgpus: Mapping[VfKey, str] | None = None
    #: Count form: long profile name → how many; the planner picks VFs.
    profiles: Mapping[str, int] | None = None
    location: SourceLocation | None = None
    #: Where each VF key or profile name was written (keys as in ``vgpus``/``profiles``).
    entry_locations: Mapping[VfKey | str, SourceLocation] = field(
        default_factory=lambda: MappingProxyType({})
    )
    #: ``mode:``: equal-size (the default) or mixed-size (``nvidia-smi vgpu -shm 1``); never
    #: ``UNKNOWN``.
    mode: VgpuMode = VgpuMode.EQUAL_SIZE
    #: The node group whose entry (at ``location``) gave this GPU its layout; None: the node's
    #: own entry.
    group: str | None = None

    def location_of(self, key: VfKey | str) -> SourceLocation | None:
        return self.entry_locations.get(key, self.location)


@record(frozen=True, slots=True)
class GpuMatch:
    """Which GPUs of a node a group's GPU entry configures: every criterion given must hold."""

    #: The model as the catalogue spells it (``NVIDIA A2``), compared with the model the host's
    #: PCI ids name; a GPU the catalogue does not know has none and never matches.
    model: str | None = None
    #: The PF's PCI device ID, four lower-case hex digits (``25b6``).
    device_id: str | None = None
    address: PciAddress | None = None
    #: ``all: true``: every GPU of the node (vgpu-device-manager's ``devices: all``); the
    #: other criteria, where given, still narrow it.
    all: bool = False

    def matches(self, gpu: Gpu) -> bool:
        return self.matches_identity(gpu.address, gpu.model, gpu.device_id)

    def matches_identity(self, address: PciAddress, model: str | None, device_id: str) -> bool:
        """Whether a GPU known by its address, catalogue model (None: not known) and PCI device
        ID matches (for GPUs seen as Harvester's objects show them)."""
        return (
            (self.model is None or self.model == model)
            and (self.device_id is None or self.device_id == device_id.lower())
            and (self.address is None or self.address == address)
        )

    def __str__(self) -> str:
        """``matching model 'NVIDIA A2'``: messages say ``GPU matching …`` of it."""
        parts = []
        if self.all and self.model is None and self.device_id is None and self.address is None:
            return "matching all GPUs"
        if self.model is not None:
            parts.append(f"model '{self.model}'")
        if self.device_id is not None:
            parts.append(f"device ID {self.device_id}")
        if self.address is not None:
            parts.append(f"address {self.address}")
        return "matching " + " and ".join(parts)


#: A GPU as a message names it: by its address, or by what selects it in a node group.
GpuRef = PciAddress | GpuMatch


@record(frozen=True, slots=True)
class GroupGpu:
    """One GPU entry of a node group: the GPUs it matches and the layout each of them gets."""

    group: str
    match: GpuMatch
    sriov: bool
    vgpus: Mapping[VfKey, str] | None = None
    profiles: Mapping[str, int] | None = None
    mode: VgpuMode = VgpuMode.EQUAL_SIZE
    location: SourceLocation | None = None
    entry_locations: Mapping[VfKey | str, SourceLocation] = field(
        default_factory=lambda: MappingProxyType({})
    )

    @property
    def model(self) -> str | None:
        return self.match.model

    @property
    def layout(self) -> tuple[object, ...]:
        """What this entry makes of a GPU: two entries with equal layouts agree."""
        return (
            self.sriov,
            self.mode,
            None if self.vgpus is None else dict(self.vgpus),
            None if self.profiles is None else dict(self.profiles),
        )

    def at(self, address: PciAddress) -> DesiredGpu:
        """The desired GPU this entry makes of the node's GPU at ``address``."""
        return DesiredGpu(
            address=address,
            sriov=self.sriov,
            model=self.match.model,
            vgpus=self.vgpus,
            profiles=self.profiles,
            location=self.location,
            entry_locations=self.entry_locations,
            mode=self.mode,
            group=self.group,
        )


#: Characters that make a glob more than its own text (``fnmatch``'s wildcards and sets).
_GLOB_SPECIALS = frozenset("*?[")


class NameGlobs:
    """A selector's name globs, compiled once: a name is admitted when it equals one of the
    literal globs (a set) or matches one alternation of the others (``fnmatch.translate``'s
    expressions, case-sensitive as ``fnmatchcase``).

    ``fnmatchcase`` compiles each glob through a cache of 32,768 patterns: a desired state
    with more distinct globs than that recompiled every glob at every match (256 groups × 256
    globs made a 100-node cluster plan take five minutes). Compiled here, each glob costs its
    translation once per loaded desired state, and a match costs one set look-up and one
    regular-expression match whose branches grow linearly with the globs."""

    __slots__ = ("_literal", "_pattern")

    def __init__(self, globs: tuple[str, ...]) -> None:
        literal = {g for g in globs if _GLOB_SPECIALS.isdisjoint(g)}
        wild = [g for g in dict.fromkeys(globs) if g not in literal]
        self._literal = frozenset(literal)
        self._pattern = _alternation([translate(g) for g in wild]) if wild else None

    def __call__(self, name: str) -> bool:
        if name in self._literal:
            return True
        return self._pattern is not None and self._pattern.match(name) is not None


def _alternation(expressions: list[str]) -> re.Pattern[str]:
    """One pattern matching what any of ``fnmatch.translate``'s ``expressions`` matches.

    Each is ``(?s:BODY)\\Z``; one ``(?s:BODY1|BODY2|…)\\Z`` is the same language, and a
    third shorter to compile (the compiler's cost grows with the pattern's text). An
    expression of another shape (another Python's ``translate``) is kept whole."""
    head, tail = "(?s:", ")\\Z"
    if all(e.startswith(head) and e.endswith(tail) for e in expressions):
        return re.compile(head + "|".join(e[len(head) : -len(tail)] for e in expressions) + tail)
    return re.compile("|".join(f"(?:{e})" for e in expressions))


@record(frozen=True, slots=True)
class NodeSelector:
    """Which nodes a group configures: any of ``names`` (globs) and all of ``labels``; an empty
    part says nothing (a selector has at least one part)."""

    names: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: ``names`` compiled, when this selector first matches a name (:class:`NameGlobs`): once
    #: per loaded desired state, and not at all for a command that matches none.
    _globs: NameGlobs | None = field(default=None, init=False, compare=False, repr=False)

    def admits_name(self, name: str) -> bool:
        if not self.names:
            return True
        globs = self._globs
        if globs is None:
            globs = NameGlobs(self.names)
            object.__setattr__(self, "_globs", globs)
        return globs(name)

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        return self.admits_name(name) and all(
            labels.get(key) == value for key, value in self.labels.items()
        )

    @property
    def key(self) -> tuple[frozenset[str], frozenset[tuple[str, str]]]:
        """Equal keys select the same nodes whatever the nodes are."""
        return frozenset(self.names), frozenset(self.labels.items())

    def __str__(self) -> str:
        parts = []
        if self.names:
            parts.append("names " + ", ".join(self.names))
        if self.labels:
            parts.append("labels " + ", ".join(f"{k}={v}" for k, v in self.labels.items()))
        return " and ".join(parts)


@record(frozen=True, slots=True)
class NodeGroup:
    name: str
    selector: NodeSelector
    gpus: tuple[GroupGpu, ...] = ()
    location: SourceLocation | None = None


@record(frozen=True, slots=True)
class DesiredNode:
    name: str
    gpus: tuple[DesiredGpu, ...] = ()
    location: SourceLocation | None = None
    #: The GPU entries of the node groups that select this node, in file order: which GPUs
    #: they configure is known once the host is observed (``plan.groups.resolve`` makes them
    #: ``gpus``). Empty for a node's own entry, which replaces every group.
    matched: tuple[GroupGpu, ...] = ()
    #: ``spec.rollout.maxParallel`` of the desired state it came from: the node agents' fleet
    #: budget, at most this many nodes changing their hosts at once (``apply/slots.py``; None:
    #: no budget). Set by :meth:`Desired.node`.
    max_parallel: int | None = None

    def gpu(self, address: PciAddress) -> DesiredGpu | None:
        for g in self.gpus:
            if g.address == address:
                return g
        return None


@record(frozen=True, slots=True)
class Rollout:
    """How a delegate-mode rollout paces the nodes (``spec.rollout``; ``--max-parallel``,
    ``--canary``, ``--max-failed-nodes``): each field None when not given, so a command-line
    flag, the desired state and the default can be layered (:meth:`over`)."""

    #: At most this many nodes changed at once.
    max_parallel: int | None = None
    #: The first this many nodes (in the plan's order) run first, alone: any failure among
    #: them stops the rollout before another node starts.
    canary: int | None = None
    #: No new node is started once more than this many nodes failed.
    max_failed_nodes: int | None = None
    #: Where it was written (``file:line:col``), for messages; "" from the command line.
    location: str = ""

    def over(self, other: Rollout | None) -> Rollout:
        """This policy's fields where given, else ``other``'s."""
        if other is None:
            return self
        return Rollout(
            max_parallel=self.max_parallel if self.max_parallel is not None else other.max_parallel,
            canary=self.canary if self.canary is not None else other.canary,
            max_failed_nodes=(
                self.max_failed_nodes
                if self.max_failed_nodes is not None
                else other.max_failed_nodes
            ),
            location=self.location or other.location,
        )


@record(frozen=True, slots=True)
class Desired:
    """A whole desired-state document (one or more files merged)."""

    name: str
    nodes: Mapping[str, DesiredNode]
    files: tuple[str, ...] = ()
    #: What validation could not check offline and accepted (names the catalogue lacks).
    notes: tuple[str, ...] = ()
    groups: tuple[NodeGroup, ...] = ()
    #: ``spec.rollout``: the pace of a delegate-mode rollout (None: not given).
    rollout: Rollout | None = None

    def node(self, name: str, labels: Mapping[str, str] | None = None) -> DesiredNode | None:
        """What the desired state wants of node ``name`` (None: nothing).

        Its own entry under ``spec.nodes`` when it has one (it replaces every group); else the
        GPU entries of every group that selects it. ``labels`` are the node's labels; None:
        not known, and a group that selects by labels and admits the name raises
        :class:`UsageError` (guessing could configure a node no group meant).
        """
        found = self._node(name, labels)
        max_parallel = self.rollout.max_parallel if self.rollout is not None else None
        if found is None or max_parallel is None:
            return found
        return replace(found, max_parallel=max_parallel)

    def _node(self, name: str, labels: Mapping[str, str] | None) -> DesiredNode | None:
        own = self.nodes.get(name)
        if own is not None:
            return own
        if labels is None:
            unknown = self.needs_labels(name)
            if unknown:
                group = unknown[0]
                where = f" ({group.location})" if group.location else ""
                raise UsageError(
                    f"node group '{group.name}'{where} selects nodes by labels, and node "
                    f"{name}'s labels are not known here: vgpuctl reads them from the cluster "
                    "(pass --kubeconfig)"
                )
        selecting = [g for g in self.groups if g.selector.matches(name, labels or {})]
        if not selecting:
            return None
        return DesiredNode(
            name,
            location=selecting[0].location,
            matched=tuple(gpu for g in selecting for gpu in g.gpus),
        )

    def may_select(self, name: str) -> tuple[NodeGroup, ...]:
        """The groups that may configure node ``name``: none when the node has its own entry,
        else every group whose selector admits its name (whatever its labels turn out to be)."""
        if name in self.nodes:
            return ()
        return tuple(g for g in self.groups if g.selector.admits_name(name))

    def needs_labels(self, name: str) -> tuple[NodeGroup, ...]:
        """The groups whose say on node ``name`` depends on its labels (none when the node has
        its own entry, or no group both admits its name and selects by labels)."""
        return tuple(g for g in self.may_select(name) if g.selector.labels)

    def selected(self, nodes: Mapping[str, Mapping[str, str]]) -> list[str]:
        """The names the desired state concerns among ``nodes`` (name → labels), with every
        node of its own entries, sorted."""
        chosen = set(self.nodes)
        for name, labels in nodes.items():
            if any(g.selector.matches(name, labels) for g in self.groups):
                chosen.add(name)
        return sorted(chosen)
