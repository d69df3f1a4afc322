"""The real adapters under the ports: the confined sysfs writer and the subprocess runner."""

from __future__ import annotations

import errno
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
)
from reconciler.model import ApplyError

# -- ConfinedSysfsWriter --------------------------------------------------------------------------


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """``sys/devices/x/create`` reachable through the link ``sys/bus/pci/devices/x``."""
    root = tmp_path / "sys"
    dev = root / "devices" / "x"
    dev.mkdir(parents=True)
    (dev / "create").write_text("")
    (root / "bus/pci/devices").mkdir(parents=True)
    (root / "bus/pci/devices/x").symlink_to("../../../devices/x")
    return root


def test_writer_writes_through_links_inside_the_root(sysfs: Path) -> None:
    ConfinedSysfsWriter(sysfs).write("bus/pci/devices/x/create", "abc")
    assert (sysfs / "devices/x/create").read_text() == "abc"


def test_writer_accepts_a_root_reached_through_a_link(sysfs: Path, tmp_path: Path) -> None:
    (tmp_path / "alias").symlink_to(sysfs)
    ConfinedSysfsWriter(tmp_path / "alias").write("devices/x/create", "1")
    assert (sysfs / "devices/x/create").read_text() == "1"


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/etc/passwd", "not a path relative to the root"),
        ("", "not a path relative to the root"),
        ("../outside", "'..' is not allowed"),
        # Stays inside once resolved, but '..' is refused before any resolution.
        ("devices/x/../x/create", "'..' is not allowed"),
    ],
)
def test_writer_refuses_absolute_and_dotdot_paths(sysfs: Path, path: str, why: str) -> None:
    with pytest.raises(PathEscapeError, match=why):
        ConfinedSysfsWriter(sysfs).write(path, "1")
    assert (sysfs / "devices/x/create").read_text() == ""


def test_writer_refuses_a_link_that_escapes_the_root(sysfs: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("intact")
    (sysfs / "devices/escape").symlink_to(outside)
    with pytest.raises(PathEscapeError, match="outside the sysfs root"):
        ConfinedSysfsWriter(sysfs).write("devices/escape/victim", "pwned")
    assert (outside / "victim").read_text() == "intact"


def test_writer_never_creates_a_missing_file(sysfs: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        ConfinedSysfsWriter(sysfs).write("devices/x/remove", "1")
    assert info.value.errno == errno.ENOENT
    assert not (sysfs / "devices/x/remove").exists()


def test_writer_lets_the_errno_through(sysfs: Path) -> None:
    with pytest.raises(OSError) as info:
        ConfinedSysfsWriter(sysfs).write("devices/x", "1")
    assert info.value.errno == errno.EISDIR
    assert not isinstance(info.value, ApplyError)


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
