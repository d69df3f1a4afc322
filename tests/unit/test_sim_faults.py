"""Injected faults (EIO writes, a failing/silent/hung sriov-manage, crashes) and reboot."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reconciler.sim import SimHost, build_host, fail, hold, init_host, reboot
from tests.holds import asked

PF = "0000:08:00.0"
VF0, VF1 = "0000:08:00.4", "0000:08:00.5"
U0 = "00000000-0000-4000-8000-000000000000"
U1 = "11111111-1111-4111-8111-111111111111"
REPO = Path(__file__).resolve().parents[2]


def script(host: SimHost, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(host.sriov_manage), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def numvfs(host: SimHost) -> int:
    return int((host.sysfs_root / "bus/pci/devices" / PF / "sriov_numvfs").read_text())


def faults(host: SimHost) -> dict[str, object]:
    state = json.loads((host.sysfs_root / ".vgpuctl-sim/state.json").read_text())
    result: dict[str, object] = state["faults"]
    return result


def create_path(host: SimHost, vf: str) -> str:
    # NVIDIA A2-4Q: found by name, as an observer must
    types = host.sysfs_root / "bus/pci/devices" / vf / "mdev_supported_types"
    type_dir = next(d.name for d in types.iterdir() if (d / "name").read_text() == "NVIDIA A2-4Q\n")
    return f"bus/pci/devices/{vf}/mdev_supported_types/{type_dir}/create"


@pytest.fixture
def a2(tmp_path: Path) -> SimHost:
    return init_host(tmp_path, [f"A2@{PF}"])


@pytest.fixture
def a2_on(tmp_path: Path) -> SimHost:
    return build_host(tmp_path, {"gpus": [{"model": "A2", "address": PF, "sriov": "enabled"}]})


# --- sysfs write faults --------------------------------------------------------------------------


def test_the_next_n_writes_fail_with_eio_once(a2_on: SimHost) -> None:
    fail(a2_on.directory, writes=2)
    assert faults(a2_on)["writes"] == 2
    w = a2_on.writer()
    for _ in range(2):
        with pytest.raises(OSError) as info:
            w.write(create_path(a2_on, VF0), U0)
        assert info.value.errno == 5  # EIO
    assert not (a2_on.sysfs_root / "bus/mdev/devices" / U0).exists()
    w.write(create_path(a2_on, VF0), U0)
    assert (a2_on.sysfs_root / "bus/mdev/devices" / U0).exists()
    assert faults(a2_on)["writes"] == 0


# --- sriov-manage faults --------------------------------------------------------------------------


def test_sriov_manage_error_fails_once_having_done_nothing(a2: SimHost) -> None:
    fail(a2.directory, sriov_manage="error")
    r = script(a2, "-e", PF)
    assert r.returncode == 1
    assert "Failed to enable VFs" in r.stderr
    assert numvfs(a2) == 0
    assert faults(a2)["sriovManage"] is None
    assert script(a2, "-e", PF).returncode == 0
    assert numvfs(a2) == 16


def test_sriov_manage_silent_exits_0_having_done_nothing(a2: SimHost) -> None:
    fail(a2.directory, sriov_manage="silent")
    r = script(a2, "-e", PF)
    assert r.returncode == 0
    assert r.stdout == f"Enabling VFs on {PF}\n"  # it even says so
    assert numvfs(a2) == 0
    assert not (a2.sysfs_root / "bus/pci/devices" / VF0).exists()
    script(a2, "-e", PF)
    assert numvfs(a2) == 16


def test_sriov_manage_hang_is_killed_by_a_timeout_and_leaves_the_host_usable(a2: SimHost) -> None:
    fail(a2.directory, sriov_manage="hang")
    with pytest.raises(subprocess.TimeoutExpired):
        script(a2, "-e", PF, timeout=3)
    assert numvfs(a2) == 0
    r = script(a2, "-e", PF, timeout=60)  # the lock was not held while hanging
    assert r.returncode == 0
    assert numvfs(a2) == 16


def test_an_invalid_call_does_not_use_up_the_fault(a2: SimHost) -> None:
    fail(a2.directory, sriov_manage="error")
    assert script(a2, "-e", "0000:42:00.0").returncode == 1
    assert faults(a2)["sriovManage"] == "error"


# --- crashes -------------------------------------------------------------------------------------

WRITER_CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from reconciler.sim import SimHost
    root, *writes = sys.argv[1:]
    writer = SimHost.open(Path(root)).writer()
    for i in range(0, len(writes), 2):
        try:
            writer.write(writes[i], writes[i + 1])
        except OSError as exc:
            print("refused", i // 2 + 1, exc.errno, flush=True)
            continue
        print("wrote", i // 2 + 1, flush=True)
    print("survived", flush=True)
    """
)


