"""The seed's node end to end through the CLI, as an operator runs it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import yaml

from tests.simnode import NODE, REPO, SEED, SimNode, make_sim, run_vgpuctl

UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
SEED_ENABLED = {
    "0000:08:00.4": "NVIDIA A2-4A",
    "0000:08:00.5": "NVIDIA A2-4Q",
    "0000:08:00.6": "NVIDIA A2-4A",
    "0000:08:00.7": "NVIDIA A2-4Q",
}


def _schema(name: str) -> dict[str, object]:
    return json.loads((REPO / "schemas" / name).read_text())  # type: ignore[no-any-return]


def test_plan_apply_status_replan(a2_node: SimNode) -> None:
    plan = a2_node.ok("plan", SEED)
    assert "+ sriov 0000:08:00.0  enable 16 VFs" in plan.stdout
    for vf, profile in SEED_ENABLED.items():
        assert f"+ vgpu {vf}  {profile}" in plan.stdout
    assert plan.stdout.rstrip().endswith("Plan: 5 to create, 0 to change, 0 to remove, 0 blocked.")

    applied = a2_node.ok("apply", SEED, "--yes")
    assert "Converged" in applied.stdout
    assert "Applied 5 actions" in applied.stderr

    status = a2_node.ok("status", env={"COLUMNS": "93"})
    # First a picture of the GPU: four quarters of its 16 GB (40 cells in 93 columns), no
    # room left for another 4 GB vGPU; then a blank line and the table.
    picture, table = status.stdout.split("\n\n", 1)
    assert picture == (
        "GPU 0000:08:00.0  NVIDIA A2  [4A=======|4Q=======|4A=======|4Q=======|]  "
        "4 GB: 4 used, 0 free"
    )
    rows = [line.split() for line in table.splitlines()[1:]]
    assert table.split()[:8] == [
        "NAME", "ADDRESS", "NODE", "NAME", "ENABLED", "UUID", "VGPUTYPE", "PARENTGPUDEVICE"
    ]  # fmt: skip
    assert len(rows) == 16
    enabled = [r for r in rows if r[3] == "true"]
    disabled = [r for r in rows if r[3] == "false"]
    assert len(enabled) == 4 and len(disabled) == 12
    for r in enabled:
        name, address, node, _, uuid, *vtype, parent = r
        assert name == f"{NODE}-{address.replace(':', '').replace('.', '')}"
        assert node == NODE and parent == "0000:08:00.0"
        assert UUID_RE.match(uuid)
        assert " ".join(vtype) == SEED_ENABLED[address]
    assert {r[0] for r in rows} >= {"harvester-kgd9c-000008004", "harvester-kgd9c-000008023"}

    again = a2_node.run("plan", SEED, "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "No changes." in again.stdout


def test_uuids_are_deterministic_across_hosts(tmp_path: Path) -> None:
    one = make_sim(tmp_path / "one", ["A2@0000:08:00.0"])
    two = make_sim(tmp_path / "two", ["A2@0000:08:00.0"])
    for n in (one, two):
        n.ok("apply", SEED, "--yes")
    inv = [json.loads(n.ok("status", "-o", "json").stdout) for n in (one, two)]
    uuids = [[vf["vgpu"]["uuid"] for vf in i["gpus"][0]["vfs"] if vf["vgpu"]] for i in inv]
    assert uuids[0] == uuids[1] and len(set(uuids[0])) == 4


def test_status_json_and_yaml_follow_the_inventory_contract(a2_node: SimNode) -> None:
    a2_node.ok("apply", SEED, "--yes")
    doc = json.loads(a2_node.ok("status", "-o", "json").stdout)
    jsonschema.validate(doc, _schema("inventory.schema.json"))
    gpu = doc["gpus"][0]
    assert gpu["address"] == "0000:08:00.0" and gpu["model"] == "NVIDIA A2"
    assert gpu["sriov"]["totalVFs"] == 16 and gpu["sriov"]["numVFs"] == 16
    assert [vf["index"] for vf in gpu["vfs"]] == list(range(16))
    assert [vf["address"] for vf in gpu["vfs"]][:5] == [
        "0000:08:00.4", "0000:08:00.5", "0000:08:00.6", "0000:08:00.7", "0000:08:01.0"
    ]  # fmt: skip
    # Equal-size rule at the maximum: 4 × 4 GB used, nothing else is creatable.
    assert all(vf["creatableTypes"] == [] for vf in gpu["vfs"])
    assert yaml.safe_load(a2_node.ok("status", "-o", "yaml").stdout) == doc


def test_plan_json_follows_the_plan_contract(a2_node: SimNode) -> None:
    res = a2_node.run("plan", SEED, "-o", "json", "--detailed-exitcode")
    assert res.returncode == 2
    doc = json.loads(res.stdout)
    jsonschema.validate(doc, _schema("plan.schema.json"))
    kinds = [a["kind"] for a in doc["actions"]]
    assert kinds == ["sriov-enable"] + ["vgpu-create"] * 4 + ["device-plugin-refresh"] * 2
    assert [a["seq"] for a in doc["actions"]] == [1, 2, 3, 4, 5, 6, 7]
    assert [a["target"] for a in doc["actions"][5:]] == [
        "nvidia.com/NVIDIA_A2-4A",
        "nvidia.com/NVIDIA_A2-4Q",
    ]
    assert all(a["reason"] for a in doc["actions"])
    assert doc["summary"] == {"create": 5, "change": 0, "remove": 0, "blocked": 0}
    assert doc["node"] == NODE and doc["observedFingerprint"].startswith("sha256:")
    assert res.stderr == ""


def test_saved_plan_applies_and_stale_plan_is_refused(a2_node: SimNode, tmp_path: Path) -> None:
    planfile = tmp_path / "plan.json"
    a2_node.ok("plan", SEED, "--out", planfile)
    a2_node.ok("apply", planfile, "--yes")
    assert a2_node.run("assert", SEED).returncode == 0

    # A plan made against the converged host goes stale once the host changes.
    a2_node.ok("plan", SEED, "--out", planfile)
    run_vgpuctl("sim", "reboot", a2_node.dir)
    stale = a2_node.run("apply", planfile, "--yes")
    assert stale.returncode == 1
    assert "stale" in stale.stderr and "Traceback" not in stale.stderr


def test_export_then_plan_is_no_changes(a2_node: SimNode, tmp_path: Path) -> None:
    a2_node.ok("apply", SEED, "--yes")
    exported = tmp_path / "exported.yaml"
    exported.write_text(a2_node.ok("export").stdout)
    assert a2_node.run("validate", exported).returncode == 0
    res = a2_node.run("plan", exported, "--detailed-exitcode")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "No changes." in res.stdout


def test_assert_reports_drift_then_match(a2_node: SimNode) -> None:
    drift = a2_node.run("assert", SEED)
    assert drift.returncode == 2 and "drifted" in drift.stdout
    a2_node.ok("apply", SEED, "--yes")
    assert a2_node.run("assert", SEED).returncode == 0


def test_apply_without_tty_needs_yes_and_changes_nothing(a2_node: SimNode) -> None:
    res = a2_node.run("apply", SEED)
    assert res.returncode == 1 and "--yes" in res.stderr
    status = json.loads(a2_node.ok("status", "-o", "json").stdout)
    assert status["gpus"][0]["sriov"]["numVFs"] == 0


def test_validate_the_shipped_desired_states() -> None:
    files = sorted((REPO / "desired-state").rglob("*.yaml"))
    assert SEED in files
    res = run_vgpuctl("validate", *files)
    assert res.returncode == 0, res.stderr
    assert "valid" in res.stdout


def test_global_options_before_or_after_and_from_env(a2_node: SimNode) -> None:
    a2_node.ok("apply", SEED, "--yes")
    after = a2_node.ok("status", "-o", "json").stdout
    before = run_vgpuctl(*a2_node.flags, "status", "-o", "json")
    env = {
        "VGPUCTL_SYSFS_ROOT": str(a2_node.dir / "sys"),
        "VGPUCTL_NODE": NODE,
    }
    from_env = run_vgpuctl("status", "-o", "json", env=env)
    node_name = run_vgpuctl(
        "status", "-o", "json", env={"VGPUCTL_SYSFS_ROOT": str(a2_node.dir / "sys"),
                                     "NODE_NAME": NODE}
    )  # fmt: skip
    assert before.returncode == from_env.returncode == node_name.returncode == 0
    assert after == before.stdout == from_env.stdout == node_name.stdout


def test_console_script_is_installed() -> None:
    import shutil
    import subprocess

    exe = shutil.which("vgpuctl")
    assert exe, "the vgpuctl console script is not on PATH"
    res = subprocess.run([exe, "--help"], capture_output=True, text=True, check=False)
    assert res.returncode == 0
    for word in ("validate", "plan", "apply", "status", "export", "assert", "sim"):
        assert word in res.stdout
