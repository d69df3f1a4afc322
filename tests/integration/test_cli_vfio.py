"""vgpuctl on NVIDIA's vendor-specific VFIO interface (docs/domain.md §3b), run as a user runs
it: ``sim init --interface vfio``, then ``apply``/``plan``/``status`` as subprocesses.

Expectations are written from the domain facts, and the host is judged from its files: each
VF's ``nvidia/current_vgpu_type`` holds the id its ``creatable_vgpu_types`` listed for the
profile's name when SR-IOV came up (read here with a parser of the test's own), ``0`` on every
other VF. There is no mdev and no UUID: the VF is the vGPU.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import yaml

from tests.simnode import SimNode, run_vgpuctl

GPU = "0000:08:00.0"
#: The L40S's first VFs (sriov_offset 4, stride 1).
VF0, VF1, VF4 = "0000:08:00.4", "0000:08:00.5", "0000:08:01.0"


def vfio_sim(tmp_path: Path) -> SimNode:
    res = run_vgpuctl(
        "sim", "init", tmp_path / "host", "--gpu", f"L40S@{GPU}", "--interface", "vfio"
    )
    assert res.returncode == 0, res.stderr
    return SimNode(tmp_path / "host")


def desired(tmp_path: Path, gpu: dict[str, object], name: str = "desired.yaml") -> Path:
    doc = {
        "apiVersion": "vgpu.reconciler.dev/v1alpha1",
        "kind": "VGPUDesiredState",
        "metadata": {"name": "vfio"},
        "spec": {"nodes": {"harvester-kgd9c": {"gpus": [{"address": GPU, **gpu}]}}},
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def vf_dir(node: SimNode, vf: str) -> Path:
    return node.dir / "sys" / "bus" / "pci" / "devices" / vf / "nvidia"


def listed(node: SimNode, vf: str) -> dict[str, str]:
    """A VF's creatable_vgpu_types as name → id: a header line, then ``id : name`` lines."""
    lines = (vf_dir(node, vf) / "creatable_vgpu_types").read_text().splitlines()
    assert lines[0].split() == ["ID", ":", "vGPU", "Name"]
    return {
        name.strip(): type_id.strip() for type_id, name in (ln.split(":", 1) for ln in lines[1:])
    }


def currents(node: SimNode) -> dict[str, str]:
    """Every VF's current_vgpu_type that is not 0, by VF address."""
    out = {}
    for path in sorted((node.dir / "sys").glob("devices/**/nvidia/current_vgpu_type")):
        value = path.read_text().strip()
        if value != "0":
            out[path.parent.parent.name] = value
    return out


def test_a_vfio_host_is_enabled_and_configured_by_writing_type_ids(tmp_path: Path) -> None:
    node = vfio_sim(tmp_path)
    four = desired(tmp_path, {"sriov": "enabled", "profiles": {"NVIDIA L40S-8Q": 4}})
    plan = json.loads(node.ok("plan", four, "-o", "json").stdout)
    assert plan["interface"] == "none"  # no GPU has VFs yet (plan.schema.json)
    # ... but the host has no mdev bus, so its VFs will show vfio: each vGPU is named by its VF.
    creates = [a for a in plan["actions"] if a["kind"] == "vgpu-create"]
    assert [(a["target"], a["uuid"]) for a in creates] == [
        (vf, vf) for vf in (VF0, VF1, "0000:08:00.6", "0000:08:00.7")
    ]
    node.ok("apply", four, "--yes")
    # Every VF listed every type before any was configured: read the id of L40S-8Q off an
    # untouched VF now that the lists have narrowed to 8 GB types.
    eight_q = listed(node, VF4)["NVIDIA L40S-8Q"]
    assert currents(node) == dict.fromkeys((VF0, VF1, "0000:08:00.6", "0000:08:00.7"), eight_q)
    # The lists narrow as the driver's do: nothing on a configured VF, one size elsewhere.
    assert listed(node, VF0) == {}
    assert {n.rsplit("-", 1)[1][:1] for n in listed(node, VF4)} == {"8"}
    status = json.loads(node.ok("status", "-o", "json").stdout)
    (gpu,) = status["gpus"]
    assert gpu["interface"] == "vfio"
    assert [
        (v["address"], v["vgpu"]["uuid"], v["vgpu"]["type"]) for v in gpu["vfs"] if v["vgpu"]
    ] == [(vf, vf, "NVIDIA L40S-8Q") for vf in (VF0, VF1, "0000:08:00.6", "0000:08:00.7")]
    res = node.run("plan", four, "--detailed-exitcode")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "No changes" in res.stdout


