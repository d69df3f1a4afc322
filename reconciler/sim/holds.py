"""The simulated host's hold probe: which vGPUs a simulated VM holds, from the state file.

:class:`SimHoldProbe` answers the observer's "is a VM holding this vGPU?": not for holders made
hidden, and not from another PID namespace than the host was built in. Its own module, apart
from the kernel emulation: ``vgpuctl plan`` on a simulated host needs the probe and nothing
else of the simulator.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from reconciler.observe.holds import (
    DeviceNodes,
    HolderScan,
    pid_namespace_blindness,
    processes_blindness,
    scan_processes,
)
from reconciler.sim.procfs import proc_root
from reconciler.sim.statefile import read_holds, state_path


def is_simulated(sysfs_root: Path | str) -> bool:
    """Whether ``sysfs_root`` is a simulated host's tree (``vgpuctl sim init``)."""
    return state_path(Path(sysfs_root)).is_file()


class SimHoldProbe:
    """Which vGPUs a simulated VM holds (``vgpuctl sim hold``); reads the state, never locks.

    Holders made with ``sim hold --hidden`` are invisible to it, as a VM in a PID namespace
    vgpuctl cannot look into is to the ``/proc`` probe. Like that probe it is blind when
    vgpuctl runs in another PID namespace than the one the host was built in. Holders made with
    ``sim hold --device-fd`` are processes of the simulated ``/proc`` (``procfs.py``): those it
    finds as the real probe does, scanning that tree with the same code.
    """

    def __init__(self, sysfs_root: Path, *, proc_root: Path = Path("/proc")) -> None:
        self._root = Path(sysfs_root)
        self._proc_root = proc_root

    def blindness(self) -> str | None:
        holds = read_holds(self._root)
        blind = pid_namespace_blindness(self._proc_root, host_namespace=holds.pid_namespace)
        if blind is None and holds.by_process:
            blind = processes_blindness(proc_root(self._root))
        return blind

    def scan(self, vgpus: Mapping[str, DeviceNodes]) -> HolderScan:
        """Input: vGPU UUID (vfio: VF address) → its device nodes; output: the visible holds."""
        holds = read_holds(self._root)
        unseen = holds.hidden | holds.by_process.keys()
        held = {
            u: holds.held[u.lower()]
            for u in vgpus
            if u.lower() in holds.held and u.lower() not in unseen
        }
        blind = pid_namespace_blindness(self._proc_root, host_namespace=holds.pid_namespace)
        if blind is not None or not holds.by_process:
            return HolderScan(held=held, blind=blind)
        found = scan_processes(proc_root(self._root), vgpus)
        return HolderScan(
            held={**found.held, **held}, blind=found.blind, unattributed=found.unattributed
        )
