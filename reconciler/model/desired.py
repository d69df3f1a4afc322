"""The desired state after loading and normalising: per node, per GPU, per VF.

Produced by ``desired`` from YAML (``schemas/desired-state.schema.json``). Profile names are
already long, spelt as the catalogue spells them (``NVIDIA A2-4Q``, ``GRID A100-4C``; the host's
spelling wins at plan time); VF keys are an address or an index. Every entry carries where it
was written, so a plan-time error can name the file, line and column.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from reconciler.model.address import PciAddress
from reconciler.model.mode import VgpuMode

#: A VF named by its PCI address or by its index (0..N-1) under the GPU.
VfKey = PciAddress | int


@dataclass(frozen=True, slots=True)
class SourceLocation:
    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


_EMPTY: Mapping[object, object] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
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

    def location_of(self, key: VfKey | str) -> SourceLocation | None:
        return self.entry_locations.get(key, self.location)


@dataclass(frozen=True, slots=True)
class DesiredNode:
    name: str
    gpus: tuple[DesiredGpu, ...] = ()
    location: SourceLocation | None = None

    def gpu(self, address: PciAddress) -> DesiredGpu | None:
        for g in self.gpus:
            if g.address == address:
                return g
        return None


@dataclass(frozen=True, slots=True)
class Desired:
    """A whole desired-state document (one or more files merged)."""

    name: str
    nodes: Mapping[str, DesiredNode]
    files: tuple[str, ...] = ()
    #: What validation could not check offline and accepted (names the catalogue lacks).
    notes: tuple[str, ...] = ()

    def node(self, name: str) -> DesiredNode | None:
        return self.nodes.get(name)
