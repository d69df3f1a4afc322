"""Other nodes' VGPUNodeStates, read into this node's KubeVirt allow-list (issue 28 item 6).

Every node's token may write its own VGPUNodeState (deploy/admission-policy.yaml), and every
agent copies the profile names and VF device ids the other nodes' summaries show configured
into the KubeVirt CR. A node's stolen token can therefore put anything there. vgpuctl now checks
each name and device id as it checks its own host's first (vgpuctl's name check; a PCI device
id of four hex digits): one that fails is refused with a line naming the object and the field,
and the rest of the summary is used. Before, a bad name went into the CR (or, refused there by
the admission policy or by the executor's mandate, stopped every other node's allow-list write:
one node's token holding up the whole fleet).

The hostile summary is written through the emulator with the other node's own token, as that
node's agent would; vgpuctl runs as this node's agent with deploy/'s RBAC and policy.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent_cluster import agent, agent_node, as_user, permitted, policed_emulator
from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import SEED

EVIL = "harvester-evil"
NODE_STATE = {"group": "vgpu.reconciler.dev", "version": "v1alpha1", "plural": "vgpunodestates"}
BAD_NAME = "evil:name"
BAD_DEVICE = "26b9,8086:1572"
#: The lines the plan's notes give the two refusals.
REFUSED_NAME = (
    f"VGPUNodeState {EVIL}: status.profiles[2].name '{BAD_NAME}' is not a vGPU type name "
    "(vgpuctl's name check): refused, left out of the KubeVirt allow-list"
)
REFUSED_DEVICE = (
    f"VGPUNodeState {EVIL}: status.gpus[1].sriov.vfDevice '{BAD_DEVICE}' is not a PCI device "
    "id (four hex digits): refused, no pciHostDevices entry is written from it"
)


@pytest.fixture
def emu() -> Iterator[ApiServerEmulator]:
    with policed_emulator() as server:
        yield server


def _hostile_summary() -> dict[str, Any]:
    """A summary of two L40S on NVIDIA's vfio interface: one as vgpuctl writes it (its
    L40S-8Q vGPU is real and must stay allow-listed), one whose VF device id smuggles a second
    selector, and a profile whose name is no vGPU type name."""

    def gpu(address: str, vf: str, device: str) -> dict[str, Any]:
        return {
            "address": address,
            "interface": "vfio",
            "managed": True,
            "sriov": {"vfDevice": device},
            "vfAddresses": [vf],
        }

    return {
        "gpus": [
            gpu("0000:41:00.0", "0000:41:00.4", "26b9"),
            gpu("0000:42:00.0", "0000:42:00.4", BAD_DEVICE),
        ],
        "vgpus": [
            {"gpu": "0000:41:00.0", "vf": "0000:41:00.4", "profile": "NVIDIA L40S-8Q"},
            {"gpu": "0000:42:00.0", "vf": "0000:42:00.4", "profile": "NVIDIA L40S-4Q"},
        ],
        "profiles": [
            {"name": "NVIDIA L40S-8Q", "resourceName": "nvidia.com/NVIDIA_L40S-8Q", "vgpus": 1},
            {"name": "NVIDIA L40S-4Q", "resourceName": "nvidia.com/NVIDIA_L40S-4Q", "vgpus": 1},
            {"name": BAD_NAME, "resourceName": f"nvidia.com/{BAD_NAME}", "wanted": 1},
        ],
    }


def _write_hostile_summary(emu: ApiServerEmulator, tmp_path: Path) -> None:
    """The other node's agent token writes its own summary (the policy allows exactly that)."""
    body = {
        "apiVersion": "vgpu.reconciler.dev/v1alpha1",
        "kind": "VGPUNodeState",
        "metadata": {
            "name": EVIL,
            "labels": {"nodename": EVIL, "app.kubernetes.io/managed-by": "vgpuctl"},
        },
        "spec": {"nodeName": EVIL},
    }
    with as_user(emu, tmp_path, agent(EVIL), "evil") as api:
        created = api.create_object(**NODE_STATE, body=body)
        created["status"] = _hostile_summary()
        api.replace_status(**NODE_STATE, name=EVIL, body=created)


def test_a_hostile_summary_is_refused_field_by_field_and_the_rest_is_used(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    _write_hostile_summary(emu, tmp_path)
    node = agent_node(tmp_path, emu)
    res = node.run("apply", SEED, "--yes")
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert out.count(REFUSED_NAME) == 1, out
    assert out.count(REFUSED_DEVICE) == 1, out
    assert "Traceback" not in res.stderr

    lists = permitted(emu)
    # The good entry from the other node's summary, and this node's own, are written.
    assert {
        "pciVendorSelector": "10DE:26B9",
        "resourceName": "nvidia.com/NVIDIA_L40S-8Q",
        "externalResourceProvider": True,
    } in lists["pciHostDevices"]
    assert [e["mdevNameSelector"] for e in lists["mediatedDevices"]] == [
        "GRID T4-2Q",
        "NVIDIA A2-4A",
        "NVIDIA A2-4Q",
    ]
    # Nothing of the refused fields.
    text = json.dumps(lists)
    assert "evil" not in text and "8086" not in text
    selectors = [e["pciVendorSelector"] for e in lists["pciHostDevices"]]
    assert selectors == ["10DE:2236", "10DE:26B9"]


def test_cluster_only_planning_refuses_the_same_fields(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """``plan --observed cluster`` reads every node's summary in one list: the same checks,
    the same lines, and the plan's allow-list change holds only what passed."""
    node = agent_node(tmp_path, emu)
    node.ok("apply", SEED, "--yes")  # this node's own summary, which cluster-only plans read
    _write_hostile_summary(emu, tmp_path)
    res = node.run("plan", SEED, "--observed", "cluster", "-o", "json")
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    plans = doc["plans"]
    notes = [n for p in plans for n in p["notes"]]
    assert notes.count(REFUSED_NAME) == 1, notes
    assert notes.count(REFUSED_DEVICE) == 1, notes
    text = json.dumps([a for p in plans for a in p["actions"] if a["kind"] == "kubevirt-allow"])
    assert "NVIDIA_L40S-8Q" in text
    assert "evil" not in text and "8086" not in text
