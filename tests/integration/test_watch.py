"""``vgpuctl watch`` as the DaemonSet runs it: a subprocess against a simulated host.

Each test starts the agent with an ephemeral operations port (``--listen 127.0.0.1:0``; the
bound address is read from its first JSON log line), a short rescan interval, and kills it in
teardown whatever happened. Edits are made the ways production makes them: in place, by an
editor's rename-over, by a git-sync link swap, by a ConfigMap ``..data`` swap. Every wait is
bounded.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from reconciler.apply import NodeLock
from reconciler.sim import SimHost
from tests.simnode import NODE, SimNode, run_vgpuctl
from tests.watch_agent import (
    SEED_VGPUS,
    U4,
    U5,
    U7,
    Watch,
    seed_text,
    vgpus,
    wait_for,
)

# -- start, probes, metrics --------------------------------------------------------------------


def test_converges_at_start_and_answers_its_probes(
    node: SimNode, desired_dir: Path, start_watch: Callable[..., Watch]
) -> None:
    watch = start_watch(node, desired_dir)
    assert watch.url.startswith("http://127.0.0.1:")
    wait_for(watch.ready, "/readyz 200")
    assert watch.get("/readyz") == (200, "ready: converged\n")
    status, body = watch.get("/healthz")
    assert status == 200
    assert body.startswith("alive")
    assert vgpus(node) == SEED_VGPUS
    assert watch.reconciles() == 1
    assert watch.metric("vgpuctl_converged") == 1
    assert watch.metric("vgpuctl_actions_applied_total", kind="vgpu-create") == 4
    assert watch.metric("vgpuctl_desired_state_valid") == 1
    _, text = watch.get("/metrics")
    assert "_created" not in text
    assert watch.get("/nothing-here")[0] == 404


def test_readyz_says_why_before_the_first_convergence(
    node: SimNode, tmp_path: Path, start_watch: Callable[..., Watch]
) -> None:
    missing = tmp_path / "not-there-yet.yaml"
    watch = start_watch(node, missing)
    watch.wait_log(lambda d: d.get("level") == "error" and "cannot read" in d["msg"], "report")
    status, body = watch.get("/readyz")
    assert status == 503
    assert (
        body == f"no valid desired state yet: {missing}: cannot read: No such file or directory\n"
    )
    assert watch.get("/healthz")[0] == 200  # not ready is not dead
    missing.write_text(seed_text())
    wait_for(watch.ready, "ready once the file appears")
    assert vgpus(node) == SEED_VGPUS


# -- edits -------------------------------------------------------------------------------------


def test_an_edit_converges_within_seconds(
    node: SimNode, desired_dir: Path, start_watch: Callable[..., Watch]
) -> None:
    watch = start_watch(node, desired_dir)
    wait_for(watch.ready, "the first convergence")
    started = time.monotonic()
    (desired_dir / "harvester-kgd9c.yaml").write_text(seed_text("NVIDIA A2-4C"))
    wait_for(lambda: vgpus(node).get(U4) == "NVIDIA A2-4C", "the edit applied", timeout=5)
    assert time.monotonic() - started < 5
    wait_for(lambda: watch.reconciles() == 2, "the second reconcile")
    assert watch.metric("vgpuctl_drift_detected_total", source="desired") == 1
    assert {u: t for u, t in vgpus(node).items() if u != U4} == {
        u: t for u, t in SEED_VGPUS.items() if u != U4
    }  # one VF touched, the others kept


def test_an_invalid_edit_is_reported_and_the_previous_state_stays(
    node: SimNode, desired_dir: Path, start_watch: Callable[..., Watch]
) -> None:
    watch = start_watch(node, desired_dir)
    wait_for(watch.ready, "the first convergence")
    path = desired_dir / "harvester-kgd9c.yaml"
    path.write_text(seed_text().replace("sriov: enabled", "sriov: maybe"))
    line = watch.wait_log(lambda d: d["msg"].startswith("invalid desired state:"), "the report")
    assert line["level"] == "error"
    assert line["msg"].startswith(f"invalid desired state: {path}:21:")
    assert (line["file"], line["line"]) == (str(path), 21)
    wait_for(lambda: watch.metric("vgpuctl_desired_state_valid") == 0, "the metric")
    assert watch.metric("vgpuctl_errors_total", kind="validation") == 1
    assert vgpus(node) == SEED_VGPUS
    # The last valid state stays in force: a vGPU removed by hand comes back.
    sim = SimHost.open(node.dir / "sys")
    assert sim is not None
    sim.writer().write(f"bus/mdev/devices/{U5}/remove", "1")
    wait_for(lambda: watch.reconciles() == 2, "the repair")
    assert vgpus(node) == SEED_VGPUS
    assert watch.proc.poll() is None  # never a crash loop
    assert watch.ready()


def test_an_editors_rename_over_the_file_is_seen(
    node: SimNode, desired_dir: Path, start_watch: Callable[..., Watch]
) -> None:
    path = desired_dir / "harvester-kgd9c.yaml"
    watch = start_watch(node, path)
    wait_for(watch.ready, "the first convergence")
    tmp = desired_dir / ".harvester-kgd9c.yaml.tmp"
    tmp.write_text(seed_text("NVIDIA A2-4C"))
    os.replace(tmp, path)
    wait_for(lambda: vgpus(node).get(U4) == "NVIDIA A2-4C", "the renamed-over edit", timeout=5)


def test_a_git_sync_link_swap_of_the_whole_directory_is_seen(
    node: SimNode, tmp_path: Path, start_watch: Callable[..., Watch]
) -> None:
    root = tmp_path / "git"
    for sha, profile in (("aaa", "NVIDIA A2-4A"), ("bbb", "NVIDIA A2-4C")):
        checkout = root / ".worktrees" / sha / "desired-state"
        checkout.mkdir(parents=True)
        (checkout / "harvester-kgd9c.yaml").write_text(seed_text(profile))
    (root / "current").symlink_to(".worktrees/aaa")
    watch = start_watch(node, root / "current" / "desired-state")
    wait_for(watch.ready, "the first convergence")
    assert vgpus(node)[U4] == "NVIDIA A2-4A"
    # git-sync publishes a commit: a new link renamed over `current`.
    (root / "current.new").symlink_to(".worktrees/bbb")
    os.replace(root / "current.new", root / "current")
    wait_for(lambda: vgpus(node).get(U4) == "NVIDIA A2-4C", "the swapped checkout", timeout=5)
    # Then removes the old checkout; the next commit is seen from the new one.
    (root / ".worktrees" / "aaa" / "desired-state" / "harvester-kgd9c.yaml").unlink()
    (root / ".worktrees" / "bbb" / "desired-state" / "harvester-kgd9c.yaml").write_text(
        seed_text("NVIDIA A2-4A")
    )
    wait_for(lambda: vgpus(node).get(U4) == "NVIDIA A2-4A", "an edit in the new checkout", 5)


def test_a_configmap_volume_update_is_seen(
    node: SimNode, tmp_path: Path, start_watch: Callable[..., Watch]
) -> None:
    volume = tmp_path / "configmap"
    volume.mkdir()

    def publish(stamp: str, profile: str) -> None:
        # The kubelet's atomic writer: a new timestamped directory, then `..data` swapped.
        (volume / stamp).mkdir()
        (volume / stamp / "harvester-kgd9c.yaml").write_text(seed_text(profile))
        (volume / "..data_tmp").symlink_to(stamp)
        os.replace(volume / "..data_tmp", volume / "..data")
        link = volume / "harvester-kgd9c.yaml"
        if not link.is_symlink():
            link.symlink_to("..data/harvester-kgd9c.yaml")

    publish("..2025_01_01_00_00_00.1", "NVIDIA A2-4A")
    watch = start_watch(node, volume)
    wait_for(watch.ready, "the first convergence")
    publish("..2025_01_01_00_01_00.2", "NVIDIA A2-4C")
    wait_for(lambda: vgpus(node).get(U4) == "NVIDIA A2-4C", "the ConfigMap update", timeout=5)


# -- host drift --------------------------------------------------------------------------------


def test_after_sim_reboot_every_vgpu_is_back_with_its_uuid(
    node: SimNode, desired_dir: Path, start_watch: Callable[..., Watch]
) -> None:
    watch = start_watch(node, desired_dir)
    wait_for(watch.ready, "the first convergence")
    assert run_vgpuctl("sim", "reboot", node.dir).returncode == 0
    wait_for(lambda: watch.reconciles() == 2, "the reconcile after the reboot")
    assert vgpus(node) == SEED_VGPUS
    assert watch.metric("vgpuctl_drift_detected_total", source="host") >= 1
    assert watch.metric("vgpuctl_actions_applied_total", kind="sriov-enable") == 2


def test_a_vgpu_removed_by_hand_is_repaired(
    node: SimNode, desired_dir: Path, start_watch: Callable[..., Watch]
) -> None:
    watch = start_watch(node, desired_dir)
    wait_for(watch.ready, "the first convergence")
    sim = SimHost.open(node.dir / "sys")
    assert sim is not None
    sim.writer().write(f"bus/mdev/devices/{U7}/remove", "1")
    wait_for(lambda: watch.reconciles() == 2, "the repair")
    assert vgpus(node) == SEED_VGPUS
    watch.wait_log(lambda d: d["msg"] == "the host changed: reconciling", "the drift log line")


# -- the lock, signals -------------------------------------------------------------------------


def test_a_concurrent_apply_fails_fast_and_watch_waits_its_turn(
    node: SimNode, desired_dir: Path, start_watch: Callable[..., Watch]
) -> None:
    state = node.dir / "state"
    state.mkdir(exist_ok=True)
    lock = NodeLock(state, NODE, command="vgpuctl apply (another)")
    lock.acquire()
    try:
        watch = start_watch(node, desired_dir)
        watch.wait_log(lambda d: d.get("error") == "lock", "the lock failure")
        assert vgpus(node) == {}
        # An apply meanwhile is refused at once, naming the holder.
        refused = node.run("apply", desired_dir / "harvester-kgd9c.yaml", "--yes", timeout=30)
        assert refused.returncode == 1
        assert "another apply holds the lock" in refused.stderr
    finally:
        lock.release()
    wait_for(watch.ready, "convergence once the lock is free")
    assert vgpus(node) == SEED_VGPUS


def test_sigterm_exits_0_and_leaves_the_lock_free(
    node: SimNode, desired_dir: Path, start_watch: Callable[..., Watch]
) -> None:
    watch = start_watch(node, desired_dir)
    wait_for(watch.ready, "the first convergence")
    assert watch.stop(signal.SIGTERM) == 0
    assert any(d["msg"] == "stopped" for d in watch.logs())
    (desired_dir / "harvester-kgd9c.yaml").write_text(seed_text("NVIDIA A2-4C"))
    applied = node.run("apply", desired_dir / "harvester-kgd9c.yaml", "--yes", timeout=60)
    assert applied.returncode == 0, applied.stderr
    assert vgpus(node)[U4] == "NVIDIA A2-4C"


def test_sigint_exits_0_too(
    node: SimNode, desired_dir: Path, start_watch: Callable[..., Watch]
) -> None:
    watch = start_watch(node, desired_dir)
    wait_for(watch.ready, "the first convergence")
    assert watch.stop(signal.SIGINT) == 0


def test_sigterm_lets_the_action_under_way_finish(
    node: SimNode, desired_dir: Path, start_watch: Callable[..., Watch]
) -> None:
    # sriov-manage hangs; watch kills it after --timeout and fails the action. A SIGTERM
    # meanwhile must not cut the action short: the process waits for that end, then exits 0.
    assert run_vgpuctl("sim", "fail", node.dir, "--sriov", "hang").returncode == 0
    watch = start_watch(node, desired_dir, "--timeout", "2")
    watch.wait_log(lambda d: d["msg"].startswith("plan: sriov-enable"), "the action starting")
    sent = time.monotonic()
    assert watch.stop(signal.SIGTERM) == 0
    assert time.monotonic() - sent > 1.0  # it waited for sriov-manage's timeout
    failed = [d for d in watch.logs() if d.get("status") == "failed"]
    assert [d["kind"] for d in failed] == ["sriov-enable"]
    assert not any(d.get("kind") == "vgpu-create" and d.get("status") for d in watch.logs())


def test_a_write_the_kernel_holds_fails_in_time_and_watch_carries_on(
    node: SimNode, desired_dir: Path, start_watch: Callable[..., Watch]
) -> None:
    """A VM vgpuctl cannot see holds the vGPU to change: the removal blocks in the kernel. watch
    reports the write timeout, stays alive and healthy, and converges once the VM lets go."""
    watch = start_watch(node, desired_dir, "--write-timeout", "1")
    wait_for(watch.ready, "the first convergence")
    assert run_vgpuctl("sim", "hold", node.dir, U4, "--hidden").returncode == 0
    (desired_dir / "harvester-kgd9c.yaml").write_text(seed_text("NVIDIA A2-4Q"))
    failed = watch.wait_log(
        lambda d: "did not return within 1 s" in json.dumps(d), "the write timeout"
    )
    assert f"the kernel is waiting for a process to release vGPU {U4}" in json.dumps(failed)
    assert watch.proc.poll() is None
    assert watch.get("/healthz")[0] == 200
    assert run_vgpuctl("sim", "release", node.dir, U4).returncode == 0
    wait_for(lambda: vgpus(node).get(U4) == "NVIDIA A2-4Q", "U4 changed once the VM let go")
    wait_for(watch.ready, "convergence after the VM let go")
    assert watch.stop() == 0