def test_a_size_change_clears_every_vf_then_writes_the_new_id(tmp_path: Path) -> None:
    node = vfio_sim(tmp_path)
    node.ok(
        "apply", desired(tmp_path, {"sriov": "enabled", "profiles": {"NVIDIA L40S-8Q": 2}}), "--yes"
    )
    whole = desired(
        tmp_path, {"sriov": "enabled", "profiles": {"NVIDIA L40S-48Q": 1}}, "whole.yaml"
    )
    # Both 8Q go before the 48Q can be configured (equal size; 48Q: one per GPU).
    forty_eight = listed(node, VF4).get("NVIDIA L40S-48Q")
    assert forty_eight is None  # not creatable while 8 GB vGPUs exist: the id is unknown yet
    out = node.ok("apply", whole, "--yes").stdout
    assert "Plan: 1 to create, 0 to change, 2 to remove, 0 blocked." in out
    (configured,) = currents(node).items()
    # At the maximum every list is a header only: no VF names the type in use any more.
    assert all(listed(node, vf) == {} for vf in (VF0, VF1, VF4))
    # vgpuctl recorded what it configured, so a fresh run still knows the type: no change,
    # nothing blocked, and status names it.
    res = node.run("plan", whole, "--detailed-exitcode")
    assert res.returncode == 0, res.stdout + res.stderr
    status = json.loads(node.ok("status", "-o", "json").stdout)
    hosted = [v["vgpu"]["type"] for v in status["gpus"][0]["vfs"] if v["vgpu"]]
    assert hosted == ["NVIDIA L40S-48Q"]
    # Without the record (another state directory) the driver names the type (nvidia-smi
    # vgpu -s -v): still no change.
    other = ["--state-dir", str(tmp_path / "elsewhere")]
    res = node.run("plan", whole, *other, "--detailed-exitcode")
    assert res.returncode == 0, res.stdout + res.stderr
    # When the driver cannot say either, the type is shown by its id, and the GPU's changes
    # are blocked rather than guessed, saying how to find out.
    res = node.run("plan", whole, *other, "--nvidia-smi", "/bin/false", "-o", "json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["applyable"] is False
    assert all(f"has vGPU type {configured[1]}" in b["reason"] for b in plan["blocked"])
    assert all("'nvidia-smi vgpu -q'" in b["reason"] for b in plan["blocked"])
    assert any("its vGPU types could not be named" in n for n in plan["notes"])


def test_after_a_reboot_the_same_profile_comes_back_on_the_same_vf(tmp_path: Path) -> None:
    node = vfio_sim(tmp_path)
    layout = desired(
        tmp_path, {"sriov": "enabled", "vgpus": {0: "NVIDIA L40S-8Q", 4: "NVIDIA L40S-8A"}}
    )
    node.ok("apply", layout, "--yes")
    before = currents(node)
    assert set(before) == {VF0, VF4}
    assert run_vgpuctl("sim", "reboot", node.dir).returncode == 0
    assert currents(node) == {}
    plan = json.loads(node.ok("plan", layout, "-o", "json").stdout)
    host = [a for a in plan["actions"] if a["phase"] == "host"]
    assert [(a["kind"], a["target"]) for a in host] == [
        ("sriov-enable", GPU),
        ("vgpu-create", VF0),
        ("vgpu-create", VF4),
    ]
    assert [a["uuid"] for a in host[1:]] == [VF0, VF4]  # the VF, not a UUID
    node.ok("apply", layout, "--yes")
    assert currents(node) == before


def test_a_vf_a_vm_holds_is_never_cleared(tmp_path: Path) -> None:
    node = vfio_sim(tmp_path)
    node.ok(
        "apply", desired(tmp_path, {"sriov": "enabled", "vgpus": {0: "NVIDIA L40S-8Q"}}), "--yes"
    )
    # sim hold takes what names the vGPU: on vfio, the VF's address.
    assert run_vgpuctl("sim", "hold", node.dir, VF0).returncode == 0
    none = desired(tmp_path, {"sriov": "enabled", "vgpus": {}}, "none.yaml")
    res = node.run("apply", none, "--yes")
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"VF {VF0} hosts NVIDIA L40S-8Q, in use by simulated VM" in res.stdout
    assert set(currents(node)) == {VF0}


def test_one_host_with_a_gpu_on_each_interface(tmp_path: Path) -> None:
    """An A2 on mdev beside an A2 on vfio: each VF is driven through the interface it shows."""
    res = run_vgpuctl(
        "sim",
        "init",
        tmp_path / "host",
        "--gpu",
        "A2@0000:08:00.0",
        "--gpu",
        "A2@0000:09:00.0:vfio",
    )
    assert res.returncode == 0, res.stderr
    node = SimNode(tmp_path / "host")
    doc = {
        "apiVersion": "vgpu.reconciler.dev/v1alpha1",
        "kind": "VGPUDesiredState",
        "metadata": {"name": "mixed"},
        "spec": {
            "nodes": {
                "harvester-kgd9c": {
                    "gpus": [
                        {"address": a, "sriov": "enabled", "vgpus": {0: "NVIDIA A2-4Q"}}
                        for a in ("0000:08:00.0", "0000:09:00.0")
                    ]
                }
            }
        },
    }
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(doc))
    # Both start with SR-IOV off and the host has the mdev bus (for the first A2), so the plan
    # takes both for mdev. The vfio A2's first create stops the run before it writes: a vGPU
    # named by a UUID cannot be made on a VF that is its own vGPU. Run again: planned from
    # what the VFs show now, it converges.
    res = node.run("apply", path, "--yes")
    assert res.returncode == 1, res.stdout + res.stderr
    assert (
        "0000:09:00.4 shows NVIDIA's vfio interface, but the plan was made for mdev" in res.stderr
    )
    assert currents(node) == {}
    node.ok("apply", path, "--yes")
    # mdev: vgpuctl's UUID, uuid5(uuid5(DNS, "vgpu.reconciler.dev"), "<node>/<VF>"), on the bus.
    expected_uuid = str(
        uuid.uuid5(
            uuid.uuid5(uuid.NAMESPACE_DNS, "vgpu.reconciler.dev"), "harvester-kgd9c/0000:08:00.4"
        )
    )
    mdev = node.dir / "sys" / "bus" / "mdev" / "devices" / expected_uuid
    assert mdev.is_symlink()
    assert os.readlink(mdev).endswith(f"0000:08:00.4/{expected_uuid}")
    # vfio: the VF's own current_vgpu_type, nothing under the mdev bus for it.
    assert set(currents(node)) == {"0000:09:00.4"}
    assert len(os.listdir(node.dir / "sys" / "bus" / "mdev" / "devices")) == 1
    res = node.run("plan", path, "--detailed-exitcode")
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_saved_vfio_plan_runs_as_reviewed_and_export_round_trips(tmp_path: Path) -> None:
    """A saved plan carries the vfio form (the VF names its vGPU): apply runs it, ``assert``
    then holds, and what ``export`` writes plans no change."""
    node = vfio_sim(tmp_path)
    layout = desired(tmp_path, {"sriov": "enabled", "vgpus": {0: "NVIDIA L40S-8Q"}})
    planfile = tmp_path / "plan.json"
    node.ok("plan", layout, "--out", planfile)
    saved = json.loads(planfile.read_text())
    (create,) = [a for a in saved["actions"] if a["kind"] == "vgpu-create"]
    assert (create["target"], create["uuid"]) == (VF0, VF0)
    node.ok("apply", planfile, "--yes")
    assert node.run("assert", layout).returncode == 0
    exported = tmp_path / "exported.yaml"
    exported.write_text(node.ok("export").stdout)
    res = node.run("plan", exported, "--detailed-exitcode")
    assert res.returncode == 0, res.stdout + res.stderr
    # A saved plan whose vfio name was edited to another VF is refused before anything runs.
    node.ok(
        "plan",
        desired(tmp_path, {"sriov": "enabled", "vgpus": {1: "NVIDIA L40S-8Q"}}, "b.yaml"),
        "--out",
        planfile,
    )
    doc = json.loads(planfile.read_text())
    for action in doc["actions"]:
        if action["kind"] == "vgpu-create":
            action["uuid"] = "0000:08:00.7"
    planfile.write_text(json.dumps(doc))
    res = node.run("apply", planfile, "--yes")
    assert res.returncode != 0
    assert "a VF address names the vGPU on that VF only" in res.stderr
    assert set(currents(node)) == {VF0}
