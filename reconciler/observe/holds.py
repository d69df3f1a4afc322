"""Which vGPUs a VM holds: the port the observer asks, and its ``/proc`` adapter.

A VM (QEMU) holds a vGPU by keeping one of its device nodes open (docs/domain.md §9): the legacy
group node ``/dev/vfio/<iommu group>``, or the iommufd character device
``/dev/vfio/devices/vfioN`` (``vfioN`` is listed under the device's ``vfio-dev/``). Such a vGPU
is never removed, so the inventory marks it ``in_use`` with who holds it.

The kernel does **not** refuse to remove a vGPU that is open: ``vfio_unregister_group_dev``
blocks the writer and keeps asking QEMU to make the guest let go. A holder the probe misses
therefore costs a VM its GPU. So a probe must also say when it cannot see every process of the
host (:attr:`HolderScan.blind`): vgpuctl running outside the host's PID namespace (a pod
without ``hostPID``), ``/proc`` unreadable, a process whose open files it may not inspect.
The observer then counts every vGPU as in use (``host.py``): detection fails closed.

The simulator supplies its own probe through the same port.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from reconciler.model.record import field, record

#: ``PROC_PID_INIT_INO`` (include/linux/proc_ns.h): the inode of the initial PID namespace, as
#: ``stat -L /proc/self/ns/pid`` shows it. Any other value: some processes are invisible.
INIT_PID_NAMESPACE = 0xEFFFFFFC  # 4026531836

VFIO_GROUP_PREFIX = "/dev/vfio/"
VFIO_CDEV_PREFIX = "/dev/vfio/devices/"


@record(frozen=True, slots=True)
class DeviceNodes:
    """The device nodes through which a process can hold one vGPU."""

    #: The IOMMU group number: ``/dev/vfio/<group>``. None: not bound to a VFIO driver.
    group: str | None = None
    #: The vfio cdev name (``vfio3``): ``/dev/vfio/devices/vfio3``. None: no cdev.
    cdev: str | None = None
    #: The device numbers (``st_rdev``) of those nodes, where sysfs gives them (their ``dev``
    #: files): they find a holder that opened a node under another path (a container's own
    #: ``/dev``), where the path alone would miss it.
    numbers: frozenset[int] = frozenset()

    @property
    def openable(self) -> bool:
        """Whether any process could have this vGPU open at all."""
        return self.group is not None or self.cdev is not None


@record(frozen=True, slots=True)
class HolderScan:
    """What a probe found: the holders it saw, and whether it could see every process."""

    #: vGPU id → who holds it (``"pid 1234 (qemu-system-x86)"``).
    held: Mapping[str, str] = field(default_factory=dict)
    #: Why some processes of the host are invisible to the probe; None when it sees them all.
    blind: str | None = None


class HoldProbe(Protocol):
    def scan(self, vgpus: Mapping[str, DeviceNodes]) -> HolderScan:
        """For ``vGPU id → device nodes``, the vGPUs a process holds open, and whether the
        probe saw every process of the host (if not, :attr:`HolderScan.blind` says why)."""
        ...

    def blindness(self) -> str | None:
        """Why this probe would not see every process of the host; None when it would."""
        ...


def current_pid_namespace(proc_root: Path = Path("/proc")) -> int | None:
    """The inode of this process's PID namespace; None when ``/proc`` cannot tell."""
    try:
        return os.stat(f"{os.fspath(proc_root)}/self/ns/pid").st_ino
    except OSError:
        return None


def pid_namespace_blindness(proc_root: Path, *, host_namespace: int) -> str | None:
    """Why the processes under ``proc_root`` are not all of the host's; None when they are.

    ``/proc/self/ns/pid`` names the namespace this process lives in; only the host's own
    (``host_namespace``) shows every process, those of VMs in virt-launcher pods included.
    """
    proc = os.fspath(proc_root)
    try:
        mine = os.stat(f"{proc}/self/ns/pid").st_ino
    except OSError as exc:
        return f"cannot read {proc}/self/ns/pid: {exc.strerror or exc}"
    if mine != host_namespace:
        return (
            f"vgpuctl runs in PID namespace {mine}, not the host's ({host_namespace}); "
            "in a pod, set hostPID: true"
        )
    return None


def describe_holder(pid: int, comm: str | None) -> str:
    """``pid 1234 (qemu-system-x86)``; just ``pid 1234`` when the name is unreadable."""
    comm = (comm or "").strip()
    return f"pid {pid} ({comm})" if comm else f"pid {pid}"


