"""The real adapters under the ports: the confined sysfs writer and the subprocess runner."""

from __future__ import annotations

import errno
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from reconciler.apply import (
    CommandNotExecutableError,
    CommandNotFoundError,
    CommandResult,
    CommandTimeoutError,
    ConfinedSysfsWriter,
    PathEscapeError,
    SubprocessRunner,
    SysfsDevice,
)
from reconciler.model import ApplyError
from tests.sysfs_devices import (
    CREATE,
    GPU,
    NIC,
    NIC_DIR,
    OTHER_VF,
    REMOVE,
    THE_VF,
    THE_VGPU,
    TYPE,
    UUID,
    VF,
    VF_DIR,
    VGPU_DIR,
    device_tree,
    link,
)

# -- ConfinedSysfsWriter --------------------------------------------------------------------------


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """A GPU, its VF hosting a vGPU, and a NIC, in the kernel's layout (``tests/sysfs_devices``)."""
    return device_tree(tmp_path / "sys")


def test_writer_writes_the_named_devices_files_through_the_bus_links(sysfs: Path) -> None:
    ConfinedSysfsWriter(sysfs).write(CREATE, UUID, device=THE_VF)
    ConfinedSysfsWriter(sysfs).write(REMOVE, "1", device=THE_VGPU)
    assert (sysfs / VF_DIR / f"mdev_supported_types/{TYPE}/create").read_text() == UUID
    assert (sysfs / VGPU_DIR / "remove").read_text() == "1"


def test_writer_accepts_a_root_reached_through_a_link(sysfs: Path, tmp_path: Path) -> None:
    (tmp_path / "alias").symlink_to(sysfs)
    ConfinedSysfsWriter(tmp_path / "alias").write(REMOVE, "1", device=THE_VGPU)
    assert (sysfs / VGPU_DIR / "remove").read_text() == "1"


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/etc/passwd", "not a path relative to the root"),
        ("", "not a path relative to the root"),
        ("../outside", "'..' is not allowed"),
        # Stays inside once resolved, but '..' is refused before any resolution.
        (f"bus/mdev/devices/{UUID}/../{UUID}/remove", "'..' is not allowed"),
        (f"{VGPU_DIR}/remove", "not a file of a device under bus/pci/devices or bus/mdev"),
        (f"bus/mdev/devices/{UUID}", "not a file of a device under bus/pci/devices or bus/mdev"),
    ],
)
def test_writer_refuses_paths_that_are_not_a_devices_file(sysfs: Path, path: str, why: str) -> None:
    with pytest.raises(PathEscapeError, match=re.escape(why)):
        ConfinedSysfsWriter(sysfs).write(path, "1", device=THE_VGPU)
    assert (sysfs / VGPU_DIR / "remove").read_text() == ""


@pytest.mark.parametrize(
    "device",
    [
        SysfsDevice(GPU, VF, "0d3cbd63-7d0d-5a5e-9b0d-4a8f3c5e2b10"),  # another vGPU
        SysfsDevice(GPU, OTHER_VF, UUID),  # the vGPU, but said to be on another VF
        SysfsDevice(NIC, VF, UUID),  # the VF, but said to be of another GPU
        SysfsDevice(GPU, VF),  # the VF itself, not its vGPU
    ],
    ids=["other-vgpu", "other-vf", "other-gpu", "the-vf"],
)
def test_writer_refuses_a_path_of_another_device_than_the_action_names(
    sysfs: Path, device: SysfsDevice
) -> None:
    with pytest.raises(PathEscapeError):
        ConfinedSysfsWriter(sysfs).write(REMOVE, "1", device=device)
    assert (sysfs / VGPU_DIR / "remove").read_text() == ""


def test_writer_refuses_a_bus_link_redirected_to_another_device(sysfs: Path) -> None:
    """``bus/mdev/devices/<uuid>`` made to lead to the NIC: its ``remove`` would unplug it."""
    link(sysfs, f"bus/mdev/devices/{UUID}", NIC_DIR)
    with pytest.raises(PathEscapeError) as info:
        ConfinedSysfsWriter(sysfs).write(REMOVE, "1", device=THE_VGPU)
    assert info.value.message == (
        f"refusing sysfs write to {REMOVE}: {sysfs}/bus/mdev/devices/{UUID} leads to "
        f"{sysfs}/{NIC_DIR}, not to vGPU {UUID} on VF {VF} of GPU {GPU}"
    )
    assert (sysfs / NIC_DIR / "remove").read_text() == ""


