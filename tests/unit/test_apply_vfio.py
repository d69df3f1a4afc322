"""VfioDriver and PerVfDriver against the simulator's kernel on NVIDIA's vendor-specific VFIO
interface (docs/domain.md §3b): ids written by name, names read back, errnos explained, the VF
as the vGPU's identity, each VF handed to the driver of the interface it shows.

Expected values come from the files themselves (a VF's list read with the test's own parser)
and from §3b, never from the driver's reads.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from reconciler.apply import (
    ConfinedSysfsWriter,
    DeviceBusyError,
    DriverRefusedError,
    HostChangedError,
    HostDriver,
    HostedVGPU,
    MdevDriver,
    PerVfDriver,
    SubprocessRunner,
    SysfsDevice,
    VfioDriver,
)
from reconciler.apply.sysfs import SysfsReader
from reconciler.model import ApplyError, PciAddress
from reconciler.sim import SimHost, build_host
from reconciler.sim.host import hold

GPU = PciAddress.parse("0000:08:00.0")
VF0 = PciAddress.parse("0000:08:00.4")
VF1 = PciAddress.parse("0000:08:00.5")
VF2 = PciAddress.parse("0000:08:00.6")


def a2(tmp_path: Path, interface: str = "vfio", vgpus: dict[int, str] | None = None) -> SimHost:
    gpu: dict[str, object] = {"model": "A2", "address": str(GPU), "sriov": "enabled"}
    if vgpus:
        gpu["vgpus"] = vgpus
    spec = {"gpus": [gpu], "interface": interface, "extraDevices": False}
    return build_host(tmp_path / interface, spec)


def files(sim: SimHost, vf: PciAddress) -> Path:
    return sim.sysfs_root / "bus" / "pci" / "devices" / str(vf) / "nvidia"


def listed(sim: SimHost, vf: PciAddress) -> dict[str, str]:
    """name → id, as the VF's creatable_vgpu_types lists them now."""
    lines = (files(sim, vf) / "creatable_vgpu_types").read_text().splitlines()
    return {n.strip(): i.strip() for i, n in (line.split(":", 1) for line in lines[1:])}


def current(sim: SimHost, vf: PciAddress) -> str:
    return (files(sim, vf) / "current_vgpu_type").read_text().strip()


def vfio_driver(sim: SimHost, **kw: object) -> VfioDriver:
    kw.setdefault("writer", ConfinedSysfsWriter(sim.sysfs_root, kernel=sim.writer()))
    return VfioDriver(
        sysfs_root=sim.sysfs_root,
        runner=SubprocessRunner(),
        sriov_manage=[str(sim.sysfs_root.parent / "bin" / "sriov-manage")],
        command_timeout=60,
        **kw,  # type: ignore[arg-type]
    )


def test_the_vfio_driver_is_a_host_driver(tmp_path: Path) -> None:
    driver: HostDriver = vfio_driver(a2(tmp_path))
    assert driver.interface == "vfio"


def test_configure_writes_the_id_the_vf_lists_for_the_name(tmp_path: Path) -> None:
    sim = a2(tmp_path)
    want = listed(sim, VF0)["NVIDIA A2-4Q"]
    driver = vfio_driver(sim)
    assert driver.vgpu_on(VF0) is None
    driver.create_vgpu(gpu=GPU, vf=VF0, vf_index=0, type_name="NVIDIA A2-4Q", uuid=str(VF0))
    assert current(sim, VF0) == want
    assert current(sim, VF1) == "0"
    assert driver.vgpu_on(VF0) == HostedVGPU(str(VF0), "NVIDIA A2-4Q")
    assert driver.vgpu_exists(str(VF0)) == VF0
    assert driver.vgpu_exists(str(VF1)) is None
    assert driver.removal_pending(VF0) is None


