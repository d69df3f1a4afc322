"""The simulated host's hold probe: which vGPUs a simulated VM holds, from the state file.

:class:`SimHoldProbe` answers the observer's "is a VM holding this vGPU?": not for holders made
hidden, and not from another PID namespace than the host was built in. Its own module, apart
from the kernel emulation: ``vgpuctl plan`` on a simulated host needs the probe and nothing
else of the simulator.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from reconciler.observe.holds import DeviceNodes, HolderScan, pid_namespace_blindness
from reconciler.sim.statefile import read_holds, state_path


def is_simulated(sysfs_root: Path | str) -> bool:
    """Whether ``sysfs_root`` is a simulated host's tree (``vgpuctl sim init``)."""
    return state_path(Path(sysfs_root)).is_file()


class SimHoldProbe:
    """Which vGPUs a simulated VM holds (``vgpuctl sim hold``); reads the state, never locks.

    Holders made with ``sim hold --hidden`` are invisible to it, as a VM in a PID namespace
    vgpuctl cannot look into is to the ``/proc`` probe. Like that probe it is blind when
    vgpuctl runs in another PID namespace than the one the host was built in.
    """

    def __init__(self, sysfs_root: Path, *, proc_root: Path = Path("/proc")) -> None:
        self._root = Path(sysfs_root)
        self._proc_root = proc_root

    def blindness(self) -> str | None:
        holds = read_holds(self._root)
        return pid_namespace_blindness(self._proc_root, host_namespace=holds.pid_namespace)

    def scan(self, vgpus: Mapping[str, DeviceNodes]) -> HolderScan:
        """Input: vGPU UUID (vfio: VF address) → its device nodes; output: the visible holds."""
        holds = read_holds(self._root)
        held = {
            u: holds.held[u.lower()]
            for u in vgpus
            if u.lower() in holds.held and u.lower() not in holds.hidden
        }
        blind = pid_namespace_blindness(self._proc_root, host_namespace=holds.pid_namespace)
        return HolderScan(held=held, blind=blind)
