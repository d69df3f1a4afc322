"""The simulated kernel's answer to sysfs writes: effects, equal-size rule, errnos, confinement."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from reconciler.sim import SimHoldProbe, SimHost, fail, hold, init_host, reboot, release
from tests.holds import asked

PF = "0000:08:00.0"
VF0, VF1, VF2, VF3, VF4 = (
    "0000:08:00.4",
    "0000:08:00.5",
    "0000:08:00.6",
    "0000:08:00.7",
    "0000:08:01.0",
)
U0 = "00000000-0000-4000-8000-000000000000"
U1 = "11111111-1111-4111-8111-111111111111"
U2 = "22222222-2222-4222-8222-222222222222"
U3 = "33333333-3333-4333-8333-333333333333"
U4 = "44444444-4444-4444-8444-444444444444"


@pytest.fixture
def a2(tmp_path: Path) -> SimHost:
    host = init_host(tmp_path, [f"A2@{PF}"])
    subprocess.run([str(host.sriov_manage), "-e", PF], check=True, capture_output=True)
    return host


def vf_dir(host: SimHost, vf: str) -> Path:
    return host.sysfs_root / "bus/pci/devices" / vf


def type_ids(host: SimHost, vf: str = VF0) -> dict[str, str]:
    """Type name → ``nvidia-<id>`` dir, read the way an observer must (by name)."""
    types = vf_dir(host, vf) / "mdev_supported_types"
    return {(d / "name").read_text().strip(): d.name for d in types.iterdir()}


def create_path(host: SimHost, vf: str, type_name: str) -> str:
    return f"bus/pci/devices/{vf}/mdev_supported_types/{type_ids(host, vf)[type_name]}/create"


def available(host: SimHost, vf: str) -> set[str]:
    types = vf_dir(host, vf) / "mdev_supported_types"
    return {
        (d / "name").read_text().strip()
        for d in types.iterdir()
        if (d / "available_instances").read_text() == "1\n"
    }


def create(host: SimHost, vf: str, type_name: str, uuid: str) -> None:
    host.writer().write(create_path(host, vf, type_name), uuid + "\n")


def errno_of(host: SimHost, path: str, value: str) -> int | None:
    with pytest.raises(OSError) as info:
        host.writer().write(path, value)
    return info.value.errno


FOUR_GB = {"NVIDIA A2-4Q", "NVIDIA A2-4A", "NVIDIA A2-4C"}


# --- create and remove -------------------------------------------------------------------------


def test_create_makes_the_mdev_and_every_link_to_it(a2: SimHost) -> None:
    create(a2, VF0, "NVIDIA A2-4Q", U0)
    root = a2.sysfs_root
    mdev = vf_dir(a2, VF0) / U0
    assert mdev.is_dir()
    assert not mdev.is_symlink()
    type_dir = type_ids(a2)["NVIDIA A2-4Q"]
    assert os.readlink(mdev / "mdev_type") == f"../mdev_supported_types/{type_dir}"
    assert (mdev / "mdev_type" / "name").read_text() == "NVIDIA A2-4Q\n"
    assert (mdev / "remove").exists()
    assert os.readlink(mdev / "driver") == "../../../../../bus/mdev/drivers/nvidia-vgpu-vfio"
    assert (mdev / "nvidia" / "vgpu_params").exists()
    group = os.readlink(mdev / "iommu_group")
    assert group.startswith("../../../../../kernel/iommu_groups/")
    vf_groups = {os.readlink(vf_dir(a2, v) / "iommu_group").rsplit("/", 1)[1] for v in [VF0, VF1]}
    assert group.rsplit("/", 1)[1] not in vf_groups  # a fresh group
    assert (root / "bus/mdev/devices" / U0).resolve() == mdev.resolve()
    assert os.readlink(root / "bus/mdev/devices" / U0).startswith("../../../devices/pci0000:00/")
    type_devices = vf_dir(a2, VF0) / "mdev_supported_types" / type_dir / "devices"
    assert os.readlink(type_devices / U0) == f"../../../{U0}"
    assert (mdev / "iommu_group" / "devices" / U0).resolve() == mdev.resolve()


def test_uuid_is_taken_in_either_case_and_shown_in_lower_case(a2: SimHost) -> None:
    create(a2, VF0, "NVIDIA A2-4Q", U0.upper())
    assert (vf_dir(a2, VF0) / U0).is_dir()
    assert (a2.sysfs_root / "bus/mdev/devices" / U0).exists()


def test_equal_size_narrowing_the_seed_example(a2: SimHost) -> None:
    assert len(available(a2, VF1)) == 15
    create(a2, VF0, "NVIDIA A2-4Q", U0)
    assert available(a2, VF0) == set()  # one vGPU per VF
    assert available(a2, VF1) == FOUR_GB  # only 4 GB types, any series
    create(a2, VF1, "NVIDIA A2-4A", U1)
    create(a2, VF2, "NVIDIA A2-4Q", U2)
    assert available(a2, VF3) == FOUR_GB
    create(a2, VF3, "NVIDIA A2-4C", U3)
    # 4 vGPUs of 4 GB fill the 16 GB GPU: nothing more on any VF.
    for vf in (VF0, VF4, "0000:08:02.3"):
        assert available(a2, vf) == set()
    assert errno_of(a2, create_path(a2, VF4, "NVIDIA A2-4Q"), U4) == errno.EINVAL
    assert not (vf_dir(a2, VF4) / U4).exists()


def test_a_type_of_another_size_is_refused_with_einval(a2: SimHost) -> None:
    create(a2, VF0, "NVIDIA A2-4Q", U0)
    assert errno_of(a2, create_path(a2, VF1, "NVIDIA A2-2Q"), U1) == errno.EINVAL
    assert errno_of(a2, create_path(a2, VF0, "NVIDIA A2-4A"), U1) == errno.EINVAL  # VF taken


def test_removing_the_last_vgpu_reopens_every_type(a2: SimHost) -> None:
    create(a2, VF0, "NVIDIA A2-4Q", U0)
    create(a2, VF1, "NVIDIA A2-4Q", U1)
    group = os.readlink(vf_dir(a2, VF0) / U0 / "iommu_group").rsplit("/", 1)[1]
    a2.writer().write(f"bus/mdev/devices/{U0}/remove", "1\n")
    root = a2.sysfs_root
    assert not (vf_dir(a2, VF0) / U0).exists()
    assert not os.path.lexists(root / "bus/mdev/devices" / U0)
    assert not os.path.lexists(root / "bus/mdev/drivers/nvidia-vgpu-vfio" / U0)
    type_dir = vf_dir(a2, VF0) / "mdev_supported_types" / type_ids(a2)["NVIDIA A2-4Q"]
    assert list((type_dir / "devices").iterdir()) == []
    assert not (root / "kernel/iommu_groups" / group).exists()
    assert available(a2, VF0) == FOUR_GB  # U1 still holds the size
    a2.writer().write(f"bus/pci/devices/{VF1}/{U1}/remove", "1")
    assert len(available(a2, VF0)) == 15
    assert list((root / "bus/mdev/devices").iterdir()) == []


def test_remove_zero_does_nothing_and_garbage_is_einval(a2: SimHost) -> None:
    create(a2, VF0, "NVIDIA A2-4Q", U0)
    a2.writer().write(f"bus/mdev/devices/{U0}/remove", "0")
    assert (vf_dir(a2, VF0) / U0).is_dir()
    assert errno_of(a2, f"bus/mdev/devices/{U0}/remove", "yes") == errno.EINVAL
    assert (vf_dir(a2, VF0) / U0).is_dir()


@pytest.mark.parametrize(
    "value",
    ["not-a-uuid", "", U0[:-1], U0 + "0", "g" + U0[1:], U0.replace("-", ""), U0 + "\n\n"],
)
def test_malformed_uuid_is_einval(a2: SimHost, value: str) -> None:
    assert errno_of(a2, create_path(a2, VF0, "NVIDIA A2-4Q"), value) == errno.EINVAL
    assert list((a2.sysfs_root / "bus/mdev/devices").iterdir()) == []


def test_a_uuid_in_use_anywhere_is_eexist(a2: SimHost) -> None:
    create(a2, VF0, "NVIDIA A2-4Q", U0)
    assert errno_of(a2, create_path(a2, VF1, "NVIDIA A2-4Q"), U0) == errno.EEXIST
    assert not (vf_dir(a2, VF1) / U0).exists()


def test_removing_a_held_vgpu_blocks_until_it_is_released(a2: SimHost) -> None:
    """As vfio_unregister_group_dev: the write does not fail, it waits for the VM to let go.

    The kernel unlinks the mdev first (bus and type links, its remove file: a second removal
    finds nothing to write), keeps its directory and IOMMU group until the VM lets go, then
    the write returns and the vGPU is gone."""
    create(a2, VF0, "NVIDIA A2-4Q", U0)
    hold(a2.directory, U0)
    writer = threading.Thread(
        target=a2.writer().write, args=(f"bus/mdev/devices/{U0}/remove", "1"), daemon=True
    )
    writer.start()
    mdev = vf_dir(a2, VF0) / U0
    deadline = time.monotonic() + 10
    while (a2.sysfs_root / "bus/mdev/devices" / U0).is_symlink():
        assert time.monotonic() < deadline, "the removal never started"
        time.sleep(0.01)
    writer.join(0.3)
    assert writer.is_alive(), "the write returned while a VM holds the vGPU"
    assert mdev.is_dir()
    assert (mdev / "iommu_group").is_symlink()
    assert not (mdev / "mdev_type").exists()
    assert not (mdev / "remove").exists()
    type_dir = vf_dir(a2, VF0) / "mdev_supported_types" / type_ids(a2)["NVIDIA A2-4Q"]
    assert not list((type_dir / "devices").iterdir())
    assert errno_of(a2, f"bus/mdev/devices/{U0}/remove", "1") == errno.ENOENT
    assert errno_of(a2, f"bus/pci/devices/{VF0}/{U0}/remove", "1") == errno.ENOENT
    assert a2.hold_probe().scan(asked(U0, U1)).held == {U0: "simulated VM"}
    release(a2.directory, U0)
    writer.join(10)
    assert not writer.is_alive()
    assert not mdev.exists()
    assert a2.hold_probe().scan(asked(U0)).held == {}
    assert "NVIDIA A2-2Q" in available(a2, VF1)  # the GPU is empty again: any size fits


def test_a_hidden_holder_is_invisible_to_the_probe_but_not_to_the_kernel(a2: SimHost) -> None:
    create(a2, VF0, "NVIDIA A2-4Q", U0)
    hold(a2.directory, U0, hidden=True)
    assert a2.hold_probe().scan(asked(U0)).held == {}
    writer = threading.Thread(
        target=a2.writer().write, args=(f"bus/mdev/devices/{U0}/remove", "1"), daemon=True
    )
    writer.start()
    writer.join(0.5)
    assert writer.is_alive(), "the kernel does not care whether vgpuctl saw the holder"
    release(a2.directory, U0)
    writer.join(10)
    assert not (vf_dir(a2, VF0) / U0).exists()


def test_the_probe_is_blind_outside_the_namespace_the_host_was_built_in(
    a2: SimHost, tmp_path: Path
) -> None:
    """A /proc of another PID namespace (a fake one here) cannot show the host's VMs."""
    fake_proc = tmp_path / "proc"
    (fake_proc / "self" / "ns").mkdir(parents=True)
    (fake_proc / "self" / "ns" / "pid").write_text("")
    create(a2, VF0, "NVIDIA A2-4Q", U0)
    scan = SimHoldProbe(a2.sysfs_root, proc_root=fake_proc).scan(asked(U0))
    mine = os.stat(fake_proc / "self" / "ns" / "pid").st_ino
    assert scan.blind is not None
    assert f"PID namespace {mine}" in scan.blind
    assert a2.hold_probe().scan(asked(U0)).blind is None  # this test's own /proc: the same


