"""No change breaks what it cannot rebuild (issue 29, item 4), through the CLI on a simulated A2.

Four A2-4Q, the one on VF .4 held by a VM; the desired state changes to two A2-8Q. No 8 GB
vGPU can be made beside a 4 GB one (equal size), so both creates wait for the VM. Before this
change ``apply`` removed the three free A2-4Q anyway (4 usable vGPUs to 1, nothing gained until
the VM left), and its blocked list named other VFs (.5/.6) than the plan had (08:01.0/08:01.1).
Now the removals that only make room wait too, with the same cause; ``--partial`` gives the
capacity up early, and names the same VFs in plan and apply. Expected values are written by
hand from the A2's rules (16 GB; equal-size vGPUs).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.cluster_node import cluster_node
from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import NODE, SimNode, make_sim, run_vgpuctl
from tests.watch_agent import Watch, vgpus, wait_for

FOUR_4Q = f"""\
apiVersion: vgpu.reconciler.dev/v1alpha1
kind: VGPUDesiredState
metadata: {{name: lab}}
spec:
  nodes:
    {NODE}:
      gpus:
        - {{address: "0000:08:00.0", sriov: enabled, profiles: {{A2-4Q: 4}}}}
"""
TWO_8Q = FOUR_4Q.replace("A2-4Q: 4", "A2-8Q: 2")
HELD = "0000:08:00.4"
WAITS = f"waits for NVIDIA A2-4Q on {HELD} (in use) to be removed"


def _held_node(tmp_path: Path) -> tuple[SimNode, Path]:
    """Four A2-4Q on .4–.7, the one on .4 held by a VM; the desired state asks for 2 × 8Q."""
    node = make_sim(tmp_path / "host", ["A2@0000:08:00.0"])
    desired = tmp_path / "desired.yaml"
    desired.write_text(FOUR_4Q)
    node.ok("apply", desired, "--yes")
    uuid = _by_vf(node)[HELD][1]
    assert run_vgpuctl("sim", "hold", node.dir, uuid).returncode == 0
    desired.write_text(TWO_8Q)
    return node, desired


def _by_vf(node: SimNode) -> dict[str, tuple[str, str]]:
    """VF address → (type, UUID) of each vGPU the host has."""
    inventory = json.loads(node.ok("status", "-o", "json").stdout)
    return {
        vf["address"]: (vf["vgpu"]["type"], vf["vgpu"]["uuid"])
        for gpu in inventory["gpus"]
        for vf in gpu["vfs"]
        if vf["vgpu"]
    }


def _steps(doc: dict[str, object], section: str) -> list[tuple[str, str]]:
    return [(s["kind"], s["target"]) for s in doc[section]]  # type: ignore[index, attr-defined]


def test_a_change_that_cannot_finish_removes_nothing(tmp_path: Path) -> None:
    node, desired = _held_node(tmp_path)
    before = _by_vf(node)
    assert [t for t, _ in before.values()] == ["NVIDIA A2-4Q"] * 4

    doc = json.loads(node.ok("plan", desired, "-o", "json").stdout)
    assert _steps(doc, "actions") == []
    assert _steps(doc, "blocked") == [
        ("vgpu-remove", "0000:08:00.4"),
        ("vgpu-remove", "0000:08:00.5"),
        ("vgpu-remove", "0000:08:00.6"),
        ("vgpu-remove", "0000:08:00.7"),
        ("vgpu-create", "0000:08:00.5"),
        ("vgpu-create", "0000:08:00.6"),
    ]
    reasons = {(b["kind"], b["target"]): b["reason"] for b in doc["blocked"]}
    assert reasons[("vgpu-remove", "0000:08:00.6")] == (
        "VF 0000:08:00.6 hosts NVIDIA A2-4Q; desired NVIDIA A2-8Q; deferred: it only makes room "
        f"for NVIDIA A2-8Q, which {WAITS} (apply --partial removes it now)"
    )
    assert reasons[("vgpu-remove", "0000:08:00.7")].startswith(
        "VF 0000:08:00.7 hosts NVIDIA A2-4Q; no vGPU desired; deferred: "
    )
    assert reasons[("vgpu-create", "0000:08:00.5")] == WAITS

    res = node.run("apply", desired, "--yes")
    assert res.returncode == 2, res.stdout + res.stderr  # blocked changes, nothing done
    assert _by_vf(node) == before  # four usable vGPUs stay


def test_partial_gives_capacity_up_and_names_the_vfs_the_plan_named(tmp_path: Path) -> None:
    node, desired = _held_node(tmp_path)
    held_uuid = _by_vf(node)[HELD][1]
    doc = json.loads(node.ok("plan", desired, "--partial", "-o", "json").stdout)
    assert _steps(doc, "actions") == [
        ("vgpu-remove", "0000:08:00.5"),
        ("vgpu-remove", "0000:08:00.6"),
        ("vgpu-remove", "0000:08:00.7"),
        ("device-plugin-refresh", "nvidia.com/NVIDIA_A2-4Q"),
    ]
    planned_creates = [t for k, t in _steps(doc, "blocked") if k == "vgpu-create"]
    assert planned_creates == ["0000:08:00.5", "0000:08:00.6"]

    res = node.run("apply", desired, "--partial", "--yes")
    assert res.returncode == 2, res.stdout + res.stderr
    assert _by_vf(node) == {HELD: ("NVIDIA A2-4Q", held_uuid)}
    # What apply reports after its run, as it words it.
    _, _, report = res.stdout.partition("3 change(s) remain blocked:\n")
    reported = [
        line.split()[2].rstrip(":")
        for line in report.splitlines()
        if line.lstrip().startswith("! vgpu-create")
    ]
    assert reported == planned_creates
    # Planned again now: the same VFs.
    again = json.loads(node.run("plan", desired, "-o", "json").stdout)
    assert [t for k, t in _steps(again, "blocked") if k == "vgpu-create"] == planned_creates

    # The VM lets go: the change finishes on the VFs named all along.
    assert run_vgpuctl("sim", "release", node.dir, held_uuid).returncode == 0
    node.ok("apply", desired, "--yes")
    assert _by_vf(node).keys() == {"0000:08:00.5", "0000:08:00.6"}
    assert {t for t, _ in _by_vf(node).values()} == {"NVIDIA A2-8Q"}


def test_partial_is_refused_in_delegate_mode(tmp_path: Path, emu: ApiServerEmulator) -> None:
    node = cluster_node(tmp_path, emu)
    desired = tmp_path / "desired.yaml"
    desired.write_text(TWO_8Q)
    for command in (["plan"], ["apply", "--yes"]):
        res = node.run(*command, desired, "--partial", "--delegate", "harvester")
        assert (res.returncode, res.stderr) == (
            1,
            "error: --partial is for node-local mode, and this run is in delegate mode "
            "(--delegate none: this node's host)\n",
        )


def test_watch_keeps_the_vgpus_unless_partial(
    tmp_path: Path, start_watch: Callable[..., Watch]
) -> None:
    node, desired = _held_node(tmp_path)
    before = vgpus(node)
    watch = start_watch(node, desired)
    wait_for(lambda: watch.metric("vgpuctl_blocked_actions") == 6, "six blocked steps")
    assert watch.metric("vgpuctl_converged") == 0
    assert vgpus(node) == before
    watch.kill()

    partial = start_watch(node, desired, "--partial")
    wait_for(lambda: len(vgpus(node)) == 1, "the three free A2-4Q removed")
    wait_for(lambda: partial.metric("vgpuctl_blocked_actions") == 3, "three blocked steps")
