"""The mdev host driver (docs/domain.md §3a): mdev sysfs for vGPUs, ``sriov-manage`` for VFs
(:class:`~reconciler.apply.sriov.SriovHost`). Kernel errnos become messages an operator can act
on.
"""

from __future__ import annotations

import errno
import uuid as uuidlib
from pathlib import PurePosixPath
from typing import Final, NoReturn

from reconciler.apply.errors import (
    DeviceBusyError,
    DriverRefusedError,
    HostChangedError,
    WriteTimeoutError,
)
from reconciler.apply.ports import HostedVGPU, SysfsDevice
from reconciler.apply.sriov import SriovHost, errno_text
from reconciler.model import ApplyError, PciAddress
from reconciler.model.errors import excerpt


def checked_uuid(text: str) -> str:
    """Return ``text`` if it is a UUID in canonical lower-case form; raise ``ApplyError`` else.

    Only such a string may become a sysfs path component or a value written to ``create``.
    """
    try:
        canonical = str(uuidlib.UUID(text))
    except (ValueError, TypeError, AttributeError):
        canonical = None
    if canonical != text:
        raise ApplyError(
            f"invalid vGPU UUID {text!r}: expected the canonical lower-case form, "
            "e.g. 2b1c6e1a-8d3f-5b7e-9a40-1c2d3e4f5a6b"
        )
    return text


def _is_uuid(name: str) -> bool:
    try:
        return str(uuidlib.UUID(name)) == name
    except ValueError:
        return False