_DELETED = " (deleted)"
#: fd targets that are never a device node: not worth a stat.
_NOT_A_NODE = ("socket:", "pipe:", "anon_inode:", "/proc/", "/sys/", "/memfd:")
#: Errnos of a process that exited while we looked: skipped, it holds nothing any more.
_GONE = frozenset({errno.ENOENT, errno.ESRCH, errno.ENOTDIR})


class ProcfsHoldProbe:
    """Finds holders by reading every process's open file descriptors under ``/proc``.

    A process that exits during the scan is skipped. One whose open files cannot be read
    (permission denied: not root, or a security module) makes the scan blind, as does a
    ``/proc`` of another PID namespace: fail closed, never assume it holds nothing.
    """

    def __init__(
        self, proc_root: Path = Path("/proc"), *, host_namespace: int = INIT_PID_NAMESPACE
    ) -> None:
        self.proc_root = proc_root
        self.host_namespace = host_namespace

    def blindness(self) -> str | None:
        blind = pid_namespace_blindness(self.proc_root, host_namespace=self.host_namespace)
        if blind is not None:
            return blind
        # Every process's open files must be readable: ask for all, about nothing in particular.
        return self._scan({}, {}, total=-1).blind

    def scan(self, vgpus: Mapping[str, DeviceNodes]) -> HolderScan:
        by_path: dict[str, list[str]] = {}  # fd target → vGPU ids it holds
        by_number: dict[int, list[str]] = {}  # st_rdev → vGPU ids it holds
        for vgpu_id, nodes in vgpus.items():
            if nodes.group is not None:
                by_path.setdefault(f"{VFIO_GROUP_PREFIX}{nodes.group}", []).append(vgpu_id)
            if nodes.cdev is not None:
                by_path.setdefault(f"{VFIO_CDEV_PREFIX}{nodes.cdev}", []).append(vgpu_id)
            for number in nodes.numbers:
                by_number.setdefault(number, []).append(vgpu_id)
        if not by_path and not by_number:
            return HolderScan()
        blind = pid_namespace_blindness(self.proc_root, host_namespace=self.host_namespace)
        if blind is not None:
            return HolderScan(blind=blind)
        total = len({i for ids in (*by_path.values(), *by_number.values()) for i in ids})
        return self._scan(by_path, by_number, total=total)

    def _scan(
        self, by_path: Mapping[str, list[str]], by_number: Mapping[int, list[str]], *, total: int
    ) -> HolderScan:
        """Each vGPU's holder (the lowest pid holding one of its nodes), and why the scan is
        blind; it stops early once every vGPU is found held."""
        proc = os.fspath(self.proc_root)
        try:
            entries = os.listdir(proc)
        except OSError as exc:
            return HolderScan(blind=f"cannot read {proc}: {exc.strerror or exc}")
        held: dict[str, str] = {}
        blind: str | None = None
        for pid in sorted(int(e) for e in entries if e.isdigit()):
            fd_dir = f"{proc}/{pid}/fd"
            try:
                fds = os.listdir(fd_dir)
            except OSError as exc:
                if exc.errno not in _GONE and blind is None:
                    blind = _uninspectable(pid, proc, exc)
                continue
            for fd in fds:
                try:
                    target = os.readlink(f"{fd_dir}/{fd}")
                except OSError as exc:
                    if exc.errno not in _GONE and blind is None:
                        blind = _uninspectable(pid, proc, exc)
                    continue  # closed since the listing
                # A node deleted and made again (udev) still leads to the same device.
                ids = by_path.get(target.removesuffix(_DELETED))
                if ids is None and by_number and not target.startswith(_NOT_A_NODE):
                    try:
                        ids = by_number.get(_char_device(f"{fd_dir}/{fd}"), None)
                    except OSError as exc:
                        if exc.errno not in _GONE and blind is None:
                            blind = _uninspectable(pid, proc, exc)
                        continue
                if ids is not None and any(i not in held for i in ids):
                    holder = describe_holder(pid, _comm(f"{proc}/{pid}/comm"))
                    for vgpu_id in ids:
                        held.setdefault(vgpu_id, holder)
            if len(held) == total:
                break  # every vGPU is held: nothing unseen could change the answer
        return HolderScan(held=held, blind=blind)


def _char_device(fd_path: str) -> int:
    """The device number of what an open descriptor refers to; -1 when not a device node."""
    st = os.stat(fd_path)
    return st.st_rdev if stat.S_ISCHR(st.st_mode) else -1


def _uninspectable(pid: int, proc: str, exc: OSError) -> str:
    who = describe_holder(pid, _comm(f"{proc}/{pid}/comm"))
    return (
        f"cannot read the open files of {who}: {exc.strerror or exc}; reading every process's "
        "takes root with CAP_SYS_PTRACE (a privileged container)"
    )


def _comm(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None
