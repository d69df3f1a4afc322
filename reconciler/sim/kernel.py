"""The kernel behind the simulated sysfs: what happens when something writes a file there.

:class:`SimSysfsWriter` is the simulator's adapter for the project's sysfs-writer port
(``write(path, value)``, path relative to the sysfs root). It resolves the path the way the
kernel's VFS would (symlinks included), refuses anything outside the root, and dispatches on
what the resolved file is: an mdev type's ``create``, an mdev's ``remove``, ``vgpu_params``, a
VF's ``nvidia/current_vgpu_type``; everything else is refused with the errno sysfs gives.
Removing an mdev a VM holds does what ``vfio_unregister_group_dev`` does: the write blocks
(the mdev's links vanish at once) until the VM lets go (drivers/vfio/vfio_main.c, as read in
Linux 6.8 and 6.18; see docs/host.md).

The observer's "is a VM holding this vGPU?" is answered by :mod:`reconciler.sim.holds`.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import time
from pathlib import Path

from reconciler.sim import driver
from reconciler.sim.driver import refusal
from reconciler.sim.state import SimState, load_state, locked, save_state
from reconciler.sim.statefile import STATE_DIR
from reconciler.sim.tree import SysfsTree

_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
UUID_LEN = 36


#: How often a writer blocked on a held vGPU looks whether the holder let go.
BLOCKED_POLL_SECONDS = 0.05
#: A simulator concession: the kernel waits for ever, a simulated blocked writer gives up after
#: this long (or as soon as its tree is gone), so no test leaves an immortal process behind.
BLOCKED_LIMIT_SECONDS = 900.0


class _WouldBlock(Exception):
    """The write must wait until a VM lets go of the vGPU (raised with the host lock held)."""

    def __init__(self, vgpu_id: str) -> None:
        super().__init__(vgpu_id)
        self.vgpu_id = vgpu_id


class SimSysfsWriter:
    """Writes to a simulated sysfs tree, with the effects and errnos of the real kernel."""

    def __init__(self, sysfs_root: Path, *, owner: int | None = None) -> None:
        self._root = Path(sysfs_root)
        self._root_real = os.path.realpath(self._root)
        #: The process that asked for writes (an apply): a crash fault kills it, also when the
        #: writes run in a writer process of its own (``apply.sysfs.BoundedWriter``).
        self._owner = os.getpid() if owner is None else owner

    def write(self, path: str, value: str) -> None:
        """Write ``value`` to ``path`` (relative to the sysfs root); raise ``OSError`` like sysfs.

        Every call counts in ``stats()["writes"]``, refused ones too. A pending ``fail(writes=N)``
        makes the write fail with EIO; a pending ``fail(crash_after=N)`` SIGKILLs the owning
        process right after the Nth further successful change (the change itself is complete).

        Removing a vGPU a VM holds blocks, as ``vfio_unregister_group_dev`` does: its links
        vanish at once (the ``remove`` attribute too, so a second removal finds nothing to
        write), the write returns once the holder lets go (``sim release``), and the vGPU is
        gone then.
        """
        error: OSError | None = None
        crash = False
        blocked: str | None = None
        with locked(self._root):
            state = load_state(self._root)
            state.counters["writes"] = state.counters.get("writes", 0) + 1
            try:
                parts = self._resolve(path)
                if state.faults.take_write_fault():
                    raise refusal(errno.EIO, f"{path}: injected fault")
                changed = _dispatch(state, SysfsTree(self._root), parts, value, shown=path)
                crash = changed and state.faults.change_made()
            except OSError as exc:
                error = exc
            except _WouldBlock as wait:
                blocked = wait.vgpu_id
            save_state(self._root, state)
        if blocked is not None:
            crash = self._finish_removal(blocked)
        if crash:
            os.kill(self._owner, signal.SIGKILL)
        if error is not None:
            raise error

    def _finish_removal(self, vgpu_id: str) -> bool:
        """Wait (without the lock) until nothing holds ``vgpu_id``, then remove it; True when
        that was the change a crash fault waits for."""
        deadline = time.monotonic() + BLOCKED_LIMIT_SECONDS
        while True:
            try:
                state = load_state(self._root)
            except OSError:
                raise refusal(errno.ENODEV, f"vGPU {vgpu_id}: the simulated host is gone") from None
            if vgpu_id not in state.held or vgpu_id not in state.vgpus:
                break
            if time.monotonic() >= deadline:
                raise refusal(errno.EINTR, f"vGPU {vgpu_id}: gave up waiting for its holder")
            time.sleep(BLOCKED_POLL_SECONDS)
        with locked(self._root):
            state = load_state(self._root)
            crash = False
            if vgpu_id in state.vgpus and vgpu_id not in state.held:
                driver.remove_vgpu(state, SysfsTree(self._root), vgpu_id)
                crash = state.faults.change_made()
            state.removing.discard(vgpu_id)
            save_state(self._root, state)
        return crash

    def _resolve(self, path: str) -> list[str]:
        """The resolved path's parts below the root; PermissionError outside it, ENOENT, EISDIR."""
        try:
            resolved = os.path.realpath(os.path.join(self._root_real, path))
        except ValueError as exc:  # an embedded NUL
            raise refusal(errno.EINVAL, f"{path!r}: {exc}") from None
        if os.path.commonpath([resolved, self._root_real]) != self._root_real:
            raise refusal(errno.EACCES, f"{path}: outside the simulated sysfs root")
        rel = os.path.relpath(resolved, self._root_real)
        parts = [] if rel == "." else rel.split(os.sep)
        if parts and parts[0] == STATE_DIR:
            raise refusal(errno.EACCES, f"{path}: the simulator's own state, not sysfs")
        if not os.path.exists(resolved):
            raise refusal(errno.ENOENT, path)
        if os.path.isdir(resolved):
            raise refusal(errno.EISDIR, path)
        return parts


