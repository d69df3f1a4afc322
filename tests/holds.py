"""Test helper: what the observer asks a hold probe about, for probes that ignore the nodes."""

from __future__ import annotations

from reconciler.observe.holds import DeviceNodes


def asked(*vgpu_ids: str) -> dict[str, DeviceNodes]:
    """``{id: DeviceNodes(group="0")}`` for each id: openable vGPUs, as the observer asks."""
    return dict.fromkeys(vgpu_ids, DeviceNodes(group="0"))
