"""``vgpuctl status --delegate harvester`` (issue 30, item 1) against the API-server emulator and
the pcidevices-controller double (``tests/doubles/pcidevices.py``) on a simulated A2: the nodes'
vGPUs as Harvester's objects show them.

Expected values written by hand: object names ``<node>-<address without ':' and '.'>``
(docs/domain.md §5), the seed's 4A, 4Q, 4A, 4Q on VFs 0-3 (functions 4-7), the A2's type ids
(§4: 4A is 751, 4Q 746; pcidevices writes the id as ``status.uuid`` on the vendor-specific VFIO
interface, §3b), a configured VF listing no ``availableTypes`` (its ``creatable_vgpu_types`` is
empty), and a VF hosting a profile only when its status says so (§6, "An admitted write is not
a done step").
"""

from __future__ import annotations

import errno
import json
import re
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
from kubernetes import client, config

from tests.doubles.emulator import ApiServerEmulator
from tests.harvester_node import NODE, SEED, VFS, Cluster, harvester_node, layout, vm_holds
from tests.simnode import REPO
from tests.watch_agent import wait_for

CRD_SETS = ("harvester",)  # the emu fixture serves Harvester's own CRDs (tests/conftest.py)

SCHEMA = json.loads((REPO / "schemas" / "delegate-status.schema.json").read_text("utf-8"))
GPU_OBJECT = f"{NODE}-000008000"
VF0, VF1 = f"{NODE}-000008004", f"{NODE}-000008005"


@pytest.fixture
def harvester(emu: ApiServerEmulator, tmp_path: Path) -> Iterator[Cluster]:
    with harvester_node(emu, tmp_path) as cluster:
        yield cluster


def _rows(text: str) -> dict[str, list[str]]:
    """The VF table's rows by VF address: cells are separated by three spaces or more."""
    rows = {}
    for line in text.splitlines():
        cells = re.split(r" {3,}", line.strip())
        if cells and cells[0].startswith("0000:08:"):
            rows[cells[0]] = cells[1:]
    return rows


def test_a_refused_enable_is_pending_and_the_converged_seed_hosts(
    harvester: Cluster, tmp_path: Path
) -> None:
    one = layout(tmp_path, {VFS[0]: "NVIDIA A2-4A"})
    # The host refuses the vGPU after the webhook admitted the spec (the double's
    # refuse_enable): the spec says enabled 4A, the status nothing.
    harvester.ctl.refuse_enable = errno.EPERM
    assert harvester.run("apply", one, "--yes", "--timeout", "3").returncode == 1
    res = harvester.ok("status", "--delegate", "harvester")
    out = res.stdout
    assert f"=== node {NODE} (Harvester's objects) ===" in out
    assert (
        f"GPU 0000:08:00.0  SRIOVGPUDevice {GPU_OBJECT}  spec.enabled: true  status: 16 VFs, "
        "16 VGPUDevices"
    ) in out
    rows = _rows(out)
    assert len(rows) == 16
    assert rows[VFS[0]] == [VF0, "NVIDIA A2-4A", "-", "-", "PENDING", "-"]
    assert rows[VFS[1]] == [VF1, "disabled", "-", "-", "free", "-"]
    assert (
        f"  PENDING {VF0}: the enable of NVIDIA A2-4A is not carried out: pcidevices-controller "
        "retries a failed enable without writing a status (its log names the error)"
    ) in out.splitlines()
    assert "1 GPU, 16 VFs: 0 hosting, 1 pending (spec not carried out), 0 in use" in out
    # The controller is fixed, the seed applied: every vGPU hosted, none pending.
    harvester.ctl.refuse_enable = None
    wait_for(lambda: harvester.types() == {VFS[0]: "751"}, "the controller's retry", 60)
    harvester.ok("apply", SEED, "--yes")
    vm_holds(harvester, VFS[1])
    rows = _rows(harvester.ok("status", "--delegate", "harvester").stdout)
    assert rows[VFS[0]] == [VF0, "NVIDIA A2-4A", "NVIDIA A2-4A", "751", "hosting", "-"]
    assert rows[VFS[1]] == [
        VF1, "NVIDIA A2-4Q", "NVIDIA A2-4Q", "746", "hosting", "VM default/win11"
    ]  # fmt: skip
    assert rows[VFS[3]] == [f"{NODE}-000008007", "NVIDIA A2-4Q", "NVIDIA A2-4Q", "746",
                            "hosting", "-"]  # fmt: skip
    assert "PENDING" not in harvester.ok("status", "--delegate", "harvester").stdout
    # --delegate auto (the default) finds pcidevices-controller: the same view, said so.
    auto = harvester.ok("status")
    assert "delegate mode" in auto.stderr
    assert _rows(auto.stdout) == rows


