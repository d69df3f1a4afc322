"""A tiny fake kernel for the apply tests (the simulator is a separate layer, not used here).

:class:`FakeKernel` builds a one-GPU sysfs tree under a temporary directory in the layout the
real kernel shows (docs: notes/contracts.md) and reacts to writes the way the mdev core does;
:class:`FakeSriovManage` is a :class:`CommandRunner` standing in for ``sriov-manage``. Shared by
``test_apply_mdev.py`` and ``test_apply_executor.py``; this module holds no tests itself.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from reconciler.apply import CommandResult, SysfsDevice
from reconciler.model import PciAddress

GPU = PciAddress.parse("0000:08:00.0")
UUID_A = "2b1c6e1a-8d3f-5b7e-9a40-1c2d3e4f5a6b"
UUID_B = "7d0f4f2e-1c3b-5a49-8e21-0a9b8c7d6e5f"
UUID_C = "c3a5e7f9-0b1d-5f3a-8c6e-2d4f6a8b0c1e"

#: Type directory → name. The ids are deliberately not in name order: drivers resolve by name.
A2_TYPES = {
    "nvidia-742": "NVIDIA A2-4A",
    "nvidia-745": "NVIDIA A2-4Q",
    "nvidia-810": "NVIDIA A2-2Q",
}

_CREATE = re.compile(r"^bus/pci/devices/([^/]+)/mdev_supported_types/([^/]+)/create$")
_REMOVE = re.compile(r"^bus/mdev/devices/([^/]+)/remove$")


def vf_address(index: int, *, first_function: int = 4) -> PciAddress:
    """Where VF ``index`` appears when VF0 is function ``first_function`` (A2: 4; others: 2)."""
    return PciAddress.from_routing_id(GPU.domain, GPU.routing_id + first_function + index)


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent))


class FakeKernel:
    """One NVIDIA GPU at ``0000:08:00.0`` under ``<dir>/sys``; VFs and mdevs made on demand."""

    def __init__(
        self,
        directory: Path,
        *,
        total_vfs: int = 4,
        first_function: int = 4,
        types: dict[str, str] | None = None,
        mdev_parents: bool = True,
    ) -> None:
        self.root = directory / "sys"
        self.total_vfs = total_vfs
        self.first_function = first_function
        self.types = dict(A2_TYPES if types is None else types)
        #: Whether enabled VFs show ``mdev_supported_types`` at once (False: call register()).
        self.mdev_parents = mdev_parents
        self.held: set[str] = set()
        #: path → errno: the next write to that path fails with it (once).
        self.fail_next: dict[str, int] = {}
        self.writes: list[tuple[str, str]] = []
        self.bus = self.root / "devices/pci0000:00/0000:00:02.0"
        pf = self.pf_dir
        pf.mkdir(parents=True)
        for name, value in {
            "vendor": "0x10de",
            "device": "0x25b6",
            "class": "0x030200",
            "sriov_totalvfs": str(total_vfs),
            "sriov_numvfs": "0",
        }.items():
            (pf / name).write_text(value + "\n")
        _link(self.root / f"bus/pci/devices/{GPU}", pf)
        (self.root / "bus/pci/drivers/nvidia").mkdir(parents=True)
        _link(pf / "driver", self.root / "bus/pci/drivers/nvidia")
        (self.root / "bus/mdev/devices").mkdir(parents=True)

    @property
    def pf_dir(self) -> Path:
        return self.bus / str(GPU)

    def vf(self, index: int) -> PciAddress:
        return vf_address(index, first_function=self.first_function)

    def vf_dir(self, vf: PciAddress) -> Path:
        return self.bus / str(vf)

    # -- what sriov-manage does --------------------------------------------------------------

    def enable(self) -> None:
        if self.num_vfs():
            return  # sriov-manage -e leaves a GPU with VFs alone
        (self.pf_dir / "sriov_numvfs").write_text(f"{self.total_vfs}\n")
        for i in range(self.total_vfs):
            vf = self.vf(i)
            d = self.vf_dir(vf)
            d.mkdir()
            _link(d / "physfn", self.pf_dir)
            _link(self.pf_dir / f"virtfn{i}", d)
            _link(self.root / f"bus/pci/devices/{vf}", d)
            if self.mdev_parents:
                self.register(vf)

    def register(self, vf: PciAddress) -> None:
        """The vGPU manager makes the VF an mdev parent."""
        for type_dir, name in self.types.items():
            t = self.vf_dir(vf) / "mdev_supported_types" / type_dir
            (t / "devices").mkdir(parents=True)
            (t / "name").write_text(name + "\n")
            (t / "available_instances").write_text("1\n")
            (t / "create").write_text("")

    def disable(self) -> None:
        for i in range(self.num_vfs()):
            vf = self.vf(i)
            for uuid in list(self.mdevs_on(vf)):
                (self.root / f"bus/mdev/devices/{uuid}").unlink()
            shutil.rmtree(self.vf_dir(vf))
            (self.pf_dir / f"virtfn{i}").unlink()
            (self.root / f"bus/pci/devices/{vf}").unlink()
        (self.pf_dir / "sriov_numvfs").write_text("0\n")

    def num_vfs(self) -> int:
        return int((self.pf_dir / "sriov_numvfs").read_text())

    # -- what the mdev core does on writes --------------------------------------------------

    def write(self, path: str, value: str) -> None:
        self.writes.append((path, value))
        full = self.root / path
        if not full.is_file():
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(full))
        if path in self.fail_next:
            code = self.fail_next.pop(path)
            raise OSError(code, os.strerror(code), str(full))
        if m := _CREATE.match(path):
            self._create(PciAddress.parse(m[1]), m[2], value.strip())
        elif m := _REMOVE.match(path):
            self._remove(m[1])
        else:
            full.write_text(value)

    def _create(self, vf: PciAddress, type_dir: str, uuid: str) -> None:
        types = self.vf_dir(vf) / "mdev_supported_types"
        if int((types / type_dir / "available_instances").read_text()) == 0:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        if (self.root / f"bus/mdev/devices/{uuid}").exists():
            raise OSError(errno.EEXIST, os.strerror(errno.EEXIST))
        self.make_mdev(vf, type_dir, uuid)

    def make_mdev(self, vf: PciAddress, type_dir: str, uuid: str) -> None:
        """An mdev as the kernel shows it (also used to set up 'already there' states)."""
        d = self.vf_dir(vf) / uuid
        d.mkdir()
        _link(d / "mdev_type", self.vf_dir(vf) / "mdev_supported_types" / type_dir)
        (d / "remove").write_text("")
        _link(self.root / f"bus/mdev/devices/{uuid}", d)
        for t in (self.vf_dir(vf) / "mdev_supported_types").iterdir():
            (t / "available_instances").write_text("0\n")  # one vGPU per VF

    def _remove(self, uuid: str) -> None:
        if uuid in self.held:
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY))
        link = self.root / f"bus/mdev/devices/{uuid}"
        d = link.resolve()
        link.unlink()
        shutil.rmtree(d)
        for t in (d.parent / "mdev_supported_types").iterdir():
            (t / "available_instances").write_text("1\n")

    def mdevs_on(self, vf: PciAddress) -> list[str]:
        d = self.vf_dir(vf)
        return sorted(p.name for p in d.iterdir() if (p / "mdev_type").exists())


@dataclass
class FakeWriter:
    """A SysfsWriter whose writes the fake kernel reacts to."""

    kernel: FakeKernel
    #: The device each write named, in order.
    devices: list[SysfsDevice] = field(default_factory=list)

    def write(self, path: str, value: str, *, device: SysfsDevice) -> None:
        self.devices.append(device)
        self.kernel.write(path, value)


@dataclass
class FakeSriovManage:
    """A CommandRunner playing ``sriov-manage``; ``behaviour`` picks how it (mis)behaves.

    ``works``: does the job; ``silent``: exits 0 having done nothing (old drivers,
    docs/domain.md §2); ``fails``: exits 1 with a message on stderr; ``later``: exits 0, the
    VFs appear on a later :meth:`tick` (slow VF creation).
    """

    kernel: FakeKernel
    behaviour: str = "works"
    calls: list[tuple[list[str], float]] = field(default_factory=list)
    _pending: Callable[[], None] | None = None
    _ticks_left: int = 0

    def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        self.calls.append((list(argv), timeout))
        flag, address = argv[-2], argv[-1]
        assert address == str(GPU)
        action = self.kernel.enable if flag == "-e" else self.kernel.disable
        if self.behaviour == "fails":
            return CommandResult(1, "", f"Enabling VFs on {address}\nError: GPU is in use\n")
        if self.behaviour == "works":
            action()
        elif self.behaviour == "later":
            self._pending, self._ticks_left = action, 3
        return CommandResult(0, "", "")

    def tick(self) -> None:
        """Time passes (the executor sleeps): a pending slow enable finishes after a few."""
        if self._pending is not None:
            self._ticks_left -= 1
            if self._ticks_left <= 0:
                self._pending()
                self._pending = None


class FakeTime:
    """An injectable clock: ``sleep`` advances it and lets the fake host progress."""

    def __init__(self, on_sleep: Callable[[], None] | None = None) -> None:
        self.now = 1000.0
        self.sleeps = 0
        self._on_sleep = on_sleep

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps += 1
        self.now += max(seconds, 0.001)
        if self._on_sleep is not None:
            self._on_sleep()
