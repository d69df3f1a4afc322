"""Pure parsers for the text the kernel and the NVIDIA driver print in sysfs.

The observers read files (``sysfs.py``) and hand the text here; nothing in this module touches
the file system, so every rule is tested on captured text (``tests/fixtures/sysfs/``). A value
that cannot be parsed raises :class:`ObserveError` naming the file it came from (``source``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from types import MappingProxyType

from reconciler.model import ObserveError
from reconciler.model.cluster import is_type_name
from reconciler.model.errors import excerpt
from reconciler.model.record import field, record

NVIDIA_VENDOR_ID = "10de"

#: PCI base class + subclass (``class >> 8``) of a GPU: VGA controller or 3D controller.
#: Audio (0x0403, the HDMI function of a GPU board) and everything else is not a GPU.
GPU_CLASSES = frozenset({0x0300, 0x0302})

_HEX = re.compile(r"^(?:0x)?([0-9a-f]{1,8})$")
_DECIMAL = re.compile(r"^[0-9]+$")
_VIRTFN = re.compile(r"^virtfn([0-9]+)$")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_VFIO_CDEV = re.compile(r"vfio[0-9]{1,10}")
#: ``4096M``, ``16G`` (also ``4096MB``/``4096MiB``): the driver prints mebibytes with ``M``.
_SIZE = re.compile(r"^([0-9]+)\s*([MG])(?:I?B)?$", re.IGNORECASE)
_SIZE_UNIT_MIB = {"M": 1, "G": 1024}
_TYPE_ID = re.compile(r"^(.*?)([0-9]+)$")


def _fail(source: str, message: str, text: str) -> ObserveError:
    # The file may be anything a hostile tree links to: quote no more than an excerpt of it.
    return ObserveError(f"{source}: {message}, got '{excerpt(text.strip())}'")


def parse_hex_id(text: str, *, source: str = "<input>") -> str:
    """``"0x10de\\n"`` → ``"10de"``; ``"25b6"`` (``sriov_vf_device`` prints no ``0x``) → ``"25b6"``.

    Always four or more lower-case digits, so ids compare as strings (``"0"`` → ``"0000"``).
    """
    m = _HEX.match(text.strip().lower())
    if m is None:
        raise _fail(source, "expected a hexadecimal PCI id such as 0x10de", text)
    return f"{int(m[1], 16):04x}"


def parse_int(text: str, *, source: str = "<input>") -> int:
    """A decimal count as the kernel prints it: ``"16\\n"`` → 16."""
    stripped = text.strip()
    if not _DECIMAL.match(stripped):
        raise _fail(source, "expected a non-negative decimal number", text)
    return int(stripped)


def parse_class(text: str, *, source: str = "<input>") -> int:
    """The PCI class code: ``"0x030200\\n"`` → ``0x030200`` (base class, subclass, prog-if)."""
    m = _HEX.match(text.strip().lower())
    if m is None:
        raise _fail(source, "expected a hexadecimal PCI class such as 0x030000", text)
    return int(m[1], 16)


def is_gpu_class(pci_class: int) -> bool:
    return (pci_class >> 8) in GPU_CLASSES


def is_nvidia_sriov_gpu(
    vendor: str, pci_class: int, has_physfn: bool, sriov_totalvfs: int | None
) -> bool:
    """Whether a PCI function is an NVIDIA GPU PF with SR-IOV (docs/domain.md §1).

    ``sriov_totalvfs`` alone does not prove it can make vGPU VFs (a T4 reports 16 and never
    does): ``sriov_vf_device`` 0 says so, and such a GPU is listed to be left alone, as one
    bound to another driver is. ``None`` means the file is absent.
    """
    return (
        vendor == NVIDIA_VENDOR_ID
        and is_gpu_class(pci_class)
        and not has_physfn
        and sriov_totalvfs is not None
        and sriov_totalvfs > 0
    )


def virtfn_index(name: str) -> int | None:
    """``"virtfn12"`` → 12; ``None`` for any other entry of a PF directory."""
    m = _VIRTFN.match(name)
    return int(m[1]) if m else None


def virtfn_links(names: list[str]) -> list[tuple[int, str]]:
    """The ``virtfn<N>`` entries among ``names`` as ``(N, name)``, in numeric order.

    A directory listing (or a glob) yields ``virtfn0, virtfn1, virtfn10, …``: the VF index is
    the number, so order by it.
    """
    found = [(i, n) for n in names if (i := virtfn_index(n)) is not None]
    found.sort()
    return found


def parse_device_number(text: str, *, source: str = "<input>") -> int:
    """A ``dev`` attribute, ``major:minor`` (``"238:0\n"``), as ``os.makedev`` gives it."""
    major, sep, minor = text.strip().partition(":")
    if not sep or not _DECIMAL.match(major) or not _DECIMAL.match(minor):
        raise _fail(source, "expected a device number such as 238:0", text)
    try:
        return os.makedev(int(major), int(minor))
    except (OverflowError, ValueError):
        raise _fail(source, "device number out of range", text) from None


#: The first line of ``nvidia/creatable_vgpu_types`` (NVIDIA's driver prints it exactly so).
_CREATABLE_HEADER = re.compile(r"^ID\s*:\s*vGPU Name$")
#: ``1147  : NVIDIA L40S-1Q`` (``"%-5d : %s"``): an id, a colon, the name (which may hold one).
_CREATABLE_ENTRY = re.compile(r"^([0-9]+)\s*:\s*(\S.*?)\s*$")
#: Why a name fails vgpuctl's name check (``model.cluster.is_type_name``).
_BAD_TYPE_NAME = (
    "not a vGPU type name (at most 63 letters, digits, spaces and '-', '_', '.', '/', as "
    "NVIDIA's are: it would become a Kubernetes resource name)"
)


def parse_creatable_types(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """``nvidia/creatable_vgpu_types`` → ``[(type id, name)]`` in the driver's order, and the
    lines that are neither the header nor an entry of a valid name (see :func:`parse_type_name`):
    reported, never silently dropped.

    A header only (or nothing) means nothing can be created on the VF now.
    """
    entries: list[tuple[str, str]] = []
    bad: list[str] = []
    for number, raw in enumerate(text.splitlines()):
        line = raw.strip()
        if not line or (number == 0 and _CREATABLE_HEADER.match(line)):
            continue
        m = _CREATABLE_ENTRY.match(line)
        if m is None:
            bad.append(raw)
            continue
        name = " ".join(m[2].split())
        if not is_type_name(name):
            bad.append(raw)
            continue
        entries.append((str(int(m[1])), name))
    return entries, bad


def vfio_cdev_name(name: str) -> bool:
    """Whether a ``vfio-dev/`` entry is a vfio cdev (``vfio3``: ``/dev/vfio/devices/vfio3``):
    ``vfio`` and ASCII digits, as vfio_main.c ``__vfio_register_dev`` names it (``"vfio%d"``)."""
    return _VFIO_CDEV.fullmatch(name) is not None


def is_mdev_uuid(name: str) -> bool:
    """Whether a directory entry is an mdev (named by its lower-case UUID)."""
    return _UUID.match(name) is not None


def type_id_order(type_id: str) -> tuple[str, int]:
    """Sort key putting ``nvidia-99`` before ``nvidia-745``: the driver's numeric id order."""
    m = _TYPE_ID.match(type_id)
    return (m[1], int(m[2])) if m else (type_id, -1)