def test_writer_refuses_a_directory_named_as_the_vgpu_under_another_device(sysfs: Path) -> None:
    (sysfs / NIC_DIR / UUID).mkdir()
    (sysfs / NIC_DIR / UUID / "remove").write_text("")
    link(sysfs, f"bus/mdev/devices/{UUID}", f"{NIC_DIR}/{UUID}")
    with pytest.raises(PathEscapeError, match=f"not to vGPU {UUID} on VF {VF}"):
        ConfinedSysfsWriter(sysfs).write(REMOVE, "1", device=THE_VGPU)
    assert (sysfs / NIC_DIR / UUID / "remove").read_text() == ""


def test_writer_refuses_a_vf_whose_physfn_leads_elsewhere(sysfs: Path) -> None:
    link(sysfs, f"{VF_DIR}/physfn", NIC_DIR)
    with pytest.raises(PathEscapeError, match=f"{VF_DIR} belongs to {NIC}, not to GPU {GPU}"):
        ConfinedSysfsWriter(sysfs).write(CREATE, UUID, device=THE_VF)
    (sysfs / VF_DIR / "physfn").unlink()
    with pytest.raises(PathEscapeError, match="has no physfn link: it is not a VF"):
        ConfinedSysfsWriter(sysfs).write(CREATE, UUID, device=THE_VF)
    assert (sysfs / VF_DIR / f"mdev_supported_types/{TYPE}/create").read_text() == ""


@pytest.mark.parametrize(
    ("planted", "path", "device"),
    [
        (f"{VGPU_DIR}/remove", REMOVE, THE_VGPU),
        (f"{VF_DIR}/mdev_supported_types", CREATE, THE_VF),
        (f"{VF_DIR}/mdev_supported_types/{TYPE}", CREATE, THE_VF),
        (f"{VF_DIR}/mdev_supported_types/{TYPE}/create", CREATE, THE_VF),
    ],
    ids=["remove", "types-dir", "type-dir", "create"],
)
def test_writer_refuses_any_link_after_the_device_directory(
    sysfs: Path, planted: str, path: str, device: SysfsDevice
) -> None:
    """The attack the security review reproduced: the vGPU's ``remove`` a link to the NIC's."""
    victim = sysfs / NIC_DIR / "remove"
    shutil.rmtree(sysfs / planted) if (sysfs / planted).is_dir() else (sysfs / planted).unlink()
    if planted.endswith(("remove", "create")):
        link(sysfs, planted, f"{NIC_DIR}/remove")
    else:
        # A whole directory replaced by a link to a copy of it under the NIC.
        copy = f"{NIC_DIR}/{Path(planted).name}"
        (sysfs / copy / TYPE).mkdir(parents=True, exist_ok=True)
        (sysfs / copy / TYPE / "create").write_text("")
        (sysfs / copy / "create").write_text("")
        link(sysfs, planted, copy)
    with pytest.raises(PathEscapeError, match="is a link"):
        ConfinedSysfsWriter(sysfs).write(path, "1", device=device)
    assert victim.read_text() == ""
    assert all(p.read_text() == "" for p in (sysfs / NIC_DIR).rglob("create"))