def _dispatch(
    state: SimState, tree: SysfsTree, parts: list[str], value: str, *, shown: str
) -> bool:
    """Act on a write to an existing, resolved file; True if it changed the host."""
    name = parts[-1]
    parent = parts[-2] if len(parts) >= 2 else ""
    grandparent = parts[-3] if len(parts) >= 3 else ""

    # Each GPU shows one interface: an mdev type's ``create`` acts on a VF of an mdev GPU only,
    # ``current_vgpu_type`` on a VF of a vfio GPU only (no VF at all: ENOENT from the handler).
    if (
        name == "create"
        and grandparent == "mdev_supported_types"
        and len(parts) >= 4
        and state.interface_of_vf(parts[-4]) != "vfio"
    ):
        return _create(state, tree, vf=parts[-4], type_dir=parent, value=value, shown=shown)
    if name == "remove" and parent in state.vgpus and state.vgpus[parent].vf == grandparent:
        try:
            flag = int(value.strip(), 0)
        except ValueError:
            raise refusal(errno.EINVAL, f"{shown}: expected 1, got {value!r}") from None
        if flag == 0:
            return False  # the kernel accepts 0 and does nothing
        if parent in state.held:
            driver.begin_removal(state, tree, parent)
            raise _WouldBlock(parent)
        driver.remove_vgpu(state, tree, parent)
        return True
    if name == "vgpu_params" and parent == "nvidia" and grandparent in state.vgpus:
        if grandparent in state.held:
            raise refusal(errno.EBUSY, f"{shown}: vGPU is open in a VM")
        tree.replace("/".join(parts), value if value.endswith("\n") else value + "\n", 0o644)
        return True
    if (
        name == "current_vgpu_type"
        and parent == "nvidia"
        and state.interface_of_vf(grandparent) != "mdev"
    ):
        return _set_vfio_type(state, tree, vf=grandparent, value=value, shown=shown)
    if name == "sriov_numvfs":
        # The NVIDIA driver refuses raw writes: VFs are made by sriov-manage (docs/domain.md §2).
        raise refusal(errno.EPERM, f"{shown}: use sriov-manage to enable or disable VFs")
    raise refusal(errno.EACCES, f"{shown}: read-only attribute")


def _create(
    state: SimState, tree: SysfsTree, *, vf: str, type_dir: str, value: str, shown: str
) -> bool:
    gpu = state.vf_owner(vf)
    vgpu_type = None
    if gpu is not None and type_dir.startswith("nvidia-") and type_dir[7:].isdigit():
        vgpu_type = state.model_of(gpu).type_with_id(int(type_dir[7:]))
    if gpu is None or vgpu_type is None:
        raise refusal(errno.ENOENT, shown)
    # As mdev's create_store: 36 characters, or 37 with a trailing newline.
    text = value[:-1] if value.endswith("\n") else value
    if len(text) != UUID_LEN or not _UUID.match(text):
        raise refusal(errno.EINVAL, f"{shown}: {value!r} is not a UUID")
    driver.create_vgpu(state, tree, vf=vf, type_name=vgpu_type.name, vgpu_id=text.lower())
    return True


def _set_vfio_type(state: SimState, tree: SysfsTree, *, vf: str, value: str, shown: str) -> bool:
    gpu = state.vf_owner(vf)
    if gpu is None:
        raise refusal(errno.ENOENT, shown)
    try:
        type_id = int(value.strip())
    except ValueError:
        raise refusal(errno.EINVAL, f"{shown}: {value!r} is not a type id") from None
    current = state.vgpu_on_vf(vf)
    if type_id == 0:
        if current is None:
            raise refusal(errno.EPERM, f"{shown}: VF {vf} has no vGPU type to clear")
        driver.remove_vgpu(state, tree, current)
        return True
    if current is not None:
        raise refusal(errno.EPERM, f"{shown}: VF {vf} already has a vGPU type; write 0 first")
    vgpu_type = state.model_of(gpu).type_with_id(type_id)
    if vgpu_type is None:
        raise refusal(errno.EINVAL, f"{shown}: no vGPU type {type_id} on this GPU")
    driver.create_vgpu(state, tree, vf=vf, type_name=vgpu_type.name, vgpu_id=vf)
    return True
