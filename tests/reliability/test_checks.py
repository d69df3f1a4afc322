"""The reliability suite's judges catch what they are there to catch.

A suite whose checks cannot fail proves nothing: each check is shown a host, a plan or an
output line that breaks its invariant, and one that does not.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from reconciler.sim import build_host, hold
from tests.reliability.bad_input import line_form, samples
from tests.reliability.faults import emulator
from tests.reliability.generators import (
    at_a_maximum,
    draw_examples,
    has_work,
    host_and_desired,
    unrecorded_on_both,
)
from tests.reliability.hosts import (
    REPO,
    Held,
    SimNode,
    TreeVgpu,
    Truth,
    orphans,
    processes_of,
    read_truth,
    reap_strays,
    safety,
    unlisted_vfio_vgpus,
)
from tests.reliability.suite import summary
from tests.reliability.sweeper import KUBEVIRT, NAMESPACE, Sweeps, seed_cluster

GPU = "0000:08:00.0"
U1, U2, U3 = (f"{n}0000000-0000-4000-8000-000000000000" for n in (1, 2, 3))


def _truth(*vgpus: tuple[str, str, int, str]) -> Truth:
    vfs = {GPU: {i: f"0000:08:00.{4 + i}" for i in range(4)}}
    tree = tuple(TreeVgpu(u, GPU, vf, i, t) for u, vf, i, t in vgpus)
    return Truth(vfs, tree, {v.uuid: v.vf for v in tree})


def test_read_truth_sees_what_the_simulator_built(tmp_path: Path) -> None:
    spec = {
        "gpus": [{"model": "A2", "address": GPU,
                  "vgpus": {0: "NVIDIA A2-4Q", 2: {"type": "NVIDIA A2-4A", "uuid": U1}}}],
        "extraDevices": False,
    }  # fmt: skip
    build_host(tmp_path / "h", spec)
    truth = read_truth(tmp_path / "h" / "sys", [GPU])
    assert len(truth.vfs[GPU]) == 16
    assert sorted((v.index, v.type_name) for v in truth.vgpus) == [
        (0, "NVIDIA A2-4Q"),
        (2, "NVIDIA A2-4A"),
    ]
    assert [v.vf for v in truth.vgpus if v.uuid == U1] == ["0000:08:00.6"]
    assert safety(truth, {}).ok
    # A second mdev directory on VF 0, unknown to the mdev bus: crowded and dangling.
    vf0 = tmp_path / "h" / "sys" / "bus" / "pci" / "devices" / "0000:08:00.4"
    existing = next(v for v in truth.vgpus if v.index == 0)
    (vf0 / U2).mkdir()
    os.symlink(os.readlink(vf0 / existing.uuid / "mdev_type"), vf0 / U2 / "mdev_type")
    found = safety(read_truth(tmp_path / "h" / "sys", [GPU]), {})
    assert found.crowded and found.dangling and not found.ok


def test_safety_finds_duplicates_and_in_use_vgpus_removed_or_changed() -> None:
    held = {U1: Held(U1, "0000:08:00.4", "NVIDIA A2-4Q")}
    assert safety(_truth((U1, "0000:08:00.4", 0, "NVIDIA A2-4Q")), held).ok
    assert safety(_truth(), held).in_use_removed
    assert safety(_truth((U1, "0000:08:00.5", 1, "NVIDIA A2-4Q")), held).in_use_removed
    assert safety(_truth((U1, "0000:08:00.4", 0, "NVIDIA A2-4A")), held).in_use_removed
    twice = _truth((U1, "0000:08:00.4", 0, "NVIDIA A2-4Q"), (U1, "0000:08:00.5", 1, "NVIDIA A2-4Q"))
    assert safety(twice, {}).duplicates


def test_orphans_per_vf_counts_and_sriov_off() -> None:
    truth = _truth((U1, "0000:08:00.4", 0, "NVIDIA A2-4Q"), (U2, "0000:08:00.5", 1, "NVIDIA A2-4Q"))
    per_vf = [{"address": GPU, "sriov": "enabled", "vgpus": {0: "A2-4Q", "0000:08:00.5": "A2-4Q"}}]
    assert orphans(truth, per_vf, set()) == []
    one = [{"address": GPU, "sriov": "enabled", "vgpus": {0: "NVIDIA A2-4Q"}}]
    assert len(orphans(truth, one, set())) == 1
    assert orphans(truth, one, {U2}) == []  # held: accounted for
    counts = [{"address": GPU, "sriov": "enabled", "profiles": {"NVIDIA A2-4Q": 1}}]
    assert len(orphans(truth, counts, set())) == 1
    assert [o.split()[2] for o in orphans(truth, counts, {U1})] == [U2]
    assert orphans(truth, counts, {U1, U2}) == []
    assert len(orphans(truth, [{"address": GPU, "sriov": "disabled"}], {U1})) == 1


def test_converged_is_the_oracles_verdict_with_the_plan_as_an_extra(tmp_path: Path) -> None:
    build_host(tmp_path / "h", {"gpus": [{"model": "A2", "address": GPU}], "extraDevices": False})
    node = SimNode(tmp_path / "h", "harvester-kgd9c")
    desired = tmp_path / "desired.yaml"
    desired.write_text((REPO / "desired-state" / "harvester-kgd9c.yaml").read_text())
    left = node.converged(desired)
    assert left and all(p.startswith("oracle: ") for p in left), left
    assert node.run("apply", desired, "--yes").returncode == 0
    assert node.converged(desired) == []
    # A vGPU gone behind vgpuctl's back (its directory and bus link removed by hand): the
    # oracle sees it from the tree.
    gone = read_truth(node.sysfs_root, [GPU]).vgpus[0]
    shutil.rmtree(node.sysfs_root / "bus" / "pci" / "devices" / gone.vf / gone.uuid)
    (node.sysfs_root / "bus" / "mdev" / "devices" / gone.uuid).unlink()
    left = node.converged(desired)
    assert any(gone.vf in p and "missing" in p for p in left), left


def test_cli_lines_must_name_the_file() -> None:
    paths = ["/tmp/d.yaml"]
    assert line_form("/tmp/d.yaml:3:5: unknown field 'x'", paths) == "located"
    assert line_form("/tmp/d.yaml: larger than 4 MiB", paths) == "file"
    assert line_form("error: /tmp/d.yaml: YAML nesting is too deep", paths) == "error-file"
    assert line_form("x' at metadata (allowed: name)", paths) is None
    assert line_form("/tmp/other.yaml:3:5: unknown field", paths) is None
    assert line_form("/tmp/d.yaml:", paths) is None


def test_generators_are_reproducible_and_varied() -> None:
    strategy = host_and_desired("n")
    first = draw_examples(strategy, count=20, seed_value=3, keep=has_work)
    assert first == draw_examples(strategy, count=20, seed_value=3, keep=has_work)
    assert len(first) == 20 and all(has_work(c) for c in first)
    kinds = {s.kind for s in draw_examples(samples(), count=200, seed_value=1)}
    assert len(kinds) >= 15, kinds


def _rng(n: int) -> random.Random:
    return random.Random(n)  # noqa: S311 - reproducible choices, not cryptography


def test_unrecorded_hosts_have_unlisted_vfio_vgpus_and_mdev_ones(tmp_path: Path) -> None:
    """``unrecorded_on_both`` fills a vfio GPU to a type's maximum (no VF lists the type any
    more: ``unlisted_vfio_vgpus`` counts them all) and gives another GPU mdev vGPUs; a host
    of one GPU gets the vfio one only; the same seed, the same host."""
    two = {
        "gpus": [
            {"model": "A2", "address": GPU, "sriov": "disabled", "vgpus": {}, "interface": "mdev"},
            {"model": "A2", "address": "0000:41:00.0", "sriov": "disabled", "vgpus": {},
             "interface": "vfio"},
        ],
        "extraDevices": False,
    }  # fmt: skip
    seen: set[str] = set()
    for n in range(2):  # seeds 0 and 1 fill one GPU each way
        filled = unrecorded_on_both(two, _rng(n))
        assert filled is not None and filled == unrecorded_on_both(two, _rng(n))
        build_host(tmp_path / f"h{n}", filled)
        sysfs = tmp_path / f"h{n}" / "sys"
        truth = read_truth(sysfs, [g["address"] for g in two["gpus"]])
        (vfio,) = [g for g in filled["gpus"] if g["interface"] == "vfio" and g["vgpus"]]
        seen.add(vfio["address"])
        assert unlisted_vfio_vgpus(sysfs, [vfio["address"]]) == len(vfio["vgpus"]) > 0
        assert sum(1 for v in truth.vgpus if v.whole_vf) == len(vfio["vgpus"])
        assert any(not v.whole_vf for v in truth.vgpus), filled
    assert len(seen) == 2  # either GPU may be the full vfio one
    one = {**two, "gpus": two["gpus"][:1]}
    alone = unrecorded_on_both(one, _rng(0))
    assert alone is not None and alone == at_a_maximum(one, _rng(0))
    assert alone["gpus"][0]["interface"] == "vfio"


def test_reap_strays_kills_only_what_outlives_the_wait(tmp_path: Path) -> None:
    program = tmp_path / "bin" / "sriov-manage"
    program.parent.mkdir()
    program.write_text("import time\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, str(program)])
    try:
        deadline = time.monotonic() + 10
        while not processes_of(program) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert processes_of(program) == [proc.pid]
        assert reap_strays(program, wait=0.2) == [proc.pid]
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert processes_of(program) == []
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_a_heartbeat_counts_and_removes_what_the_sweep_takes(tmp_path: Path) -> None:
    """The scenarios' virt-handler heartbeat removes a vGPU whose type is not allow-listed and
    counts it, a held one counted and left: without blocking on the simulator's host lock,
    which it holds while it reads (a sweep that found something to remove used to wait for
    ever on that lock, so a loss hung the suite instead of being counted)."""
    spec = {
        "gpus": [{"model": "A2", "address": GPU,
                  "vgpus": {0: {"type": "NVIDIA A2-4Q", "uuid": U1},
                            1: {"type": "NVIDIA A2-4A", "uuid": U2},
                            2: {"type": "NVIDIA A2-4A", "uuid": U3}}}],
        "extraDevices": False,
    }  # fmt: skip
    host = tmp_path / "h"
    build_host(host, spec)
    hold(host, U3)
    with emulator(kubevirt=False) as emu:
        node = SimNode(host, "n", extra=seed_cluster(emu, tmp_path, host))
        sweeps = Sweeps()
        sweeps.heartbeat(node, emu)  # every type the host starts with is listed
        assert (sweeps.heartbeats, sweeps.lost) == (1, 0)
        cr = emu.get_object(*KUBEVIRT, namespace=NAMESPACE)
        entries = cr["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
        cr["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"] = [
            e for e in entries if e["mdevNameSelector"] != "NVIDIA A2-4A"
        ]
        emu.seed(cr)
        beat = threading.Thread(target=sweeps.heartbeat, args=(node, emu), daemon=True)
        beat.start()
        beat.join(timeout=30)
        assert not beat.is_alive(), "the heartbeat blocked"
    assert sweeps.heartbeats == 2
    assert sweeps.swept == {U2: "NVIDIA A2-4A"}
    assert sweeps.swept_held == {U3: "NVIDIA A2-4A"}
    assert sweeps.lost == 2
    assert sorted(v.uuid for v in read_truth(host / "sys", [GPU]).vgpus) == sorted([U1, U3])


def test_the_summary_adds_up_both_crash_scenarios_sweeps() -> None:
    def figures(runs: int, beats: int, lost: int, held: int) -> dict[str, object]:
        sweeper = {"heartbeats": beats, "vgpus_lost": lost, "in_use_removed": held}
        return {"runs": runs, "converged": runs, "sweeper": sweeper}

    both = {"crash_safety": figures(8, 25, 0, 0), "watch_crash_safety": figures(4, 90, 2, 1)}
    both["crash_safety"].update(
        runs_with_unlisted_vfio_vgpus=3, runs_unrecorded_on_both_interfaces=2, state_dir_deleted=4
    )
    both["watch_crash_safety"].update(
        runs_with_unlisted_vfio_vgpus=2, runs_unrecorded_on_both_interfaces=2, state_dir_deleted=2
    )
    out = summary(both)
    assert out["killed_and_restarted"]["runs"] == 12
    assert out["killed_and_restarted"]["runs_with_unlisted_vfio_vgpus"] == 5
    assert out["killed_and_restarted"]["runs_unrecorded_on_both_interfaces"] == 4
    assert out["killed_and_restarted"]["state_dir_deleted"] == 6
    assert out["killed_and_restarted"]["sweeper"] == {
        "heartbeats": 115,
        "vgpus_lost": 2,
        "in_use_removed": 1,
    }