def run_writer_child(host: SimHost, *writes: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", WRITER_CHILD, str(host.sysfs_root), *writes],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.mark.parametrize("n", [1, 2])
def test_crash_after_kills_the_writer_after_its_nth_change(a2_on: SimHost, n: int) -> None:
    fail(a2_on.directory, crash_after=n)
    r = run_writer_child(a2_on, create_path(a2_on, VF0), U0, create_path(a2_on, VF1), U1)
    assert r.returncode == -signal.SIGKILL
    assert r.stdout.splitlines() == [f"wrote {k}" for k in range(1, n)]
    created = sorted(os.listdir(a2_on.sysfs_root / "bus/mdev/devices"))
    assert created == [U0, U1][:n]  # the change that triggered the crash is complete
    assert faults(a2_on)["crashAfter"] is None  # one-shot


def test_refused_writes_do_not_count_towards_a_crash(a2_on: SimHost) -> None:
    fail(a2_on.directory, crash_after=1)
    r = run_writer_child(
        a2_on, f"bus/pci/devices/{PF}/sriov_numvfs", "0", create_path(a2_on, VF0), U0
    )
    assert r.returncode == -signal.SIGKILL
    assert r.stdout.splitlines() == ["refused 1 1"]  # EPERM, then killed by the create
    assert os.listdir(a2_on.sysfs_root / "bus/mdev/devices") == [U0]


SRIOV_PARENT = textwrap.dedent(
    """
    import subprocess, sys
    r = subprocess.run([sys.argv[1], "-e", "ALL"])
    print("survived", r.returncode, flush=True)
    """
)


def test_crash_after_kills_the_caller_of_sriov_manage_after_the_change(a2: SimHost) -> None:
    fail(a2.directory, crash_after=1)
    r = subprocess.run(
        [sys.executable, "-c", SRIOV_PARENT, str(a2.sriov_manage)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == -signal.SIGKILL
    assert "survived" not in r.stdout
    assert numvfs(a2) == 16


def test_an_idempotent_sriov_manage_call_is_no_change(a2: SimHost) -> None:
    script(a2, "-e", PF)
    fail(a2.directory, crash_after=1)
    r = subprocess.run(
        [sys.executable, "-c", SRIOV_PARENT, str(a2.sriov_manage)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0
    assert "survived 0" in r.stdout
    assert faults(a2)["crashAfter"] == 1


@pytest.mark.parametrize(
    "kwargs",
    [{"writes": -1}, {"sriov_manage": "explode"}, {"crash_after": 0}],
)
def test_bad_fault_arguments_are_refused(a2: SimHost, kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        fail(a2.directory, **kwargs)  # type: ignore[arg-type]


def test_fail_on_a_plain_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a simulated host"):
        fail(tmp_path / "nothing", writes=1)


# --- reboot ---------------------------------------------------------------------------------------


def tree_entries(root: Path) -> set[str]:
    return {
        str(Path(d, n).relative_to(root))
        for d, dirs, files in os.walk(root)
        for n in dirs + files
        if ".vgpuctl-sim" not in d and n != ".vgpuctl-sim"
    }


def test_reboot_clears_vfs_vgpus_holds_and_faults(tmp_path: Path) -> None:
    fresh = init_host(tmp_path / "fresh", [f"A2@{PF}", "L4"])
    host = build_host(
        tmp_path / "busy",
        {
            "gpus": [
                {"model": "A2", "address": PF, "vgpus": {0: {"type": "A2-4Q", "held": True}}},
                {"model": "L4", "vgpus": {3: "L4-2Q"}},
            ]
        },
    )
    fail(host.directory, writes=3, sriov_manage="hang", crash_after=2)
    reboot(host.directory)
    root = host.sysfs_root
    assert numvfs(host) == 0
    assert os.listdir(root / "bus/mdev/devices") == []
    assert os.listdir(root / "class/mdev_bus") == []
    assert not any(n.startswith("virtfn") for n in os.listdir(root / "bus/pci/devices" / PF))
    assert faults(host) == {"writes": 0, "sriovManage": None, "crashAfter": None}
    state = json.loads((root / ".vgpuctl-sim/state.json").read_text())
    assert state["held"] == {}
    assert state["vgpus"] == {}
    # PFs, the NIC with its VFs, the audio function and IOMMU groups are as at power-on.
    assert tree_entries(root) == tree_entries(fresh.sysfs_root)
    assert script(host, "-e", "ALL").returncode == 0  # and the host works again


def test_hold_survives_nothing_but_reboot(tmp_path: Path) -> None:
    host = build_host(tmp_path, {"gpus": [{"model": "A2", "address": PF, "vgpus": {0: "A2-4Q"}}]})
    uuid = os.listdir(host.sysfs_root / "bus/mdev/devices")[0]
    hold(host.directory, uuid)
    assert host.hold_probe().scan(asked(uuid)).held == {uuid: "simulated VM"}
    reboot(host.directory)
    assert host.hold_probe().scan(asked(uuid)).held == {}
