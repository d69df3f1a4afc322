"""A GPU the desired state stops naming, through the CLI against the API-server emulator.

The README promises that a GPU the desired state does not name is left alone: its vGPUs stay on
the host, and on the cluster side its objects stay too, describing what the host has (kept and
updated, never deleted), its vGPUs' types stay allow-listed, and the plan says once that the
GPU is unmanaged. Objects go only with their GPU or VF (issue 29, item 3).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from reconciler.sim import SimHost
from tests.cluster_node import NODE_STATES, SRIOV, VGPUS, ClusterNode, stored
from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import NODE, make_sim, run_vgpuctl

#: Every scenario runs with our CRDs and with Harvester's own.
CRD_SETS = ("ours", "harvester")

A2_4A, A2_4Q = "NVIDIA A2-4A", "NVIDIA A2-4Q"
KEPT = "harvester-kgd9c-000009000"
NOTE = (
    "Note: GPU 0000:09:00.0 (NVIDIA A2) is not in the desired state: unmanaged; its objects "
    "describe what the host has"
)
#: The vGPU created by hand on the unnamed GPU.
HAND_UUID = "7b0c9d1e-2f3a-4b5c-8d6e-9f0a1b2c3d4e"


def _node(tmp_path: Path, emu: ApiServerEmulator, host: str, gpus: list[str]) -> ClusterNode:
    sim = make_sim(tmp_path / host, gpus)
    node = ClusterNode(sim.dir, NODE)
    node.kubeconfig = emu.kubeconfig(tmp_path / "kubeconfig")
    node.kubelet_dir = tmp_path / "kubelet"
    (node.kubelet_dir / "device-plugins").mkdir(parents=True, exist_ok=True)
    return node


def _desired(tmp_path: Path, name: str, gpus: list[dict[str, Any]]) -> Path:
    doc = {
        "apiVersion": "vgpu.reconciler.dev/v1alpha1",
        "kind": "VGPUDesiredState",
        "metadata": {"name": "lab"},
        "spec": {"nodes": {NODE: {"gpus": gpus}}},
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def _gpu(pf: str, vgpus: dict[str, str]) -> dict[str, Any]:
    return {"address": pf, "sriov": "enabled", "vgpus": vgpus}


def _names(emu: ApiServerEmulator, res: tuple[str, str, str], gpu: str) -> list[str]:
    prefix = "harvester-kgd9c-0000" + gpu
    return sorted(
        o["metadata"]["name"] for o in emu.objects(*res) if o["metadata"]["name"].startswith(prefix)
    )


def _mediated(emu: ApiServerEmulator) -> list[str]:
    kv = emu.get_object("kubevirt.io", "v1", "kubevirts", "kubevirt", "harvester-system")
    assert kv is not None
    devices = kv["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
    return [e["mdevNameSelector"] for e in devices]


def _vf_spec(vf: str, profile: str | None) -> dict[str, Any]:
    return {
        "address": vf,
        "enabled": profile is not None,
        "nodeName": NODE,
        "parentGPUDeviceAddress": "0000:09:00.0",
        "vGPUTypeName": profile or "",
    }


def _create_by_hand(node: ClusterNode, vf: str, type_name: str, uuid: str) -> None:
    """What an operator's ``echo UUID > …/mdev_supported_types/<type>/create`` does."""
    root = node.dir / "sys"
    types = root / "bus" / "pci" / "devices" / vf / "mdev_supported_types"
    type_id = next(t.name for t in types.iterdir() if (t / "name").read_text().strip() == type_name)
    sim = SimHost.open(root)
    assert sim is not None
    sim.writer().write(f"bus/pci/devices/{vf}/mdev_supported_types/{type_id}/create", uuid)


