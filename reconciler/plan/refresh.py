"""Device-plugin refreshes: which advertised profiles change when the host actions run. Pure.

A profile's device set (the UUIDs the kubelet sees under ``nvidia.com/<profile>``) changes when
a vGPU of that type is created or removed. For each such profile the plan ends with one
``device-plugin-refresh`` naming the resource and the device set the host will have, so a
device plugin in the same process (the watch mode) updates its ``ListAndWatch`` stream at once;
a standalone ``vgpuctl device-plugin`` notices the same change by rescanning.
"""

from __future__ import annotations

from collections.abc import Sequence

from reconciler.model import DevicePluginRefresh, HostAction, Inventory, VgpuCreate, VgpuRemove
from reconciler.model.cluster import resource_name


def refresh_steps(actions: Sequence[HostAction], predicted: Inventory) -> list[DevicePluginRefresh]:
    """One refresh per profile whose set of vGPUs the ``actions`` change."""
    added: dict[str, int] = {}
    removed: dict[str, int] = {}
    for a in actions:
        if isinstance(a, VgpuCreate):
            added[a.type_name] = added.get(a.type_name, 0) + 1
        elif isinstance(a, VgpuRemove):
            removed[a.type_name] = removed.get(a.type_name, 0) + 1
    steps = []
    for type_name in sorted(added.keys() | removed.keys()):
        devices = sorted(
            vf.vgpu.uuid
            for gpu in predicted.gpus
            for vf in gpu.vfs
            if vf.vgpu is not None and vf.vgpu.type_name == type_name
        )
        resource = resource_name(type_name)
        change = ", ".join(
            part
            for part in (
                f"{added[type_name]} added" if type_name in added else "",
                f"{removed[type_name]} removed" if type_name in removed else "",
            )
            if part
        )
        steps.append(
            DevicePluginRefresh(
                target=resource,
                reason=f"{type_name}: {change}; {len(devices)} advertised after",
                resource=resource,
                type_name=type_name,
                devices=tuple(devices),
            )
        )
    return steps