def test_the_json_document_follows_its_schema(harvester: Cluster, tmp_path: Path) -> None:
    harvester.ok("apply", SEED, "--yes")
    vm_holds(harvester, VFS[1])
    doc = json.loads(harvester.ok("status", "--delegate", "harvester", "-o", "json").stdout)
    jsonschema.validate(doc, SCHEMA)
    assert (doc["formatVersion"], doc["observed"]) == (1, "harvester")
    (node,) = doc["nodes"]
    assert node["node"] == NODE
    assert node["summary"] == {"gpus": 1, "vfs": 16, "hosting": 4, "pending": 0, "inUse": 1}
    assert node["notes"] == []
    (gpu,) = node["gpus"]
    assert (gpu["name"], gpu["address"], gpu["spec"]) == (
        GPU_OBJECT, "0000:08:00.0", {"enabled": True}
    )  # fmt: skip
    assert len(gpu["status"]["vfAddresses"]) == 16
    assert sorted(gpu["status"]["vGPUDevices"])[:2] == [VF0, VF1]
    assert [v["address"] for v in gpu["vfs"]][:5] == [*VFS, "0000:08:01.0"]
    assert gpu["vfs"][1] == {
        "name": VF1,
        "address": VFS[1],
        "index": 1,
        "spec": {"enabled": True, "vGPUTypeName": "NVIDIA A2-4Q"},
        "status": {
            "vGPUStatus": "vGPUConfigured",
            "configureVGPUTypeName": "NVIDIA A2-4Q",
            "uuid": "746",
            "availableTypes": [],
        },
        "hosts": "NVIDIA A2-4Q",
        "state": "hosting",
        "pendingReason": None,
        "usedBy": "VM default/win11",
    }
    free = gpu["vfs"][4]
    assert (free["spec"], free["hosts"], free["state"], free["usedBy"]) == (
        {"enabled": False, "vGPUTypeName": ""}, None, "free", None
    )  # fmt: skip
    # Four 4 GB vGPUs fill the A2's 16 GB: a free VF can take nothing more (§4).
    assert free["status"]["availableTypes"] == []
    # Named nodes: a node without objects is listed, empty.
    doc = json.loads(
        harvester.ok("status", "--delegate", "harvester", "-o", "json", "cpu-only", NODE).stdout
    )
    jsonschema.validate(doc, SCHEMA)
    assert [(n["node"], len(n["gpus"])) for n in doc["nodes"]] == [("cpu-only", 0), (NODE, 1)]


def test_a_type_change_the_controller_ignores_shows_as_pending_with_its_cause(
    harvester: Cluster,
) -> None:
    harvester.ok("apply", SEED, "--yes")
    api = config.new_client_from_config(config_file=str(harvester.kubeconfig))
    client.CustomObjectsApi(api).patch_cluster_custom_object(
        "devices.harvesterhci.io", "v1beta1", "vgpudevices", VF1,
        {"spec": {"vGPUTypeName": "NVIDIA A2-4A"}},
    )  # fmt: skip
    api.close()
    harvester.ctl.run_until_idle()
    out = harvester.ok("status", "--delegate", "harvester").stdout
    assert _rows(out)[VFS[1]] == [VF1, "NVIDIA A2-4A", "NVIDIA A2-4Q", "746", "PENDING", "-"]
    assert (
        f"  PENDING {VF1}: the spec asks NVIDIA A2-4A over the NVIDIA A2-4Q it hosts: "
        "pcidevices-controller ignores a type change on an enabled VGPUDevice (vgpuctl apply "
        "disables and enables it again, or sets the spec back when the profile it hosts is the "
        "desired one)"
    ) in out.splitlines()


def test_node_names_and_crds_are_refused_where_they_mean_nothing(harvester: Cluster) -> None:
    res = harvester.run("status", "--delegate", "none", NODE)
    assert res.returncode == 1
    assert "node names select nodes of the delegate view" in res.stderr
    res = harvester.run("status", "--delegate", "harvester", "-o", "crds")
    assert res.returncode == 1
    assert "in delegate mode the objects are Harvester's" in res.stderr