def test_a_gpu_the_desired_state_stops_naming_keeps_its_objects_until_it_leaves_the_host(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    node = _node(tmp_path, emu, "host", ["A2@0000:08:00.0", "A2@0000:09:00.0"])
    named = _gpu("0000:08:00.0", {"0000:08:00.4": A2_4Q, "0000:08:00.5": A2_4Q})
    unnamed = _gpu("0000:09:00.0", {"0000:09:00.4": A2_4A, "0000:09:00.5": A2_4A})
    both = _desired(tmp_path, "both.yaml", [named, unnamed])
    one = _desired(tmp_path, "one.yaml", [named])
    node.ok("apply", both, "--yes")
    # 09:00.0's objects: the GPU's and its 16 VFs' (4 at functions .4-.7 of device 00, 8 of
    # device 01, 4 of device 02).
    vf_names = [f"harvester-kgd9c-00000900{f}" for f in range(4, 8)] + [
        f"harvester-kgd9c-0000090{d}{f}" for d in (1, 2) for f in range(8 if d == 1 else 4)
    ]
    assert _names(emu, VGPUS, "09") == sorted(vf_names)
    assert _names(emu, SRIOV, "09") == [KEPT]
    versions = {name: stored(emu, VGPUS, name)["metadata"]["resourceVersion"] for name in vf_names}

    # The file stops naming 09:00.0: nothing of it is deleted, A2-4A stays allow-listed, and
    # one note says why.
    plan = node.ok("plan", one)
    assert "\n    - " not in plan.stdout, plan.stdout  # no cr-delete, no allow-list removal
    assert plan.stdout.count(NOTE) == 1, plan.stdout
    assert plan.stdout.count("is not in the desired state: unmanaged; its objects") == 1
    assert "0 to remove" in plan.stdout
    node.ok("apply", one, "--yes")
    assert _names(emu, VGPUS, "09") == sorted(vf_names)
    assert _names(emu, SRIOV, "09") == [KEPT]
    # They already said what the host has: not even rewritten.
    for name in vf_names:
        assert stored(emu, VGPUS, name)["metadata"]["resourceVersion"] == versions[name]
    assert stored(emu, VGPUS, "harvester-kgd9c-000009004")["spec"] == _vf_spec(
        "0000:09:00.4", A2_4A
    )
    assert stored(emu, VGPUS, "harvester-kgd9c-000009006")["spec"] == _vf_spec("0000:09:00.6", None)
    assert stored(emu, SRIOV, KEPT)["spec"] == {
        "address": "0000:09:00.0",
        "enabled": True,
        "nodeName": NODE,
    }
    assert A2_4A in _mediated(emu) and A2_4Q in _mediated(emu)
    summary = stored(emu, NODE_STATES, NODE)["status"]
    assert [(g["address"], g["managed"]) for g in summary["gpus"]] == [
        ("0000:08:00.0", True),
        ("0000:09:00.0", False),
    ]
    assert node.run("plan", one, "--detailed-exitcode").returncode == 0

    # A vGPU created by hand on the unnamed GPU: its VF's object follows the host.
    _create_by_hand(node, "0000:09:00.6", A2_4A, HAND_UUID)
    plan = node.ok("plan", one)
    assert "~ VGPUDevice harvester-kgd9c-000009006" in plan.stdout
    assert (
        "VGPUDevice for VF 0000:09:00.6: spec differs from the host; status differs from the host"
    ) in plan.stdout
    assert "\n    - " not in plan.stdout, plan.stdout
    assert plan.stdout.count(NOTE) == 1
    node.ok("apply", one, "--yes")
    vf = stored(emu, VGPUS, "harvester-kgd9c-000009006")
    assert vf["spec"] == _vf_spec("0000:09:00.6", A2_4A)
    assert vf["status"]["uuid"] == HAND_UUID
    assert vf["status"]["vGPUStatus"] == "vGPUConfigured"
    assert vf["status"]["configureVGPUTypeName"] == A2_4A
    assert vf["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "vgpuctl"
    assert node.run("plan", one, "--detailed-exitcode").returncode == 0

    # A power cycle: every VF is gone from the host, so are their objects; the GPU's stays,
    # saying SR-IOV is off. A2-4A is now on no VF of any node: it leaves the allow-list.
    assert run_vgpuctl("sim", "reboot", node.dir).returncode == 0
    plan = node.ok("plan", one)
    assert "- VGPUDevice harvester-kgd9c-000009004" in plan.stdout
    assert "VF 0000:09:00.4 does not exist (SR-IOV off on GPU 0000:09:00.0)" in plan.stdout
    assert "- SRIOVGPUDevice" not in plan.stdout
    assert plan.stdout.count(NOTE) == 1
    # A grace of 0: the entry goes in this run (its two-phase retirement is
    # test_allow_list_race.py's).
    node.ok("apply", one, "--yes", "--allow-list-grace", "0")
    assert _names(emu, VGPUS, "09") == []
    assert stored(emu, SRIOV, KEPT)["spec"] == {
        "address": "0000:09:00.0",
        "enabled": False,
        "nodeName": NODE,
    }
    assert stored(emu, SRIOV, KEPT).get("status", {}) == {}
    assert A2_4A not in _mediated(emu) and A2_4Q in _mediated(emu)

    # The GPU pulled from the host (the node now runs on a host with the named GPU only): its
    # last object goes.
    pulled = _node(tmp_path, emu, "host-pulled", ["A2@0000:08:00.0"])
    plan = pulled.ok("plan", one)
    assert "- SRIOVGPUDevice harvester-kgd9c-000009000" in plan.stdout
    assert "GPU 0000:09:00.0 is not on this host" in plan.stdout
    assert NOTE not in plan.stdout
    pulled.ok("apply", one, "--yes")
    assert _names(emu, SRIOV, "09") == []
    assert _names(emu, SRIOV, "08") == ["harvester-kgd9c-000008000"]
    assert len(_names(emu, VGPUS, "08")) == 16
