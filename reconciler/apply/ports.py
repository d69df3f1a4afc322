"""The ports through which ``apply`` changes a host: sysfs writes, commands, and a host driver.

The executor speaks only :class:`HostDriver`; each host interface (mdev, NVIDIA's
vendor-specific VFIO: docs/domain.md §3) is one adapter behind it, and a node's driver hands each
VF to the one it shows (``drivers.PerVfDriver``). Adapters in turn write
through :class:`SysfsWriter` and run programs through :class:`CommandRunner`, so the simulator
(or a test's fake kernel) plugs in underneath the real adapter code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from reconciler.model import PciAddress, VgpuMode
from reconciler.model.record import record
from reconciler.observe.vgpumode import ModeReading


@record(frozen=True, slots=True)
class SysfsDevice:
    """The device a sysfs write is meant for, as the action names it: VF ``vf`` of GPU
    ``gpu``, or the vGPU (mdev) ``vgpu`` on that VF. A writer refuses a path that leads to a
    file of any other device (a link planted on the way: docs/domain.md §3a's layout is
    ``bus/mdev/devices/<uuid> -> …/<VF>/<uuid>``, and ``<VF>/physfn`` leads to the GPU)."""

    gpu: PciAddress
    vf: PciAddress
    vgpu: str | None = None

    def __str__(self) -> str:
        if self.vgpu is not None:
            return f"vGPU {self.vgpu} on VF {self.vf} of GPU {self.gpu}"
        return f"VF {self.vf} of GPU {self.gpu}"

    def to_json(self) -> dict[str, str | None]:
        return {"gpu": str(self.gpu), "vf": str(self.vf), "vgpu": self.vgpu}

    @classmethod
    def from_json(cls, raw: object) -> SysfsDevice:
        """Raises ``ValueError`` unless ``raw`` is what :meth:`to_json` makes."""
        if not isinstance(raw, dict):
            raise ValueError("device must be an object")
        vgpu = raw.get("vgpu")
        if vgpu is not None and not isinstance(vgpu, str):
            raise ValueError("device.vgpu must be a string or null")
        return cls(
            PciAddress.parse(str(raw.get("gpu"))), PciAddress.parse(str(raw.get("vf"))), vgpu
        )


class SysfsWriter(Protocol):
    """Writes one value to one existing sysfs attribute of one device."""

    def write(self, path: str, value: str, *, device: SysfsDevice) -> None:
        """Write ``value`` to ``path`` (relative to the sysfs root), a file of ``device``.

        Raises ``OSError`` carrying the errno the kernel returned; the driver explains it.
        """
        ...


class SysfsKernel(Protocol):
    """What stands behind a confined writer's checks: the file written (a real one), or a
    kernel's emulation of the write (the simulator's)."""

    def write(self, path: str, value: str) -> None:
        """Write ``value`` to ``path``, relative to the root and passing through no link."""
        ...


@record(frozen=True, slots=True)
class CommandResult:
    """How a finished command ended. A non-zero ``returncode`` is a result, not an exception."""

    returncode: int
    stdout: str
    stderr: str


class CommandRunner(Protocol):
    """Runs a program from an argv list (never a shell string) with a time limit."""

    def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        """Run ``argv`` to completion.

        Raises an ``ApplyError`` subclass when the program cannot be started or does not finish
        within ``timeout`` seconds (see ``reconciler.apply.errors``).
        """
        ...


class HostedVGPU(NamedTuple):
    """The vGPU a VF hosts, as the host shows it. Compares equal to ``(uuid, type_name)``."""

    uuid: str
    type_name: str


class HostDriver(Protocol):
    """Enable/disable SR-IOV and create/remove vGPUs on one host interface, plus the reads the
    executor needs to re-check preconditions and verify effects.

    Writes raise ``ApplyError`` subclasses with a message fit for an operator. Reads raise
    ``ApplyError`` when the GPU itself is missing or a file cannot be read; VFs, vGPUs and
    types that are simply not there read as ``0``/``[]``/``False``/``None``. Every identifier
    is validated before it reaches a path or a command line.
    """

    @property
    def interface(self) -> str:
        """The host interface this driver speaks (``mdev`` or ``vfio``, as in plans), or
        ``any`` for one that serves each VF through the interface it shows."""
        ...

    # -- writes -----------------------------------------------------------------------------

    def enable_sriov(self, gpu: PciAddress) -> None: ...

    def disable_sriov(self, gpu: PciAddress) -> None: ...

    def create_vgpu(
        self, *, gpu: PciAddress, vf: PciAddress, vf_index: int, type_name: str, uuid: str
    ) -> None:
        """Make a vGPU of ``type_name`` on ``vf``, named ``uuid``: an mdev UUID, or on the
        vfio interface the VF's own address (the VF is the vGPU there)."""
        ...

    def remove_vgpu(self, *, gpu: PciAddress, vf: PciAddress, uuid: str) -> None: ...

    def set_vgpu_mode(self, gpu: PciAddress, mode: VgpuMode) -> None:
        """Put ``gpu`` in vGPU ``mode`` (``nvidia-smi vgpu -i <gpu> -shm 0|1``)."""
        ...

    # -- reads ------------------------------------------------------------------------------

    def num_vfs(self, gpu: PciAddress) -> int:
        """``sriov_numvfs`` of the GPU (0 when SR-IOV is off)."""
        ...

    def vgpu_modes(self) -> ModeReading:
        """Every GPU's vGPU mode where the host tells it (``nvidia-smi -q``); never raises:
        a reading that failed says why."""
        ...

    def pf_driver(self, gpu: PciAddress) -> str:
        """The driver bound to the GPU's PF (``nvidia``; ``vfio-pci`` when it is passed
        through whole), "" when none is."""
        ...

    def vf_addresses(self, gpu: PciAddress) -> list[PciAddress]:
        """The GPU's VFs from its ``virtfn<N>`` links, in numeric ``N`` order (index = position)."""
        ...

    def vgpu_parent_ready(self, vf: PciAddress) -> bool:
        """Whether the VF shows the vGPU interface yet (it appears a moment after the VF).

        Raises ``ApplyError`` when the VF shows another interface, one this driver cannot
        drive: waiting for it would be waiting for ever.
        """
        ...

    def vgpu_on(self, vf: PciAddress) -> HostedVGPU | None:
        """The vGPU the VF hosts, if any."""
        ...

    def vgpu_exists(self, uuid: str) -> PciAddress | None:
        """The VF that hosts the vGPU with this UUID, or ``None`` when no such vGPU exists."""
        ...

    def removal_pending(self, vf: PciAddress) -> str | None:
        """The vGPU on the VF whose removal is under way (the kernel waits for whatever holds
        it to let go), if any: nothing may be done on that VF until it is gone."""
        ...
