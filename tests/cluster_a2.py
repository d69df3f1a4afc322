"""A hand-built A2 node for tests of cluster planning (tests/unit/test_plan_cluster.py and the
tests of the allow-list beside it): the GPU as the observer gives it, its desired state as the
loader gives it, KubeVirt allow-list entries as vgpuctl writes them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from reconciler.catalog import default_catalog
from reconciler.model import (
    VGPU,
    DesiredGpu,
    DesiredNode,
    Gpu,
    Interface,
    PciAddress,
    Vf,
    VfKey,
    VGPUType,
)
from reconciler.model.cluster import KubeVirtConfig

CATALOG = default_catalog()
NODE = "n1"
A2 = PciAddress.parse("0000:08:00.0")


def mdev_a2(vgpus: Mapping[int, str], *, held: Mapping[int, str] | None = None) -> Gpu:
    """An A2 with SR-IOV on, ``vgpus`` by VF index (``held``: index → host holder)."""
    held = held or {}
    model = CATALOG.model("A2")
    assert model is not None
    types = tuple(
        VGPUType(p.name, f"nvidia-{742 + i}", p.framebuffer_mib, p.max_instances)
        for i, p in enumerate(model.time_sliced_profiles)
    )
    base = Gpu(
        A2,
        "10de",
        "25b6",
        model="NVIDIA A2",
        total_vfs=16,
        num_vfs=16,
        vf_offset=4,
        driver="nvidia",
    )
    vfs = tuple(
        Vf(
            base.predicted_vf_address(i),
            i,
            VGPU(f"uuid-{i}", vgpus[i], i in held, held.get(i, "")) if i in vgpus else None,
        )
        for i in range(16)
    )
    return replace(base, interface=Interface.MDEV, vfs=vfs, types=types)


def a2_desired(vgpus: Mapping[int, str]) -> DesiredNode:
    keyed: dict[VfKey, str] = dict(vgpus.items())
    return DesiredNode(NODE, (DesiredGpu(A2, True, vgpus=keyed),))


def allow_entry(profile: str) -> dict[str, Any]:
    return {
        "mdevNameSelector": profile,
        "resourceName": "nvidia.com/" + profile.replace(" ", "_"),
        "externalResourceProvider": True,
    }


def kubevirt_config(selectors: list[str], owned: list[str]) -> KubeVirtConfig:
    entries = tuple(allow_entry(s) for s in selectors)
    return KubeVirtConfig("kubevirt", "kubevirt", "5", entries, frozenset(owned))
