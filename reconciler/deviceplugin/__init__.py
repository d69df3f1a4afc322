"""Kubelet device plugins (gRPC v1beta1): advertise each vGPU profile on the node to the kubelet.

``devices.py`` is the pure part (device sets from an inventory, health and tombstones, the
``Allocate`` answer, preferred allocation); ``server.py`` serves one profile on its own Unix
socket and registers it; ``manager.py`` runs one plugin per profile present, follows kubelet
restarts, and runs the plugins alone (``vgpuctl device-plugin``).

Importing this package does not import grpc or watchdog: node-local commands must start fast.
The gRPC-backed names are loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.deviceplugin.devices import (
    HEALTHY,
    UNHEALTHY,
    Allocation,
    AllocationError,
    DeviceSets,
    PluginDevice,
    UnknownDeviceError,
    allocate_env_name,
    allocation,
    carry_vanished,
    device_sets,
    preferred,
    socket_name,
)
from reconciler.model.lazy import lazy_exports

if TYPE_CHECKING:
    from reconciler.deviceplugin.manager import (
        Backoff,
        PluginManager,
        removals,
        run_standalone,
    )
    from reconciler.deviceplugin.server import (
        API_VERSION,
        DEFAULT_PLUGIN_DIR,
        KUBELET_SOCKET,
        PluginDirError,
        ProfilePlugin,
        RegistrationError,
        check_plugin_dir,
    )

_LAZY = {
    "Backoff": "reconciler.deviceplugin.manager",
    "PluginManager": "reconciler.deviceplugin.manager",
    "removals": "reconciler.deviceplugin.manager",
    "run_standalone": "reconciler.deviceplugin.manager",
    "API_VERSION": "reconciler.deviceplugin.server",
    "DEFAULT_PLUGIN_DIR": "reconciler.deviceplugin.server",
    "KUBELET_SOCKET": "reconciler.deviceplugin.server",
    "PluginDirError": "reconciler.deviceplugin.server",
    "ProfilePlugin": "reconciler.deviceplugin.server",
    "RegistrationError": "reconciler.deviceplugin.server",
    "check_plugin_dir": "reconciler.deviceplugin.server",
}


__getattr__ = lazy_exports(__name__, _LAZY, globals())


__all__ = [
    "API_VERSION",
    "DEFAULT_PLUGIN_DIR",
    "HEALTHY",
    "KUBELET_SOCKET",
    "UNHEALTHY",
    "Allocation",
    "AllocationError",
    "Backoff",
    "DeviceSets",
    "PluginDevice",
    "PluginDirError",
    "PluginManager",
    "ProfilePlugin",
    "RegistrationError",
    "UnknownDeviceError",
    "allocate_env_name",
    "allocation",
    "carry_vanished",
    "check_plugin_dir",
    "device_sets",
    "preferred",
    "removals",
    "run_standalone",
    "socket_name",
]
