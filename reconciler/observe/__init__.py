"""Host observers: read sysfs (or a simulated tree) into an :class:`~reconciler.model.Inventory`.

``observe_host`` is the entry point. Each observer is a thin raw read (``sysfs.py``) plus pure
parsers (``parse.py``); ``pci.py`` finds the GPUs, one reader per host interface (``mdev.py``)
describes their VFs, and a :class:`HoldProbe` (``holds.py``) says which vGPUs a VM holds.
``observe_cluster`` (``cluster.py``) reads the cluster side through the ClusterApi port, with
the kubelet's device-plugin checkpoint (``checkpoint.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.model.lazy import lazy_exports

if TYPE_CHECKING:
    from reconciler.observe.checkpoint import CheckpointEntry, parse_checkpoint, read_checkpoint
    from reconciler.observe.cluster import (
        FleetReader,
        inventory_from_cluster,
        kubevirt_config,
        observe_cluster,
        observe_nodes_from_cluster,
    )
    from reconciler.observe.holds import HoldProbe, ProcfsHoldProbe
    from reconciler.observe.host import SysfsChangedError, observe_host
    from reconciler.observe.sysfs import SysfsTree

#: Where each public name lives. Imported on first use: a host's plan without a cluster reads
#: no cluster (``cluster.py`` and what it imports stay out of its start).
_EXPORTS = {
    "CheckpointEntry": "reconciler.observe.checkpoint",
    "FleetReader": "reconciler.observe.cluster",
    "HoldProbe": "reconciler.observe.holds",
    "ProcfsHoldProbe": "reconciler.observe.holds",
    "SysfsChangedError": "reconciler.observe.host",
    "SysfsTree": "reconciler.observe.sysfs",
    "inventory_from_cluster": "reconciler.observe.cluster",
    "kubevirt_config": "reconciler.observe.cluster",
    "observe_cluster": "reconciler.observe.cluster",
    "observe_host": "reconciler.observe.host",
    "observe_nodes_from_cluster": "reconciler.observe.cluster",
    "parse_checkpoint": "reconciler.observe.checkpoint",
    "read_checkpoint": "reconciler.observe.checkpoint",
}


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())


__all__ = [
    "CheckpointEntry",
    "FleetReader",
    "HoldProbe",
    "ProcfsHoldProbe",
    "SysfsChangedError",
    "SysfsTree",
    "inventory_from_cluster",
    "kubevirt_config",
    "observe_cluster",
    "observe_host",
    "observe_nodes_from_cluster",
    "parse_checkpoint",
    "read_checkpoint",
]