def test_hold_of_an_unknown_vgpu_is_a_clear_error(a2: SimHost) -> None:
    with pytest.raises(ValueError, match="no vGPU"):
        hold(a2.directory, U0)
    with pytest.raises(ValueError, match="no vGPU"):
        release(a2.directory, U0)


def test_vgpu_params_are_settable_until_a_vm_opens_the_vgpu(a2: SimHost) -> None:
    create(a2, VF0, "NVIDIA A2-4Q", U0)
    a2.writer().write(f"bus/mdev/devices/{U0}/nvidia/vgpu_params", "enable_uvm=1")
    params = vf_dir(a2, VF0) / U0 / "nvidia/vgpu_params"
    assert params.read_text() == "enable_uvm=1\n"
    hold(a2.directory, U0)
    assert errno_of(a2, f"bus/mdev/devices/{U0}/nvidia/vgpu_params", "x=1") == errno.EBUSY


# --- refusals -------------------------------------------------------------------------------------


def test_raw_sriov_numvfs_write_is_eperm(a2: SimHost, tmp_path: Path) -> None:
    fresh = init_host(tmp_path / "fresh", ["A2"])
    assert errno_of(fresh, f"bus/pci/devices/{PF}/sriov_numvfs", "16") == errno.EPERM
    assert (fresh.sysfs_root / f"bus/pci/devices/{PF}/sriov_numvfs").read_text() == "0\n"
    assert errno_of(a2, f"bus/pci/devices/{PF}/sriov_numvfs", "0") == errno.EPERM


