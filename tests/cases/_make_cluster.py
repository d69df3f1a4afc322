"""Write the cluster cases' ``cluster.json`` files from short descriptions.

The committed ``cluster.json`` files are the test data; this script only saves typing them.
Run ``python tests/cases/_make_observed.py`` first (the hosts), then
``python tests/cases/_make_cluster.py``, then read the diff.

A cluster "as vgpuctl left it" holds the CRs vgpuctl renders for a desired state on the case's
host (``render_objects``), each with a resourceVersion, and a KubeVirt CR whose allow-list has
those profiles. Harvester's own objects (pcidevices-controller) look like the seed's examples:
no managed-by label, no last-applied annotation, a status with only what Harvester writes and
its VF lists in glob order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from reconciler.model import DesiredGpu, DesiredNode, Inventory, PciAddress
from reconciler.model.cluster import (
    NODE_LABEL,
    PARENT_LABEL,
    ClusterState,
    DeviceUse,
    KubeObject,
    KubeVirtConfig,
    resource_name,
)
from reconciler.model.nodestate import stamped
from reconciler.plan.nodestate import settled_node_state
from reconciler.plan.render import render_objects

CASES = Path(__file__).parent
NODE = "harvester-kgd9c"
A2 = PciAddress.parse("0000:08:00.0")
L4 = PciAddress.parse("0000:09:00.0")
SEED_VGPUS = {
    PciAddress.parse("0000:08:00.4"): "NVIDIA A2-4A",
    PciAddress.parse("0000:08:00.5"): "NVIDIA A2-4Q",
    PciAddress.parse("0000:08:00.6"): "NVIDIA A2-4A",
    PciAddress.parse("0000:08:00.7"): "NVIDIA A2-4Q",
}
SEED = DesiredNode(NODE, (DesiredGpu(A2, True, model="NVIDIA A2", vgpus=SEED_VGPUS),))
SEED_AND_L4 = DesiredNode(
    NODE, (*SEED.gpus, DesiredGpu(L4, True, vgpus={0: "NVIDIA L4-6Q", 1: "NVIDIA L4-6Q"}))
)
VF5 = "harvester-kgd9c-000008005"
WIN11 = "VM default/win11 (pod virt-launcher-win11-x7k2p)"


def entry(profile: str) -> dict[str, Any]:
    return {
        "mdevNameSelector": profile,
        "resourceName": resource_name(profile),
        "externalResourceProvider": True,
    }


def kubevirt(entries: Iterable[Mapping[str, Any]], owned: Iterable[str]) -> KubeVirtConfig:
    return KubeVirtConfig(
        namespace="harvester-system",
        name="kubevirt",
        resource_version="880021",
        mediated_devices=tuple(entries),
        owned=frozenset(owned),
    )


SEED_KUBEVIRT = kubevirt(
    [entry("NVIDIA A2-4A"), entry("NVIDIA A2-4Q")], ["NVIDIA A2-4A", "NVIDIA A2-4Q"]
)


def stored(objects: Iterable[KubeObject], first_version: int = 7100) -> list[KubeObject]:
    """The objects as the API server returns them: each with its own resourceVersion."""
    return [replace(o, resource_version=str(first_version + i)) for i, o in enumerate(objects)]


def harvesters(objects: Iterable[KubeObject]) -> list[KubeObject]:
    """What Harvester's pcidevices-controller would have made of the same host (seed §5)."""
    out = []
    for o in objects:
        labels = {k: v for k, v in o.labels.items() if k in (NODE_LABEL, PARENT_LABEL)}
        if o.kind == "SRIOVGPUDevice" and o.status:
            pairs = sorted(zip(o.status["vfAddresses"], o.status["vGPUDevices"], strict=True))
            # A glob of virtfn* links: virtfn0, virtfn1, virtfn10, …
            order = sorted(range(len(pairs)), key=str)
            status: dict[str, Any] = {
                "vGPUDevices": [pairs[i][1] for i in order],
                "vfAddresses": [pairs[i][0] for i in order],
            }
        elif o.kind == "SRIOVGPUDevice":
            status = {}
        else:
            status = dict(o.status)
        out.append(replace(o, labels=labels, annotations={}, status=status))
    return out


@dataclass(frozen=True)
class Case:
    """A cluster as some earlier run left it (``baseline`` rendered on the case's host), then
    changed by ``change``."""

    baseline: DesiredNode | None  # None: no CRs yet
    kubevirt: KubeVirtConfig | None = SEED_KUBEVIRT
    change: Callable[[list[KubeObject]], list[KubeObject]] = lambda objects: objects
    profiles_elsewhere: frozenset[str] = frozenset()
    device_uses: tuple[DeviceUse, ...] = ()
    vmi_resources: Mapping[str, tuple[str, ...]] | None = None
    #: The node's VGPUNodeState as vgpuctl left it (False: none, as on a node Harvester runs).
    node_state: bool = True


def hand_edit(objects: list[KubeObject]) -> list[KubeObject]:
    """Someone ran ``kubectl edit vgpudevice harvester-kgd9c-000008005``."""
    return [
        replace(o, spec={**o.spec, "vGPUTypeName": "NVIDIA A2-4A"}) if o.name == VF5 else o
        for o in objects
    ]


