"""The simulator's hidden state file and the lock that serialises every change to a host.

``<sysfs root>/.vgpuctl-sim/state.json`` holds what the sysfs files do not say by themselves:
which catalogue model each GPU is (with its types, copied), which vGPU interface it shows
(mdev or vfio, per GPU) and its vGPU mode (equal-size or mixed-size: no sysfs file shows it),
the VFs and vGPUs with their IOMMU groups, which vGPUs a simulated VM holds, pending faults,
counters, and the IOMMU group allocator. The tree is rendered from it, and both change together
under one ``fcntl`` lock (``.vgpuctl-sim/lock``): the apply process (through the writer),
``sriov-manage`` and ``nvidia-smi`` subprocesses act on one host concurrently. The file is
replaced atomically, so readers (the hold probe, ``stats``) need no lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reconciler.model.mode import VgpuMode
from reconciler.model.record import field, record
from reconciler.observe.holds import INIT_PID_NAMESPACE
from reconciler.sim.rules import SimModel
from reconciler.sim.statefile import (
    FORMAT_VERSION,
    STATE_DIR,
    STATE_FILE,
    Holds,
    read_state_document,
    state_path,
)

LOCK_FILE = "lock"

#: Faults ``sriov-manage`` can be told to show once.
SRIOV_MANAGE_FAULTS = ("error", "silent", "hang")


# The records below are mutable on purpose: they are the in-memory image of the state file,
# changed by one operation at a time while it holds the lock, then written back whole.


@record(slots=True)
class VfRecord:
    address: str
    iommu_group: int


@record(slots=True)
class GpuRecord:
    address: str
    model: str  # key into SimState.models
    root_port: str
    iommu_group: int
    vfs: list[VfRecord] = field(default_factory=list)  # in virtfn order; empty: SR-IOV off
    #: The driver bound to the PF: ``nvidia``, or ``vfio-pci`` for a GPU passed through whole.
    driver: str = "nvidia"
    #: False: ``sriov_vf_device`` reads 0, the GPU makes no vGPU VFs (a T4's SR-IOV).
    vgpu_vfs: bool = True
    #: The vGPU host interface its VFs show: ``mdev`` (``mdev_supported_types/``, a vGPU is an
    #: mdev UUID) or ``vfio`` (NVIDIA's vendor-specific ``nvidia/current_vgpu_type``, the VF is
    #: the vGPU). Per GPU: one host may have GPUs of both kinds.
    interface: str = "mdev"
    #: Its vGPU mode: mixed-size after ``nvidia-smi vgpu -i <GPU> -shm 1`` (only while its VFs
    #: are on and it hosts no vGPU); ``sriov-manage -d`` and a reboot make it equal-size again.
    vgpu_mode: VgpuMode = VgpuMode.EQUAL_SIZE
    #: MIG mode, after ``nvidia-smi -i <GPU> -mig 1`` (a MIG-capable model only): its VFs then
    #: offer no time-sliced type. Kept by ``sriov-manage -d`` (whether the real script resets it
    #: is not known to us; nvidia-smi's setting lasts until it is changed or the GPU reset) and
    #: cleared by a reboot (on a vGPU host MIG mode does not survive one: NVIDIA/gpu-operator
    #: PR 2603).
    mig_mode: bool = False


@record(slots=True)
class DeviceRecord:
    """A non-GPU function (root port, NIC and its VFs, audio): fixed for the host's life."""

    address: str
    role: str  # root-port | nic | nic-vf | audio
    root_port: str  # "" for a root port itself
    iommu_group: int


@record(slots=True)
class VgpuRecord:
    vf: str
    type: str  # type name
    iommu_group: int
    #: The vfio cdev number N (``vfio-dev/vfioN``, ``/dev/vfio/devices/vfioN``); None: none.
    cdev: int | None = None
    #: Its placement ID in mixed-size mode (the first slot it occupies: ``rules.py``'s model);
    #: None in equal-size mode.
    placement: int | None = None


@record(slots=True)
class Faults:
    writes: int = 0  # the next N sysfs writes fail with EIO
    sriov_manage: str | None = None  # the next sriov-manage call: error | silent | hang
    crash_after: int | None = None  # SIGKILL the caller after N more successful changes

    def take_write_fault(self) -> bool:
        """Consume one pending EIO write fault; True if this write must fail."""
        if self.writes <= 0:
            return False
        self.writes -= 1
        return True

    def take_sriov_manage_fault(self) -> str | None:
        fault, self.sriov_manage = self.sriov_manage, None
        return fault

    def change_made(self) -> bool:
        """Count a successful change; True when it is the one after which to kill the caller."""
        if self.crash_after is None:
            return False
        self.crash_after -= 1
        if self.crash_after > 0:
            return False
        self.crash_after = None
        return True


