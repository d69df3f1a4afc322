"""A vGPU a VM holds is never destroyed: its removal, and what depends on it, is blocked."""

from __future__ import annotations

import json
from pathlib import Path

from tests.simnode import NODE, SEED, SimNode, run_vgpuctl

CHANGED = f"""apiVersion: vgpu.reconciler.dev/v1alpha1
kind: VGPUDesiredState
metadata: {{name: changed}}
spec:
  nodes:
    {NODE}:
      gpus:
        - address: "0000:08:00.0"
          sriov: enabled
          vgpus:
            "0000:08:00.4": A2-4A
            "0000:08:00.5": A2-4A   # was A2-4Q: a replacement
            "0000:08:00.6": A2-4A
"""


def _vgpus(node: SimNode) -> dict[str, dict[str, str]]:
    inv = json.loads(node.ok("status", "-o", "json").stdout)
    return {vf["address"]: vf["vgpu"] for g in inv["gpus"] for vf in g["vfs"] if vf["vgpu"]}


def test_held_vgpu_blocks_its_replacement_and_removal(a2_node: SimNode, tmp_path: Path) -> None:
    a2_node.ok("apply", SEED, "--yes")
    before = _vgpus(a2_node)
    held = {before["0000:08:00.5"]["uuid"], before["0000:08:00.7"]["uuid"]}
    for uuid in held:
        assert run_vgpuctl("sim", "hold", a2_node.dir, uuid).returncode == 0

    desired = tmp_path / "changed.yaml"
    desired.write_text(CHANGED)
    plan = a2_node.run("plan", desired, "--detailed-exitcode")
    assert plan.returncode == 2
    assert "! vgpu-remove 0000:08:00.5" in plan.stdout
    assert "! vgpu-remove 0000:08:00.7" in plan.stdout
    assert "! vgpu-create 0000:08:00.5" in plan.stdout  # depends on the blocked removal
    assert "2 blocked" in plan.stdout or "3 blocked" in plan.stdout

    res = a2_node.run("apply", desired, "--yes")
    assert res.returncode == 2, res.stdout + res.stderr
    after = _vgpus(a2_node)
    assert {after[a]["uuid"] for a in ("0000:08:00.5", "0000:08:00.7")} == held
    assert after["0000:08:00.5"]["type"] == "NVIDIA A2-4Q"

    # Once the VM lets go, the same desired state converges.
    for uuid in held:
        assert run_vgpuctl("sim", "release", a2_node.dir, uuid).returncode == 0
    assert "Converged" in a2_node.ok("apply", desired, "--yes").stdout
    final = _vgpus(a2_node)
    assert sorted(final) == ["0000:08:00.4", "0000:08:00.5", "0000:08:00.6"]
    assert {v["type"] for v in final.values()} == {"NVIDIA A2-4A"}
    # Untouched VFs keep their vGPU (and its UUID): the plan was minimal.
    assert final["0000:08:00.4"] == before["0000:08:00.4"]