def test_remove_writes_0(tmp_path: Path) -> None:
    sim = a2(tmp_path, vgpus={0: "NVIDIA A2-4Q"})
    driver = vfio_driver(sim)
    driver.remove_vgpu(gpu=GPU, vf=VF0, uuid=str(VF0))
    assert current(sim, VF0) == "0"
    assert driver.vgpu_on(VF0) is None
    assert "NVIDIA A2-16Q" in listed(sim, VF0)  # every size creatable again


def test_a_change_is_0_then_the_new_id(tmp_path: Path) -> None:
    sim = a2(tmp_path, vgpus={0: "NVIDIA A2-4Q"})
    driver = vfio_driver(sim)
    with pytest.raises(HostChangedError, match="already has vGPU type"):
        # An id over an id is refused by the driver (EPERM): the driver checks first.
        driver.create_vgpu(gpu=GPU, vf=VF0, vf_index=0, type_name="NVIDIA A2-4A", uuid=str(VF0))
    driver.remove_vgpu(gpu=GPU, vf=VF0, uuid=str(VF0))
    eight_a = listed(sim, VF0)["NVIDIA A2-4A"]
    driver.create_vgpu(gpu=GPU, vf=VF0, vf_index=0, type_name="NVIDIA A2-4A", uuid=str(VF0))
    assert current(sim, VF0) == eight_a


def test_a_type_not_listed_now_is_refused_naming_what_the_vf_lists(tmp_path: Path) -> None:
    sim = a2(tmp_path, vgpus={0: "NVIDIA A2-4Q"})
    driver = vfio_driver(sim)
    with pytest.raises(DriverRefusedError) as e:
        driver.create_vgpu(gpu=GPU, vf=VF1, vf_index=1, type_name="NVIDIA A2-2Q", uuid=str(VF1))
    assert "NVIDIA A2-2Q is not creatable on 0000:08:00.5 now" in e.value.message
    assert "NVIDIA A2-4Q" in e.value.message  # 4 GB types are what the VF lists
    assert current(sim, VF1) == "0"


@pytest.mark.parametrize("name", ["2b1c6e1a-8d3f-5b7e-9a40-1c2d3e4f5a6b", "0000:08:00.5", ""])
def test_the_vgpu_on_a_vf_is_named_by_that_vf_only(tmp_path: Path, name: str) -> None:
    sim = a2(tmp_path)
    driver = vfio_driver(sim)
    with pytest.raises(ApplyError, match="identity is the VF address"):
        driver.create_vgpu(gpu=GPU, vf=VF0, vf_index=0, type_name="NVIDIA A2-4Q", uuid=name)
    with pytest.raises(ApplyError, match="identity is the VF address"):
        driver.remove_vgpu(gpu=GPU, vf=VF0, uuid=name)
    assert current(sim, VF0) == "0"


def test_clearing_a_vf_a_vm_holds_is_busy(tmp_path: Path) -> None:
    sim = a2(tmp_path, vgpus={0: "NVIDIA A2-4Q"})
    hold(sim.sysfs_root.parent, str(VF0))
    with pytest.raises(DeviceBusyError, match="in use"):
        vfio_driver(sim).remove_vgpu(gpu=GPU, vf=VF0, uuid=str(VF0))
    assert current(sim, VF0) != "0"


class Refusing:
    """A writer whose every write fails with one errno, as a driver's store would."""

    def __init__(self, code: int) -> None:
        self.code = code

    def write(self, path: str, value: str, *, device: SysfsDevice) -> None:
        raise OSError(self.code, errno.errorcode[self.code], path)


@pytest.mark.parametrize(
    ("code", "error", "words"),
    [
        (errno.EPERM, HostChangedError, "already has a vGPU type"),
        (errno.EINVAL, DriverRefusedError, "not creatable there now"),
        (errno.EBUSY, DeviceBusyError, "busy"),
        (errno.EIO, DriverRefusedError, "see the kernel log"),
        (errno.EACCES, DriverRefusedError, "must run as root"),
    ],
)
def test_configure_errnos_are_explained(
    tmp_path: Path, code: int, error: type[ApplyError], words: str
) -> None:
    sim = a2(tmp_path)
    driver = vfio_driver(sim, writer=Refusing(code))
    with pytest.raises(error, match=words):
        driver.create_vgpu(gpu=GPU, vf=VF0, vf_index=0, type_name="NVIDIA A2-4Q", uuid=str(VF0))


