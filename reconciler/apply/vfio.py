"""The host driver for NVIDIA's vendor-specific VFIO interface (docs/domain.md §3b; vGPU 17+ on
kernel 6.8+): a VF's profile is its ``nvidia/current_vgpu_type``.

- configure: read ``0``, then write the type id;
- remove: write ``0``;
- a change is a remove then a configure (the driver refuses an id over an id: ``EPERM``).

There is no mdev and no UUID: the VF is the vGPU, handed to a VM as a PCI device, so the VF's
address is its identity. Plans say so: a vgpu-create or vgpu-remove on this interface carries the
VF address where mdev has the UUID, and this driver refuses any other.

Type ids are facts of a card and driver branch, so a type is written by the id the VF lists
for its name *now* (never one stored elsewhere). The name of a type in use is not listed any
more (the lists narrow to what can still be created): it is read back through the ids this
driver has written and the names it was given (``known_types``: the record of earlier runs,
and what the scan asked the driver), then through the other VFs' lists, then by asking the
driver (``nvidia-smi vgpu -s -v -i <GPU>``, once per GPU, checked against the lists:
``observe/vgputypes.py``); a type none of them names reads as ``type <id>``
(:func:`~reconciler.model.type_shown_by_id`).

Before its first write of a type id on a GPU, the driver hands every id → name it knows of
that GPU (every VF's list, and the names above) to ``on_seen`` (``TypeRecord.remember``): once
the write has narrowed the lists, a crash still leaves nothing vgpuctl cannot name.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final, NoReturn

from reconciler.apply.errors import (
    DeviceBusyError,
    DriverRefusedError,
    HostChangedError,
    WriteTimeoutError,
)
from reconciler.apply.ports import CommandRunner, HostedVGPU, SysfsDevice, SysfsWriter
from reconciler.apply.sriov import DEFAULT_NVIDIA_SMI, SriovHost, errno_text
from reconciler.model import ApplyError, PciAddress, TypeNames, type_shown_by_id
from reconciler.model.errors import excerpt
from reconciler.observe.parse import parse_creatable_types
from reconciler.observe.vgputypes import check_against_lists

CREATABLE = "nvidia/creatable_vgpu_types"
CURRENT = "nvidia/current_vgpu_type"


def vf_identity(vf: PciAddress) -> str:
    """The identity of the vGPU on ``vf`` in plans, the journal and the CRs: the VF's address."""
    return str(vf)


