"""Crash safety: kill ``apply`` at every action boundary, run it again, and it converges.

The simulator's ``fail --crash-after N`` SIGKILLs the process that makes the Nth change, right
after the change took effect and before the executor could verify or journal it: the worst
moment. For every N of a plan with removals, replacements, an SR-IOV enable and creations, the
re-run must converge with no orphaned and no duplicate vGPU.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

from tests.simnode import NODE, SimNode, make_sim, run_vgpuctl

START = f"""apiVersion: vgpu.reconciler.dev/v1alpha1
kind: VGPUDesiredState
metadata: {{name: start}}
spec:
  nodes:
    {NODE}:
      gpus:
        - address: "0000:08:00.0"
          sriov: enabled
          vgpus: {{0: A2-4Q, 1: A2-4Q, 2: A2-4A, 3: A2-4A}}
"""

TARGET = f"""apiVersion: vgpu.reconciler.dev/v1alpha1
kind: VGPUDesiredState
metadata: {{name: target}}
spec:
  nodes:
    {NODE}:
      gpus:
        - address: "0000:08:00.0"
          sriov: enabled
          vgpus: {{0: A2-2Q, 1: A2-2Q, 5: A2-2B, 6: A2-2Q, 9: A2-2Q}}
        - address: "0000:18:00.0"
          sriov: enabled
          profiles: {{NVIDIA L4-6Q: 4}}
"""


def _inventory(node: SimNode) -> dict[str, object]:
    return json.loads(node.ok("status", "-o", "json").stdout)  # type: ignore[no-any-return]


def _check_host(node: SimNode) -> None:
    inv = _inventory(node)
    uuids = [
        vf["vgpu"]["uuid"]
        for g in inv["gpus"]  # type: ignore[attr-defined]
        for vf in g["vfs"]
        if vf["vgpu"]
    ]
    assert len(uuids) == len(set(uuids)), "duplicate vGPU"
    by_gpu = {
        g["address"]: {vf["index"]: vf["vgpu"]["type"] for vf in g["vfs"] if vf["vgpu"]}
        for g in inv["gpus"]  # type: ignore[attr-defined]
    }
    # Exactly the desired vGPUs: nothing orphaned, nothing missing.
    assert by_gpu["0000:08:00.0"] == {
        0: "NVIDIA A2-2Q", 1: "NVIDIA A2-2Q", 5: "NVIDIA A2-2B", 6: "NVIDIA A2-2Q",
        9: "NVIDIA A2-2Q",
    }  # fmt: skip
    assert sorted(by_gpu["0000:18:00.0"].values()) == ["NVIDIA L4-6Q"] * 4


def test_kill_at_every_action_boundary_then_rerun_converges(tmp_path: Path) -> None:
    template = make_sim(tmp_path / "template", ["A2@0000:08:00.0", "L4@0000:18:00.0"])
    start, target = tmp_path / "start.yaml", tmp_path / "target.yaml"
    start.write_text(START)
    target.write_text(TARGET)
    template.ok("apply", start, "--yes")

    plan = json.loads(template.run("plan", target, "-o", "json").stdout)
    # Every host action is one change on the host: a boundary after each.
    n_actions = sum(1 for a in plan["actions"] if a["kind"] != "device-plugin-refresh")
    assert n_actions >= 10, plan["actions"]

    for boundary in range(1, n_actions + 1):
        host_dir = tmp_path / f"crash-{boundary}"
        shutil.copytree(template.dir, host_dir, symlinks=True)
        node = SimNode(host_dir)
        assert run_vgpuctl("sim", "fail", host_dir, "--crash-after", str(boundary)).returncode == 0
        crashed = node.run("apply", target, "--yes")
        assert crashed.returncode == -signal.SIGKILL, (boundary, crashed.stdout, crashed.stderr)

        rerun = node.run("apply", target, "--yes")
        assert rerun.returncode == 0, (boundary, rerun.stdout, rerun.stderr)
        # The last boundary kills the run after its final change: nothing is left to do.
        expected = "No changes." if boundary == n_actions else "Converged"
        assert expected in rerun.stdout, (boundary, rerun.stdout)
        _check_host(node)
        # What the crashed run already did is not redone.
        remaining = len(json.loads(node.run("plan", target, "-o", "json").stdout)["actions"])
        assert remaining == 0
