"""vgpuctl against public captures of real NVIDIA vGPU hosts (``tests/fixtures/hosts``).

Not the simulator: trees rebuilt from what real hosts showed, observed through the real
``/proc`` hold probe and the real (confined) writer path, driven as a user drives the CLI.
Every expectation is written by hand from the capture (its README says what it holds). The
probe runs with ``--unsafe-assume-no-hidden-holders``: whether a test machine shows every
process is its own business (this suite checks that elsewhere), and nothing here holds the
capture's ``/dev/vfio`` groups.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.captures import harvester_a2_host, l40s_vfio_host
from tests.simnode import run_vgpuctl

NODE = "harvester-a2"
PF = "0000:08:00.0"
#: The three vGPUs of the capture: VF index → (VF, type, mdev UUID, IOMMU group).
CAPTURED = {
    0: ("0000:08:00.4", "NVIDIA A2-4C", "f715f63c-0d00-4007-9c5a-b07b0c6c05de", "106"),
    2: ("0000:08:00.6", "NVIDIA A2-4A", "3deab9a4-200a-4c54-99b1-5eb0722d1d81", "108"),
    12: ("0000:08:02.0", "NVIDIA A2-4Q", "c728e022-f16f-434b-ad2c-9665ee634d3d", "107"),
}
#: The A2's VFs in virtfn order, as the capture's links give them: functions 4..7, then 8..19.
VFS = [f"0000:08:{f // 8:02x}.{f % 8}" for f in range(4, 20)]
#: The 15 types of the A2 as its driver listed them (nvidia-742 … nvidia-756).
TYPES = [
    "NVIDIA A2-1B",
    "NVIDIA A2-2B",
    "NVIDIA A2-1Q",
    "NVIDIA A2-2Q",
    "NVIDIA A2-4Q",
    "NVIDIA A2-8Q",
    "NVIDIA A2-16Q",
    "NVIDIA A2-1A",
    "NVIDIA A2-2A",
    "NVIDIA A2-4A",
    "NVIDIA A2-8A",
    "NVIDIA A2-16A",
    "NVIDIA A2-4C",
    "NVIDIA A2-8C",
    "NVIDIA A2-16C",
]
FOUR_GB = ["NVIDIA A2-4A", "NVIDIA A2-4C", "NVIDIA A2-4Q"]
#: ``uuid5(NAMESPACE_DNS, "vgpu.reconciler.dev")``: vgpuctl's namespace for vGPU UUIDs.
NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "vgpu.reconciler.dev")


@pytest.fixture
def a2_host(tmp_path: Path) -> list[str]:
    root = tmp_path / "sys"
    harvester_a2_host(root)
    (tmp_path / "kubelet").mkdir()
    return host_flags(tmp_path, root, kubelet=tmp_path / "kubelet")


def host_flags(tmp_path: Path, root: Path, *, kubelet: Path) -> list[str]:
    """The CLI flags that point vgpuctl at a rebuilt capture instead of this machine."""
    return [
        "--sysfs-root",
        str(root),
        "--node",
        NODE,
        "--kubelet-dir",
        str(kubelet),
        "--state-dir",
        str(tmp_path / "state"),
        "--unsafe-assume-no-hidden-holders",
    ]


def desired(tmp_path: Path, vgpus: dict[str, str], name: str = "desired.yaml") -> Path:
    gpu = {"address": PF, "model": "NVIDIA A2", "sriov": "enabled", "vgpus": vgpus}
    doc = {
        "apiVersion": "vgpu.reconciler.dev/v1alpha1",
        "kind": "VGPUDesiredState",
        "metadata": {"name": "capture"},
        "spec": {"nodes": {NODE: {"gpus": [gpu]}}},
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def as_captured() -> dict[str, str]:
    return {vf: type_name for vf, type_name, _, _ in CAPTURED.values()}


def test_status_shows_what_the_real_host_had(a2_host: list[str]) -> None:
    res = run_vgpuctl("status", "-o", "json", *a2_host)
    assert res.returncode == 0, res.stderr
    inventory = json.loads(res.stdout)
    (gpu,) = inventory["gpus"]  # the Intel NIC with SR-IOV is not a GPU
    assert gpu["address"] == PF
    assert (gpu["vendorId"], gpu["deviceId"]) == ("10de", "25b6")
    assert (gpu["subsystemVendorId"], gpu["subsystemDeviceId"]) == ("10de", "157e")
    assert gpu["model"] == "NVIDIA A2"
    assert gpu["interface"] == "mdev"
    assert gpu["driver"] == "nvidia"
    assert gpu["sriov"] == {
        "totalVFs": 16,
        "numVFs": 16,
        "vfOffset": 4,
        "vfStride": 1,
        "vfDevice": "25b6",
    }
    assert [t["name"] for t in gpu["vgpuTypes"]] == TYPES
    assert [t["id"] for t in gpu["vgpuTypes"]] == [f"nvidia-{742 + i}" for i in range(15)]
    four_q = gpu["vgpuTypes"][4]
    assert (four_q["framebufferMiB"], four_q["maxInstances"], four_q["maxResolution"]) == (
        4096,
        4,
        "7680x4320",
    )
    assert [v["address"] for v in gpu["vfs"]] == VFS
    for vf in gpu["vfs"]:
        index = vf["index"]
        if index in CAPTURED:
            _, type_name, mdev, group = CAPTURED[index]
            assert vf["vgpu"] == {
                "type": type_name,
                "uuid": mdev,
                "holder": "",
                "iommuGroup": group,
            }
            assert vf["creatableTypes"] == []
        else:
            assert vf["vgpu"] is None
            # Three 4 GB vGPUs exist of at most four: only a fourth 4 GB one fits.
            assert vf["creatableTypes"] == FOUR_GB
        assert vf["inUse"] is False


def test_the_status_table_reads_as_kubectl_would(a2_host: list[str]) -> None:
    res = run_vgpuctl("status", *a2_host)
    assert res.returncode == 0, res.stderr
    picture, table = res.stdout.split("\n\n", 1)
    # The captured A2 hosts an A2-4C, an A2-4A and an A2-4Q: three quarters of its 16 GB.
    assert picture.endswith("4 GB: 3 used, 1 free")
    rows = [line.split() for line in table.splitlines()[1:]]
    enabled = [(r[1], r[4], r[5], r[6]) for r in rows if r[3] == "true"]
    assert enabled == [
        ("0000:08:00.4", "f715f63c-0d00-4007-9c5a-b07b0c6c05de", "NVIDIA", "A2-4C"),
        ("0000:08:00.6", "3deab9a4-200a-4c54-99b1-5eb0722d1d81", "NVIDIA", "A2-4A"),
        ("0000:08:02.0", "c728e022-f16f-434b-ad2c-9665ee634d3d", "NVIDIA", "A2-4Q"),
    ]
    assert len(rows) == 16
    assert "GPU 0000:08:00.0 NVIDIA A2: SR-IOV on, 16 VFs, mdev, 3 vGPUs" in res.stderr


def test_export_plans_to_no_changes(a2_host: list[str], tmp_path: Path) -> None:
    res = run_vgpuctl("export", *a2_host)
    assert res.returncode == 0, res.stderr
    exported = yaml.safe_load(res.stdout)
    (gpu,) = exported["spec"]["nodes"][NODE]["gpus"]
    assert gpu == {
        "address": PF,
        "model": "NVIDIA A2",
        "sriov": "enabled",
        "vgpus": {
            "0000:08:00.4": "NVIDIA A2-4C",
            "0000:08:00.6": "NVIDIA A2-4A",
            "0000:08:02.0": "NVIDIA A2-4Q",
        },
    }
    path = tmp_path / "exported.yaml"
    path.write_text(res.stdout)
    plan = run_vgpuctl("plan", path, "--detailed-exitcode", *a2_host)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "No changes. The node matches the desired state." in plan.stdout


def test_a_one_vf_change_is_one_create(a2_host: list[str], tmp_path: Path) -> None:
    """A fourth 4 GB vGPU on VF 1: the only thing that changes."""
    layout = {**as_captured(), "0000:08:00.5": "A2-4Q"}
    res = run_vgpuctl("plan", desired(tmp_path, layout), "-o", "json", *a2_host)
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    host = [a for a in plan["actions"] if a["kind"].startswith(("vgpu-", "sriov-"))]
    new_uuid = str(uuid.uuid5(NAMESPACE, f"{NODE}/0000:08:00.5"))
    assert host == [
        {
            "seq": 1,
            "kind": "vgpu-create",
            "phase": "host",
            "target": "0000:08:00.5",
            "gpu": PF,
            "vfIndex": 1,
            "type": "NVIDIA A2-4Q",
            "uuid": new_uuid,
            "reason": "VF 0000:08:00.5 has no vGPU; desired NVIDIA A2-4Q",
        }
    ]
    assert plan["summary"] == {"create": 1, "change": 0, "remove": 0, "blocked": 0}
    assert plan["applyable"] is True
    refresh = [a for a in plan["actions"] if a["kind"] == "device-plugin-refresh"]
    assert [a["target"] for a in refresh] == ["nvidia.com/NVIDIA_A2-4Q"]
    assert sorted(refresh[0]["devices"]) == sorted([CAPTURED[12][2], new_uuid])


def test_a_removal_names_the_captured_uuid(a2_host: list[str], tmp_path: Path) -> None:
    layout = as_captured()
    del layout["0000:08:00.6"]
    res = run_vgpuctl("plan", desired(tmp_path, layout), *a2_host)
    assert res.returncode == 0, res.stderr
    assert (
        "  - vgpu 0000:08:00.6  NVIDIA A2-4A  (uuid 3deab9a4-200a-4c54-99b1-5eb0722d1d81)"
        in res.stdout
    )
    assert "Plan: 0 to create, 0 to change, 1 to remove, 0 blocked." in res.stdout


def test_the_drivers_rules_hold_on_the_real_host(a2_host: list[str], tmp_path: Path) -> None:
    """A fifth 4 GB vGPU is one over the A2's maximum (the capture's max_instance=4, the
    catalogue's too); an 8 GB one does not fit beside 4 GB ones."""
    five = {**as_captured(), "0000:08:00.5": "A2-4Q", "0000:08:00.7": "A2-4A"}
    res = run_vgpuctl("plan", desired(tmp_path, five, "five.yaml"), *a2_host)
    assert res.returncode == 1
    assert "5 vGPUs of 4 GB on GPU 0000:08:00.0" in res.stderr
    assert "at most 4 per NVIDIA A2" in res.stderr
    mixed = {**as_captured(), "0000:08:00.5": "A2-8Q"}
    res = run_vgpuctl("plan", desired(tmp_path, mixed, "mixed.yaml"), *a2_host)
    assert res.returncode == 1
    assert "mixed framebuffer sizes on GPU 0000:08:00.0" in res.stderr
    assert "equal-size mode" in res.stderr


