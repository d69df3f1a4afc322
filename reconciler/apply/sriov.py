"""What every NVIDIA host driver shares, whichever interface makes its vGPUs: SR-IOV through
``sriov-manage`` (docs/domain.md §2), a GPU's vGPU mode through ``nvidia-smi`` (§4), and the
reads of a GPU's PF and VFs (§1).

:class:`~reconciler.apply.mdev.MdevDriver` and :class:`~reconciler.apply.vfio.VfioDriver` add
the vGPU half. Writes go through a :class:`~reconciler.apply.ports.SysfsWriter` (the confined
real writer, or the simulator's kernel emulation) and commands through a
:class:`~reconciler.apply.ports.CommandRunner`; reads are plain file reads under the same root.
Kernel errnos become messages an operator can act on.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType

from reconciler.apply.errors import (
    CommandFailedError,
    CommandNotExecutableError,
    CommandNotFoundError,
    DriverRefusedError,
)
from reconciler.apply.ports import CommandRunner, SysfsWriter
from reconciler.apply.sysfs import SysfsReader
from reconciler.model import ApplyError, PciAddress, VgpuMode
from reconciler.model.errors import excerpt
from reconciler.observe.vgpumode import ModeReading, parse_vgpu_modes
from reconciler.observe.vgputypes import (
    SupportedTypes,
    parse_supported_types,
    supported_types_argv,
)

#: ``--nvidia-smi``'s default: where NVIDIA's host driver package installs it.
DEFAULT_NVIDIA_SMI = "/usr/bin/nvidia-smi"
#: How long ``nvidia-smi -q`` may take (it reads every GPU; seconds on a large host).
DEFAULT_QUERY_TIMEOUT = 60.0
#: ``-shm``'s value for each mode a GPU is put in.
_SHM = {VgpuMode.EQUAL_SIZE: "0", VgpuMode.MIXED_SIZE: "1"}
_VIRTFN = re.compile(r"^virtfn(\d+)$")
#: How many trailing lines of a failed command's output go into the message.
_OUTPUT_LINES = 5


class SriovHost:
    """SR-IOV and the PF/VF reads of :class:`~reconciler.apply.ports.HostDriver`."""

    def __init__(
        self,
        *,
        sysfs_root: Path,
        writer: SysfsWriter,
        runner: CommandRunner,
        sriov_manage: Sequence[str],
        command_timeout: float = 300.0,
        nvidia_smi: Sequence[str] = (DEFAULT_NVIDIA_SMI,),
        query_timeout: float = DEFAULT_QUERY_TIMEOUT,
    ) -> None:
        for name, argv in (("sriov_manage", sriov_manage), ("nvidia_smi", nvidia_smi)):
            if isinstance(argv, str) or not argv:
                raise ValueError(f"{name} must be a non-empty argv prefix (a list), not a string")
        self._read = SysfsReader(sysfs_root)
        self._writer = writer
        self._runner = runner
        self._sriov_manage = tuple(str(a) for a in sriov_manage)
        self._command_timeout = command_timeout
        self._nvidia_smi = tuple(str(a) for a in nvidia_smi)
        self._query_timeout = query_timeout

    # -- SR-IOV -----------------------------------------------------------------------------

    def enable_sriov(self, gpu: PciAddress) -> None:
        self._run_sriov_manage("-e", gpu)

    def disable_sriov(self, gpu: PciAddress) -> None:
        self._run_sriov_manage("-d", gpu)

    def _run_sriov_manage(self, flag: str, gpu: PciAddress) -> None:
        self._run(self._sriov_manage, (flag, str(gpu)), option="--sriov-manage")

    def _run(self, program: tuple[str, ...], args: tuple[str, ...], *, option: str) -> None:
        """Run ``program`` (an argv prefix) with ``args``, bounded in time; a program that
        cannot be run names ``option``, a non-zero exit the command and its last output."""
        what = " ".join((os.path.basename(program[-1]), *args))
        try:
            result = self._runner.run([*program, *args], timeout=self._command_timeout)
        except (CommandNotFoundError, CommandNotExecutableError) as e:
            raise type(e)(f"{e.message}: set {option}") from e
        if result.returncode != 0:
            raise CommandFailedError(
                f"{what} failed (exit {result.returncode}): "
                f"{tail(result.stderr) or tail(result.stdout) or 'no output'}"
            )

    # -- the vGPU mode (nvidia-smi) ----------------------------------------------------------

    def set_vgpu_mode(self, gpu: PciAddress, mode: VgpuMode) -> None:
        """``nvidia-smi vgpu -i <gpu> -shm 1`` (mixed-size) or ``-shm 0`` (equal-size)."""
        flag = _SHM.get(mode)
        if flag is None:
            raise ValueError(f"{mode} is not a mode a GPU is put in")
        self._run(self._nvidia_smi, ("vgpu", "-i", str(gpu), "-shm", flag), option="--nvidia-smi")

    def vgpu_modes(self) -> ModeReading:
        return read_vgpu_modes(self._runner, self._nvidia_smi, timeout=self._query_timeout)

    def supported_types(self, gpu: PciAddress) -> SupportedTypes:
        """The driver's names of ``gpu``'s vGPU type ids (``observe/vgputypes.py``)."""
        return read_supported_types(
            self._runner, self._nvidia_smi, gpu, timeout=self._query_timeout
        )

    def _write_failed(self, e: OSError, what: str) -> ApplyError:
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return DriverRefusedError(
                f"cannot {what}: {errno_text(e)} writing {e.filename or 'sysfs'} "
                "(apply must run as root on the host)"
            )
        if e.errno == errno.EIO:
            return DriverRefusedError(
                f"the driver failed to {what} (I/O error): see the kernel log (dmesg) "
                "and the nvidia-vgpu-mgr service",
                transient=True,
            )
        return DriverRefusedError(
            f"the driver refused to {what}: {errno_text(e)}",
            transient=e.errno in (errno.ENOMEM, errno.EAGAIN),
        )

    # -- reads ---------------------------------------------------------------------------

    def num_vfs(self, gpu: PciAddress) -> int:
        pf = f"bus/pci/devices/{gpu}"
        if not self._read.exists(pf):
            self._read.check_root()
            raise ApplyError(f"no PCI device {gpu} under {self._read.path('bus/pci/devices')}")
        if not self._read.exists(f"{pf}/sriov_numvfs"):
            raise ApplyError(f"{gpu} has no sriov_numvfs: it is not an SR-IOV device")
        return self._read.integer(f"{pf}/sriov_numvfs")

    def pf_driver(self, gpu: PciAddress) -> str:
        link = f"bus/pci/devices/{gpu}/driver"
        if not self._read.exists(link):
            self._read.check_root()
            return ""
        return self._read.link_name(link)

    def vf_addresses(self, gpu: PciAddress) -> list[PciAddress]:
        pf = f"bus/pci/devices/{gpu}"
        # Sort by the number, not the name: a glob order puts virtfn10 before virtfn2.
        links = sorted(
            (int(m[1]), name) for name in self._read.entries(pf) if (m := _VIRTFN.match(name))
        )
        out = []
        for _, name in links:
            target = self._read.link_name(f"{pf}/{name}")
            try:
                out.append(PciAddress.parse(target))
            except ValueError:
                raise ApplyError(
                    f"{gpu}/{name} points to '{excerpt(target)}', not a PCI address"
                ) from None
        return out


def read_vgpu_modes(
    runner: CommandRunner, nvidia_smi: Sequence[str], *, timeout: float = DEFAULT_QUERY_TIMEOUT
) -> ModeReading:
    """Every GPU's vGPU mode as ``nvidia-smi -q`` tells it (one call, bounded in time); a call
    that cannot run or fails tells nothing, and says why."""
    argv = [*nvidia_smi, "-q"]
    try:
        result = runner.run(argv, timeout=timeout)
    except ApplyError as e:
        return ModeReading(problem=e.message)
    if result.returncode != 0:
        output = tail(result.stderr) or tail(result.stdout) or "no output"
        return ModeReading(problem=f"exit {result.returncode}: {output}")
    return ModeReading(MappingProxyType(parse_vgpu_modes(result.stdout)))


def read_supported_types(
    runner: CommandRunner,
    nvidia_smi: Sequence[str],
    gpu: PciAddress,
    *,
    timeout: float = DEFAULT_QUERY_TIMEOUT,
) -> SupportedTypes:
    """``gpu``'s supported vGPU types as ``nvidia-smi vgpu -s -v -i <gpu>`` names them (one
    call, bounded in time as the mode read is, its output in size by the parser); a call that
    cannot run or fails tells nothing, and says why."""
    args = supported_types_argv(gpu)
    what = " ".join(("nvidia-smi", *args))
    try:
        result = runner.run([*nvidia_smi, *args], timeout=timeout)
    except ApplyError as e:  # not found, not executable, timed out
        return SupportedTypes(problem=f"{what}: {e.message}", ran=False)
    if result.returncode != 0:
        output = tail(result.stderr) or tail(result.stdout) or "no output"
        return SupportedTypes(problem=f"{what}: exit {result.returncode}: {excerpt(output, 200)}")
    return parse_supported_types(result.stdout, gpu)


def errno_text(e: OSError) -> str:
    name = errno.errorcode.get(e.errno or 0, str(e.errno))
    return f"{e.strerror or name} ({name})"


def tail(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return "; ".join(lines[-_OUTPUT_LINES:])