@pytest.mark.parametrize("name", ["available_instances", "name", "description", "device_api"])
def test_read_only_type_attributes_are_eacces(a2: SimHost, name: str) -> None:
    path = create_path(a2, VF0, "NVIDIA A2-4Q").replace("/create", f"/{name}")
    before = (a2.sysfs_root / path).read_text()
    assert errno_of(a2, path, "5") == errno.EACCES
    assert (a2.sysfs_root / path).read_text() == before


def test_other_read_only_files_are_eacces(a2: SimHost) -> None:
    for path in (f"bus/pci/devices/{PF}/vendor", f"bus/pci/devices/{PF}/sriov_totalvfs"):
        assert errno_of(a2, path, "1") == errno.EACCES


def test_missing_paths_are_enoent_and_directories_eisdir(a2: SimHost) -> None:
    assert errno_of(a2, "bus/pci/devices/0000:09:00.0/remove", "1") == errno.ENOENT
    assert errno_of(a2, f"bus/mdev/devices/{U0}/remove", "1") == errno.ENOENT
    assert errno_of(a2, f"bus/pci/devices/{VF0}/mdev_supported_types", "1") == errno.EISDIR


@pytest.mark.parametrize(
    "path",
    [
        "../../etc/passwd",
        "/etc/passwd",
        f"bus/pci/devices/{VF0}/../../../../../outside",
        ".vgpuctl-sim/state.json",
    ],
)
def test_writes_outside_the_tree_are_refused(a2: SimHost, path: str) -> None:
    with pytest.raises(PermissionError):
        a2.writer().write(path, "1")


