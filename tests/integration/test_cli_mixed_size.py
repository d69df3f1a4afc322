"""Mixed-size mode (docs/domain.md §4), run as a user runs it: ``sim init``, then ``plan``,
``apply``, ``status``, ``export`` as subprocesses, with the simulator's ``nvidia-smi`` found
beside its ``sriov-manage``.

The facts the expectations are written from: ``nvidia-smi vgpu -i <GPU> -shm 1`` puts a GPU in
mixed-size mode; the driver takes it only after ``sriov-manage -e`` and while the GPU hosts no
vGPU, and ``sriov-manage -d`` or a reboot clears it; in that mode an L40S (48 GB) may host an
8Q beside a 16Q. The host is judged from the simulator's own state and its call counters.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.simnode import SimNode, run_vgpuctl

GPU = "0000:41:00.0"
VF0, VF1, VF2 = "0000:41:00.4", "0000:41:00.5", "0000:41:00.6"


def sim(tmp_path: Path, interface: str) -> SimNode:
    res = run_vgpuctl(
        "sim", "init", tmp_path / "host", "--gpu", f"L40S@{GPU}", "--interface", interface
    )
    assert res.returncode == 0, res.stderr
    assert "VGPUCTL_NVIDIA_SMI=" in res.stdout  # sim init says how to drive it
    return SimNode(tmp_path / "host")


def desired(tmp_path: Path, gpu: dict[str, object], name: str = "desired.yaml") -> Path:
    doc = {
        "apiVersion": "vgpu.reconciler.dev/v1alpha1",
        "kind": "VGPUDesiredState",
        "metadata": {"name": "mixed"},
        "spec": {"nodes": {"harvester-kgd9c": {"gpus": [{"address": GPU, **gpu}]}}},
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def state(node: SimNode) -> dict[str, object]:
    """The simulator's record of the GPU: its mode, and the type of each VF's vGPU."""
    raw = json.loads((node.dir / "sys" / ".vgpuctl-sim" / "state.json").read_text())
    (gpu,) = [g for g in raw["gpus"] if g["address"] == GPU]
    return gpu  # type: ignore[no-any-return]


def counters(node: SimNode) -> dict[str, int]:
    raw = json.loads((node.dir / "sys" / ".vgpuctl-sim" / "state.json").read_text())
    return raw["counters"]  # type: ignore[no-any-return]


MIXED = {
    "sriov": "enabled",
    "mode": "mixed-size",
    "vgpus": {VF0: "NVIDIA L40S-16Q", VF1: "NVIDIA L40S-8Q"},
}


def test_an_l40s_gets_two_sizes_in_mixed_size_mode(tmp_path: Path) -> None:
    for interface in ("vfio", "mdev"):
        node = sim(tmp_path / interface, interface)
        path = desired(tmp_path / interface, MIXED)
        plan = json.loads(node.ok("plan", path, "-o", "json").stdout)
        assert [(a["kind"], a["target"]) for a in plan["actions"] if a["phase"] == "host"] == [
            ("sriov-enable", GPU),
            ("vgpu-mode", GPU),
            ("vgpu-create", VF0),
            ("vgpu-create", VF1),
        ]
        node.ok("apply", path, "--yes")
        gpu = state(node)
        assert gpu["vgpuMode"] == "mixed-size", interface
        assert counters(node)["nvidiaSmiCalls"] == 1  # one switch, nothing else
        # Converged: planning again reads the mode (one nvidia-smi -q per run, for the GPU
        # declared mixed-size) and finds it so.
        queries = counters(node).get("nvidiaSmiQueries", 0)
        assert "No changes" in node.ok("plan", path).stdout
        assert node.run("assert", path).returncode == 0
        assert counters(node).get("nvidiaSmiQueries", 0) == queries + 2
        # status reads it and says so; export writes it, and the export plans to no changes.
        shown = node.ok("status")
        assert "2 vGPUs, mixed-size mode" in shown.stderr
        exported = tmp_path / interface / "export.yaml"
        exported.write_text(node.ok("export").stdout)
        doc = yaml.safe_load(exported.read_text())
        (entry,) = doc["spec"]["nodes"]["harvester-kgd9c"]["gpus"]
        assert entry["mode"] == "mixed-size"
        assert "No changes" in node.ok("plan", exported).stdout


def test_an_equal_size_node_never_runs_nvidia_smi(tmp_path: Path) -> None:
    # The mode is read only for GPUs wanted in mixed-size mode: a node that never asks for it
    # needs no nvidia-smi at all, and a missing one changes nothing.
    node = sim(tmp_path, "vfio")
    two = desired(tmp_path, {"sriov": "enabled", "profiles": {"NVIDIA L40S-8Q": 2}}, "2.yaml")
    node.ok("apply", two, "--yes")  # sriov-enable, then creates
    four = desired(tmp_path, {"sriov": "enabled", "profiles": {"NVIDIA L40S-8Q": 4}}, "4.yaml")
    node.ok("apply", four, "--yes")  # creates on a GPU whose SR-IOV is on
    seen = counters(node)
    assert seen.get("nvidiaSmiCalls", 0) == 0 and seen.get("nvidiaSmiQueries", 0) == 0
    six = desired(tmp_path, {"sriov": "enabled", "profiles": {"NVIDIA L40S-8Q": 6}}, "6.yaml")
    node.ok("apply", six, "--yes", "--nvidia-smi", "/nonexistent/nvidia-smi")
    assert "No changes" in node.ok("plan", six).stdout


def test_a_saved_plan_carries_the_mode(tmp_path: Path) -> None:
    # The plan file embeds its desired state; the mode must survive it, or the fresh plan made
    # under the lock would judge the two sizes by equal-size rules and refuse.
    node = sim(tmp_path, "vfio")
    path = desired(tmp_path, MIXED)
    saved = tmp_path / "mixed.plan"
    node.ok("plan", path, "--out", saved)
    doc = json.loads(saved.read_text())
    (entry,) = doc["desiredState"]["spec"]["nodes"]["harvester-kgd9c"]["gpus"]
    assert entry["mode"] == "mixed-size"
    node.ok("apply", saved, "--yes")
    assert state(node)["vgpuMode"] == "mixed-size"
    assert "No changes" in node.ok("plan", path).stdout


def test_after_a_reboot_the_mode_is_set_again_before_the_vgpus(tmp_path: Path) -> None:
    node = sim(tmp_path, "vfio")
    path = desired(tmp_path, MIXED)
    node.ok("apply", path, "--yes")
    assert run_vgpuctl("sim", "reboot", node.dir).returncode == 0
    assert state(node)["vgpuMode"] == "equal-size"  # a reboot clears it, with the vGPUs
    plan = json.loads(node.ok("plan", path, "-o", "json").stdout)
    assert [a["kind"] for a in plan["actions"] if a["phase"] == "host"][:3] == [
        "sriov-enable",
        "vgpu-mode",
        "vgpu-create",
    ]
    node.ok("apply", path, "--yes")
    assert state(node)["vgpuMode"] == "mixed-size"
    assert "No changes" in node.ok("plan", path).stdout


def test_a_gpu_whose_vgpus_stay_is_not_switched_and_says_why(tmp_path: Path) -> None:
    # Equal-size first: one 8Q. Then mixed-size with a 16Q added beside it: the 8Q stays, so
    # the switch (refused by the driver under a vGPU) and the 16Q wait, blocked, named.

    node = sim(tmp_path, "vfio")
    equal = desired(tmp_path, {"sriov": "enabled", "vgpus": {VF0: "NVIDIA L40S-8Q"}}, "eq.yaml")
    node.ok("apply", equal, "--yes")
    more = desired(
        tmp_path,
        {
            "sriov": "enabled",
            "mode": "mixed-size",
            "vgpus": {VF0: "NVIDIA L40S-8Q", VF2: "NVIDIA L40S-16Q"},
        },
    )
    plan = json.loads(node.ok("plan", more, "-o", "json").stdout)
    assert [a["kind"] for a in plan["actions"] if a["phase"] == "host"] == []
    assert [(b["kind"], b["target"]) for b in plan["blocked"]] == [
        ("vgpu-mode", GPU),
        ("vgpu-create", VF2),
    ]
    assert "it is equal-size" in plan["blocked"][0]["reason"]  # read through nvidia-smi -q
    assert node.run("apply", more, "--yes").returncode == 2  # blocked: nothing it can do
    assert counters(node).get("nvidiaSmiCalls", 0) == 0  # no switch was tried
    assert counters(node)["nvidiaSmiQueries"] >= 1  # the mode was read
    assert state(node)["vgpuMode"] == "equal-size"
    # Where nvidia-smi cannot tell, the mode of a GPU with vGPUs is unknown: still blocked,
    # with a note saying why, never switched on a guess.
    unknown = json.loads(node.ok("plan", more, "-o", "json", "--nvidia-smi", "/bin/false").stdout)
    assert "its mode could not be read" in unknown["blocked"][0]["reason"]
    assert any("vGPU mode of GPU 0000:41:00.0 not known" in n for n in unknown["notes"])


def test_a_declared_mode_the_gpu_is_not_in_is_never_silent(tmp_path: Path) -> None:
    # One 8Q made in equal-size mode; then the same 8Q declared in mixed-size mode. Nothing is
    # to be created, and the 8Q stays, so the driver cannot switch the GPU: plan says so in a
    # note, and assert reports drift (exit 2) rather than "matches".
    node = sim(tmp_path, "vfio")
    equal = desired(tmp_path, {"sriov": "enabled", "vgpus": {VF0: "NVIDIA L40S-8Q"}}, "eq.yaml")
    node.ok("apply", equal, "--yes")
    mixed = desired(
        tmp_path, {"sriov": "enabled", "mode": "mixed-size", "vgpus": {VF0: "NVIDIA L40S-8Q"}}
    )
    plan = json.loads(node.ok("plan", mixed, "-o", "json").stdout)
    assert plan["actions"] == [] and plan["blocked"] == []
    (note,) = [n for n in plan["notes"] if "desired mixed-size mode" in n]
    assert note.startswith(f"GPU {GPU}: desired mixed-size mode, it is equal-size (nvidia-smi -q)")
    assert f"it hosts 1 vGPU (the first on {VF0})" in note
    shown = node.ok("plan", mixed).stdout
    assert "desired mixed-size mode, it is equal-size" in shown
    verdict = node.run("assert", mixed)
    assert verdict.returncode == 2, verdict.stdout
    assert "has drifted: its vGPU mode differs" in verdict.stdout
    assert state(node)["vgpuMode"] == "equal-size"
    # Where nvidia-smi cannot tell, the plan says the mode was not read; never a guess.
    unread = json.loads(node.ok("plan", mixed, "-o", "json", "--nvidia-smi", "/bin/false").stdout)
    assert any(
        n.startswith(f"GPU {GPU}: desired mixed-size mode; its mode could not be read")
        for n in unread["notes"]
    )


def test_an_empty_gpu_declared_mixed_size_is_switched(tmp_path: Path) -> None:
    # SR-IOV on, no vGPU, mixed-size declared with none wanted: the switch can run, so it is
    # planned (before, nothing was planned and assert said "matches" of an equal-size GPU).
    node = sim(tmp_path, "vfio")
    on = desired(tmp_path, {"sriov": "enabled"}, "on.yaml")
    node.ok("apply", on, "--yes")
    mixed = desired(tmp_path, {"sriov": "enabled", "mode": "mixed-size"})
    assert node.run("assert", mixed).returncode == 2
    plan = json.loads(node.ok("plan", mixed, "-o", "json").stdout)
    assert [(a["kind"], a["target"]) for a in plan["actions"] if a["phase"] == "host"] == [
        ("vgpu-mode", GPU)
    ]
    node.ok("apply", mixed, "--yes")
    assert state(node)["vgpuMode"] == "mixed-size"
    assert "No changes" in node.ok("plan", mixed).stdout
    assert node.run("assert", mixed).returncode == 0


def test_a_layout_that_fragments_is_refused_at_plan_time(tmp_path: Path) -> None:
    # Mixed-size mode, one 3Q made: the simulated driver put it at placement 0 (slots 0-2 of
    # the model's 48, one per GiB). Adding a 24Q and a 16Q: 3 + 24 + 16 = 43 of 48 GB, but a
    # 24Q begins only at 0 or 24 and a 16Q at 0, 16 or 32 (multiples of their sizes). 0 is
    # taken, so the 24Q goes to 24 (slots 24-47), and each 16Q placement then overlaps it (16)
    # or the 3Q (0) or it again (32): no set of placements holds them, and plan says which.
    node = sim(tmp_path, "vfio")
    one = desired(
        tmp_path, {"sriov": "enabled", "mode": "mixed-size", "vgpus": {VF0: "NVIDIA L40S-3Q"}}
    )
    node.ok("apply", one, "--yes")
    vf0 = node.dir / "sys" / "bus" / "pci" / "devices" / VF0 / "nvidia"
    assert (vf0 / "placement_id").read_text() == "0\n"
    more = desired(
        tmp_path,
        {
            "sriov": "enabled",
            "mode": "mixed-size",
            "vgpus": {VF0: "NVIDIA L40S-3Q", VF1: "NVIDIA L40S-24Q", VF2: "NVIDIA L40S-16Q"},
        },
        "more.yaml",
    )
    refused = node.run("plan", more)
    assert refused.returncode == 1, refused.stdout
    assert (
        f"NVIDIA L40S-16Q for VF {VF2} occupies 16 placement slots, and every placement it may "
        "begin at is taken (16 overlaps the NVIDIA L40S-24Q for VF "
        f"{VF1} (slots 24-47); 32 overlaps the NVIDIA L40S-24Q for VF {VF1} (slots 24-47))"
    ) in refused.stderr
    assert "fragmentation" in refused.stderr
    assert node.run("apply", more, "--yes").returncode == 1  # refused before any write
    raw = json.loads((node.dir / "sys" / ".vgpuctl-sim" / "state.json").read_text())
    assert [v["type"] for v in raw["vgpus"].values()] == ["NVIDIA L40S-3Q"]
    # Without the 3Q (removed first) the two fit (24Q at 0, 16Q at 32): a plan that removes
    # first is not checked, as the host shows only what can be placed now, and it says so.
    fits = desired(
        tmp_path,
        {
            "sriov": "enabled",
            "mode": "mixed-size",
            "vgpus": {VF1: "NVIDIA L40S-24Q", VF2: "NVIDIA L40S-16Q"},
        },
        "fits.yaml",
    )
    assert "placement not checked (vGPUs are removed first" in node.ok("plan", fits).stdout
    node.ok("apply", fits, "--yes")
    assert "No changes" in node.ok("plan", fits).stdout


def test_a_host_without_placement_facts_is_planned_as_before_and_says_so(tmp_path: Path) -> None:
    # mdev shows no placement facts (nor does any real host we know of): a mixed-size layout is
    # planned by the framebuffer alone, with a note that placement was not checked.
    for interface in ("mdev", "vfio"):
        node = sim(tmp_path / interface, interface)
        path = desired(tmp_path / interface, MIXED)
        plan = json.loads(node.ok("plan", path, "-o", "json").stdout)
        note = f"GPU {GPU} (NVIDIA L40S): placement not checked (the host shows no placement facts)"
        # SR-IOV still off: neither interface can show placements before the mode is set.
        assert note in plan["notes"], interface
        assert [a["kind"] for a in plan["actions"] if a["phase"] == "host"][-2:] == [
            "vgpu-create",
            "vgpu-create",
        ]
    # mdev in mixed-size mode, one more vGPU wanted: still no facts, still said.
    node = SimNode(tmp_path / "mdev" / "host")
    node.ok("apply", desired(tmp_path / "mdev", MIXED), "--yes")
    three = desired(
        tmp_path / "mdev",
        {**MIXED, "vgpus": {**MIXED["vgpus"], VF2: "NVIDIA L40S-8Q"}},  # type: ignore[dict-item]
        "three.yaml",
    )
    shown = node.ok("plan", three).stdout
    assert "placement not checked (the host shows no placement facts)" in shown


def test_placement_facts_the_host_shows_otherwise_are_not_used(tmp_path: Path) -> None:
    # A configured VF whose placement_id is not a number, or a placements file with a line not
    # in its format: the layout is planned as before (the 8Q fits either way), and the note
    # says why placement was not checked. Never a guess from half a fact.
    node = sim(tmp_path, "vfio")
    one = desired(
        tmp_path, {"sriov": "enabled", "mode": "mixed-size", "vgpus": {VF0: "NVIDIA L40S-3Q"}}
    )
    node.ok("apply", one, "--yes")
    two = desired(
        tmp_path,
        {
            "sriov": "enabled",
            "mode": "mixed-size",
            "vgpus": {VF0: "NVIDIA L40S-3Q", VF1: "NVIDIA L40S-8Q"},
        },
        "two.yaml",
    )
    assert "placement not checked" not in node.ok("plan", two).stdout  # checked: it fits
    devices = node.dir / "sys" / "bus" / "pci" / "devices"

    def overwrite(path: Path, text: str) -> None:
        path.chmod(0o644)
        path.write_text(text)
        path.chmod(0o444)

    placement_id = devices / VF0 / "nvidia" / "placement_id"
    overwrite(placement_id, "Not Applicable\n")
    plan = json.loads(node.ok("plan", two, "-o", "json").stdout)
    assert (
        f"GPU {GPU} (NVIDIA L40S): placement not checked (VF {VF0} hosts a vGPU but its "
        "nvidia/placement_id reads 'Not Applicable')"
    ) in plan["notes"]
    assert [a["target"] for a in plan["actions"] if a["kind"] == "vgpu-create"] == [VF1]
    overwrite(placement_id, "0\n")
    # The first VF with the file is the one read (VF0's, the same on every VF).
    placements = devices / VF0 / "nvidia" / "creatable_placements"
    overwrite(placements, placements.read_text() + "1152  : eight : 8 16\n")
    plan = json.loads(node.ok("plan", two, "-o", "json").stdout)
    (note,) = [n for n in plan["notes"] if "placement not checked" in n]
    assert "nvidia/creatable_placements: cannot read the line '1152  : eight : 8 16'" in note