@record(slots=True)
class SimState:
    models: dict[str, SimModel]
    gpus: list[GpuRecord]
    devices: list[DeviceRecord]
    #: vGPU id (the mdev UUID; on vfio the VF address) → record.
    vgpus: dict[str, VgpuRecord] = field(default_factory=dict)
    #: vGPU id → who holds it (a simulated VM).
    held: dict[str, str] = field(default_factory=dict)
    #: Held vGPUs whose holder no probe can see (``sim hold --hidden``: a VM in a PID namespace
    #: vgpuctl cannot look into). The kernel still waits for them.
    hidden: set[str] = field(default_factory=set)
    #: Held vGPUs whose holder is a process of the simulated ``/proc`` keeping only a VFIO
    #: device fd (``sim hold --device-fd``): vGPU id → its pid. The probe finds it by scanning
    #: that tree (``procfs.py``), not from here.
    by_process: dict[str, int] = field(default_factory=dict)
    #: vGPUs whose removal is under way: a writer is blocked until the holder lets go.
    removing: set[str] = field(default_factory=set)
    #: The inode of the PID namespace the host was built in: the simulated host's processes
    #: are visible from there only (``unshare --pid`` makes a probe blind, as on a real host).
    pid_namespace: int = INIT_PID_NAMESPACE
    faults: Faults = field(default_factory=Faults)
    counters: dict[str, int] = field(default_factory=lambda: {"writes": 0, "sriovManageCalls": 0})
    #: IOMMU group number → the device (address or UUID) in it; the lowest free number is next.
    iommu_groups: dict[int, str] = field(default_factory=dict)
    #: vfio cdev number → the device (UUID) it belongs to; the lowest free number is next.
    cdevs: dict[int, str] = field(default_factory=dict)

    # --- look-ups -------------------------------------------------------------------------

    def gpu(self, address: str) -> GpuRecord | None:
        for g in self.gpus:
            if g.address == address:
                return g
        return None

    def vf_owner(self, vf: str) -> GpuRecord | None:
        for g in self.gpus:
            for v in g.vfs:
                if v.address == vf:
                    return g
        return None

    def model_of(self, gpu: GpuRecord) -> SimModel:
        return self.models[gpu.model]

    def interface_of_vf(self, vf: str) -> str | None:
        """The interface of the GPU ``vf`` is an enabled VF of, or None."""
        gpu = self.vf_owner(vf)
        return gpu.interface if gpu is not None else None

    def hosted(self, gpu: GpuRecord) -> dict[str, str | None]:
        """Every VF of the GPU → the type name of its vGPU, or None."""
        out: dict[str, str | None] = {v.address: None for v in gpu.vfs}
        for rec in self.vgpus.values():
            if rec.vf in out:
                out[rec.vf] = rec.type
        return out

    def placed(self, gpu: GpuRecord) -> dict[str, tuple[str, int]]:
        """The GPU's VFs whose vGPU has a placement (mixed-size mode) → (type name, ID)."""
        vfs = {v.address for v in gpu.vfs}
        return {
            rec.vf: (rec.type, rec.placement)
            for rec in self.vgpus.values()
            if rec.vf in vfs and rec.placement is not None
        }

    def vgpus_on(self, gpu: GpuRecord) -> list[str]:
        vfs = {v.address for v in gpu.vfs}
        return [vid for vid, rec in self.vgpus.items() if rec.vf in vfs]

    def vgpu_on_vf(self, vf: str) -> str | None:
        for vid, rec in self.vgpus.items():
            if rec.vf == vf:
                return vid
        return None

    # --- IOMMU groups ---------------------------------------------------------------------

    def allocate_group(self, owner: str) -> int:
        """The lowest free group number, as the kernel's IDA hands them out."""
        return _allocate(self.iommu_groups, owner)

    def free_group(self, number: int) -> None:
        self.iommu_groups.pop(number, None)

    def allocate_cdev(self, owner: str) -> int:
        """The lowest free vfio cdev number (the kernel's ``vfio.device_ida``)."""
        return _allocate(self.cdevs, owner)

    def free_cdev(self, number: int | None) -> None:
        if number is not None:
            self.cdevs.pop(number, None)

    # --- JSON -----------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "formatVersion": FORMAT_VERSION,
            "models": {k: m.to_json() for k, m in self.models.items()},
            "gpus": [
                {
                    "address": g.address,
                    "model": g.model,
                    "rootPort": g.root_port,
                    "iommuGroup": g.iommu_group,
                    "vfs": [{"address": v.address, "iommuGroup": v.iommu_group} for v in g.vfs],
                    "driver": g.driver,
                    "vgpuVfs": g.vgpu_vfs,
                    "interface": g.interface,
                    "vgpuMode": str(g.vgpu_mode),
                    **({"migMode": True} if g.mig_mode else {}),
                }
                for g in self.gpus
            ],
            "devices": [
                {
                    "address": d.address,
                    "role": d.role,
                    "rootPort": d.root_port,
                    "iommuGroup": d.iommu_group,
                }
                for d in self.devices
            ],
            "vgpus": {
                vid: {
                    "vf": r.vf,
                    "type": r.type,
                    "iommuGroup": r.iommu_group,
                    "cdev": r.cdev,
                    **({} if r.placement is None else {"placement": r.placement}),
                }
                for vid, r in self.vgpus.items()
            },
            "held": dict(self.held),
            "hidden": sorted(self.hidden),
            "byProcess": dict(sorted(self.by_process.items())),
            "removing": sorted(self.removing),
            "pidNamespace": self.pid_namespace,
            "faults": {
                "writes": self.faults.writes,
                "sriovManage": self.faults.sriov_manage,
                "crashAfter": self.faults.crash_after,
            },
            "counters": dict(self.counters),
            "iommuGroups": {str(k): v for k, v in sorted(self.iommu_groups.items())},
            "cdevs": {str(k): v for k, v in sorted(self.cdevs.items())},
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SimState:
        """From the state file's JSON (its format version checked by the reader). A file from
        before GPUs had an interface each has a host-level ``interface``: every GPU takes it;
        one from before mixed-size mode has no ``vgpuMode``: every GPU is equal-size."""
        faults = raw.get("faults", {})
        holds = Holds.from_json(raw)
        host_interface = str(raw.get("interface", "mdev"))
        return cls(
            models={k: SimModel.from_json(m) for k, m in raw["models"].items()},
            gpus=[
                GpuRecord(
                    address=g["address"],
                    model=g["model"],
                    root_port=g["rootPort"],
                    iommu_group=int(g["iommuGroup"]),
                    vfs=[VfRecord(v["address"], int(v["iommuGroup"])) for v in g["vfs"]],
                    driver=str(g.get("driver", "nvidia")),
                    vgpu_vfs=bool(g.get("vgpuVfs", True)),
                    interface=str(g.get("interface", host_interface)),
                    vgpu_mode=_vgpu_mode(g.get("vgpuMode")),
                    mig_mode=g.get("migMode") is True,
                )
                for g in raw["gpus"]
            ],
            devices=[
                DeviceRecord(d["address"], d["role"], d["rootPort"], int(d["iommuGroup"]))
                for d in raw["devices"]
            ],
            vgpus={
                vid: VgpuRecord(
                    r["vf"],
                    r["type"],
                    int(r["iommuGroup"]),
                    None if r.get("cdev") is None else int(r["cdev"]),
                    None if r.get("placement") is None else int(r["placement"]),
                )
                for vid, r in raw["vgpus"].items()
            },
            held=dict(holds.held),
            hidden=set(holds.hidden),
            by_process=dict(holds.by_process),
            removing={str(v) for v in raw.get("removing", [])},
            pid_namespace=holds.pid_namespace,
            faults=Faults(
                writes=int(faults.get("writes", 0)),
                sriov_manage=faults.get("sriovManage"),
                crash_after=faults.get("crashAfter"),
            ),
            counters={str(k): int(v) for k, v in raw["counters"].items()},
            iommu_groups={int(k): str(v) for k, v in raw["iommuGroups"].items()},
            cdevs={int(k): str(v) for k, v in raw.get("cdevs", {}).items()},
        )