def test_writer_refuses_a_link_that_escapes_the_root(sysfs: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside" / UUID
    outside.mkdir(parents=True)
    (outside / "remove").write_text("intact")
    (sysfs / f"bus/mdev/devices/{UUID}").unlink()
    (sysfs / f"bus/mdev/devices/{UUID}").symlink_to(outside)
    with pytest.raises(PathEscapeError, match="outside the sysfs root"):
        ConfinedSysfsWriter(sysfs).write(REMOVE, "pwned", device=THE_VGPU)
    assert (outside / "remove").read_text() == "intact"


def test_writer_never_creates_a_missing_file(sysfs: Path) -> None:
    (sysfs / VGPU_DIR / "remove").unlink()
    with pytest.raises(FileNotFoundError) as info:
        ConfinedSysfsWriter(sysfs).write(REMOVE, "1", device=THE_VGPU)
    assert info.value.errno == errno.ENOENT
    assert not (sysfs / VGPU_DIR / "remove").exists()


def test_writer_says_the_device_is_gone_when_its_link_is(sysfs: Path) -> None:
    (sysfs / f"bus/mdev/devices/{UUID}").unlink()
    with pytest.raises(FileNotFoundError):
        ConfinedSysfsWriter(sysfs).write(REMOVE, "1", device=THE_VGPU)


def test_writer_lets_the_errno_through(sysfs: Path) -> None:
    (sysfs / VGPU_DIR / "remove").unlink()
    (sysfs / VGPU_DIR / "remove").mkdir()
    with pytest.raises(OSError) as info:
        ConfinedSysfsWriter(sysfs).write(REMOVE, "1", device=THE_VGPU)
    assert info.value.errno == errno.EISDIR
    assert not isinstance(info.value, ApplyError)


def test_writer_hands_a_checked_write_to_its_kernel(sysfs: Path) -> None:
    """The simulator's kernel stands behind the same checks: it gets the link-free path."""
    seen: list[tuple[str, str]] = []

    class Kernel:
        def write(self, path: str, value: str) -> None:
            seen.append((path, value))

    writer = ConfinedSysfsWriter(sysfs, kernel=Kernel())
    writer.write(REMOVE, "1", device=THE_VGPU)
    link(sysfs, f"{VGPU_DIR}/remove", f"{NIC_DIR}/remove")
    with pytest.raises(PathEscapeError):
        writer.write(REMOVE, "1", device=THE_VGPU)
    assert seen == [(f"{VGPU_DIR}/remove", "1")]


# -- SubprocessRunner -----------------------------------------------------------------------------


def _script(path: Path, body: str, *, mode: int = 0o755) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(mode)
    return path


def test_runner_captures_exit_code_and_output() -> None:
    result = SubprocessRunner().run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10)
    assert result == CommandResult(3, "out\n", "err\n")


def test_runner_reports_a_missing_program_by_path(tmp_path: Path) -> None:
    missing = tmp_path / "nvidia" / "sriov-manage"
    with pytest.raises(CommandNotFoundError) as info:
        SubprocessRunner().run([str(missing), "-e", "0000:08:00.0"], timeout=10)
    assert info.value.message == f"sriov-manage not found at {missing}"


def test_runner_reports_a_missing_program_on_path() -> None:
    with pytest.raises(CommandNotFoundError, match="no-such-program-4242 not found on PATH"):
        SubprocessRunner().run(["no-such-program-4242"], timeout=10)


def test_runner_reports_a_program_that_is_not_executable(tmp_path: Path) -> None:
    script = _script(tmp_path / "sriov-manage", "exit 0\n", mode=0o644)
    with pytest.raises(CommandNotExecutableError) as info:
        SubprocessRunner().run([str(script), "-e", "0000:08:00.0"], timeout=10)
    assert info.value.message == f"{script} is not executable"


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_runner_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "sleep.pid"
    # The script forks `sleep 60`, which keeps our stdout pipe open: killing only the script
    # would leave the run waiting for that pipe for a minute.
    script = _script(tmp_path / "sriov-manage", f'sleep 60 &\necho $! > "{pidfile}"\nwait\n')
    started = time.monotonic()
    with pytest.raises(CommandTimeoutError) as info:
        SubprocessRunner().run([str(script), "-e", "0000:08:00.0"], timeout=0.5)
    assert time.monotonic() - started < 5
    assert info.value.message == "sriov-manage -e 0000:08:00.0 did not finish within 0.5 s"
    assert info.value.transient
    sleeper = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(sleeper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(sleeper)


def test_runner_takes_argv_literally_never_through_a_shell(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    result = SubprocessRunner().run(
        [sys.executable, "-c", "import sys; print(sys.argv[1])", f"x; touch {marker}"],
        timeout=10,
    )
    assert result.stdout == f"x; touch {marker}\n"
    assert not marker.exists()


def test_runner_gives_the_command_no_terminal_input() -> None:
    # sriov-manage must never sit waiting for a prompt's answer.
    result = SubprocessRunner().run(
        [sys.executable, "-c", "import sys; print(repr(sys.stdin.read()))"], timeout=10
    )
    assert result.stdout == "''\n"
