"""Kubelet device plugins (gRPC v1beta1): advertise each vGPU profile on the node to the kubelet.

``devices.py`` is the pure part (device sets from an inventory, health and tombstones, the
``Allocate`` answer, preferred allocation); ``server.py`` serves one profile on its own Unix
socket and registers it; ``manager.py`` runs one plugin per profile present, follows kubelet
restarts, and runs the plugins alone (``vgpuctl device-plugin``).

Importing this package does not import grpc or watchdog: node-local commands must start fast.
The gRPC-backed names are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
    "Backoff": "manager",
    "PluginManager": "manager",
    "removals": "manager",
    "run_standalone": "manager",
    "API_VERSION": "server",
    "DEFAULT_PLUGIN_DIR": "server",
    "KUBELET_SOCKET": "server",
    "PluginDirError": "server",
    "ProfilePlugin": "server",
    "RegistrationError": "server",
    "check_plugin_dir": "server",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


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