def test_a_type_in_use_no_list_names_is_named_by_what_vgpuctl_knows(tmp_path: Path) -> None:
    """At a profile's maximum every list is a header only (one A2-16Q per GPU)."""
    sim = a2(tmp_path)
    sixteen_q = listed(sim, VF0)["NVIDIA A2-16Q"]
    configured: list[tuple[PciAddress, str, str]] = []
    driver = vfio_driver(sim, on_configured=lambda *a: configured.append(a))
    driver.create_vgpu(gpu=GPU, vf=VF0, vf_index=0, type_name="NVIDIA A2-16Q", uuid=str(VF0))
    assert configured == [(GPU, sixteen_q, "NVIDIA A2-16Q")]
    assert all(listed(sim, vf) == {} for vf in (VF0, VF1, VF2))
    # The driver that wrote it remembers; another knows it only from the record.
    assert driver.vgpu_on(VF0) == HostedVGPU(str(VF0), "NVIDIA A2-16Q")
    assert vfio_driver(sim).vgpu_on(VF0) == HostedVGPU(str(VF0), f"type {sixteen_q}")
    recorded = vfio_driver(sim, known_types={(GPU, sixteen_q): "NVIDIA A2-16Q"})
    assert recorded.vgpu_on(VF0) == HostedVGPU(str(VF0), "NVIDIA A2-16Q")


def test_a_type_nothing_else_names_is_asked_of_the_driver_once(tmp_path: Path) -> None:
    """The simulator made the A2-16Q (no record, no list names it): the host driver asks
    nvidia-smi (``vgpu -s -v -i``) once for the GPU, and only then."""
    from reconciler.sim.state import load_state

    sim = a2(tmp_path, vgpus={0: "NVIDIA A2-16Q"})
    assert all(listed(sim, vf) == {} for vf in (VF0, VF1, VF2))
    smi = [str(sim.sysfs_root.parent / "bin" / "nvidia-smi")]
    driver = vfio_driver(sim, nvidia_smi=smi)
    assert driver.vgpu_on(VF0) == HostedVGPU(str(VF0), "NVIDIA A2-16Q")
    assert driver.vgpu_on(VF0) == HostedVGPU(str(VF0), "NVIDIA A2-16Q")
    assert load_state(sim.sysfs_root).counters["nvidiaSmiTypeQueries"] == 1
    # An answer not in the expected shape (a decimal id) is not believed: the id stays unnamed.
    sixteen_q = current(sim, VF0)
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\necho 'GPU 00000000:08:00.0'\n"
        f"echo '    vGPU Type ID : {sixteen_q}'\necho '        Name : NVIDIA A2-16Q'\n"
    )
    fake.chmod(0o755)
    muddled = vfio_driver(sim, nvidia_smi=[str(fake)])
    assert muddled.vgpu_on(VF0) == HostedVGPU(str(VF0), f"type {sixteen_q}")


def test_every_listed_type_is_remembered_before_the_first_write(tmp_path: Path) -> None:
    """Before it writes an id on a GPU, the driver hands every id → name any of the GPU's VFs
    lists (not only the one it writes) to ``on_seen``: a crash right after the write leaves
    none unnamed. Once per GPU."""
    sim = a2(tmp_path)
    everything = listed(sim, VF0)
    seen: list[tuple[PciAddress, dict[str, str], str]] = []
    driver = vfio_driver(
        sim, on_seen=lambda gpu, names: seen.append((gpu, dict(names), current(sim, VF0)))
    )
    driver.create_vgpu(gpu=GPU, vf=VF0, vf_index=0, type_name="NVIDIA A2-16Q", uuid=str(VF0))
    assert seen == [(GPU, {i: n for n, i in everything.items()}, "0")]  # VF 0 still empty
    driver.remove_vgpu(gpu=GPU, vf=VF0, uuid=str(VF0))
    driver.create_vgpu(gpu=GPU, vf=VF1, vf_index=1, type_name="NVIDIA A2-4Q", uuid=str(VF1))
    assert len(seen) == 1


