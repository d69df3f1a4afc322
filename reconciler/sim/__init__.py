"""The NVIDIA host simulator: realistic sysfs trees, the driver's reaction to writes, sriov-manage.

``init_host``/``build_host`` make ``DIR/sys`` and ``DIR/bin/sriov-manage``; ``SimHost.open``
recognises such a tree and supplies the kernel writer (plugged into apply's sysfs-writer port),
a hold probe for the observer, and counters. ``hold``/``release``/``fail``/``reboot`` act on the
host as a VM, a flaky driver or a power cycle would. Nothing here is used on a real host.
"""

from reconciler.sim.host import (
    SimGpu,
    SimHost,
    build_host,
    fail,
    hold,
    init_host,
    reboot,
    release,
)
from reconciler.sim.kernel import SimHoldProbe, SimSysfsWriter

__all__ = [
    "SimGpu",
    "SimHoldProbe",
    "SimHost",
    "SimSysfsWriter",
    "build_host",
    "fail",
    "hold",
    "init_host",
    "reboot",
    "release",
]
