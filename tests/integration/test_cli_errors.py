"""Bad input: each a clear one-line error and exit 1, never a traceback."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.simnode import NODE, SEED, SimNode, run_vgpuctl


def _fails(res: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert res.returncode == 1, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    assert "Traceback" not in res.stderr + res.stdout
    assert res.stderr.strip(), "an error must say something on stderr"
    for fragment in fragments:
        assert fragment in res.stderr, f"{fragment!r} not in:\n{res.stderr}"


def _desired(tmp_path: Path, body: str, name: str = "desired.yaml") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


HEADER = f"""apiVersion: vgpu.reconciler.dev/v1alpha1
kind: VGPUDesiredState
metadata: {{name: t}}
spec:
  nodes:
    {NODE}:
      gpus:
"""


def test_malformed_yaml(tmp_path: Path, a2_node: SimNode) -> None:
    path = _desired(tmp_path, HEADER + '        - address: "0000:08:00.0"\n          sriov: [\n')
    _fails(a2_node.run("plan", path), f"{path}:")
    _fails(run_vgpuctl("validate", path), f"{path}:")


def test_wrong_type_and_unknown_field(tmp_path: Path) -> None:
    path = _desired(
        tmp_path,
        HEADER + '        - address: "0000:08:00.0"\n          sriov: yes\n'
        "          vgpu: {0: A2-4Q}\n",
    )
    res = run_vgpuctl("validate", path)
    _fails(res, f"{path}:9:", f"{path}:10:", "did you mean 'vgpus'")


def test_invalid_pci_address(tmp_path: Path) -> None:
    path = _desired(
        tmp_path, HEADER + '        - address: "0000:08:00.9"\n          sriov: enabled\n'
    )
    _fails(run_vgpuctl("validate", path), f"{path}:8:", "0000:08:00.9")


def test_gpu_not_on_host_lists_what_is_there(tmp_path: Path, a2_node: SimNode) -> None:
    path = _desired(
        tmp_path, HEADER + '        - address: "0000:41:00.0"\n          sriov: enabled\n'
    )
    _fails(a2_node.run("plan", path), "0000:41:00.0", "0000:08:00.0")


def test_vf_of_another_gpu(tmp_path: Path) -> None:
    from tests.simnode import make_sim

    node = make_sim(tmp_path / "h", ["A2@0000:08:00.0", "A2@0000:09:00.0"])
    node.ok("apply", _desired(tmp_path, HEADER + (
        '        - {address: "0000:08:00.0", sriov: enabled}\n'
        '        - {address: "0000:09:00.0", sriov: enabled}\n')), "--yes")  # fmt: skip
    path = _desired(
        tmp_path,
        HEADER + '        - address: "0000:08:00.0"\n          sriov: enabled\n'
        '          vgpus: {"0000:09:00.4": A2-4Q}\n',
        "other.yaml",
    )
    _fails(node.run("plan", path), "0000:09:00.4", "0000:09:00.0")


def test_profile_not_offered_lists_offered(tmp_path: Path, a2_node: SimNode) -> None:
    path = _desired(
        tmp_path,
        HEADER + '        - address: "0000:08:00.0"\n          sriov: enabled\n'
        "          vgpus: {0: L4-4Q}\n",
    )
    res = a2_node.run("plan", path)
    _fails(res, "does not offer 'NVIDIA L4-4Q'", "offered: NVIDIA A2-1B", "-4Q")


def test_node_not_in_file(a2_node: SimNode) -> None:
    res = run_vgpuctl("plan", SEED, "--sysfs-root", a2_node.dir / "sys", "--node", "other")
    _fails(res, "other", NODE, "--node")


def test_missing_sysfs_root(tmp_path: Path) -> None:
    res = run_vgpuctl("status", "--sysfs-root", tmp_path / "nope", "--node", NODE)
    _fails(res, str(tmp_path / "nope"))


def test_unreadable_sysfs_root(tmp_path: Path, a2_node: SimNode) -> None:
    if os.geteuid() == 0:
        # root reads a mode-000 directory anyway; a regular file stands in for "not a tree".
        bad = tmp_path / "file"
        bad.write_text("x")
    else:
        bad = tmp_path / "locked"
        bad.mkdir(mode=0)
    _fails(run_vgpuctl("status", "--sysfs-root", bad, "--node", NODE), str(bad))


def test_sriov_manage_missing(tmp_path: Path, a2_node: SimNode) -> None:
    res = run_vgpuctl(
        "apply", SEED, "--yes", "--sysfs-root", a2_node.dir / "sys",
        "--sriov-manage", tmp_path / "absent", "--node", NODE,
    )  # fmt: skip
    _fails(res, "not found", str(tmp_path / "absent"))


def test_sriov_manage_not_executable(tmp_path: Path, a2_node: SimNode) -> None:
    script = tmp_path / "sriov-manage"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    res = run_vgpuctl(
        "apply", SEED, "--yes", "--sysfs-root", a2_node.dir / "sys",
        "--sriov-manage", script, "--node", NODE,
    )  # fmt: skip
    _fails(res, "not executable")


def test_sriov_manage_failing(a2_node: SimNode) -> None:
    assert run_vgpuctl("sim", "fail", a2_node.dir, "--sriov", "error").returncode == 0
    _fails(a2_node.run("apply", SEED, "--yes"), "sriov-manage")


def test_sriov_manage_exit_0_without_effect_is_a_failed_apply(a2_node: SimNode) -> None:
    assert run_vgpuctl("sim", "fail", a2_node.dir, "--sriov", "silent").returncode == 0
    res = a2_node.run("apply", SEED, "--yes", "--verify-timeout", "1")
    _fails(res, "0000:08:00.0")
    assert "VF" in res.stderr


def test_sriov_manage_hanging_is_killed(a2_node: SimNode) -> None:
    assert run_vgpuctl("sim", "fail", a2_node.dir, "--sriov", "hang").returncode == 0
    res = a2_node.run("apply", SEED, "--yes", "--timeout", "2", timeout=60)
    _fails(res, "did not finish within 2")


def test_failed_write_stops_apply_and_rerun_repairs(a2_node: SimNode) -> None:
    assert run_vgpuctl("sim", "fail", a2_node.dir, "--writes", "1").returncode == 0
    _fails(a2_node.run("apply", SEED, "--yes"))
    assert "Converged" in a2_node.ok("apply", SEED, "--yes").stdout


def test_lock_held_by_another_apply(a2_node: SimNode) -> None:
    state = a2_node.dir / "state"
    holder = subprocess.Popen(
        [
            sys.executable, "-c",
            "import sys, time\n"
            "from pathlib import Path\n"
            "from reconciler.apply import NodeLock\n"
            f"with NodeLock(Path({str(state)!r}), {NODE!r}):\n"
            "    print('locked', flush=True)\n"
            "    time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        res = a2_node.run("apply", SEED, "--yes")
        _fails(res, "lock", str(holder.pid))
    finally:
        holder.kill()
        holder.wait()
    assert json.loads(a2_node.ok("status", "-o", "json").stdout)["gpus"][0]["sriov"]["numVFs"] == 0


def test_saved_plan_that_is_not_a_plan(tmp_path: Path, a2_node: SimNode) -> None:
    junk = tmp_path / "junk.json"
    junk.write_text('{"hello": 1}')
    _fails(a2_node.run("apply", junk, "--yes"), "not a saved plan")
    broken = tmp_path / "broken.json"
    broken.write_text('{"formatVersion": 1, "actions": [')
    _fails(a2_node.run("apply", broken, "--yes"), f"{broken}:")


@pytest.mark.parametrize(
    "args",
    [
        ["plan"],
        ["status", "-o", "xml"],
        ["frobnicate"],
        ["plan", str(SEED), "--no-such-flag"],
        [],
    ],
)
def test_usage_errors_exit_1(args: list[str]) -> None:
    res = run_vgpuctl(*args)
    _fails(res)
