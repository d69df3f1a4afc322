"""MdevDriver against a fake kernel: types by name, errnos explained, sriov-manage argv, reads."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from test_apply_fakes import (
    GPU,
    UUID_A,
    UUID_B,
    FakeKernel,
    FakeSriovManage,
    FakeWriter,
)

from reconciler.apply import (
    CommandFailedError,
    CommandNotFoundError,
    CommandResult,
    ConfinedSysfsWriter,
    DeviceBusyError,
    DriverRefusedError,
    HostChangedError,
    HostDriver,
    HostedVGPU,
    MdevDriver,
    SubprocessRunner,
)
from reconciler.model import ApplyError, PciAddress

VF0 = PciAddress.parse("0000:08:00.4")
VF1 = PciAddress.parse("0000:08:00.5")


class RecordingRunner:
    def __init__(self, result: CommandResult | None = None) -> None:
        self.result = result or CommandResult(0, "", "")
        self.calls: list[tuple[list[str], float]] = []

    def run(self, argv: list[str], *, timeout: float) -> CommandResult:
        self.calls.append((list(argv), timeout))
        return self.result


@pytest.fixture
def kernel(tmp_path: Path) -> FakeKernel:
    k = FakeKernel(tmp_path)
    k.enable()
    return k


def _driver(kernel: FakeKernel, **kw: object) -> MdevDriver:
    args: dict[str, object] = {
        "sysfs_root": kernel.root,
        "writer": FakeWriter(kernel),
        "runner": FakeSriovManage(kernel),
        "sriov_manage": ["/usr/lib/nvidia/sriov-manage"],
    }
    args.update(kw)
    return MdevDriver(**args)  # type: ignore[arg-type]


def test_mdev_driver_is_a_host_driver(kernel: FakeKernel) -> None:
    driver: HostDriver = _driver(kernel)
    assert driver.interface == "mdev"


# -- create / remove ------------------------------------------------------------------------------


def test_create_resolves_the_type_directory_by_name(kernel: FakeKernel) -> None:
    driver = _driver(kernel)
    driver.create_vgpu(gpu=GPU, vf=VF1, vf_index=1, type_name="NVIDIA A2-4Q", uuid=UUID_A)
    assert kernel.writes == [
        (f"bus/pci/devices/{VF1}/mdev_supported_types/nvidia-745/create", UUID_A)
    ]
    assert driver.vgpu_on(VF1) == (UUID_A, "NVIDIA A2-4Q")
    assert driver.vgpu_exists(UUID_A) == VF1


def test_create_through_the_confined_writer_writes_the_uuid_to_create(kernel: FakeKernel) -> None:
    # The real writer on a plain tree: no kernel reacts, but the path and value are the real ones.
    driver = _driver(kernel, writer=ConfinedSysfsWriter(kernel.root))
    driver.create_vgpu(gpu=GPU, vf=VF0, vf_index=0, type_name="NVIDIA A2-4A", uuid=UUID_B)
    create = kernel.vf_dir(VF0) / "mdev_supported_types/nvidia-742/create"
    assert create.read_text() == UUID_B


def test_create_of_a_type_not_offered_lists_the_offered_names(kernel: FakeKernel) -> None:
    with pytest.raises(DriverRefusedError) as info:
        _driver(kernel).create_vgpu(
            gpu=GPU, vf=VF1, vf_index=1, type_name="NVIDIA A2-16Q", uuid=UUID_A
        )
    assert info.value.message == (
        "NVIDIA A2-16Q is not offered on 0000:08:00.5; "
        "it offers: NVIDIA A2-2Q, NVIDIA A2-4A, NVIDIA A2-4Q"
    )
    assert kernel.writes == []


def test_create_on_a_vf_that_is_no_mdev_parent_says_so(tmp_path: Path) -> None:
    kernel = FakeKernel(tmp_path, mdev_parents=False)
    kernel.enable()
    with pytest.raises(DriverRefusedError, match="offers no vGPU types"):
        _driver(kernel).create_vgpu(
            gpu=GPU, vf=VF1, vf_index=1, type_name="NVIDIA A2-4Q", uuid=UUID_A
        )


@pytest.mark.parametrize(
    "bad", [UUID_A.upper(), "not-a-uuid", "../../../../etc", UUID_A.replace("-", ""), ""]
)
def test_uuids_are_checked_before_they_reach_a_path(kernel: FakeKernel, bad: str) -> None:
    driver = _driver(kernel)
    with pytest.raises(ApplyError, match="invalid vGPU UUID"):
        driver.create_vgpu(gpu=GPU, vf=VF1, vf_index=1, type_name="NVIDIA A2-4Q", uuid=bad)
    with pytest.raises(ApplyError, match="invalid vGPU UUID"):
        driver.remove_vgpu(gpu=GPU, vf=VF1, uuid=bad)
    with pytest.raises(ApplyError, match="invalid vGPU UUID"):
        driver.vgpu_exists(bad)
    assert kernel.writes == []


def test_create_einval_with_no_available_instance(kernel: FakeKernel) -> None:
    kernel.make_mdev(VF1, "nvidia-742", UUID_B)  # VF1 already hosts a vGPU: available 0
    with pytest.raises(DriverRefusedError) as info:
        _driver(kernel).create_vgpu(
            gpu=GPU, vf=VF1, vf_index=1, type_name="NVIDIA A2-4Q", uuid=UUID_A
        )
    assert info.value.message.startswith(
        "the driver refused to create NVIDIA A2-4Q on 0000:08:00.5 "
        "(no available instance: available_instances is 0"
    )


def _fail_create(kernel: FakeKernel, code: int, vf: PciAddress = VF1) -> None:
    kernel.fail_next[f"bus/pci/devices/{vf}/mdev_supported_types/nvidia-745/create"] = code


@pytest.mark.parametrize(
    ("code", "error", "message"),
    [
        (
            errno.EINVAL,
            DriverRefusedError,
            "the driver refused to create NVIDIA A2-4Q on 0000:08:00.5 "
            "(Invalid argument (EINVAL); available_instances is 1)",
        ),
        (
            errno.EEXIST,
            HostChangedError,
            "the driver refused to create NVIDIA A2-4Q on 0000:08:00.5: "
            f"a vGPU with UUID {UUID_A} already exists",
        ),
        (errno.EBUSY, DeviceBusyError, "0000:08:00.5 is busy: NVIDIA A2-4Q not created"),
        (
            errno.ENODEV,
            HostChangedError,
            "NVIDIA A2-4Q on 0000:08:00.5 disappeared while creating",
        ),
        (
            errno.EIO,
            DriverRefusedError,
            "the driver failed to create NVIDIA A2-4Q on 0000:08:00.5 (I/O error): "
            "see the kernel log (dmesg)",
        ),
        (
            errno.EACCES,
            DriverRefusedError,
            "cannot create NVIDIA A2-4Q on 0000:08:00.5: Permission denied (EACCES) writing",
        ),
        (
            errno.ENOMEM,
            DriverRefusedError,
            "the driver refused to create NVIDIA A2-4Q on 0000:08:00.5: "
            "Cannot allocate memory (ENOMEM)",
        ),
    ],
)
def test_create_errnos_are_explained(
    kernel: FakeKernel, code: int, error: type[ApplyError], message: str
) -> None:
    _fail_create(kernel, code)
    with pytest.raises(error) as info:
        _driver(kernel).create_vgpu(
            gpu=GPU, vf=VF1, vf_index=1, type_name="NVIDIA A2-4Q", uuid=UUID_A
        )
    assert type(info.value) is error
    assert info.value.message.startswith(message), info.value.message
    assert isinstance(info.value.__cause__, OSError)


@pytest.mark.parametrize(
    ("code", "transient"),
    [(errno.EIO, True), (errno.ENOMEM, True), (errno.EACCES, False), (errno.EINVAL, False)],
)
def test_a_driver_that_failed_may_succeed_later_one_that_refused_not(
    kernel: FakeKernel, code: int, transient: bool
) -> None:
    kernel.make_mdev(VF1, "nvidia-745", UUID_A)
    kernel.fail_next[f"bus/mdev/devices/{UUID_A}/remove"] = code
    with pytest.raises(DriverRefusedError) as info:
        _driver(kernel).remove_vgpu(gpu=GPU, vf=VF1, uuid=UUID_A)
    assert info.value.transient is transient


def test_remove_writes_1_to_the_mdev_remove_file(kernel: FakeKernel) -> None:
    kernel.make_mdev(VF1, "nvidia-745", UUID_A)
    driver = _driver(kernel)
    driver.remove_vgpu(gpu=GPU, vf=VF1, uuid=UUID_A)
    assert kernel.writes == [(f"bus/mdev/devices/{UUID_A}/remove", "1")]
    assert driver.vgpu_exists(UUID_A) is None
    assert driver.vgpu_on(VF1) is None


def test_remove_of_a_vgpu_held_by_a_vm_is_busy_and_transient(kernel: FakeKernel) -> None:
    kernel.make_mdev(VF1, "nvidia-745", UUID_A)
    kernel.held.add(UUID_A)
    with pytest.raises(DeviceBusyError) as info:
        _driver(kernel).remove_vgpu(gpu=GPU, vf=VF1, uuid=UUID_A)
    assert info.value.message == (
        f"vGPU {UUID_A} on 0000:08:00.5 is in use (held by a VM): not removed"
    )
    assert info.value.transient
    assert kernel.mdevs_on(VF1) == [UUID_A]


def test_remove_of_a_vgpu_already_gone_is_not_an_error(kernel: FakeKernel) -> None:
    # Vanished between the executor's precondition check and the write: removal's goal.
    _driver(kernel).remove_vgpu(gpu=GPU, vf=VF1, uuid=UUID_A)


def test_remove_eio_points_at_the_kernel_log(kernel: FakeKernel) -> None:
    kernel.make_mdev(VF1, "nvidia-745", UUID_A)
    kernel.fail_next[f"bus/mdev/devices/{UUID_A}/remove"] = errno.EIO
    with pytest.raises(DriverRefusedError, match=r"failed to remove vGPU .* \(I/O error\)"):
        _driver(kernel).remove_vgpu(gpu=GPU, vf=VF1, uuid=UUID_A)


# -- sriov-manage ---------------------------------------------------------------------------------


def test_sriov_manage_argv_keeps_a_wrapper_prefix(kernel: FakeKernel) -> None:
    runner = RecordingRunner()
    driver = _driver(
        kernel,
        runner=runner,
        sriov_manage=["chroot", "/host", "/usr/lib/nvidia/sriov-manage"],
        command_timeout=120.0,
    )
    driver.enable_sriov(GPU)
    driver.disable_sriov(GPU)
    assert runner.calls == [
        (["chroot", "/host", "/usr/lib/nvidia/sriov-manage", "-e", "0000:08:00.0"], 120.0),
        (["chroot", "/host", "/usr/lib/nvidia/sriov-manage", "-d", "0000:08:00.0"], 120.0),
    ]


def test_sriov_manage_must_be_an_argv_list(kernel: FakeKernel) -> None:
    with pytest.raises(ValueError, match="argv prefix"):
        _driver(kernel, sriov_manage="/usr/lib/nvidia/sriov-manage -x")
    with pytest.raises(ValueError, match="argv prefix"):
        _driver(kernel, sriov_manage=[])


def test_sriov_manage_non_zero_exit_carries_its_stderr(kernel: FakeKernel, tmp_path: Path) -> None:
    script = tmp_path / "sriov-manage"
    script.write_text("#!/bin/sh\necho 'Enabling VFs on '$2\necho 'GPU is in use' >&2\nexit 1\n")
    script.chmod(0o755)
    driver = _driver(kernel, runner=SubprocessRunner(), sriov_manage=[str(script)])
    with pytest.raises(CommandFailedError) as info:
        driver.disable_sriov(GPU)
    assert info.value.message == "sriov-manage -d 0000:08:00.0 failed (exit 1): GPU is in use"
    assert info.value.transient  # the GPU may be free next time


def test_sriov_manage_non_zero_exit_without_stderr_shows_stdout(kernel: FakeKernel) -> None:
    runner = RecordingRunner(CommandResult(2, "usage: sriov-manage [-e|-d] ADDR\n", ""))
    with pytest.raises(CommandFailedError, match=r"failed \(exit 2\): usage: sriov-manage"):
        _driver(kernel, runner=runner).enable_sriov(GPU)


def test_sriov_manage_missing_says_how_to_point_at_it(kernel: FakeKernel) -> None:
    driver = _driver(
        kernel, runner=SubprocessRunner(), sriov_manage=["/usr/lib/nvidia-none/sriov-manage"]
    )
    with pytest.raises(CommandNotFoundError) as info:
        driver.enable_sriov(GPU)
    assert info.value.message == (
        "sriov-manage not found at /usr/lib/nvidia-none/sriov-manage: set --sriov-manage"
    )


# -- reads ----------------------------------------------------------------------------------------


def test_vf_addresses_follow_virtfn_numbers_not_names(tmp_path: Path) -> None:
    kernel = FakeKernel(tmp_path, total_vfs=12, first_function=2)
    kernel.enable()
    driver = _driver(kernel)
    assert driver.num_vfs(GPU) == 12
    # A name sort would put virtfn10 and virtfn11 right after virtfn1.
    assert driver.vf_addresses(GPU) == [kernel.vf(i) for i in range(12)]
    assert str(driver.vf_addresses(GPU)[10]) == "0000:08:01.4"


def test_reads_with_sriov_off(tmp_path: Path) -> None:
    driver = _driver(FakeKernel(tmp_path))
    assert driver.num_vfs(GPU) == 0
    assert driver.vf_addresses(GPU) == []
    assert not driver.vgpu_parent_ready(VF0)
    assert driver.vgpu_on(VF0) is None
    assert driver.vgpu_exists(UUID_A) is None


def test_vgpu_on_names_the_type_and_ignores_other_entries(kernel: FakeKernel) -> None:
    kernel.make_mdev(VF0, "nvidia-742", UUID_B)
    driver = _driver(kernel)
    assert driver.vgpu_on(VF0) == HostedVGPU(UUID_B, "NVIDIA A2-4A")
    assert driver.vgpu_on(VF1) is None  # has physfn, mdev_supported_types: no vGPU
    assert driver.vgpu_parent_ready(VF1)


def test_reading_an_unknown_gpu_fails_clearly(kernel: FakeKernel) -> None:
    with pytest.raises(ApplyError, match=r"no PCI device 0000:41:00\.0 under"):
        _driver(kernel).num_vfs(PciAddress.parse("0000:41:00.0"))


def test_a_vanished_sysfs_root_is_named_and_no_absence_counts_as_done(kernel: FakeKernel) -> None:
    """All of sysfs gone (unmounted, or the suite's renamed tree): no read may pass an absence
    off as an effect, and every message says what is really wrong."""
    kernel.make_mdev(VF1, "nvidia-745", UUID_A)
    driver = _driver(kernel)
    away = kernel.root.with_name("sys.away")
    kernel.root.rename(away)
    gone = rf"the sysfs root {kernel.root} does not exist"
    try:
        with pytest.raises(ApplyError, match=gone):
            driver.vgpu_exists(UUID_A)  # not "removed"
        with pytest.raises(ApplyError, match=gone):
            driver.vf_addresses(GPU)  # not "0 VFs"
        with pytest.raises(ApplyError, match=gone):
            driver.num_vfs(GPU)
        with pytest.raises(ApplyError, match=gone):
            driver.vgpu_on(VF1)
        with pytest.raises(ApplyError, match=gone):
            driver.remove_vgpu(gpu=GPU, vf=VF1, uuid=UUID_A)  # not "already gone"
    finally:
        away.rename(kernel.root)
    assert driver.vgpu_exists(UUID_A) == VF1