class MdevDriver(SriovHost):
    """:class:`~reconciler.apply.ports.HostDriver` for GPUs whose VFs are mdev parents."""

    interface: Final = "mdev"

    # -- vGPUs ------------------------------------------------------------------------------

    def create_vgpu(
        self, *, gpu: PciAddress, vf: PciAddress, vf_index: int, type_name: str, uuid: str
    ) -> None:
        uuid = checked_uuid(uuid)
        offered = self._offered_types(vf)
        if not offered:
            raise DriverRefusedError(
                f"{vf} (VF {vf_index} of {gpu}) offers no vGPU types (no mdev_supported_types): "
                "is SR-IOV enabled and the NVIDIA vGPU manager running?"
            )
        type_dir = offered.get(type_name)
        if type_dir is None:
            # The names are what the tree's files say: quote no more than an excerpt of each.
            names = ", ".join(excerpt(n) for n in sorted(offered))
            raise DriverRefusedError(f"{type_name} is not offered on {vf}; it offers: {names}")
        rel = f"bus/pci/devices/{vf}/mdev_supported_types/{type_dir}"
        try:
            self._writer.write(f"{rel}/create", uuid, device=SysfsDevice(gpu, vf))
        except WriteTimeoutError as e:
            raise WriteTimeoutError(
                f"{e.message}: the NVIDIA driver did not finish creating {type_name} on {vf}; "
                "see the kernel log (dmesg) and the nvidia-vgpu-mgr service",
                pid=e.pid,
            ) from e
        except OSError as e:
            self._explain_create(e, vf=vf, type_name=type_name, uuid=uuid, type_rel=rel)

    def _explain_create(
        self, e: OSError, *, vf: PciAddress, type_name: str, uuid: str, type_rel: str
    ) -> NoReturn:
        code = e.errno
        if code in (errno.EINVAL, errno.ENOSPC, errno.EDQUOT):
            available = self._available_instances(type_rel)
            if available == 0:
                detail = (
                    "no available instance: available_instances is 0 (the VF already hosts a "
                    "vGPU, the GPU hosts vGPUs of another size, or the profile's maximum is "
                    "reached)"
                )
            else:
                detail = f"{errno_text(e)}; available_instances is {available}"
            raise DriverRefusedError(
                f"the driver refused to create {type_name} on {vf} ({detail})"
            ) from e
        if code == errno.EEXIST:
            raise HostChangedError(
                f"the driver refused to create {type_name} on {vf}: "
                f"a vGPU with UUID {uuid} already exists"
            ) from e
        if code == errno.EBUSY:
            raise DeviceBusyError(f"{vf} is busy: {type_name} not created, try again") from e
        if code in (errno.ENOENT, errno.ENODEV):
            self._read.check_root()
            raise HostChangedError(
                f"{type_name} on {vf} disappeared while creating (SR-IOV disabled meanwhile?)"
            ) from e
        raise self._write_failed(e, f"create {type_name} on {vf}") from e

    def remove_vgpu(self, *, gpu: PciAddress, vf: PciAddress, uuid: str) -> None:
        uuid = checked_uuid(uuid)
        try:
            self._writer.write(
                f"bus/mdev/devices/{uuid}/remove", "1", device=SysfsDevice(gpu, vf, uuid)
            )
        except WriteTimeoutError as e:
            # The kernel does not refuse to remove an open device: it asks the holder to let go
            # and waits (vfio_unregister_group_dev). vgpuctl plans no removal of a vGPU it sees
            # held, so the holder is one it could not see.
            raise WriteTimeoutError(
                f"{e.message}: the kernel is waiting for a process to release vGPU {uuid}: "
                "probably a VM vgpuctl could not see; the removal completes on its own once "
                "it lets go (the next run sees the outcome)",
                pid=e.pid,
            ) from e
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENODEV):
                # Gone between the precondition check and the write: what removal wants
                # (unless all of sysfs went).
                self._read.check_root()
                return
            if e.errno == errno.EBUSY:
                raise DeviceBusyError(
                    f"vGPU {uuid} on {vf} is in use (held by a VM): not removed"
                ) from e

            raise self._write_failed(e, f"remove vGPU {uuid} from {vf}") from e

    # -- reads ------------------------------------------------------------------------------

    def vgpu_parent_ready(self, vf: PciAddress) -> bool:
        if self._read.entries(f"bus/pci/devices/{vf}/mdev_supported_types"):
            return True
        if self._read.exists(f"bus/pci/devices/{vf}/nvidia/creatable_vgpu_types"):
            raise DriverRefusedError(
                f"{vf} exposes NVIDIA's vendor-specific VFIO interface "
                "(nvidia/creatable_vgpu_types), not the mdev the plan was made for: no vGPU "
                "was created; plan again"
            )
        return False

    def vgpu_on(self, vf: PciAddress) -> HostedVGPU | None:
        dev = f"bus/pci/devices/{vf}"
        for name in self._read.entries(dev):
            if _is_uuid(name) and self._read.exists(f"{dev}/{name}/mdev_type"):
                return HostedVGPU(name, self._read.text(f"{dev}/{name}/mdev_type/name"))
        return None

    def removal_pending(self, vf: PciAddress) -> str | None:
        # An mdev directory under the VF that the mdev bus no longer lists: the kernel unlinks
        # it first, then waits for the holder to let go (device_del → vfio_unregister_group_dev).
        dev = f"bus/pci/devices/{vf}"
        for name in self._read.entries(dev):
            if (
                _is_uuid(name)
                and not self._read.exists(f"bus/mdev/devices/{name}")
                and not self._read.exists(f"{dev}/{name}/remove")  # not one still being made
            ):
                return name
        return None

    def vgpu_exists(self, uuid: str) -> PciAddress | None:
        link = f"bus/mdev/devices/{checked_uuid(uuid)}"
        if not self._read.exists(link):
            self._read.check_root()  # a vGPU is not "gone" because all of sysfs is
            return None
        # The link points at <VF dir>/<uuid>: the parent's name is the VF's address.
        parent = PurePosixPath(self._read.real(link)).parent.name
        try:
            return PciAddress.parse(parent)
        except ValueError:
            raise ApplyError(
                f"{self._read.path(link)} does not point into a VF (parent '{excerpt(parent)}')"
            ) from None

    def _offered_types(self, vf: PciAddress) -> dict[str, str]:
        """Type name → type directory (``nvidia-745``): ids vary by driver branch, names do not."""
        base = f"bus/pci/devices/{vf}/mdev_supported_types"
        out: dict[str, str] = {}
        for type_dir in self._read.entries(base):
            if self._read.exists(f"{base}/{type_dir}/name"):
                out.setdefault(self._read.text(f"{base}/{type_dir}/name"), type_dir)
        return out

    def _available_instances(self, type_rel: str) -> int | None:
        try:
            return self._read.integer(f"{type_rel}/available_instances")
        except ApplyError:
            return None
