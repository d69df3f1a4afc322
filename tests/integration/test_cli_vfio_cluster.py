"""NVIDIA's vendor-specific VFIO interface with a cluster (the API server emulator), run as a
user runs it: who holds a VF-backed vGPU per the cluster, and mixed-size mode converging with
the CRs.

On this interface the VF is the vGPU, so the device ID the kubelet allocated (its
device-plugin checkpoint) is the VF's address, and a running VMI that requests the profile's
resource may hold any of its VFs (docs/domain.md §3b, §9). Either keeps the VF's removal blocked,
naming the VM, exactly as on mdev.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.cluster_node import ClusterNode
from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import NODE, run_vgpuctl

GPU = "0000:41:00.0"
VF0, VF1 = "0000:41:00.4", "0000:41:00.5"
RESOURCE = "nvidia.com/NVIDIA_L40S-8Q"
POD_UID = "9f1c7d1e-0000-4000-8000-00000000000a"


def vfio_node(tmp_path: Path, emu: ApiServerEmulator) -> ClusterNode:
    res = run_vgpuctl(
        "sim", "init", tmp_path / "host", "--gpu", f"L40S@{GPU}", "--interface", "vfio"
    )
    assert res.returncode == 0, res.stderr
    node = ClusterNode(tmp_path / "host", NODE)
    node.kubeconfig = emu.kubeconfig(tmp_path / "kubeconfig")
    node.kubelet_dir = tmp_path / "kubelet"
    (node.kubelet_dir / "device-plugins").mkdir(parents=True)
    return node


def desired(tmp_path: Path, gpu: dict[str, object], name: str) -> Path:
    doc = {
        "apiVersion": "vgpu.reconciler.dev/v1alpha1",
        "kind": "VGPUDesiredState",
        "metadata": {"name": "vfio"},
        "spec": {"nodes": {NODE: {"gpus": [{"address": GPU, "sriov": "enabled", **gpu}]}}},
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def vmi(name: str, namespace: str, uid: str, pod: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": namespace, "uid": uid,
                     "labels": {"kubevirt.io/nodeName": NODE}},
        "spec": {"domain": {"devices": {"gpus": [{"name": "gpu1", "deviceName": RESOURCE}]}}},
        "status": {"phase": "Running", "nodeName": NODE, "activePods": {pod: NODE}},
    }  # fmt: skip


def two_8q(tmp_path: Path, node: ClusterNode) -> Path:
    """Apply two L40S-8Q (VFs 0 and 1); return a desired state that keeps only VF 0's."""
    node.ok(
        "apply",
        desired(tmp_path, {"vgpus": {VF0: "NVIDIA L40S-8Q", VF1: "NVIDIA L40S-8Q"}}, "two.yaml"),
        "--yes",
    )
    return desired(tmp_path, {"vgpus": {VF0: "NVIDIA L40S-8Q"}}, "one.yaml")


