"""KubeVirt's virt-handler beside a crash-safety run: the cluster it reads, and its sweeps counted.

The crash scenarios (``crash.py``: apply; ``watch_crash.py``: watch) run every vgpuctl process
against the API-server emulator, whose KubeVirt CR starts allow-listing the types the host
starts with (:func:`seed_cluster`: a node reconciled before would have it so). Between their
steps they run virt-handler's heartbeat (:mod:`reconciler.sim.virt_handler`), which removes
every mdev whose type the CR does not allow-list, in use or not; :class:`Sweeps` runs them and
counts what they took (vGPUs lost, held ones among them: both must be 0).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reconciler.model.cluster import KUBEVIRT_OWNED_ANNOTATION, resource_name
from reconciler.sim.kernel import SimSysfsWriter
from reconciler.sim.state import load_state
from reconciler.sim.virt_handler import MDEV_DEVICES, sweep
from tests.doubles.emulator import ApiServerEmulator
from tests.reliability.hosts import SimNode, kernel_quiet

#: The KubeVirt CR (group, version, plural, name) and its namespace.
KUBEVIRT = ("kubevirt.io", "v1", "kubevirts", "kubevirt")
NAMESPACE = "harvester-system"


def seed_cluster(emu: ApiServerEmulator, directory: Path, host_dir: Path) -> tuple[str, ...]:
    """The emulator's KubeVirt CR allow-listing (as vgpuctl's) the types the host starts with,
    and the global flags for it."""
    types = sorted({v.type for v in load_state(host_dir / "sys").vgpus.values()})
    entries = [
        {"mdevNameSelector": t, "resourceName": resource_name(t), "externalResourceProvider": True}
        for t in types
    ]
    kubevirt: dict[str, Any] = {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {"name": KUBEVIRT[-1], "namespace": NAMESPACE},
        "spec": {"configuration": {"permittedHostDevices": {"mediatedDevices": entries}}},
    }
    if types:
        kubevirt["metadata"]["annotations"] = {KUBEVIRT_OWNED_ANNOTATION: ",".join(types)}
    emu.seed(kubevirt)
    kubelet = directory / "kubelet"
    (kubelet / "device-plugins").mkdir(parents=True)
    kubeconfig = emu.kubeconfig(directory / "kubeconfig")
    return ("--kubeconfig", str(kubeconfig), "--kubelet-dir", str(kubelet))


@dataclass(slots=True)
class Sweeps:
    """The heartbeats run beside one run, and the vGPUs their sweeps took (UUID → type; held:
    a VM's)."""

    heartbeats: int = 0
    swept: dict[str, str] = field(default_factory=dict)
    swept_held: dict[str, str] = field(default_factory=dict)
    #: When the last heartbeat ran (``time.monotonic``), for :meth:`every`.
    last: float = 0.0

    @property
    def lost(self) -> int:
        return len(self.swept) + len(self.swept_held)

    def heartbeat(self, node: SimNode, emu: ApiServerEmulator) -> None:
        """One virt-handler heartbeat: its sweep under the KubeVirt CR as the emulator has it,
        both read at one instant (the simulated kernel idle: no vgpuctl change half done). A
        held vGPU's removal is counted, not started (the run must not block on its VM); the
        others are removed, once the host lock is let go (a removal takes it)."""
        with kernel_quiet(node.sysfs_root):
            kubevirt = emu.get_object(*KUBEVIRT, namespace=NAMESPACE)
            found = sweep(node.dir, kubevirt, wait=False, dry_run=True)
        writer = SimSysfsWriter(node.sysfs_root)
        for uuid in found.removed:
            try:
                writer.write(str(MDEV_DEVICES / uuid / "remove"), "1")
            except FileNotFoundError:
                continue  # gone meanwhile
            self.swept[uuid] = found.removed[uuid]
        self.swept_held.update(found.held)
        self.heartbeats += 1
        self.last = time.monotonic()

    def every(self, seconds: float, node: SimNode, emu: ApiServerEmulator) -> None:
        """A heartbeat when the last one is ``seconds`` old or more (a waiting loop's tick)."""
        if time.monotonic() - self.last >= seconds:
            self.heartbeat(node, emu)

    def describe(self) -> str:
        return f"virt-handler swept {self.swept} (held: {self.swept_held})"


def figures(tallies: list[Sweeps]) -> dict[str, int]:
    """A scenario's ``sweeper`` figures: heartbeats, vGPUs lost, held ones among them."""
    return {
        "heartbeats": sum(t.heartbeats for t in tallies),
        "vgpus_lost": sum(t.lost for t in tallies),
        "in_use_removed": sum(len(t.swept_held) for t in tallies),
    }