def parse_framebuffer(value: str, *, source: str = "<input>") -> int:
    """``"4096M"`` → 4096, ``"16G"`` → 16384 (MiB)."""
    m = _SIZE.match(value.strip())
    if m is None:
        raise _fail(source, "framebuffer: expected a size such as 4096M or 16G", value)
    return int(m[1]) * _SIZE_UNIT_MIB[m[2].upper()]


@record(frozen=True, slots=True)
class TypeDescription:
    """What an mdev type's ``description`` file says."""

    framebuffer_mib: int
    max_instance: int  # per physical GPU
    num_heads: int = 0
    frl_config: int = 0
    max_resolution: str = ""
    #: Keys this parser does not know, kept as text (newer drivers add some).
    extra: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


_DESCRIPTION_INTS = ("max_instance", "num_heads", "frl_config")
_DESCRIPTION_REQUIRED = ("framebuffer", "max_instance")


def parse_description(text: str, *, source: str = "<input>") -> TypeDescription:
    """Parse ``num_heads=4, frl_config=60, framebuffer=4096M, max_resolution=7680x4320,
    max_instance=4``.

    ``framebuffer`` and ``max_instance`` are required (the planner's size and count rules
    depend on them); the other known keys default to 0/empty; unknown keys land in ``extra``.
    """
    fields: dict[str, str] = {}
    for raw in re.split(r"[,\n]", text):
        item = raw.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise _fail(source, "malformed entry (expected key=value)", item)
        fields[key] = value
    missing = [k for k in _DESCRIPTION_REQUIRED if k not in fields]
    if missing:
        raise _fail(source, f"missing {' and '.join(missing)} in the type description", text)
    numbers: dict[str, int] = {}
    for key in _DESCRIPTION_INTS:
        if key in fields:
            value = fields[key]
            if not _DECIMAL.match(value):
                raise _fail(source, f"{key}: expected a decimal number", value)
            numbers[key] = int(value)
    known = {"framebuffer", "max_resolution", *_DESCRIPTION_INTS}
    return TypeDescription(
        framebuffer_mib=parse_framebuffer(fields["framebuffer"], source=source),
        max_instance=numbers["max_instance"],
        num_heads=numbers.get("num_heads", 0),
        frl_config=numbers.get("frl_config", 0),
        max_resolution=fields.get("max_resolution", ""),
        extra=MappingProxyType({k: v for k, v in fields.items() if k not in known}),
    )


def parse_type_name(text: str, *, source: str = "<input>") -> str:
    """An mdev type's ``name`` file: ``"NVIDIA A2-4Q\\n"`` → ``"NVIDIA A2-4Q"`` (spaces kept).

    A name that could not be a Kubernetes resource name (control characters, a megabyte, a
    quote) is an error naming the file: a hostile or broken tree, not a type to publish."""
    name = " ".join(text.split())
    if not name:
        raise _fail(source, "empty vGPU type name", text)
    if not is_type_name(name):
        raise _fail(source, _BAD_TYPE_NAME, text)
    return name


def link_basename(target: str) -> str:
    """The last component of a link target: ``../../bus/pci/drivers/nvidia`` → ``nvidia``."""
    return target.rstrip("/").rpartition("/")[2]
