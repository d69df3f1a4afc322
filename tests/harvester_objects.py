"""Harvester objects and delegate steps for unit tests of delegate mode: one A2's VF 0
(``n1-000008004``) as a ``VGPUDevice``, and the ``vgpudevice-enable``/``-disable`` steps on it.
Shared by ``tests/unit/test_apply_delegate.py`` and ``test_watch_leader.py``."""

from __future__ import annotations

from typing import Any

from reconciler.model import PciAddress, VgpuDeviceDisable, VgpuDeviceEnable

NODE = "n1"
GPU = PciAddress.parse("0000:08:00.0")
VF0 = PciAddress.parse("0000:08:00.4")
TYPES = {"NVIDIA A2-2Q": "nvidia-743", "NVIDIA A2-4Q": "nvidia-744"}


def vf_object(enabled: bool, type_name: str, configured: bool) -> dict[str, Any]:
    status: dict[str, Any] = (
        {
            "vGPUStatus": "vGPUConfigured",
            "configureVGPUTypeName": type_name,
            "uuid": TYPES.get(type_name, "nvidia-0"),
        }
        if configured
        else {"availableTypes": dict(TYPES)}
    )
    return {
        "metadata": {"name": f"{NODE}-000008004", "labels": {"nodename": NODE}},
        "spec": {"address": str(VF0), "enabled": enabled, "nodeName": NODE,
                 "parentGPUDeviceAddress": str(GPU), "vGPUTypeName": type_name},
        "status": status,
    }  # fmt: skip


def enable(type_name: str, replaces: str | None = None) -> VgpuDeviceEnable:
    return VgpuDeviceEnable(
        target=f"{NODE}-000008004", reason="r", node=NODE, gpu=GPU, vf=VF0, vf_index=0,
        resource_version="1", type_name=type_name, replaces=replaces,
    )  # fmt: skip


def disable(type_name: str, replaced_by: str | None = None) -> VgpuDeviceDisable:
    return VgpuDeviceDisable(
        target=f"{NODE}-000008004", reason="r", node=NODE, gpu=GPU, vf=VF0, vf_index=0,
        resource_version="1", type_name=type_name, replaced_by=replaced_by,
    )  # fmt: skip
