"""The simulated host's ``/proc``: processes that keep a vGPU through a VFIO *device* fd only.

A process that got a device fd from its group (``VFIO_GROUP_GET_DEVICE_FD``) may close
``/dev/vfio/<group>`` and keep the vGPU through that fd alone (docs/domain.md §9): the real
``/proc`` shows it as below, and the real probe (``observe/holds.py``) reads this tree the same
way, through :func:`~reconciler.observe.holds.scan_processes`.

- ``<pid>/fd/<n>`` is a link reading ``anon_inode:[vfio-device]``: drivers/vfio/group.c
  ``vfio_device_open_file`` makes the fd with ``anon_inode_getfile("[vfio-device]", …)``, and
  fs/anon_inodes.c names anonymous files ``anon_inode:<name>``.
- ``<pid>/fdinfo/<n>`` holds the four lines fs/proc/fd.c ``seq_show`` prints for every fd
  (``pos``, ``flags``, ``mnt_id``, ``ino``), then, since Linux 6.18, what
  drivers/vfio/vfio_main.c ``vfio_device_show_fdinfo`` adds: ``vfio-device-syspath: /sys`` +
  ``kobject_get_path(&device->dev->kobj)``, the sysfs path of the VF (vendor-specific VFIO) or of
  the mdev below it. :data:`OLD_KERNEL` leaves that line out, as Linux before 6.18 does.
- ``<pid>/comm``: the process's name.

The tree lives in the state directory (``<sysfs root>/.vgpuctl-sim/proc``); the state file says
which pid holds which vGPU, and the emulated kernel blocks a removal of it as of any holder.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from reconciler.sim.statefile import STATE_DIR

PROC_DIR = "proc"
#: The fd number the simulated process keeps its device fd at (QEMU's are in the 20s-30s).
DEVICE_FD = 23
#: fdinfo as Linux 6.18 and later write it: the device named.
NEW_KERNEL = "syspath"
#: fdinfo as Linux before 6.18 write it: no ``vfio-device-syspath``.
OLD_KERNEL = "no-syspath"
FDINFO_STYLES = (NEW_KERNEL, OLD_KERNEL)
#: The lowest pid a simulated device-fd holder gets.
FIRST_PID = 4000

_VFIO_DEVICE_FD = "anon_inode:[vfio-device]"
#: O_RDWR | O_CLOEXEC, as ``seq_show`` prints ``f_flags`` ("0%o") for an fd QEMU opened.
_FLAGS = "02000002"


def proc_root(sysfs_root: Path) -> Path:
    """Where the simulated host's ``/proc`` is."""
    return Path(sysfs_root) / STATE_DIR / PROC_DIR


def device_syspath(sysfs_root: Path, device: str) -> str:
    """``/sys/devices/…``: what ``vfio_device_show_fdinfo`` prints for the device at ``device``
    (a path under the sysfs root, e.g. ``bus/mdev/devices/<uuid>``), links resolved."""
    root = os.path.realpath(sysfs_root)
    resolved = os.path.realpath(os.path.join(root, device))
    return "/sys/" + os.path.relpath(resolved, root)


def fdinfo_text(syspath: str | None) -> str:
    """A VFIO device fd's fdinfo: ``seq_show``'s lines, then the device's syspath if given."""
    text = f"pos:\t0\nflags:\t{_FLAGS}\nmnt_id:\t15\nino:\t1057\n"
    if syspath is not None:
        text += f"vfio-device-syspath: {syspath}\n"
    return text


def add_device_fd_holder(sysfs_root: Path, pid: int, comm: str, syspath: str | None) -> None:
    """Process ``pid`` named ``comm`` keeps one VFIO device fd (and ``/dev/null``, a socket),
    its fdinfo naming ``syspath`` (None: an older kernel's, naming nothing)."""
    d = proc_root(sysfs_root) / str(pid)
    if d.exists():
        shutil.rmtree(d)
    (d / "fd").mkdir(parents=True)
    (d / "fdinfo").mkdir()
    (d / "comm").write_text(comm + "\n", encoding="utf-8")
    os.symlink("/dev/null", d / "fd" / "0")
    os.symlink("socket:[53810]", d / "fd" / "1")
    os.symlink(_VFIO_DEVICE_FD, d / "fd" / str(DEVICE_FD))
    (d / "fdinfo" / "0").write_text(fdinfo_text(None).replace(_FLAGS, "0100002"))
    (d / "fdinfo" / "1").write_text(fdinfo_text(None))
    (d / "fdinfo" / str(DEVICE_FD)).write_text(fdinfo_text(syspath), encoding="utf-8")


def remove_process(sysfs_root: Path, pid: int) -> None:
    """The process exits: its ``/proc`` entry goes."""
    shutil.rmtree(proc_root(sysfs_root) / str(pid), ignore_errors=True)


def remove_all(sysfs_root: Path) -> None:
    """Every simulated process is gone (a power cycle)."""
    shutil.rmtree(proc_root(sysfs_root), ignore_errors=True)