def _inventory(name: str) -> Inventory:
    raw = json.loads((CASES / name / "observed.json").read_text(encoding="utf-8"))
    return Inventory.from_json(raw)


def seed_vf5_uuid() -> str:
    inventory = _inventory("cluster-in-use-checkpoint")
    gpu = inventory.gpu(A2)
    assert gpu is not None
    vf = gpu.vf(PciAddress.parse("0000:08:00.5"))
    assert vf is not None and vf.vgpu is not None
    return vf.vgpu.uuid


CLUSTERS: dict[str, Case] = {
    "cluster-seed-fresh": Case(baseline=None, kubevirt=kubevirt([], [])),
    "cluster-seed-in-sync": Case(baseline=SEED),
    "cluster-drift-hand-edit": Case(baseline=SEED, change=hand_edit),
    "cluster-profile-change": Case(baseline=SEED),
    "cluster-foreign-controller": Case(
        baseline=SEED,
        # Harvester appended the allow-list entries itself: they are not vgpuctl's.
        kubevirt=kubevirt([entry("NVIDIA A2-4A"), entry("NVIDIA A2-4Q")], []),
        change=harvesters,
        node_state=False,
    ),
    "cluster-foreign-adopt": Case(
        baseline=SEED,
        kubevirt=kubevirt([entry("NVIDIA A2-4A"), entry("NVIDIA A2-4Q")], []),
        change=harvesters,
        node_state=False,
    ),
    "cluster-in-use-checkpoint": Case(
        baseline=SEED,
        device_uses=(DeviceUse(seed_vf5_uuid(), resource_name("NVIDIA A2-4Q"), WIN11),),
    ),
    "cluster-in-use-vmi-unknown": Case(
        baseline=SEED, vmi_resources={"default/win11": (resource_name("NVIDIA A2-4Q"),)}
    ),
    "cluster-kubevirt-profile-gone": Case(
        baseline=SEED,
        kubevirt=kubevirt(
            [
                entry("NVIDIA A2-4A"),
                entry("NVIDIA A2-4Q"),
                entry("NVIDIA A2-8Q"),  # added by a person: never vgpuctl's to remove
                entry("NVIDIA L4-6Q"),
            ],
            ["NVIDIA A2-4A", "NVIDIA A2-4Q", "NVIDIA L4-6Q"],
        ),
        profiles_elsewhere=frozenset({"NVIDIA L4-6Q"}),  # another node still offers it
    ),
    "cluster-kubevirt-missing": Case(baseline=SEED, kubevirt=None),
    "cluster-gpu-dropped": Case(
        baseline=SEED_AND_L4,
        kubevirt=kubevirt(
            [entry("NVIDIA A2-4A"), entry("NVIDIA A2-4Q"), entry("NVIDIA L4-6Q")],
            ["NVIDIA A2-4A", "NVIDIA A2-4Q", "NVIDIA L4-6Q"],
        ),
    ),
    "cluster-sriov-disabled": Case(baseline=SEED),
    "cluster-count-form-fresh-l40s": Case(baseline=None, kubevirt=kubevirt([], [])),
    # SR-IOV on, no vGPU yet: every VF offers every type until the first vGPU narrows them.
    "cluster-first-vgpu-narrows": Case(
        baseline=DesiredNode(NODE, (DesiredGpu(A2, True, model="NVIDIA A2", vgpus={}),)),
        kubevirt=kubevirt([], []),
    ),
}


#: When the earlier run wrote the node's VGPUNodeState.
EARLIER = "2026-11-30T10:00:00Z"


def baseline_node_state(baseline: DesiredNode, inventory: Inventory) -> KubeObject:
    """The VGPUNodeState a run that reached ``baseline`` on ``inventory`` left (nothing
    blocked, nothing changed since)."""
    rendered = settled_node_state(NODE, baseline, inventory)
    return replace(rendered, status=stamped(rendered.status, EARLIER), resource_version="7001")


def cluster_state(name: str, case: Case) -> ClusterState:
    objects: list[KubeObject] = []
    node_state = None
    if case.baseline is not None:
        inventory = _inventory(name)
        objects = case.change(stored(render_objects(NODE, case.baseline, inventory)))
        if case.node_state:
            node_state = baseline_node_state(case.baseline, inventory)
    return ClusterState(
        node=NODE,
        sriov_gpu_devices={o.name: o for o in objects if o.kind == "SRIOVGPUDevice"},
        vgpu_devices={o.name: o for o in objects if o.kind == "VGPUDevice"},
        node_state=node_state,
        profiles_elsewhere=case.profiles_elsewhere,
        kubevirt=case.kubevirt,
        device_uses={u.device_id: u for u in case.device_uses},
        vmi_resources=case.vmi_resources or {},
    )


def main() -> None:
    for name, case in CLUSTERS.items():
        text = json.dumps(cluster_state(name, case).to_json(), indent=2, ensure_ascii=False)
        (CASES / name / "cluster.json").write_text(text + "\n", encoding="utf-8")
    for name in ("cluster-foreign-adopt",):
        (CASES / name / "options.json").write_text('{"adopt": true}\n', encoding="utf-8")


if __name__ == "__main__":
    main()
