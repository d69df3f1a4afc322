"""What a host-interface reader returns for one GPU, and the port every such reader fills.

A GPU makes vGPUs through one host interface (DOMAIN.md §3): mdev (``mdev.py``) or, later,
NVIDIA's vendor-specific VFIO (a ``vfio.py`` implementing :class:`InterfaceReader`). ``host.py``
asks each reader in turn; the first that recognises the GPU's VFs describes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from reconciler.model import VGPU, Interface, VGPUType
from reconciler.observe.pci import PhysicalFunction


@dataclass(frozen=True, slots=True)
class VfReading:
    """One VF as an interface reader sees it."""

    #: Type names with ``available_instances`` > 0.
    creatable: frozenset[str] = frozenset()
    #: The vGPU on the VF (``in_use`` is filled in later, by the hold probe).
    vgpu: VGPU | None = None
    #: The vGPU's IOMMU group number (``/dev/vfio/<group>``), when asked for and known.
    iommu_group: str | None = None


@dataclass(frozen=True, slots=True)
class GpuReading:
    interface: Interface
    #: Offered types in the driver's numeric type-id order.
    types: tuple[VGPUType, ...] = ()
    #: One per VF of the PF, in the same (``virtfn``) order.
    vfs: tuple[VfReading, ...] = ()
    notes: tuple[str, ...] = ()


class InterfaceReader(Protocol):
    """Reads the vGPU side of one GPU for one host interface."""

    def read_gpu(self, pf: PhysicalFunction) -> GpuReading | None:
        """The GPU's types and per-VF state, or ``None`` if its VFs do not use this interface."""
        ...
