"""The simulator's ``sriov-manage``: NVIDIA's script, emulated on a simulated sysfs tree.

``DIR/bin/sriov-manage`` (written by :func:`install_script`) runs :func:`main` on ``DIR/sys``.
Like the real script: ``-e <addr|ALL>`` enables all VFs of a GPU at once and leaves a GPU that
has VFs alone, does nothing (exit 0) for a GPU without vGPU VFs, and first unbinds a PF from any
other driver it has (``vfio-pci`` included: a VM's whole GPU, so vgpuctl must never ask);
``-d <addr|ALL>`` disables them, removing the GPU's vGPUs first, and fails while a VM holds one;
``-r 0|1`` is accepted with ``-e``; messages follow the real script's wording.
Injected faults (``fail(sriov_manage=…)``) make one call fail, exit 0 having done nothing (a
driver bug seen in the field), or hang until killed.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from reconciler.model import PciAddress
from reconciler.sim import driver
from reconciler.sim.scripts import install_program
from reconciler.sim.state import GpuRecord, load_state, locked, save_state
from reconciler.sim.tree import SysfsTree

USAGE = "usage: sriov-manage <-e|-d> [-r 0|1] <ssss:bb:dd.f|ALL>"
#: How long a hung call sleeps: far beyond any timeout a caller would use.
HANG_SECONDS = 3600.0

EXIT_OK = 0
EXIT_FAIL = 1


def main(
    argv: Sequence[str],
    *,
    sysfs_root: Path,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run one ``sriov-manage`` call on the tree at ``sysfs_root``; return its exit status."""
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    parsed = _parse(argv)
    if isinstance(parsed, str):
        if parsed == "help":
            print(USAGE, file=out)
            return EXIT_OK
        print(f"sriov-manage: {parsed}", file=err)
        print(USAGE, file=err)
        return EXIT_FAIL
    enable, target = parsed
    try:
        return _run(enable, target, sysfs_root=sysfs_root, out=out, err=err)
    except OSError as exc:
        # The tree itself is gone or unreadable (the reliability suite renames it away): the
        # real script fails the same way when sysfs cannot be read, with a message.
        where = exc.filename or sysfs_root
        print(f"sriov-manage: cannot read {where}: {exc.strerror or exc}", file=err)
        return EXIT_FAIL


def _run(enable: bool, target: str, *, sysfs_root: Path, out: TextIO, err: TextIO) -> int:
    verb = "enable" if enable else "disable"
    fault: str | None = None
    crash = False
    status = EXIT_OK
    with locked(sysfs_root):
        state = load_state(sysfs_root)
        state.counters["sriovManageCalls"] = state.counters.get("sriovManageCalls", 0) + 1
        gpus = _targets(state.gpus, target)
        if isinstance(gpus, str):
            save_state(sysfs_root, state)
            print(gpus, file=err)
            return EXIT_FAIL
        fault = state.faults.take_sriov_manage_fault()
        changed = False
        if fault is None:
            tree = SysfsTree(sysfs_root)
            for gpu in gpus:
                try:
                    if enable:
                        if gpu.vfs:
                            print(f"GPU at {gpu.address} already has VFs enabled.", file=out)
                            continue
                        if not gpu.vgpu_vfs:
                            # No SR-IOV vGPU mode for this GPU: the script does nothing, exit 0.
                            continue
                        if gpu.driver != "nvidia":
                            # As the real script: unbind from whatever driver it has (a VM's
                            # vfio-pci included: nothing asks), bind nvidia, then enable.
                            print(f"Unbinding {gpu.address} from {gpu.driver}", file=out)
                            tree.rebind(gpu.address, gpu.root_port, old=gpu.driver, new="nvidia")
                            gpu.driver = "nvidia"
                            changed = True
                        print(f"Enabling VFs on {gpu.address}", file=out)
                        changed |= driver.enable_vfs(state, tree, gpu)
                    else:
                        if not gpu.vfs:
                            print(f"GPU at {gpu.address} already has VFs disabled.", file=out)
                            continue
                        print(f"Disabling VFs on {gpu.address}", file=out)
                        changed |= driver.disable_vfs(state, tree, gpu)
                except OSError as exc:
                    print(f"Failed to {verb} VFs on {gpu.address}: {exc.strerror}", file=err)
                    status = EXIT_FAIL
            crash = changed and state.faults.change_made()
        save_state(sysfs_root, state)

    if fault == "error":
        for gpu in gpus:
            print(f"Failed to {verb} VFs on {gpu.address}: injected fault", file=err)
        return EXIT_FAIL
    if fault == "silent":
        # The driver bug docs/domain.md §2 warns of: success reported, nothing done.
        for gpu in gpus:
            print(f"{'Enabling' if enable else 'Disabling'} VFs on {gpu.address}", file=out)
        return EXIT_OK
    if fault == "hang":
        out.flush()
        time.sleep(HANG_SECONDS)  # the lock is released: a killed hang leaves the host usable
        return EXIT_FAIL
    if crash:
        out.flush()
        err.flush()
        # The caller (an apply) dies right after the change it asked for is complete.
        os.kill(os.getppid(), signal.SIGKILL)
    return status


def _parse(argv: Sequence[str]) -> tuple[bool, str] | str:
    """(enable?, target) or an error message ("help" for -h)."""
    mode: str | None = None
    reset: str | None = None
    target: str | None = None
    args = list(argv)
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-h", "--help"):
            return "help"
        if a in ("-e", "-d"):
            if mode is not None:
                return "give exactly one of -e and -d"
            mode = a
            if i + 1 < len(args) and not args[i + 1].startswith("-"):
                target = args[i + 1] if target is None else target
                i += 1
        elif a == "-r":
            if i + 1 >= len(args):
                return "-r needs a value (0 or 1)"
            reset = args[i + 1]
            i += 1
        elif a.startswith("-"):
            return f"unknown option {a}"
        elif target is None:
            target = a
        else:
            return f"unexpected argument {a}"
        i += 1
    if mode is None:
        return "give -e or -d"
    if target is None:
        return f"{mode} needs a GPU address or ALL"
    if reset is not None and (mode != "-e" or reset not in ("0", "1")):
        return "-r 0|1 goes with -e"
    return mode == "-e", target


def _targets(gpus: Sequence[GpuRecord], target: str) -> list[GpuRecord] | str:
    if target.upper() == "ALL":
        return sorted(gpus, key=lambda g: PciAddress.parse(g.address))
    try:
        address = str(PciAddress.parse(target))
    except ValueError:
        return f"Invalid GPU address {target!r}: expected ssss:bb:dd.f"
    for g in gpus:
        if g.address == address:
            return [g]
    return f"No NVIDIA SR-IOV GPU at {address}"


def install_script(directory: Path) -> Path:
    """Write ``DIR/bin/sriov-manage``: runs :func:`main` on ``DIR/sys`` with this interpreter."""
    return install_program(
        directory,
        "sriov-manage",
        module=__name__,
        summary="Simulated NVIDIA sriov-manage (vgpuctl sim): acts on the sysfs tree beside it.",
    )
