"""Which vGPUs a VM holds: the port the observer asks, and its ``/proc`` adapter.

A VM (QEMU) holds a vGPU by keeping one of its device nodes open (docs/domain.md §9): the legacy
group node ``/dev/vfio/<iommu group>``, or the iommufd character device
``/dev/vfio/devices/vfioN`` (``vfioN`` is listed under the device's ``vfio-dev/``). Such a vGPU
is never removed, so the inventory marks it ``in_use`` with who holds it.

A process may also keep only the VFIO *device* fd it got from the group
(``VFIO_GROUP_GET_DEVICE_FD``) and close the group node: drivers/vfio/group.c
``vfio_device_open_file`` makes that fd with ``anon_inode_getfile("[vfio-device]", …)``, so
``/proc/<pid>/fd/<n>`` reads ``anon_inode:[vfio-device]`` (fs/anon_inodes.c names anonymous files
``anon_inode:<name>``), and the group stays held ("Device FDs hold a group file reference",
``vfio_group_fops_release``). Such an fd is matched to its device through
``/proc/<pid>/fdinfo/<n>``: since Linux 6.18, drivers/vfio/vfio_main.c
``vfio_device_show_fdinfo`` (under ``CONFIG_PROC_FS``) adds ``vfio-device-syspath: /sys`` + the
``kobject_get_path`` of the device (the VF, or the mdev under it) after the four lines
fs/proc/fd.c ``seq_show`` prints for every fd. Where the line is missing (an older kernel) or does
not parse, the fd is the device of a group the process opened, now or before.

A process that still has as many VFIO group nodes open as it has such fds is taken to hold them
for the devices of those groups, which the group nodes already match: that is how QEMU (the VMM
behind KubeVirt and Harvester) keeps them, closing a group's fd only once its last device is
put (hw/vfio/container.c ``vfio_put_group``: ``if (!QLIST_EMPTY(&group->device_list)) return;``
before ``close(group->fd)``). Without that (Linux before 6.18 shows no syspath, and every QEMU
keeps device fds beside its group fds), any VM would blind every scan of its node. A process
with more unnamed device fds than open group nodes has kept a device of a group it closed: it
may hold any vGPU, and the scan is blind (:attr:`HolderScan.unattributed`), never guessed.

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

from reconciler.model.errors import excerpt
from reconciler.model.record import field, record

#: ``PROC_PID_INIT_INO`` (include/linux/proc_ns.h): the inode of the initial PID namespace, as
#: ``stat -L /proc/self/ns/pid`` shows it. Any other value: some processes are invisible.
INIT_PID_NAMESPACE = 0xEFFFFFFC  # 4026531836

VFIO_GROUP_PREFIX = "/dev/vfio/"
VFIO_CDEV_PREFIX = "/dev/vfio/devices/"
#: What ``/proc/<pid>/fd/<n>`` reads for a VFIO device fd got through a group (group.c
#: ``vfio_device_open_file``: ``anon_inode_getfile("[vfio-device]", …)``).
VFIO_DEVICE_FD = "anon_inode:[vfio-device]"
#: The fdinfo line that names such an fd's device (vfio_main.c ``vfio_device_show_fdinfo``,
#: Linux 6.18+): ``vfio-device-syspath: /sys/devices/pci0000:00/…/0000:08:00.4``.
SYSPATH_KEY = "vfio-device-syspath:"
#: At most this much of an fdinfo file is read: the kernel's four lines, any ``lock:`` lines
#: and one sysfs path (``kobject_get_path``, below ``PATH_MAX``) fit; more is not a VFIO
#: device's fdinfo, and the scan is blind.
FDINFO_LIMIT = 16384
_SYSPATH_PREFIX = "/sys/devices/"


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
    #: The device's sysfs name, the last component of its path under ``/sys/devices`` (the
    #: VF's PCI address, or the mdev's UUID): what a VFIO device fd's ``vfio-device-syspath``
    #: ends in. None: not known.
    device: str | None = None

    @property
    def openable(self) -> bool:
        """Whether any process could have this vGPU open at all."""
        return self.group is not None or self.cdev is not None


@record(frozen=True, slots=True)
class HolderScan:
    """What a probe found: the holders it saw, and whether it could see every process."""

    #: vGPU id → who holds it (``"pid 1234 (qemu-system-x86)"``).
    held: Mapping[str, str] = field(default_factory=dict)
    #: Why the probe cannot vouch for every holder; None when it can. Any reason makes every
    #: vGPU count as in use (``host.py``): some processes of the host are invisible to it, or
    #: (:attr:`unattributed`) one it sees keeps a VFIO device fd it cannot match to a device.
    blind: str | None = None
    #: The only blindness is a VFIO device fd whose fdinfo names no device (Linux before 6.18)
    #: or names it in a way that does not parse: every process was seen, not every target.
    unattributed: bool = False


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
    ``/proc`` of another PID namespace: fail closed, never assume it holds nothing. A VFIO
    device fd is matched through its fdinfo (:func:`vfio_device_of`); one that names no device
    makes the scan blind too (:attr:`HolderScan.unattributed`).
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
        return processes_blindness(self.proc_root)

    def scan(self, vgpus: Mapping[str, DeviceNodes]) -> HolderScan:
        if not any(n.openable for n in vgpus.values()):
            return HolderScan()
        blind = pid_namespace_blindness(self.proc_root, host_namespace=self.host_namespace)
        if blind is not None:
            return HolderScan(blind=blind)
        return scan_processes(self.proc_root, vgpus)


def scan_processes(proc_root: Path, vgpus: Mapping[str, DeviceNodes]) -> HolderScan:
    """Who holds which of ``vgpus`` among the processes under ``proc_root`` (no PID namespace
    check: :class:`ProcfsHoldProbe` makes it first; the simulator's probe scans its own tree)."""
    by_path: dict[str, list[str]] = {}  # fd target → vGPU ids it holds
    by_number: dict[int, list[str]] = {}  # st_rdev → vGPU ids it holds
    by_device: dict[str, list[str]] = {}  # sysfs device name → vGPU ids it holds
    for vgpu_id, nodes in vgpus.items():
        if not nodes.openable:
            continue
        if nodes.group is not None:
            by_path.setdefault(f"{VFIO_GROUP_PREFIX}{nodes.group}", []).append(vgpu_id)
        if nodes.cdev is not None:
            by_path.setdefault(f"{VFIO_CDEV_PREFIX}{nodes.cdev}", []).append(vgpu_id)
        for number in nodes.numbers:
            by_number.setdefault(number, []).append(vgpu_id)
        if nodes.device:
            by_device.setdefault(nodes.device.lower(), []).append(vgpu_id)
    if not by_path and not by_number:
        return HolderScan()
    total = len({i for ids in (*by_path.values(), *by_number.values()) for i in ids})
    return _scan(os.fspath(proc_root), by_path, by_number, by_device, total=total)


def processes_blindness(proc_root: Path) -> str | None:
    """Why a scan of the processes under ``proc_root`` would be blind, whatever it is asked
    about: a process whose open files cannot be read, or a VFIO device fd no fdinfo names."""
    return _scan(os.fspath(proc_root), {}, {}, {}, total=-1).blind


def _scan(
    proc: str,
    by_path: Mapping[str, list[str]],
    by_number: Mapping[int, list[str]],
    by_device: Mapping[str, list[str]],
    *,
    total: int,
) -> HolderScan:
    """Each vGPU's holder (the lowest pid holding one of its nodes, or a VFIO device fd its
    fdinfo names), and why the scan is blind; it stops early once every vGPU is found held."""
    try:
        entries = os.listdir(proc)
    except OSError as exc:
        return HolderScan(blind=f"cannot read {proc}: {exc.strerror or exc}")
    held: dict[str, str] = {}
    blind: str | None = None
    unattributed: str | None = None  # the first VFIO device fd no fdinfo names
    for pid in sorted(int(e) for e in entries if e.isdigit()):
        fd_dir = f"{proc}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError as exc:
            if exc.errno not in _GONE and blind is None:
                blind = _uninspectable(pid, proc, exc)
            continue
        groups = 0  # the VFIO group nodes this process has open
        unnamed: list[tuple[str, str]] = []  # its VFIO device fds no fdinfo names: (fd, why)
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError as exc:
                if exc.errno not in _GONE and blind is None:
                    blind = _uninspectable(pid, proc, exc)
                continue  # closed since the listing
            if target == VFIO_DEVICE_FD:
                try:
                    device = vfio_device_of(f"{proc}/{pid}/fdinfo/{fd}")
                except UnattributedDeviceFd as exc:
                    unnamed.append((fd, str(exc)))
                    continue
                except OSError as exc:
                    if exc.errno not in _GONE and blind is None:
                        blind = _uninspectable(pid, proc, exc)
                    continue  # closed, or the process exited, since the link was read
                ids = by_device.get(device.lower())
            else:
                # A node deleted and made again (udev) still leads to the same device.
                node = target.removesuffix(_DELETED)
                groups += node.startswith(VFIO_GROUP_PREFIX) and node[_GROUP_AT:].isdecimal()
                ids = by_path.get(node)
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
        if len(unnamed) > groups and unattributed is None:
            unattributed = _unattributed(pid, proc, unnamed, groups)
        if len(held) == total:
            break  # every vGPU is held: nothing unseen could change the answer
    if blind is not None:
        return HolderScan(held=held, blind=blind)
    if unattributed is not None:
        return HolderScan(held=held, blind=unattributed, unattributed=True)
    return HolderScan(held=held)


#: Where a VFIO group node's number starts in its path (``/dev/vfio/22``).
_GROUP_AT = len(VFIO_GROUP_PREFIX)


def _unattributed(pid: int, proc: str, unnamed: list[tuple[str, str]], groups: int) -> str:
    """Why a process's VFIO device fds that no fdinfo names make the scan blind: more of them
    than the VFIO groups it has open (:func:`_scan`)."""
    who = describe_holder(pid, _comm(f"{proc}/{pid}/comm"))
    fd, why = min(unnamed, key=lambda u: int(u[0]))
    count = len(unnamed)
    fds = "a VFIO device fd" if count == 1 else f"{count} VFIO device fds"
    beside = f" beside {groups} open VFIO group{'s' * (groups != 1)}" if groups else ""
    return f"{who} holds {fds} vgpuctl cannot attribute{beside} (fd {fd}: {why})"


class UnattributedDeviceFd(Exception):
    """A VFIO device fd whose fdinfo does not name its device; the message says why."""


def vfio_device_of(fdinfo: str) -> str:
    """The sysfs name of the device a VFIO device fd refers to (``0000:08:00.4``, or an
    mdev's UUID), from its ``/proc/<pid>/fdinfo/<fd>``: the last component of the
    ``vfio-device-syspath`` line (vfio_main.c ``vfio_device_show_fdinfo``).

    Read as an untrusted file: opened without following a link and without blocking, a
    regular file, at most :data:`FDINFO_LIMIT` bytes. :class:`UnattributedDeviceFd` when it
    names no device (Linux before 6.18) or does not parse; :class:`OSError` when it cannot be
    read (gone: the fd was closed or the process exited).
    """
    raw = _read_bounded(fdinfo)
    if raw is None:
        raise UnattributedDeviceFd(
            f"its fdinfo is not a regular file of at most {FDINFO_LIMIT} bytes"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UnattributedDeviceFd(
            f"its fdinfo is not text: '{excerpt(raw.decode('utf-8', 'replace'))}'"
        ) from None
    lines = [line for line in text.split("\n") if line.startswith(SYSPATH_KEY)]
    if not lines:
        raise UnattributedDeviceFd(
            "its fdinfo names no device: Linux writes vfio-device-syspath there from 6.18 on"
        )
    if len(lines) > 1:
        raise UnattributedDeviceFd("its fdinfo has more than one vfio-device-syspath")
    path = lines[0][len(SYSPATH_KEY) :].strip()
    if not _is_device_syspath(path):
        raise UnattributedDeviceFd(
            f"its vfio-device-syspath is not a device's sysfs path: '{excerpt(path)}'"
        )
    return path.rpartition("/")[2]


def _is_device_syspath(path: str) -> bool:
    """``/sys/devices/`` then one or more plain components (no ``.``/``..``, printable ASCII,
    no whitespace): what ``"/sys" + kobject_get_path(device)`` prints for a device."""
    if not path.startswith(_SYSPATH_PREFIX) or len(path) > FDINFO_LIMIT:
        return False
    components = path[len(_SYSPATH_PREFIX) :].split("/")
    return all(
        c not in ("", ".", "..")
        and c.isascii()
        and c.isprintable()
        and not any(ch.isspace() for ch in c)
        for c in components
    )


def _read_bounded(path: str) -> bytes | None:
    """At most :data:`FDINFO_LIMIT` bytes of a regular file; None when it is not one or is
    longer. Opened ``O_NONBLOCK | O_NOFOLLOW``: a FIFO or a link put in its place can neither
    hang the scan nor lead it elsewhere."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = os.read(fd, FDINFO_LIMIT + 1 - size)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > FDINFO_LIMIT:
                return None
    finally:
        os.close(fd)


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
