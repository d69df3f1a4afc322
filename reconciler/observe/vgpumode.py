"""A GPU's vGPU mode (equal-size or mixed-size, docs/domain.md §4), which sysfs does not show.

It is read from ``nvidia-smi -q``: under each ``GPU 00000000:08:00.0`` section, the line
``vGPU Heterogeneous Mode : Enabled`` (mixed-size) or ``: Disabled`` (equal-size). Real captures
of ``nvidia-smi -q`` (R550 and later) carry that line under ``GPU Virtualization Mode``; the
ones we could find come from hosts without vGPU, where it reads ``N/A``. That a vGPU host
prints ``Enabled``/``Disabled`` there (nvidia-smi's words for every other on/off mode) is our
assumption, so anything else reads as "not known", never as a mode.

Where the mode is not known (no nvidia-smi, a failed call, another output) the driver's own
default decides what can be decided: a GPU whose SR-IOV is off, or that hosts no vGPU, counts as
equal-size (``sriov-manage`` leaves it so); one that hosts vGPUs is ``unknown``, and the planner
blocks what would need its mode rather than guess (``plan/mode.py``).

Pure: the command is run by the host driver (``apply/sriov.py``), and only for GPUs wanted in
mixed-size mode (``engine/observe.py``) or shown by ``status``/``export``; this module only
reads its output, bounded, as untrusted text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from reconciler.model import Inventory, PciAddress, VgpuMode
from reconciler.model.errors import excerpt
from reconciler.model.record import field, record, replace

#: At most this much of the output is read (nvidia-smi prints a few KiB per GPU).
MAX_OUTPUT = 4 << 20

_SECTION = re.compile(r"GPU ([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])")
_MODE_KEY = "vGPU Heterogeneous Mode"
_WORDS = {"Enabled": VgpuMode.MIXED_SIZE, "Disabled": VgpuMode.EQUAL_SIZE}


@record(frozen=True, slots=True)
class ModeReading:
    """What one ``nvidia-smi -q`` said: the mode of each GPU it named with a known word, and
    why the others (or all) could not be read."""

    modes: Mapping[PciAddress, VgpuMode] = field(default_factory=lambda: MappingProxyType({}))
    #: Why the call told nothing (it could not run, or failed); None when it ran.
    problem: str | None = None


def parse_vgpu_modes(output: str) -> dict[PciAddress, VgpuMode]:
    """The vGPU mode of every GPU section of ``nvidia-smi -q`` output with a known word."""
    modes: dict[PciAddress, VgpuMode] = {}
    current: PciAddress | None = None
    for line in output[:MAX_OUTPUT].splitlines():
        if not line.startswith(" "):
            current = parse_section(line.strip())
            continue
        if current is None:
            continue
        key, sep, value = line.partition(":")
        if sep and key.strip() == _MODE_KEY:
            mode = _WORDS.get(value.strip())
            if mode is not None:
                modes[current] = mode
            else:
                modes.pop(current, None)  # N/A, or a word we do not know: not known
    return modes


def parse_section(line: str) -> PciAddress | None:
    """The GPU a ``GPU 00000000:08:00.0`` line opens (nvidia-smi prints a 32-bit domain)."""
    m = _SECTION.fullmatch(line)
    if m is None:
        return None
    domain = int(m[1], 16)
    if domain > 0xFFFF:
        return None
    try:
        return PciAddress.parse(f"{domain:04x}:{m[2]}:{m[3]}.{m[4]}".lower())
    except ValueError:
        return None


def with_vgpu_modes(
    inventory: Inventory, gpus: Iterable[PciAddress], reading: ModeReading
) -> Inventory:
    """``inventory`` with the vGPU mode of ``gpus`` as ``reading`` says, else as the driver's
    default decides (see the module's docstring); a note says which could not be read, and why.
    Other GPUs are left as observed."""
    wanted = frozenset(gpus)
    unread: list[str] = []
    changed = []
    for gpu in inventory.gpus:
        if gpu.address not in wanted:
            changed.append(gpu)
            continue
        mode = reading.modes.get(gpu.address) if gpu.sriov_enabled else VgpuMode.EQUAL_SIZE
        if mode is None:
            hosts = any(vf.vgpu is not None for vf in gpu.vfs)
            mode = VgpuMode.UNKNOWN if hosts else VgpuMode.EQUAL_SIZE
            if hosts:
                unread.append(str(gpu.address))
        changed.append(gpu if gpu.vgpu_mode is mode else replace(gpu, vgpu_mode=mode))
    notes = inventory.notes
    if unread:
        why = excerpt(reading.problem, 200) if reading.problem else "it does not say"
        notes = (
            *notes,
            f"vGPU mode of GPU {', '.join(unread)} not known: nvidia-smi -q: {why}; "
            "a GPU that hosts vGPUs is not switched on a guess",
        )
    return replace(inventory, gpus=tuple(changed), notes=notes)
