"""``vgpuctl capacity`` against the API-server emulator with nodes, pods and vgpuctl's and
Harvester's objects (issue 15 item 2). Every expected number is worked out by hand below from
the objects seeded: allocatable from the nodes' status, requests from the pods bound to a node
and not finished (an init container counted as the scheduler counts it), configured from the
node's VGPUNodeState, else its VGPUDevices."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import run_vgpuctl

Q, A = "nvidia.com/NVIDIA_A2-4Q", "nvidia.com/NVIDIA_A2-4A"


def node(name: str, allocatable: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"allocatable": {"cpu": "8", **allocatable}}}  # fmt: skip


def container(asks: dict[str, str], *, limits_only: bool = False, **extra: str) -> dict[str, Any]:
    resources = {"limits": asks} if limits_only else {"requests": asks, "limits": asks}
    return {"name": "c", "image": "x", "resources": resources, **extra}


def pod(name: str, node_name: str | None, phase: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": [container({})], **spec}
    if node_name:
        body["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "vms"},
            "spec": body, "status": {"phase": phase}}  # fmt: skip


def node_state(name: str, profiles: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "vgpu.reconciler.dev/v1alpha1", "kind": "VGPUNodeState",
        "metadata": {"name": name},
        "status": {"profiles": [
            {"name": p, "resourceName": "nvidia.com/" + p.replace(" ", "_"), "wanted": n,
             "vgpus": n, "inUse": 0, "creatable": 0}
            for p, n in profiles.items()
        ]},
    }  # fmt: skip


def vgpu_device(node_name: str, fn: int, profile: str) -> dict[str, Any]:
    return {
        "apiVersion": "devices.harvesterhci.io/v1beta1", "kind": "VGPUDevice",
        "metadata": {"name": f"{node_name}-00000800{fn}", "labels": {"nodename": node_name}},
        "spec": {"address": f"0000:08:00.{fn}", "enabled": True, "nodeName": node_name,
                 "parentGPUDeviceAddress": "0000:08:00.0", "vGPUTypeName": profile},
        "status": {"configureVGPUTypeName": profile, "vGPUStatus": "vGPUConfigured",
                   "uuid": f"u{fn}"},
    }  # fmt: skip


@pytest.fixture
def cluster(emu: ApiServerEmulator, tmp_path: Path) -> Path:
    # node-a: vgpuctl's node agent runs there (a VGPUNodeState: four A2-4Q).
    emu.seed(node("node-a", {Q: "4"}))
    emu.seed(node_state("node-a", {"NVIDIA A2-4Q": 4}))
    emu.seed(pod("vm1", "node-a", "Running", containers=[container({Q: "1"})]))
    # vm1's VirtualMachineInstance: its virt-launcher pod above carries the request, so the VMI
    # is not counted again.
    emu.seed({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
              "metadata": {"name": "vm1", "namespace": "vms"},
              "spec": {"domain": {"devices": {"gpus": [{"name": "g", "deviceName": Q}]}}},
              "status": {"phase": "Running", "nodeName": "node-a"}})  # fmt: skip
    emu.seed(pod("vm2", "node-a", "Pending", containers=[container({Q: "2"}, limits_only=True)]))
    emu.seed(pod("done", "node-a", "Succeeded", containers=[container({Q: "1"})]))
    emu.seed(pod("crashed", "node-a", "Failed", containers=[container({Q: "1"})]))
    # node-b: no summary (delegate mode): its VGPUDevices say two A2-4A and two A2-4Q.
    emu.seed(node("node-b", {Q: "2", A: "2"}))
    for fn, profile in ((4, "NVIDIA A2-4A"), (5, "NVIDIA A2-4A"), (6, "NVIDIA A2-4Q"),
                        (7, "NVIDIA A2-4Q")):  # fmt: skip
        emu.seed(vgpu_device("node-b", fn, profile))
    # A sidecar (restartable init container) holds one A2-4A for the pod's life; the regular
    # init container after it asks one more while it runs: max(0 + 1, 1 + 1) = 2 at the peak.
    emu.seed(pod("vm3", "node-b", "Running",
                 initContainers=[container({A: "1"}, restartPolicy="Always"),
                                 container({A: "1"})],
                 containers=[container({})]))  # fmt: skip
    emu.seed(pod("unscheduled", None, "Pending", containers=[container({Q: "4"})]))
    return emu.kubeconfig(tmp_path / "kubeconfig")


def capacity(kubeconfig: Path, *args: str) -> Any:
    return run_vgpuctl("capacity", "--kubeconfig", kubeconfig, *args)


def test_the_table_per_node_and_the_cluster(cluster: Path) -> None:
    res = capacity(cluster)
    assert res.returncode == 0, res.stderr
    rows = [line.split() for line in res.stdout.splitlines()]
    assert rows == [
        ["NODE", "RESOURCE", "CONFIGURED", "ALLOCATABLE", "REQUESTED", "HELD", "FREE"],
        ["node-a", Q, "4", "4", "3", "0", "1"],  # vm1 1 + vm2 2 (its limit); finished pods not
        ["node-b", A, "2", "2", "2", "0", "0"],  # vm3's init peak
        ["node-b", Q, "2", "2", "0", "0", "2"],
        ["(cluster)", A, "2", "2", "2", "0", "0"],
        ["(cluster)", Q, "6", "6", "3", "0", "3"],
    ]


def test_json_and_require(cluster: Path) -> None:
    doc = json.loads(capacity(cluster, "-o", "json", "--require", f"{Q}=2").stdout)
    assert doc["totals"] == [
        {"resource": A, "configured": 2, "allocatable": 2, "requested": 2, "held": 0, "free": 0},
        {"resource": Q, "configured": 6, "allocatable": 6, "requested": 3, "held": 0, "free": 3},
    ]
    assert doc["require"] == {
        "mode": "joint",
        "satisfied": True,
        "requirements": [
            {"resource": Q, "count": 2, "node": "node-b", "free": 2, "satisfied": True}
        ],
        "messages": [f"node node-b has 2 {Q} free (needed 2)"],
    }

    # Three free in the cluster, but no single node has three: a VM cannot span nodes.
    short = capacity(cluster, "--require", f"{Q}=3")
    assert short.returncode == 2
    assert short.stderr.strip().endswith(
        f"no node has 3 {Q} free: the best, node-b, has 2 (short by 1)"
    )
    none = capacity(cluster, "--require", "nvidia.com/NVIDIA_L40S-8Q=1")
    assert (none.returncode, none.stderr.strip()) == (2, "no node offers nvidia.com/NVIDIA_L40S-8Q")
    bad = capacity(cluster, "--require", "A2-4Q")
    assert bad.returncode == 1
    assert "--require 'A2-4Q': expected PROFILE=N (N from 1), as A2-4Q=3" in bad.stderr


def test_without_a_cluster_it_says_so(tmp_path: Path) -> None:
    res = run_vgpuctl("capacity")
    assert res.returncode == 1
    assert "capacity reads the cluster: pass --kubeconfig" in res.stderr


def test_a_type_harvester_names_with_a_run_of_spaces_is_counted_under_its_resource(
    emu: ApiServerEmulator, tmp_path: Path
) -> None:
    """Harvester keeps a type's name as the driver printed it (``configureVGPUTypeName``) and
    advertises it under pcidevices' ``GeneratevGPUDeviceName``, where a run of whitespace is
    one ``_``: two VGPUDevices of ``NVIDIA  A2-4Q`` (two spaces) are two vGPUs of
    ``nvidia.com/NVIDIA_A2-4Q``, the resource the node's allocatable shows. vgpuctl counted
    them under ``nvidia.com/NVIDIA__A2-4Q``, a resource nothing offers, and the node's A2-4Q
    as none configured."""
    emu.seed(node("node-c", {Q: "2"}))
    for fn in (4, 5):
        emu.seed(vgpu_device("node-c", fn, "NVIDIA  A2-4Q"))
    res = capacity(emu.kubeconfig(tmp_path / "kubeconfig"))
    assert res.returncode == 0, res.stderr
    rows = [line.split() for line in res.stdout.splitlines()]
    assert rows == [
        ["NODE", "RESOURCE", "CONFIGURED", "ALLOCATABLE", "REQUESTED", "HELD", "FREE"],
        ["node-c", Q, "2", "2", "0", "0", "2"],
        ["(cluster)", Q, "2", "2", "0", "0", "2"],
    ]
