"""What a scan reads depends on who needs it: a plan with no cluster reads no VF's
``available_instances`` (only the cluster's objects and the node summary show them), and
``status`` reads every one. Judged from outside: every ``available_instances`` of the simulated
tree is replaced by a FIFO, which the scan refuses to read ("is a FIFO, not a sysfs
attribute"), so a command that reads one fails and names it."""

from __future__ import annotations

import os
from pathlib import Path

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