def test_a_symlink_escaping_the_tree_is_refused(a2: SimHost, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    (a2.sysfs_root / "bus/pci/devices/evil").symlink_to(victim)
    with pytest.raises(PermissionError):
        a2.writer().write("bus/pci/devices/evil", "1")
    assert victim.read_text() == "untouched\n"


def test_every_write_is_counted_refused_ones_too(a2: SimHost) -> None:
    before = a2.stats()
    assert before == {"writes": 0, "sriovManageCalls": 1, "nvidiaSmiCalls": 0}
    create(a2, VF0, "NVIDIA A2-4Q", U0)
    with pytest.raises(OSError):
        a2.writer().write(f"bus/pci/devices/{PF}/sriov_numvfs", "0")
    assert a2.stats() == {"writes": 2, "sriovManageCalls": 1, "nvidiaSmiCalls": 0}


# --- the vfio interface ---------------------------------------------------------------------------


@pytest.fixture
def a2_vfio(tmp_path: Path) -> SimHost:
    host = init_host(tmp_path, [f"A2@{PF}"], interface="vfio")
    subprocess.run([str(host.sriov_manage), "-e", "ALL"], check=True, capture_output=True)
    return host


def creatable_ids(host: SimHost, vf: str) -> list[str]:
    text = (vf_dir(host, vf) / "nvidia/creatable_vgpu_types").read_text()
    return [line.split(":")[0].strip() for line in text.splitlines()[1:]]


def test_vfio_current_vgpu_type_creates_and_clears(a2_vfio: SimHost) -> None:
    w = a2_vfio.writer()
    current = f"bus/pci/devices/{VF0}/nvidia/current_vgpu_type"
    w.write(current, "746\n")  # NVIDIA A2-4Q
    assert (a2_vfio.sysfs_root / current).read_text() == "746\n"
    assert creatable_ids(a2_vfio, VF0) == []
    assert creatable_ids(a2_vfio, VF1) == ["746", "751", "754"]  # the 4 GB types
    assert a2_vfio.hold_probe().scan(asked(VF0)).held == {}
    hold(a2_vfio.directory, VF0)
    assert a2_vfio.hold_probe().scan(asked(VF0)).held == {VF0: "simulated VM"}
    assert errno_of(a2_vfio, current, "0") == errno.EBUSY
    release(a2_vfio.directory, VF0)
    w.write(current, "0")
    assert (a2_vfio.sysfs_root / current).read_text() == "0\n"
    assert len(creatable_ids(a2_vfio, VF1)) == 15


def test_vfio_refusals(a2_vfio: SimHost) -> None:
    current = f"bus/pci/devices/{VF0}/nvidia/current_vgpu_type"
    assert errno_of(a2_vfio, current, "0") == errno.EPERM  # nothing to clear
    assert errno_of(a2_vfio, current, "four") == errno.EINVAL
    assert errno_of(a2_vfio, current, "9999") == errno.EINVAL
    a2_vfio.writer().write(current, "746")
    assert errno_of(a2_vfio, current, "751") == errno.EPERM  # a change is 0 first
    other = f"bus/pci/devices/{VF1}/nvidia/current_vgpu_type"
    assert errno_of(a2_vfio, other, "745") == errno.EINVAL  # 2 GB next to 4 GB
    types = f"bus/pci/devices/{VF1}/nvidia/creatable_vgpu_types"
    assert errno_of(a2_vfio, types, "745") == errno.EACCES


CONCURRENT_WRITER = """
import sys
from pathlib import Path
from reconciler.sim import SimHost
root, *pairs = sys.argv[1:]
writer = SimHost.open(Path(root)).writer()
for i in range(0, len(pairs), 2):
    writer.write(pairs[i], pairs[i + 1])
"""


def test_concurrent_writers_lose_no_update(a2: SimHost) -> None:
    vfs = sorted(os.listdir(a2.sysfs_root / "class/mdev_bus"))
    jobs = []
    for worker in range(4):
        args: list[str] = []
        for vf in vfs[worker::4]:
            args += [create_path(a2, vf, "NVIDIA A2-1Q"), str(uuid.uuid4())]
        jobs.append(
            subprocess.Popen(
                [sys.executable, "-c", CONCURRENT_WRITER, str(a2.sysfs_root), *args],
                stderr=subprocess.PIPE,
            )
        )
    for job in jobs:
        _, err = job.communicate(timeout=120)
        assert job.returncode == 0, err
    assert len(os.listdir(a2.sysfs_root / "bus/mdev/devices")) == 16
    assert a2.stats()["writes"] == 16
    assert all(available(a2, vf) == set() for vf in vfs)  # 16 × 1 GB: the A2 is full


# --- one host, both interfaces (a GPU each) -------------------------------------------------------

PF2 = "0000:09:00.0"
#: The vfio GPU's first VFs (the A2's sriov_offset 4, stride 1, on bus 09).
W0, W1 = "0000:09:00.4", "0000:09:00.5"


@pytest.fixture
def mixed(tmp_path: Path) -> SimHost:
    host = init_host(tmp_path, [f"A2@{PF}", f"A2@{PF2}:vfio"], extra_devices=False)
    subprocess.run([str(host.sriov_manage), "-e", "ALL"], check=True, capture_output=True)
    return host


def creatable_names(host: SimHost, vf: str) -> set[str]:
    text = (vf_dir(host, vf) / "nvidia/creatable_vgpu_types").read_text()
    return {line.split(":", 1)[1].strip() for line in text.splitlines()[1:]}


def current(vf: str) -> str:
    return f"bus/pci/devices/{vf}/nvidia/current_vgpu_type"


def test_each_gpu_takes_its_vgpus_through_its_own_interface(mixed: SimHost) -> None:
    create(mixed, VF0, "NVIDIA A2-4Q", U0)
    assert os.listdir(mixed.sysfs_root / "bus/mdev/devices") == [U0]
    assert available(mixed, VF1) == FOUR_GB
    # The other GPU has its own framebuffer: every type is still creatable there.
    assert len(creatable_ids(mixed, W1)) == 15
    mixed.writer().write(current(W0), "745\n")  # NVIDIA A2-2Q beside the mdev's 4 GB
    assert (mixed.sysfs_root / current(W0)).read_text() == "745\n"
    assert creatable_names(mixed, W1) == {"NVIDIA A2-2B", "NVIDIA A2-2Q", "NVIDIA A2-2A"}
    assert available(mixed, VF1) == FOUR_GB  # the mdev GPU is untouched
    assert os.listdir(mixed.sysfs_root / "bus/mdev/devices") == [U0]  # no mdev for a VF
    mixed.writer().write(f"bus/mdev/devices/{U0}/remove", "1")
    mixed.writer().write(current(W0), "0")
    assert len(available(mixed, VF1)) == 15
    assert len(creatable_ids(mixed, W1)) == 15


def test_a_vf_refuses_the_other_interfaces_files(mixed: SimHost) -> None:
    root = mixed.sysfs_root
    # Neither GPU shows the other interface's files …
    assert errno_of(mixed, current(VF0), "746") == errno.ENOENT
    mdev_create = f"bus/pci/devices/{W0}/mdev_supported_types/nvidia-746/create"
    assert errno_of(mixed, mdev_create, U0) == errno.ENOENT
    # … and a file of that name made by hand does not make one answer to it.
    (vf_dir(mixed, VF0) / "nvidia").mkdir()
    (vf_dir(mixed, VF0) / "nvidia/current_vgpu_type").write_text("0\n")
    assert errno_of(mixed, current(VF0), "746") == errno.EACCES
    (vf_dir(mixed, W0) / "mdev_supported_types/nvidia-746").mkdir(parents=True)
    (vf_dir(mixed, W0) / "mdev_supported_types/nvidia-746/create").write_text("")
    assert errno_of(mixed, mdev_create, U0) == errno.EACCES
    assert os.listdir(root / "bus/mdev/devices") == []
    assert (root / current(W0)).read_text() == "0\n"
    assert len(available(mixed, VF0)) == 15  # nothing was created on either GPU
    assert len(creatable_ids(mixed, W0)) == 15


def test_holds_name_an_mdev_by_uuid_and_a_vfio_vgpu_by_its_vf(mixed: SimHost) -> None:
    create(mixed, VF0, "NVIDIA A2-4Q", U0)
    mixed.writer().write(current(W0), "746")
    hold(mixed.directory, U0)
    hold(mixed.directory, W0)
    assert mixed.hold_probe().scan(asked(U0, W0)).held == {U0: "simulated VM", W0: "simulated VM"}
    assert errno_of(mixed, current(W0), "0") == errno.EBUSY
    disable = [str(mixed.sriov_manage), "-d", PF2]
    assert subprocess.run(disable, check=False, capture_output=True).returncode == 1
    release(mixed.directory, W0)
    assert mixed.hold_probe().scan(asked(U0, W0)).held == {U0: "simulated VM"}
    mixed.writer().write(current(W0), "0")
    assert subprocess.run(disable, check=False, capture_output=True).returncode == 0
    assert not vf_dir(mixed, W0).exists()
    assert (vf_dir(mixed, VF0) / U0).is_dir()  # the mdev GPU keeps its held vGPU


def test_faults_and_reboot_on_a_host_of_both_interfaces(mixed: SimHost) -> None:
    fail(mixed.directory, writes=1)
    assert errno_of(mixed, current(W0), "746") == errno.EIO
    mixed.writer().write(current(W0), "746")
    create(mixed, VF0, "NVIDIA A2-4Q", U0)
    hold(mixed.directory, U0)
    reboot(mixed.directory)
    root = mixed.sysfs_root
    assert not vf_dir(mixed, VF0).exists()
    assert not vf_dir(mixed, W0).exists()
    assert os.listdir(root / "bus/mdev/devices") == []  # the bus stays, empty
    assert os.listdir(root / "class/mdev_bus") == []
    assert mixed.hold_probe().scan(asked(U0)).held == {}
    subprocess.run([str(mixed.sriov_manage), "-e", "ALL"], check=True, capture_output=True)
    # Each GPU comes back with its own interface.
    assert len(available(mixed, VF0)) == 15
    assert not (vf_dir(mixed, VF0) / "nvidia").exists()
    assert (root / current(W0)).read_text() == "0\n"
    assert not (vf_dir(mixed, W0) / "mdev_supported_types").exists()
