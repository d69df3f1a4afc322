"""Which vGPUs a VM holds: the port the observer asks, and its ``/proc`` adapter.

A VM (QEMU) holds a vGPU by keeping ``/dev/vfio/<iommu group>`` open. Such a vGPU is never
removed (ARCHITECTURE.md, "Never destroy what is in use"), so the inventory marks it
``in_use`` with who holds it. The simulator supplies its own probe through the same port.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from reconciler.model import ObserveError

VFIO_GROUP_PREFIX = "/dev/vfio/"


class HoldProbe(Protocol):
    def held(self, vgpus: Mapping[str, str | None]) -> dict[str, str]:
        """For ``uuid → iommu group`` (``None``: no group, so nothing can hold it), return
        ``uuid → holder`` (``"pid 1234 (qemu-system-x86)"``) for the vGPUs a VM holds."""
        ...


def vfio_group_of(fd_target: str) -> str | None:
    """The IOMMU group an open file descriptor refers to: ``/dev/vfio/12`` → ``"12"``.

    ``/dev/vfio/vfio`` (the container) and ``/dev/vfio/devices/…`` (iommufd) are not groups.
    """
    if not fd_target.startswith(VFIO_GROUP_PREFIX):
        return None
    group = fd_target[len(VFIO_GROUP_PREFIX) :]
    return group if group.isdigit() else None


def describe_holder(pid: int, comm: str | None) -> str:
    """``pid 1234 (qemu-system-x86)``; just ``pid 1234`` when the name is unreadable."""
    comm = (comm or "").strip()
    return f"pid {pid} ({comm})" if comm else f"pid {pid}"


class ProcfsHoldProbe:
    """Finds holders by reading every process's open file descriptors under ``/proc``.

    Processes that exit during the scan, and ones we may not inspect (not root), are skipped:
    the kernel still refuses to remove a vGPU that is open, so a miss fails at apply time
    instead of destroying anything.
    """

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.proc_root = proc_root

    def held(self, vgpus: Mapping[str, str | None]) -> dict[str, str]:
        uuids_by_group: dict[str, list[str]] = {}
        for uuid, group in vgpus.items():
            if group is not None:
                uuids_by_group.setdefault(group, []).append(uuid)
        if not uuids_by_group:
            return {}
        holders = self._holders(set(uuids_by_group))
        return {
            uuid: holders[group]
            for group, uuids in uuids_by_group.items()
            if group in holders
            for uuid in uuids
        }

    def _holders(self, groups: set[str]) -> dict[str, str]:
        """Group → holder of the lowest pid holding it."""
        proc = os.fspath(self.proc_root)
        try:
            entries = os.listdir(proc)
        except OSError as exc:
            raise ObserveError(f"cannot read {proc}: {exc.strerror}") from None
        holders: dict[str, str] = {}
        for pid in sorted(int(e) for e in entries if e.isdigit()):
            fd_dir = f"{proc}/{pid}/fd"
            try:
                fds = os.listdir(fd_dir)
            except OSError:
                continue  # exited, or not ours to inspect
            for fd in fds:
                try:
                    group = vfio_group_of(os.readlink(f"{fd_dir}/{fd}"))
                except OSError:
                    continue  # closed since the listing
                if group in groups and group not in holders:
                    holders[group] = describe_holder(pid, _comm(f"{proc}/{pid}/comm"))
            if len(holders) == len(groups):
                break
        return holders


def _comm(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None