def test_a_vf_of_the_other_interface_is_not_ready_for_this_driver(tmp_path: Path) -> None:
    mdev = a2(tmp_path, interface="mdev")
    with pytest.raises(DriverRefusedError, match="is an mdev parent"):
        vfio_driver(mdev).vgpu_parent_ready(VF0)
    assert vfio_driver(a2(tmp_path)).vgpu_parent_ready(VF0) is True


# -- PerVfDriver ---------------------------------------------------------------------------------


def per_vf(sim: SimHost) -> PerVfDriver:
    writer = ConfinedSysfsWriter(sim.sysfs_root, kernel=sim.writer())
    argv = [str(sim.sysfs_root.parent / "bin" / "sriov-manage")]
    runner = SubprocessRunner()
    return PerVfDriver(
        mdev=MdevDriver(sysfs_root=sim.sysfs_root, writer=writer, runner=runner, sriov_manage=argv),
        vfio=VfioDriver(sysfs_root=sim.sysfs_root, writer=writer, runner=runner, sriov_manage=argv),
        reader=SysfsReader(sim.sysfs_root),
    )


def test_each_vf_is_served_by_the_interface_it_shows(tmp_path: Path) -> None:
    mdev_sim, vfio_sim = a2(tmp_path, "mdev"), a2(tmp_path, "vfio")
    uuid = "2b1c6e1a-8d3f-5b7e-9a40-1c2d3e4f5a6b"
    on_mdev, on_vfio = per_vf(mdev_sim), per_vf(vfio_sim)
    on_mdev.create_vgpu(gpu=GPU, vf=VF0, vf_index=0, type_name="NVIDIA A2-4Q", uuid=uuid)
    on_vfio.create_vgpu(gpu=GPU, vf=VF0, vf_index=0, type_name="NVIDIA A2-4Q", uuid=str(VF0))
    assert (mdev_sim.sysfs_root / "bus" / "mdev" / "devices" / uuid).is_symlink()
    assert current(vfio_sim, VF0) != "0"
    assert on_mdev.vgpu_on(VF0) == HostedVGPU(uuid, "NVIDIA A2-4Q")
    assert on_vfio.vgpu_on(VF0) == HostedVGPU(str(VF0), "NVIDIA A2-4Q")
    assert on_mdev.vgpu_exists(uuid) == VF0
    assert on_vfio.vgpu_exists(str(VF0)) == VF0


def test_a_plan_made_for_one_interface_is_not_run_on_the_other(tmp_path: Path) -> None:
    mdev_sim, vfio_sim = a2(tmp_path, "mdev"), a2(tmp_path, "vfio")
    uuid = "2b1c6e1a-8d3f-5b7e-9a40-1c2d3e4f5a6b"
    with pytest.raises(HostChangedError, match="shows NVIDIA's vfio interface, but the plan"):
        per_vf(vfio_sim).create_vgpu(
            gpu=GPU, vf=VF0, vf_index=0, type_name="NVIDIA A2-4Q", uuid=uuid
        )
    with pytest.raises(HostChangedError, match="shows NVIDIA's mdev interface, but the plan"):
        per_vf(mdev_sim).create_vgpu(
            gpu=GPU, vf=VF0, vf_index=0, type_name="NVIDIA A2-4Q", uuid=str(VF0)
        )
    assert current(vfio_sim, VF0) == "0"
    assert list((mdev_sim.sysfs_root / "bus" / "mdev" / "devices").iterdir()) == []