class VfioDriver(SriovHost):
    """:class:`~reconciler.apply.ports.HostDriver` for GPUs whose VFs take a vGPU type through
    ``nvidia/current_vgpu_type``."""

    interface: Final = "vfio"

    def __init__(
        self,
        *,
        sysfs_root: Path,
        writer: SysfsWriter,
        runner: CommandRunner,
        sriov_manage: Sequence[str],
        command_timeout: float = 300.0,
        nvidia_smi: Sequence[str] = (DEFAULT_NVIDIA_SMI,),
        known_types: TypeNames | None = None,
        on_configured: Callable[[PciAddress, str, str], None] | None = None,
        on_seen: Callable[[PciAddress, Mapping[str, str]], None] | None = None,
    ) -> None:
        super().__init__(
            sysfs_root=sysfs_root,
            writer=writer,
            runner=runner,
            sriov_manage=sriov_manage,
            command_timeout=command_timeout,
            nvidia_smi=nvidia_smi,
        )
        #: (GPU, type id) → name: the record of earlier runs, then what this driver wrote.
        self._names: dict[tuple[PciAddress, str], str] = dict(known_types or {})
        self._on_configured = on_configured
        self._on_seen = on_seen
        #: GPUs whose types were handed to ``on_seen`` (before the first write on each).
        self._remembered: set[PciAddress] = set()
        #: GPUs whose supported types the driver was asked (at most once each).
        self._asked: set[PciAddress] = set()

    # -- vGPUs ------------------------------------------------------------------------------

    def create_vgpu(
        self, *, gpu: PciAddress, vf: PciAddress, vf_index: int, type_name: str, uuid: str
    ) -> None:
        self._check_identity(vf, uuid)
        offered = self._listed(vf)
        if offered is None:
            raise DriverRefusedError(
                f"{vf} (VF {vf_index} of {gpu}) has no {CREATABLE}: it does not use NVIDIA's "
                "vendor-specific VFIO interface (is the NVIDIA vGPU manager running?)"
            )
        current = self._current(vf)
        if current != "0":
            raise HostChangedError(
                f"{vf} already has vGPU type {current} ({self._name(vf, current)}), but the plan "
                f"expects it empty for {type_name}: run plan again"
            )
        by_name = {name: type_id for type_id, name in offered.items()}
        type_id = by_name.get(type_name)
        if type_id is None:
            names = ", ".join(excerpt(n) for n in sorted(by_name)) or "nothing (header only)"
            raise DriverRefusedError(
                f"{type_name} is not creatable on {vf} now; its {CREATABLE} lists: {names}"
            )
        self._remember(gpu)
        try:
            self._writer.write(
                f"bus/pci/devices/{vf}/{CURRENT}", type_id, device=SysfsDevice(gpu, vf)
            )
        except WriteTimeoutError as e:
            raise WriteTimeoutError(
                f"{e.message}: the NVIDIA driver did not finish configuring {type_name} on "
                f"{vf}; see the kernel log (dmesg) and the nvidia-vgpu-mgr service",
                pid=e.pid,
            ) from e
        except OSError as e:
            self._explain_create(e, vf=vf, type_name=type_name, type_id=type_id)
        self._names[(gpu, type_id)] = type_name
        if self._on_configured is not None:
            self._on_configured(gpu, type_id, type_name)

    def _explain_create(
        self, e: OSError, *, vf: PciAddress, type_name: str, type_id: str
    ) -> NoReturn:
        code = e.errno
        if code == errno.EPERM:
            # The driver refuses an id on a VF that has one: someone configured it meanwhile.
            raise HostChangedError(
                f"the driver refused to configure {type_name} (type {type_id}) on {vf}: the VF "
                f"already has a vGPU type ({errno_text(e)}); run plan again"
            ) from e
        if code == errno.EINVAL:
            raise DriverRefusedError(
                f"the driver refused to configure {type_name} (type {type_id}) on {vf} "
                f"({errno_text(e)}): the type is not creatable there now (the GPU hosts vGPUs "
                "of another size, or the profile's maximum is reached)"
            ) from e
        if code == errno.EBUSY:
            raise DeviceBusyError(f"{vf} is busy: {type_name} not configured, try again") from e
        if code in (errno.ENOENT, errno.ENODEV):
            self._read.check_root()
            raise HostChangedError(
                f"{vf} disappeared while configuring {type_name} (SR-IOV disabled meanwhile?)"
            ) from e
        raise self._write_failed(e, f"configure {type_name} on {vf}") from e

    def remove_vgpu(self, *, gpu: PciAddress, vf: PciAddress, uuid: str) -> None:
        self._check_identity(vf, uuid)
        try:
            self._writer.write(f"bus/pci/devices/{vf}/{CURRENT}", "0", device=SysfsDevice(gpu, vf))
        except WriteTimeoutError as e:
            # Whether NVIDIA's driver refuses to clear the type of a VF a VM holds, or waits
            # for the VM as vfio_unregister_group_dev does for an mdev, is not public
            # (docs/domain.md §9): vgpuctl plans no removal of a vGPU it sees held, so a
            # holder is one it could not see.
            raise WriteTimeoutError(
                f"{e.message}: the NVIDIA driver did not finish clearing the vGPU type of {vf}: "
                "probably a VM vgpuctl could not see holds it (the next run sees the outcome)",
                pid=e.pid,
            ) from e
        except OSError as e:
            if e.errno == errno.EPERM and self._current(vf) == "0":
                return  # cleared between the precondition check and the write: as wanted
            if e.errno in (errno.ENOENT, errno.ENODEV):
                self._read.check_root()
                return  # the VF is gone, and its type with it
            if e.errno == errno.EBUSY:
                raise DeviceBusyError(
                    f"the vGPU on {vf} is in use (held by a VM): its type not cleared"
                ) from e
            raise self._write_failed(e, f"clear the vGPU type of {vf}") from e

    # -- reads ------------------------------------------------------------------------------

    def vgpu_parent_ready(self, vf: PciAddress) -> bool:
        if self._read.exists(f"bus/pci/devices/{vf}/{CREATABLE}"):
            return True
        if self._read.entries(f"bus/pci/devices/{vf}/mdev_supported_types"):
            raise DriverRefusedError(
                f"{vf} is an mdev parent (mdev_supported_types), not NVIDIA's vendor-specific "
                "VFIO interface the plan was made for: plan again"
            )
        return False

    def vgpu_on(self, vf: PciAddress) -> HostedVGPU | None:
        if not self._read.exists(f"bus/pci/devices/{vf}/{CURRENT}"):
            return None
        current = self._current(vf)
        if current == "0":
            return None
        return HostedVGPU(vf_identity(vf), self._name(vf, current))

    def vgpu_exists(self, uuid: str) -> PciAddress | None:
        vf = _identity_address(uuid)
        if not self._read.exists(f"bus/pci/devices/{vf}"):
            self._read.check_root()  # a vGPU is not "gone" because all of sysfs is
            return None
        return vf if self.vgpu_on(vf) is not None else None

    def removal_pending(self, vf: PciAddress) -> str | None:
        # Nothing is known to be left half-removed on this interface: a write of 0 returns
        # having cleared the type, fails, or hangs (bounded by the writer); a type still set
        # reads as the vGPU still there.
        return None

    # -- helpers ----------------------------------------------------------------------------

    @staticmethod
    def _check_identity(vf: PciAddress, uuid: str) -> None:
        if uuid != vf_identity(vf):
            raise ApplyError(
                f"invalid vGPU identity {excerpt(uuid)!r} for {vf}: on NVIDIA's vendor-specific "
                "VFIO interface the VF is the vGPU, so its identity is the VF address"
            )

    def _current(self, vf: PciAddress) -> str:
        rel = f"bus/pci/devices/{vf}/{CURRENT}"
        text = self._read.text(rel).strip()
        if not text.isdigit() or len(text) > 9:
            raise ApplyError(f"{self._read.path(rel)} reads '{excerpt(text)}', not a vGPU type id")
        return str(int(text))

    def _listed(self, vf: PciAddress) -> dict[str, str] | None:
        """Type id → name as the VF lists them now; None when it has no list."""
        rel = f"bus/pci/devices/{vf}/{CREATABLE}"
        if not self._read.exists(rel):
            return None
        entries, _ = parse_creatable_types(self._read.text(rel))
        return dict(entries)

    def _name(self, vf: PciAddress, type_id: str) -> str:
        """The name of type ``type_id`` on ``vf``'s GPU: what this driver wrote or was given
        (the same driver's ids: no read), else a list of any of its VFs (a configured VF's own
        list never names its type), else the driver's answer (asked once per GPU), else
        ``type <id>``."""
        gpu = self._gpu_of(vf)
        if gpu is None:
            return type_shown_by_id(type_id)
        known = self._names.get((gpu, type_id))
        if known is not None:
            return known
        listed = self._gpu_listed(gpu)
        if type_id in listed:
            return listed[type_id]
        self._ask_driver(gpu, listed)
        return self._names.get((gpu, type_id)) or type_shown_by_id(type_id)

    def _gpu_listed(self, gpu: PciAddress) -> dict[str, str]:
        """Type id → name as any of ``gpu``'s VFs lists them now."""
        listed: dict[str, str] = {}
        for vf in self.vf_addresses(gpu):
            listed.update(self._listed(vf) or {})
        return listed

    def _ask_driver(self, gpu: PciAddress, listed: Mapping[str, str]) -> None:
        """Learn the names of ``gpu``'s supported types from the driver, once per GPU: only an
        answer that agrees with every VF's list is used (``observe/vgputypes.py``)."""
        if gpu in self._asked:
            return
        self._asked.add(gpu)
        answer = check_against_lists(self.supported_types(gpu), listed)
        for type_id, name in answer.names.items():
            self._names.setdefault((gpu, type_id), name)

    def _remember(self, gpu: PciAddress) -> None:
        """Hand every type id → name known of ``gpu`` to ``on_seen``, once, before the first
        write on it: every VF's list, what this driver was told or learnt, and the name of
        each configured VF's type (asking the driver when nothing else names one)."""
        if self._on_seen is None or gpu in self._remembered:
            return
        listed = self._gpu_listed(gpu)
        for vf in self.vf_addresses(gpu):
            if self._read.exists(f"bus/pci/devices/{vf}/{CURRENT}"):
                current = self._current(vf)
                if current != "0" and current not in listed:
                    self._name(vf, current)  # asks the driver when nothing else names it
        names = {t: n for (g, t), n in self._names.items() if g == gpu}
        names.update(listed)
        self._on_seen(gpu, names)
        self._remembered.add(gpu)

    def _gpu_of(self, vf: PciAddress) -> PciAddress | None:
        link = f"bus/pci/devices/{vf}/physfn"
        if not self._read.exists(link):
            return None
        try:
            return PciAddress.parse(self._read.link_name(link))
        except ValueError:
            return None


def _identity_address(uuid: str) -> PciAddress:
    try:
        return PciAddress.parse(uuid)
    except ValueError:
        raise ApplyError(
            f"invalid vGPU identity {excerpt(uuid)!r}: on NVIDIA's vendor-specific VFIO "
            "interface a vGPU is named by its VF's PCI address"
        ) from None
