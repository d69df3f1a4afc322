"""What a scan reads depends on who needs it: a plan with no cluster reads no VF's
``available_instances`` (only the cluster's objects and the node summary show them), and
``status`` reads every one. Judged from outside: every ``available_instances`` of the simulated
tree is replaced by a FIFO, which the scan refuses to read ("is a FIFO, not a sysfs
attribute"), so a command that reads one fails and names it."""

from __future__ import annotations

import os
from pathlib import Path

from tests.cluster_node import VGPUS, cluster_node, stored
from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import SEED, make_sim


def _fifos_for_counts(root: Path) -> int:
    count = 0
    for path in root.rglob("available_instances"):
        if path.is_file() and not path.is_symlink():
            path.unlink()
            os.mkfifo(path)
            count += 1
    return count


def test_plan_and_apply_without_a_cluster_read_no_count_and_status_reads_them(
    tmp_path: Path,
) -> None:
    node = make_sim(tmp_path / "a2", ["A2@0000:08:00.0"])
    node.ok("apply", SEED, "--yes")
    # 16 VFs x 15 types, the 4 VFs with a vGPU included.
    assert _fifos_for_counts(tmp_path / "a2" / "sys") == 16 * 15

    plan = node.run("plan", SEED, "--detailed-exitcode")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "No changes." in plan.stdout
    applied = node.ok("apply", SEED, "--yes")
    assert "FIFO" not in applied.stdout + applied.stderr

    status = node.run("status")
    assert status.returncode != 0
    assert "/available_instances is a FIFO, not a sysfs attribute: not read" in status.stderr


def test_with_a_cluster_the_counts_are_read_and_published(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """The cluster's objects show each VF's available types: a plan against a cluster reads
    them (it fails on the FIFOs), and what apply published says what the host offered."""
    node = cluster_node(tmp_path, emu)
    desired = tmp_path / "half.yaml"
    desired.write_text(
        "apiVersion: vgpu.reconciler.dev/v1alpha1\nkind: VGPUDesiredState\n"
        "metadata: {name: half}\nspec:\n  nodes:\n"
        f"    {node.node}:\n      gpus:\n"
        '        - address: "0000:08:00.0"\n          sriov: enabled\n'
        "          profiles: {NVIDIA A2-4Q: 2}\n"
    )
    node.ok("apply", desired, "--yes")
    # Two of the A2's four 4 GB slices are left: a free VF can make another 4 GB vGPU.
    vgpu = stored(emu, VGPUS, f"{node.node}-000008023")
    assert "NVIDIA A2-4Q" in vgpu["status"]["availableTypes"], vgpu["status"]
    _fifos_for_counts(node.dir / "sys")
    plan = node.run("plan", desired)
    assert plan.returncode != 0
    assert "/available_instances is a FIFO, not a sysfs attribute: not read" in plan.stderr