# --- the vendor-specific VFIO interface: Harvester's L40S capture ----------------------------


def l40s_flags(tmp_path: Path, configured: dict[int, str] | None = None) -> list[str]:
    root = tmp_path / "l40s" / "sys"
    l40s_vfio_host(root, configured=configured)
    flags = host_flags(tmp_path, root, kubelet=tmp_path / "no-kubelet")
    return [*flags, "--sriov-manage", str(tmp_path / "no-sriov-manage")]


def l40s_desired(tmp_path: Path, vgpus: dict[int, str]) -> Path:
    doc: dict[str, Any] = {
        "apiVersion": "vgpu.reconciler.dev/v1alpha1",
        "kind": "VGPUDesiredState",
        "metadata": {"name": "l40s"},
        "spec": {
            "nodes": {
                NODE: {"gpus": [{"address": "0000:26:00.0", "sriov": "enabled", "vgpus": vgpus}]}
            }
        },
    }
    path = tmp_path / "l40s.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_vendor_specific_vfio_gpu_is_read_and_reported(tmp_path: Path) -> None:
    res = run_vgpuctl("status", "-o", "json", *l40s_flags(tmp_path))
    assert res.returncode == 0, res.stderr
    (gpu,) = json.loads(res.stdout)["gpus"]
    assert (gpu["model"], gpu["interface"]) == ("NVIDIA L40S", "vfio")
    ids = [t["id"] for t in gpu["vgpuTypes"]]
    assert ids == [str(i) for i in range(1145, 1167)] + ["2164"]
    assert gpu["vgpuTypes"][-1]["name"] == "NVIDIA L40S-3B"
    assert all(vf["vgpu"] is None for vf in gpu["vfs"])
    assert len(gpu["vfs"][0]["creatableTypes"]) == 23


