"""What the NVIDIA driver calls each vGPU type id of a GPU: its list of *supported* types.

On NVIDIA's vendor-specific VFIO interface a VF says only the id of its type
(``nvidia/current_vgpu_type``), and the VFs' ``creatable_vgpu_types`` list only what can be
created *now*: once a GPU's capacity for a size is used, no list names the types of that size
(docs/domain.md §3b). A vGPU vgpuctl has no record of (made by pcidevices-controller, by hand,
by another tool, or by vgpuctl with a state directory since lost) is then known by its id
alone. The driver still knows every type the GPU supports: NVML's
``nvmlDeviceGetSupportedVgpus`` gives the ids and ``nvmlVgpuTypeGetName`` their names
(docs.nvidia.com/deploy/nvml-api, "vGPU Management"), and ``nvidia-smi vgpu -s -v -i <GPU>``
prints them. This module reads that output; ``apply/sriov.py`` runs the command (bounded in
time, like the mode read), ``cli/host.py`` and ``apply/vfio.py`` ask it only when an id is
unknown, once per GPU and scan.

The format, as a public capture shows it (bigstack-oss/cubecos,
``core/sdk_sh/tests/test_gpu_sriov_vgpu_count_limit.sh``: ``nvidia-smi vgpu -s -v`` on an RTX
PRO 6000 Blackwell, driver 580.105.06; the same layout as ``nvidia-smi -q``, keys padded to
column 42)::

    GPU 00000000:8C:00.0
        vGPU Type ID                          : 0x5ee
            Name                              : NVIDIA RTX Pro 6000 Blackwell DC-2B
            Class                             : NVS
            Max Instances                     : 32
            ...

The type id is printed in **hexadecimal** (``0x5ee`` = 1518), where sysfs prints decimal. That
the two are one id (NVML's ``nvmlVgpuTypeId_t``) is what the same project's parser relies on
(``ParseVgpuTypeNames``: ``strtol(value, NULL, 16)``, mapped to the decimal ids of
``current_vgpu_type``); no NVIDIA document we found says it in words. So the answer is
checked against the host before it is believed (:func:`check_against_lists`): every id a VF's
list names must be in the answer under the same name, or the answer is not used.

Parsed conservatively, failing closed: anything unexpected (no section for the GPU asked, a
section for another, an id not in ``0x`` hex, an id without a ``Name`` or a ``Name`` without
an id, one id under two names, a name a driver would not print, a line with no ``key : value``,
more than :data:`MAX_OUTPUT` characters) makes the whole answer unusable, with the reason: a
type vgpuctl cannot name keeps its GPU's changes blocked (``plan/guard.py``), the safe side.
Other keys (``Class``, ``Max Instances``…) are not read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

from reconciler.model import PciAddress, ReconcilerError
from reconciler.model.errors import excerpt
from reconciler.model.record import field, record
from reconciler.observe.parse import parse_type_name
from reconciler.observe.vgpumode import parse_section

#: At most this much output is read (a GPU supports a few dozen types, ~400 bytes each).
MAX_OUTPUT = 1 << 20

_ID = re.compile(r"0x([0-9A-Fa-f]{1,8})")
_ID_KEY = "vGPU Type ID"
_NAME_KEY = "Name"


@record(frozen=True, slots=True)
class SupportedTypes:
    """One GPU's answer: type id (decimal, as sysfs prints it) → name; or why there is none."""

    names: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: Why the answer tells nothing (the command could not run, failed, or said something
    #: unexpected); None when it was read.
    problem: str | None = None
    #: False when the command could not be run or did not finish in time: asking about
    #: another GPU in the same scan would fare no better.
    ran: bool = True


def supported_types_argv(gpu: PciAddress) -> list[str]:
    """The arguments after ``nvidia-smi``: ``vgpu -s -v -i 00000000:08:00.0`` (the GPU by its
    PCI bus id as nvidia-smi prints it, a 32-bit domain)."""
    return ["vgpu", "-s", "-v", "-i", smi_bus_id(gpu)]


def smi_bus_id(address: PciAddress) -> str:
    """How nvidia-smi prints a bus id: ``00000000:AF:00.0`` (a 32-bit domain, upper-case)."""
    return f"{address.domain:08X}:{address.bus:02X}:{address.slot:02X}.{address.function:X}"


def parse_supported_types(output: str, gpu: PciAddress) -> SupportedTypes:
    """The types of ``gpu`` in ``nvidia-smi vgpu -s -v -i <gpu>`` output (see the module's
    docstring), or the reason it cannot be used."""
    try:
        return SupportedTypes(MappingProxyType(_parse(output, gpu)))
    except ValueError as e:
        return SupportedTypes(problem=f"nvidia-smi vgpu -s -v -i {smi_bus_id(gpu)}: {e}")


def _parse(output: str, gpu: PciAddress) -> dict[str, str]:
    if len(output) > MAX_OUTPUT:
        raise ValueError(f"more than {MAX_OUTPUT} characters of output: not read")
    names: dict[str, str] = {}
    section: PciAddress | None = None
    pending: str | None = None  # an id whose Name has not come yet
    for line in output.splitlines():
        if not line.strip():
            continue
        if not line[:1].isspace():
            if pending is not None:
                raise ValueError(f"type id 0x{int(pending):x} has no Name")
            if section is not None:
                raise ValueError(f"a second section '{excerpt(line.strip())}'")
            section = parse_section(line.strip())
            if section != gpu:
                raise ValueError(f"'{excerpt(line.strip())}' is not the section of GPU {gpu}")
            continue
        if section is None:
            raise ValueError(f"'{excerpt(line.strip())}' before any GPU section")
        key, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"cannot read the line '{excerpt(line.strip())}'")
        key, value = key.strip(), value.strip()
        if key == _ID_KEY:
            if pending is not None:
                raise ValueError(f"type id 0x{int(pending):x} has no Name")
            m = _ID.fullmatch(value)
            if m is None:
                raise ValueError(f"a vGPU Type ID '{excerpt(value)}' that is not 0x-hexadecimal")
            pending = str(int(m[1], 16))
        elif key == _NAME_KEY:
            if pending is None:
                raise ValueError(f"a Name '{excerpt(value)}' outside a vGPU type")
            try:
                name = parse_type_name(value, source="Name")
            except ReconcilerError as e:
                raise ValueError(e.message) from None
            if names.setdefault(pending, name) != name:
                raise ValueError(f"type id 0x{int(pending):x} is named twice")
            pending = None
    if pending is not None:
        raise ValueError(f"type id 0x{int(pending):x} has no Name")
    if section is None:
        raise ValueError(f"no section for GPU {gpu}")
    return names


def check_against_lists(answer: SupportedTypes, listed: Mapping[str, str]) -> SupportedTypes:
    """``answer`` when every id the GPU's VFs list (``listed``: id → name) is in it under the
    same name; else an answer that tells nothing, saying which id disagrees. The lists are the
    sysfs ids vgpuctl writes: an answer in another id space (or of another GPU) must not name
    anything."""
    if answer.problem is not None:
        return answer
    for type_id, name in sorted(listed.items()):
        said = answer.names.get(type_id)
        if said != name:
            what = f"names it '{excerpt(said)}'" if said is not None else "does not list it"
            return SupportedTypes(
                problem=f"a VF lists type {type_id} as {name}, but nvidia-smi {what}: its "
                "answer is not used"
            )
    return answer
