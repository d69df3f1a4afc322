"""One host driver for a node whose GPUs may use either host interface (docs/domain.md §3):
each VF is served by the driver of the interface it shows, detected at every call.

A host may have GPUs of both kinds (an older card beside a newer one, or a driver update part
way), and a GPU's interface shows only once its VFs exist, so the choice is made per VF, from
what the VF shows now: ``nvidia/creatable_vgpu_types`` is NVIDIA's vendor-specific VFIO, anything
else is left to the mdev driver (which knows mdev parents, and a VF showing no interface yet).
A vGPU is named by a UUID on mdev and by its VF's address on vfio, so a name alone says which
driver knows it.
"""

from __future__ import annotations

from typing import Final

from reconciler.apply.errors import HostChangedError
from reconciler.apply.mdev import MdevDriver
from reconciler.apply.ports import HostDriver, HostedVGPU
from reconciler.apply.sysfs import SysfsReader
from reconciler.apply.vfio import CREATABLE, CURRENT, VfioDriver
from reconciler.model import PciAddress, VgpuMode
from reconciler.observe.vgpumode import ModeReading


class PerVfDriver:
    """:class:`~reconciler.apply.ports.HostDriver` that hands each VF to the mdev or the vfio
    driver, by the interface the VF shows."""

    interface: Final = "any"

    def __init__(self, *, mdev: MdevDriver, vfio: VfioDriver, reader: SysfsReader) -> None:
        self._mdev = mdev
        self._vfio = vfio
        self._read = reader

    def _shows_vfio(self, vf: PciAddress) -> bool:
        base = f"bus/pci/devices/{vf}"
        return self._read.exists(f"{base}/{CREATABLE}") or self._read.exists(f"{base}/{CURRENT}")

    def _for(self, vf: PciAddress) -> HostDriver:
        return self._vfio if self._shows_vfio(vf) else self._mdev

    @staticmethod
    def _named_by_address(uuid: str) -> bool:
        try:
            PciAddress.parse(uuid)
        except ValueError:
            return False
        return True

    # -- writes -----------------------------------------------------------------------------

    def enable_sriov(self, gpu: PciAddress) -> None:
        self._mdev.enable_sriov(gpu)

    def disable_sriov(self, gpu: PciAddress) -> None:
        self._mdev.disable_sriov(gpu)

    def create_vgpu(
        self, *, gpu: PciAddress, vf: PciAddress, vf_index: int, type_name: str, uuid: str
    ) -> None:
        vfio = self._shows_vfio(vf)
        if vfio != self._named_by_address(uuid):
            planned, seen = ("mdev", "vfio") if vfio else ("vfio", "mdev")
            raise HostChangedError(
                f"{vf} shows NVIDIA's {seen} interface, but the plan was made for {planned} "
                f"(vGPU {uuid}): {type_name} not created; plan again"
            )
        driver: HostDriver = self._vfio if vfio else self._mdev
        driver.create_vgpu(gpu=gpu, vf=vf, vf_index=vf_index, type_name=type_name, uuid=uuid)

    def remove_vgpu(self, *, gpu: PciAddress, vf: PciAddress, uuid: str) -> None:
        driver: HostDriver = self._vfio if self._named_by_address(uuid) else self._mdev
        driver.remove_vgpu(gpu=gpu, vf=vf, uuid=uuid)

    def set_vgpu_mode(self, gpu: PciAddress, mode: VgpuMode) -> None:
        self._mdev.set_vgpu_mode(gpu, mode)  # one command for both interfaces

    # -- reads ------------------------------------------------------------------------------

    def num_vfs(self, gpu: PciAddress) -> int:
        return self._mdev.num_vfs(gpu)

    def vgpu_modes(self) -> ModeReading:
        return self._mdev.vgpu_modes()

    def pf_driver(self, gpu: PciAddress) -> str:
        return self._mdev.pf_driver(gpu)

    def vf_addresses(self, gpu: PciAddress) -> list[PciAddress]:
        return self._mdev.vf_addresses(gpu)

    def vgpu_parent_ready(self, vf: PciAddress) -> bool:
        return self._for(vf).vgpu_parent_ready(vf)

    def vgpu_on(self, vf: PciAddress) -> HostedVGPU | None:
        return self._for(vf).vgpu_on(vf)

    def vgpu_exists(self, uuid: str) -> PciAddress | None:
        driver: HostDriver = self._vfio if self._named_by_address(uuid) else self._mdev
        return driver.vgpu_exists(uuid)

    def removal_pending(self, vf: PciAddress) -> str | None:
        return self._for(vf).removal_pending(vf)
