"""Host observers: read sysfs (or a simulated tree) into an :class:`~reconciler.model.Inventory`.

``observe_host`` is the entry point. Each observer is a thin raw read (``sysfs.py``) plus pure
parsers (``parse.py``); ``pci.py`` finds the GPUs, one reader per host interface (``mdev.py``)
describes their VFs, and a :class:`HoldProbe` (``holds.py``) says which vGPUs a VM holds.
``observe_cluster`` (``cluster.py``) reads the cluster side through the ClusterApi port, with
the kubelet's device-plugin checkpoint (``checkpoint.py``).
"""

from reconciler.observe.checkpoint import CheckpointEntry, parse_checkpoint, read_checkpoint
from reconciler.observe.cluster import (
    inventory_from_cluster,
    kubevirt_config,
    observe_cluster,
    observe_nodes_from_cluster,
)
from reconciler.observe.holds import HoldProbe, ProcfsHoldProbe
from reconciler.observe.host import SysfsChangedError, observe_host
from reconciler.observe.sysfs import SysfsTree

__all__ = [
    "CheckpointEntry",
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