def test_vgpus_on_the_vendor_specific_interface_are_shown_never_planned_absent(
    tmp_path: Path,
) -> None:
    """VF 1 was given type 1152 (L40S-8Q): its name is not in its own list any more, other
    VFs' lists name it. VF 3 has a type no list names and vgpuctl has no record of: it is shown
    by its id, and nothing on that GPU is changed."""
    flags = l40s_flags(tmp_path, configured={1: "1152", 3: "9999"})
    res = run_vgpuctl("status", "-o", "json", *flags)
    assert res.returncode == 0, res.stderr
    vfs = json.loads(res.stdout)["gpus"][0]["vfs"]
    assert vfs[1]["vgpu"]["type"] == "NVIDIA L40S-8Q"
    assert vfs[1]["vgpu"]["uuid"] == "0000:26:00.5"  # the VF is the vGPU's identity
    assert vfs[3]["vgpu"]["type"] == "type 9999"
    # A desired state without them: their removal is planned, and blocked with the reason.
    res = run_vgpuctl("plan", l40s_desired(tmp_path, {0: "L40S-8Q"}), "-o", "json", *flags)
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert [a["kind"] for a in plan["actions"] if a["kind"].startswith("vgpu")] == []
    blocked = {(b["kind"], b["target"]) for b in plan["blocked"]}
    assert blocked == {
        ("vgpu-create", "0000:26:00.4"),
        ("vgpu-remove", "0000:26:00.5"),
        ("vgpu-remove", "0000:26:00.7"),
    }
    assert all("VF 0000:26:00.7 has vGPU type 9999" in b["reason"] for b in plan["blocked"])
    assert plan["applyable"] is False
    # apply changes nothing (no write is tried: the files are as they were) and exits 2.
    root = tmp_path / "l40s" / "sys"
    before = {p: p.read_bytes() for p in root.rglob("current_vgpu_type")}
    res = run_vgpuctl("apply", l40s_desired(tmp_path, {0: "L40S-8Q"}), "--yes", *flags)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Plan: 0 to create, 0 to change, 0 to remove, 3 blocked." in res.stdout
    assert {p: p.read_bytes() for p in root.rglob("current_vgpu_type")} == before
    # export leaves the GPU out rather than write a layout it cannot stand behind.
    res = run_vgpuctl("export", *flags)
    assert res.returncode == 0, res.stderr
    assert yaml.safe_load(res.stdout)["spec"]["nodes"][NODE]["gpus"] == []
    assert "left out: GPU 0000:26:00.0: VF 0000:26:00.7 has vGPU type 9999" in res.stderr


