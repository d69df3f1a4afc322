"""Host observers: read sysfs (or a simulated tree) into an :class:`~reconciler.model.Inventory`.

``observe_host`` is the entry point. Each observer is a thin raw read (``sysfs.py``) plus pure
parsers (``parse.py``); ``pci.py`` finds the GPUs, one reader per host interface (``mdev.py``)
describes their VFs, and a :class:`HoldProbe` (``holds.py``) says which vGPUs a VM holds.
"""

from reconciler.observe.holds import HoldProbe, ProcfsHoldProbe
from reconciler.observe.host import SysfsChangedError, observe_host
from reconciler.observe.sysfs import SysfsTree

__all__ = ["HoldProbe", "ProcfsHoldProbe", "SysfsChangedError", "SysfsTree", "observe_host"]
