"""The apply scenarios at the ci size, with their invariants asserted (``just test``); the
watch scenarios' ci-size tests are ``test_watch_crash.py``, ``test_watch_race.py`` and
``test_watch_faults.py``.

The full size is ``python -m tests.reliability.suite`` (``just reliability``); here each scenario
runs small enough for the test suite and must still hold every invariant, and must actually
have exercised what it is about (something killed, the lock contended, bad input rejected).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.bad_input import bad_input
from tests.reliability.concurrency import concurrency
from tests.reliability.crash import crash_safety
from tests.reliability.faults import FAULTS, faults_survived
from tests.reliability.hosts import REPO
from tests.reliability.sizes import SIZES, Context, show

CI = SIZES["ci"]

pytestmark = pytest.mark.slow


def test_crash_safety_converges_every_time_and_loses_nothing(ctx: Context) -> None:
    f = crash_safety(ctx)
    assert f["runs"] == CI.crash_runs, show(f)
    assert f["converged"] == f["runs"], show(f)
    assert f["orphaned"] == 0, show(f)
    assert f["duplicates"] == 0, show(f)
    assert f["vfs_with_two_vgpus"] == 0, show(f)
    assert f["dangling_mdev_links"] == 0, show(f)
    assert f["in_use_removed"] == 0, show(f)
    assert f["not_converged_by_the_oracle"] == 0, show(f)
    assert f["tracebacks"] == 0, show(f)
    assert f["hung_processes"] == 0, show(f)
    assert f["stray_sriov_manage"] == 0, show(f)
    assert f["unmanaged_gpus_touched"] == 0, show(f)
    # KubeVirt's virt-handler swept after every process: it found nothing to take.
    assert f["sweeper"]["heartbeats"] >= f["runs"] * 2, show(f)
    assert f["sweeper"]["vgpus_lost"] == 0, show(f)
    assert f["sweeper"]["in_use_removed"] == 0, show(f)
    # It tested what it is about: applies died mid-way, with VMs holding vGPUs.
    assert f["kill_points"]["crash_after"]["killed"] >= 1, show(f)
    assert f["runs_with_held_vgpus"] >= 1, show(f)
    # ... from hosts with vfio vGPUs vgpuctl has no record of and no list names, and with the
    # state directory lost between runs (issue 31).
    assert f["runs_with_unlisted_vfio_vgpus"] >= 1, show(f)
    assert f["state_dir_deleted"] >= 1, show(f)
    assert f["ok"], show(f)


def test_bad_input_is_always_a_located_rejection(ctx: Context) -> None:
    f = bad_input(ctx)
    assert f["documents"] == CI.bad_documents, show(f)
    assert f["rejected"] > 0 and f["accepted"] > 0, show(f)
    assert f["exceptions"] == 0, show(f)
    assert f["unlocated_problems"] == 0, show(f)
    assert f["lines_out_of_range"] == 0, show(f)
    assert f["messages_with_line_breaks"] == 0, show(f)
    assert f["slow_documents"] == 0, show(f)
    cli = f["cli"]
    assert cli["documents"] >= CI.bad_cli_sample, show(f)
    assert cli["tracebacks"] == 0, show(f)
    assert cli["unlocated_lines"] == 0, show(f)
    assert cli["silent_rejections"] == 0, show(f)
    assert cli["exits"] == {"exit 1": cli["documents"]}, show(f)
    assert f["ok"], show(f)


def test_concurrent_applies_one_proceeds_no_double_create(ctx: Context) -> None:
    f = concurrency(ctx)
    assert f["trials"] == CI.concurrency_trials, show(f)
    assert f["trials_with_exactly_one_proceeding"] == f["trials"], show(f)
    assert f["lock_conflicts"] >= 1, show(f)  # the lock was contended
    assert f["lock_conflicts_naming_the_holder"] == f["lock_conflicts"], show(f)
    assert f["failed_observing_a_changing_host"] == 0, show(f)
    assert f["broken_or_unexpected"] == 0, show(f)
    assert f["double_creates"] == 0, show(f)
    assert f["host_safety_violations"] == 0, show(f)
    assert f["converged"] == f["trials"], show(f)
    assert f["ok"], show(f)


def test_faults_are_survived(ctx: Context) -> None:
    f = faults_survived(ctx)
    for name in FAULTS:
        assert f[name]["survived"], show(f[name])
    assert any(
        "cannot reach the Kubernetes API server" in m
        for m in f["api_server_down_before_apply"]["messages"]
    ), show(f)
    assert any(
        "did not finish within 2 s" in m for m in f["sriov_manage_hangs_past_timeout"]["messages"]
    )
    assert f["ok"], show(f)


def test_the_suite_prints_one_json_document(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    argv = [
        sys.executable, "-m", "tests.reliability.suite", "--size", "ci",
        "--only", "concurrency", "--seed", "7", "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # its scratch trees stay under tmp_path
    res = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, check=False, cwd=REPO, env=env
    )
    document = json.loads(res.stdout)
    assert json.loads(out.read_text()) == document
    assert list(document["scenarios"]) == ["concurrency"]
    assert document["summary"] == {
        "races": {
            "trials": CI.concurrency_trials,
            "double_creates": document["scenarios"]["concurrency"]["double_creates"],
        }
    }
    assert document["size"] == "ci" and document["seed"] == 7
    assert res.returncode == (0 if document["ok"] else 1), res.stderr
    assert "reliability: concurrency" in res.stderr