def test_apply_writes_the_id_the_vf_lists_for_the_profile(tmp_path: Path) -> None:
    """On the captured L40S with VF 1 at type 1152 (L40S-8Q), asking for L40S-8Q on VF 0 too
    writes 1152, the id the capture lists for that name, into VF 0's current_vgpu_type, and
    nothing else; the plan names the vGPU by the VF. Type ids are resolved by name on the host,
    never stored: the capture's list is the only source of 1152 here."""
    flags = l40s_flags(tmp_path, configured={1: "1152"})
    desired = l40s_desired(tmp_path, {0: "L40S-8Q", 1: "L40S-8Q"})
    res = run_vgpuctl("plan", desired, "-o", "json", *flags)
    assert res.returncode == 0, res.stderr
    (create,) = [a for a in json.loads(res.stdout)["actions"] if a["kind"] == "vgpu-create"]
    assert (create["target"], create["uuid"], create["type"]) == (
        "0000:26:00.4",
        "0000:26:00.4",
        "NVIDIA L40S-8Q",
    )
    root = tmp_path / "l40s" / "sys"
    currents = sorted(root.rglob("current_vgpu_type"))
    before = {p: p.read_text() for p in currents}
    res = run_vgpuctl("apply", desired, "--yes", *flags)
    assert res.returncode == 0, res.stdout + res.stderr
    after = {p: p.read_text() for p in currents}
    changed = {p.parent.parent.name: after[p] for p in currents if after[p] != before[p]}
    assert changed == {"0000:26:00.4": "1152"}
