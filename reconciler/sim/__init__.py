"""The NVIDIA host simulator: realistic sysfs trees, the driver's reaction to writes, sriov-manage.

``init_host``/``build_host`` make ``DIR/sys``, ``DIR/bin/sriov-manage`` and ``DIR/bin/nvidia-smi``;
``SimHost.open`` recognises such a tree and supplies the kernel writer (plugged into apply's
sysfs-writer port), a hold probe for the observer, and counters. ``hold``/``release``/``remove``/
``fail``/``reboot`` act on the host as a VM, an administrator, a flaky driver or a power cycle
would. Nothing here is used on a real host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.model.lazy import lazy_exports

if TYPE_CHECKING:
    from reconciler.sim.holds import SimHoldProbe
    from reconciler.sim.host import (
        SimGpu,
        SimHost,
        build_host,
        fail,
        hold,
        init_host,
        reboot,
        release,
        remove,
    )
    from reconciler.sim.kernel import SimSysfsWriter

#: Where each name lives, imported on first use: the CLI's plan on a simulated host needs only
#: the hold probe (``reconciler.sim.holds``), not the kernel emulation and the builders.
_HOMES = {
    "SimHoldProbe": "reconciler.sim.holds",
    "SimSysfsWriter": "reconciler.sim.kernel",
    **dict.fromkeys(
        (
            "SimGpu",
            "SimHost",
            "build_host",
            "fail",
            "hold",
            "init_host",
            "reboot",
            "release",
            "remove",
        ),
        "reconciler.sim.host",
    ),
}


__getattr__ = lazy_exports(__name__, _HOMES, globals())


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
    "remove",
]