def _vgpu_mode(raw: Any) -> VgpuMode:
    """A GPU's ``vgpuMode`` in the state file (absent: equal-size, the driver's default)."""
    if raw is None:
        return VgpuMode.EQUAL_SIZE
    if raw not in (VgpuMode.EQUAL_SIZE, VgpuMode.MIXED_SIZE):
        raise ValueError(f"simulator state: vgpuMode {raw!r} is neither equal-size nor mixed-size")
    return VgpuMode(raw)


def _allocate(taken: dict[int, str], owner: str) -> int:
    """The lowest number not in ``taken``, now given to ``owner`` (an IDA's rule)."""
    n = 0
    while n in taken:
        n += 1
    taken[n] = owner
    return n


def load_state(sysfs_root: Path) -> SimState:
    """Read the state without the lock (it is replaced atomically)."""
    return SimState.from_json(read_state_document(sysfs_root))


def save_state(sysfs_root: Path, state: SimState) -> None:
    path = state_path(sysfs_root)
    tmp = path.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")
    # Compact on purpose: indenting makes json fall back to its slow pure-Python encoder, and
    # this file is rewritten on every simulated sysfs write.
    tmp.write_text(json.dumps(state.to_json(), separators=(",", ":")) + "\n", encoding="utf-8")
    os.replace(tmp, path)


@contextlib.contextmanager
def locked(sysfs_root: Path) -> Iterator[None]:
    """Hold the host's lock (blocking): one change to a simulated host at a time."""
    fd = os.open(sysfs_root / STATE_DIR / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock
