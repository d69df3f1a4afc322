"""Hand-built GPUs as the observer gives them, and desired GPUs as the loader gives them, for
tests of the planner that need no simulated host (tests/unit/test_plan*.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from reconciler.catalog import default_catalog
from reconciler.model import (
    VGPU,
    DesiredGpu,
    Gpu,
    Interface,
    PciAddress,
    SourceLocation,
    Vf,
    VGPUType,
)

CATALOG = default_catalog()
NODE = "node-1"
A2 = PciAddress.parse("0000:08:00.0")
A2_B = PciAddress.parse("0000:09:00.0")
A2_C = PciAddress.parse("0000:0a:00.0")


def card(
    short: str,
    address: PciAddress,
    vgpus: Mapping[int, str] | None = None,
    *,
    enabled: bool = True,
    in_use: Mapping[int, str] | None = None,
) -> Gpu:
    """A GPU of a catalogue model; ``vgpus``: VF index → short profile name."""
    model = CATALOG.model(short)
    assert model is not None
    pci = model.pci_ids[0]
    vgpus = vgpus or {}
    in_use = in_use or {}
    off = Gpu(
        address,
        pci.vendor,
        pci.device,
        pci.subsystem_vendor,
        pci.subsystem_device,
        model=model.name,
        total_vfs=model.vfs,
        vf_offset=model.vf_offset if model.vf_offset is not None else 4,
        vf_stride=model.vf_stride,
        driver="nvidia",
    )
    if not enabled:
        return off
    vfs = tuple(
        Vf(
            off.predicted_vf_address(i),
            i,
            None
            if i not in vgpus
            else VGPU(f"uuid-{address}-{i}", f"NVIDIA {vgpus[i]}", i in in_use, in_use.get(i, "")),
        )
        for i in range(model.vfs)
    )
    # Type ids are the driver branch's: any will do, the planner resolves types by name.
    types = tuple(
        VGPUType(p.name, f"nvidia-{500 + n}", p.framebuffer_mib, p.max_instances)
        for n, p in enumerate(model.time_sliced_profiles)
    )
    return replace(off, interface=Interface.MDEV, num_vfs=model.vfs, vfs=vfs, types=types)


def a2(
    address: PciAddress = A2,
    vgpus: Mapping[int, str] | None = None,
    *,
    enabled: bool = True,
    in_use: Mapping[int, str] | None = None,
) -> Gpu:
    """An NVIDIA A2: 16 VFs, VF 0 at function 4."""
    return card("A2", address, vgpus, enabled=enabled, in_use=in_use)


def want(
    address: PciAddress = A2,
    vgpus: Mapping[PciAddress | int, str] | None = None,
    *,
    profiles: Mapping[str, int] | None = None,
    sriov: bool = True,
    line: int | None = None,
) -> DesiredGpu:
    """A desired GPU; profile names short (``A2-4Q``). ``line`` locates it in ``d.yaml``."""
    where = None if line is None else SourceLocation("d.yaml", line, 11)
    return DesiredGpu(
        address=address,
        sriov=sriov,
        vgpus=None if vgpus is None else {k: f"NVIDIA {v}" for k, v in vgpus.items()},
        profiles=None if profiles is None else {f"NVIDIA {k}": n for k, n in profiles.items()},
        location=where,
    )