def test_a_vf_the_kubelet_gave_a_vm_is_never_removed(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    node = vfio_node(tmp_path, emu)
    one = two_8q(tmp_path, node)
    emu.seed(vmi("win11", "default", "vmi-uid-1", POD_UID))
    checkpoint = {
        "Data": {
            "PodDeviceEntries": [
                {"PodUID": POD_UID, "ContainerName": "compute", "ResourceName": RESOURCE,
                 "DeviceIDs": {"-1": [VF1]}, "AllocResp": ""},
            ],
            "RegisteredDevices": {RESOURCE: [VF0, VF1]},
        },
        "Checksum": 1,
    }  # fmt: skip
    (node.kubelet_dir / "device-plugins" / "kubelet_internal_checkpoint").write_text(
        json.dumps(checkpoint)
    )
    plan = node.run("plan", one, "--detailed-exitcode")
    assert plan.returncode == 2, plan.stdout + plan.stderr
    assert f"! vgpu-remove {VF1}" in plan.stdout
    assert f"in use by VM default/win11 (pod {POD_UID})" in plan.stdout
    assert node.run("apply", one, "--yes").returncode == 2
    current = node.dir / "sys" / "bus" / "pci" / "devices" / VF1 / "nvidia" / "current_vgpu_type"
    assert current.read_text().strip() != "0"  # still configured


def test_a_running_vmi_of_the_profile_keeps_every_vf_of_it(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    node = vfio_node(tmp_path, emu)
    one = two_8q(tmp_path, node)
    emu.seed(vmi("db", "prod", "vmi-uid-2", "pod-vmi-uid-2"))  # no checkpoint: which VF unknown
    plan = node.run("plan", one)
    assert f"! vgpu-remove {VF1}" in plan.stdout
    assert "prod/db" in plan.stdout


def test_mixed_size_converges_with_the_cluster(tmp_path: Path, emu: ApiServerEmulator) -> None:
    node = vfio_node(tmp_path, emu)
    mixed = desired(
        tmp_path,
        {"mode": "mixed-size", "vgpus": {VF0: "NVIDIA L40S-16Q", VF1: "NVIDIA L40S-8Q"}},
        "mixed.yaml",
    )
    node.ok("apply", mixed, "--yes")
    assert "No changes" in node.ok("plan", mixed).stdout
    emu.requests.clear()
    node.ok("apply", mixed, "--yes")
    assert [r for r in emu.requests if r.verb not in ("get", "list", "watch")] == []


def test_vgpus_vgpuctl_did_not_make_show_by_name_in_the_cluster_objects(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """Two L40-24Q the simulator made (no record; at the maximum no VF lists the type): the
    driver names them, so the same layout writes only the node's objects, each VGPUDevice and
    the node summary naming the type, never its id; and an apply after that writes nothing."""
    from reconciler.sim import build_host
    from tests.cluster_node import NODE_STATES, VGPUS

    made = {0: "NVIDIA L40-24Q", 1: "NVIDIA L40-24Q"}
    spec: dict[str, Any] = {
        "interface": "vfio",
        "gpus": [{"model": "L40", "address": GPU, "vgpus": made}],
    }
    build_host(tmp_path / "host", spec)
    node = ClusterNode(tmp_path / "host", NODE)
    node.kubeconfig = emu.kubeconfig(tmp_path / "kubeconfig")
    node.kubelet_dir = tmp_path / "kubelet"
    (node.kubelet_dir / "device-plugins").mkdir(parents=True)
    ids = {p.read_text().strip() for p in (tmp_path / "host" / "sys").glob(
        "devices/**/nvidia/current_vgpu_type")} - {"0"}  # fmt: skip
    (type_id,) = ids
    same = desired(tmp_path, {"profiles": {"NVIDIA L40-24Q": 2}}, "same.yaml")
    plan = json.loads(node.ok("plan", same, "-o", "json").stdout)
    assert plan["blocked"] == [] and plan["applyable"]
    host_kinds = {"vgpu-create", "vgpu-remove", "sriov-enable", "sriov-disable"}
    assert [a for a in plan["actions"] if a["kind"] in host_kinds] == []
    node.ok("apply", same, "--yes")
    devices = {
        d["spec"]["address"]: d
        for d in emu.objects(*VGPUS)
        if d["metadata"].get("labels", {}).get("nodename") == NODE
    }
    for vf in (VF0, VF1):
        assert devices[vf]["spec"]["vGPUTypeName"] == "NVIDIA L40-24Q"
        assert devices[vf]["status"]["configureVGPUTypeName"] == "NVIDIA L40-24Q"
    (summary,) = [s for s in emu.objects(*NODE_STATES) if s["metadata"]["name"] == NODE]
    assert f"type {type_id}" not in json.dumps(summary)
    assert f"type {type_id}" not in json.dumps(list(devices.values()))
    emu.requests.clear()
    node.ok("apply", same, "--yes")
    assert [r for r in emu.requests if r.verb not in ("get", "list", "watch")] == []
