"""The simulator's ``nvidia-smi``: only what vgpuctl needs of it, a GPU's vGPU mode.

``DIR/bin/nvidia-smi`` (written by :func:`install_script`, as ``sriov-manage`` is) runs
:func:`main` on ``DIR/sys``. It implements one command, ``nvidia-smi vgpu -i <GPU> -shm 0|1``
(docs/domain.md §4): ``-shm 1`` puts the GPU in mixed-size mode, ``-shm 0`` back in equal-size
mode. ``<GPU>`` is its PCI address, as ``0000:08:00.0`` or as nvidia-smi prints bus ids
(``00000000:08:00.0``); a GPU index or UUID is not simulated. The driver's rules: the mode is
set after ``sriov-manage -e`` and before the first vGPU; a call while the GPU's SR-IOV is off or
while it hosts a vGPU is refused, the mode unchanged. ``sriov-manage -d`` and a reboot clear it.

Not NVIDIA's: the wording of the messages (stdout on success, stderr on a refusal) is the
simulator's own, and so are the exit codes' meanings beyond "non-zero is a failure" (2: a bad
argument, 3: the operation is not available now, after nvidia-smi's documented return values;
which one the real driver returns for each refusal is not documented to us). Nothing may parse
these messages. No query of the mode is simulated: how a host reports it is not documented to us.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from reconciler.model import PciAddress
from reconciler.model.mode import VgpuMode
from reconciler.sim import driver
from reconciler.sim.scripts import install_program
from reconciler.sim.state import load_state, locked, save_state
from reconciler.sim.tree import SysfsTree

USAGE = "usage: nvidia-smi vgpu -i <GPU PCI address> -shm <0|1>"

EXIT_OK = 0
#: A supplied argument or flag is invalid.
EXIT_INVALID_ARGUMENT = 2
#: The requested operation is not available on the target device (now).
EXIT_NOT_AVAILABLE = 3

#: ``-shm`` values → the mode they set.
_MODES = {"0": VgpuMode.EQUAL_SIZE, "1": VgpuMode.MIXED_SIZE}


@dataclass(frozen=True, slots=True)
class SetMode:
    """``nvidia-smi vgpu -i <gpu> -shm <0|1>``, parsed."""

    gpu: PciAddress
    mode: VgpuMode


def main(
    argv: Sequence[str],
    *,
    sysfs_root: Path,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run one ``nvidia-smi`` call on the tree at ``sysfs_root``; return its exit status."""
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    parsed = parse(argv)
    if isinstance(parsed, str):
        if parsed == "help":
            print(USAGE, file=out)
            return EXIT_OK
        print(f"nvidia-smi: {parsed}", file=err)
        print(USAGE, file=err)
        return EXIT_INVALID_ARGUMENT
    try:
        return _set_mode(parsed, sysfs_root=sysfs_root, out=out, err=err)
    except OSError as exc:
        where = exc.filename or sysfs_root
        print(f"nvidia-smi: cannot read {where}: {exc.strerror or exc}", file=err)
        return EXIT_NOT_AVAILABLE


def _set_mode(call: SetMode, *, sysfs_root: Path, out: TextIO, err: TextIO) -> int:
    address = str(call.gpu)
    with locked(sysfs_root):
        state = load_state(sysfs_root)
        state.counters["nvidiaSmiCalls"] = state.counters.get("nvidiaSmiCalls", 0) + 1
        gpu = state.gpu(address)
        if gpu is None:
            save_state(sysfs_root, state)
            print(f"No GPU with the PCI bus id {address} is found.", file=err)
            return EXIT_INVALID_ARGUMENT
        try:
            driver.set_vgpu_mode(state, SysfsTree(sysfs_root), gpu, call.mode)
        except OSError as exc:
            save_state(sysfs_root, state)
            print(
                f"Unable to set the vGPU mode of GPU {address} to {call.mode}: {_reason(exc)}",
                file=err,
            )
            return EXIT_NOT_AVAILABLE
        save_state(sysfs_root, state)
    print(f"vGPU mode of GPU {address} is {call.mode}.", file=out)
    return EXIT_OK


def _reason(exc: OSError) -> str:
    text = str(exc.strerror or exc)
    return text.split(": ", 1)[1] if ": " in text else text


def parse(argv: Sequence[str]) -> SetMode | str:
    """The call, or an error message ("help" for -h)."""
    args = list(argv)
    if any(a in ("-h", "--help") for a in args):
        return "help"
    if not args or args[0] != "vgpu":
        first = args[0] if args else "nothing"
        return f"only 'vgpu -i <GPU> -shm 0|1' is simulated, not {first!r}"
    gpu: str | None = None
    shm: str | None = None
    i = 1
    while i < len(args):
        a = args[i]
        if a in ("-i", "-shm"):
            if i + 1 >= len(args):
                return f"{a} needs a value"
            value = args[i + 1]
            if a == "-i":
                if gpu is not None:
                    return "give -i once"
                gpu = value
            else:
                if shm is not None:
                    return "give -shm once"
                shm = value
            i += 2
            continue
        return f"unknown option {a}" if a.startswith("-") else f"unexpected argument {a}"
    if gpu is None:
        return "-i <GPU PCI address> is required"
    if shm is None:
        return "-shm 0|1 is required (no other vgpu command is simulated)"
    mode = _MODES.get(shm)
    if mode is None:
        return f"-shm takes 0 or 1, not {shm!r}"
    address = _bus_id(gpu)
    if address is None:
        return f"invalid GPU {gpu!r}: expected a PCI address such as 0000:08:00.0"
    return SetMode(address, mode)


def _bus_id(text: str) -> PciAddress | None:
    """``0000:08:00.0``, or nvidia-smi's own ``00000000:08:00.0`` (a 32-bit domain)."""
    head, sep, rest = text.partition(":")
    if sep and len(head) == 8 and head[:4] == "0000":
        text = f"{head[4:]}:{rest}"
    try:
        return PciAddress.parse(text)
    except ValueError:
        return None


def install_script(directory: Path) -> Path:
    """Write ``DIR/bin/nvidia-smi``: runs :func:`main` on ``DIR/sys`` with this interpreter."""
    return install_program(
        directory,
        "nvidia-smi",
        module=__name__,
        summary="Simulated nvidia-smi (vgpuctl sim): only 'vgpu -i <GPU> -shm 0|1'.",
    )
