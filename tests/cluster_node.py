"""A simulated host with a kubeconfig for the API-server emulator: ``vgpuctl`` in a subprocess
against both, and the cluster objects tests read back.

Shared by the CLI, watch and security tests of the cluster (the ``emu`` fixture:
``tests/conftest.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from reconciler.model.cluster import GROUP, VERSION
from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import NODE, REPO, SimNode, make_sim

SRIOV = (GROUP, VERSION, "sriovgpudevices")
VGPUS = (GROUP, VERSION, "vgpudevices")
NODE_STATES = ("vgpu.reconciler.dev", "v1alpha1", "vgpunodestates")
KUBEVIRTS = ("kubevirt.io", "v1", "kubevirts")
VMIS = ("kubevirt.io", "v1", "virtualmachineinstances")


#: Our CRDs; Harvester's own, as pcidevices-controller installs them, are test fixtures.
OUR_CRDS = REPO / "schemas" / "crds"
HARVESTER_CRDS = REPO / "tests" / "fixtures" / "harvester-crds"


def install_crds(emu: ApiServerEmulator, directory: Path = OUR_CRDS) -> None:
    """Install every CRD manifest in ``directory``: its schema prunes and validates writes."""
    for path in sorted(directory.glob("*.yaml")):
        emu.register_crd(yaml.safe_load(path.read_text()))


#: vgpuctl's own CRD, installed beside Harvester's on a Harvester cluster.
NODE_STATE_CRD = OUR_CRDS / "vgpunodestates.vgpu.reconciler.dev.yaml"


def register_crds(emu: ApiServerEmulator, *, harvester: bool = False) -> None:
    """Our CRDs (``harvester``: Harvester's own for its two kinds, as pcidevices-controller
    installs them, and ours for the VGPUNodeState), and KubeVirt's resources (served without
    a schema)."""
    if harvester:
        install_crds(emu, HARVESTER_CRDS)
        emu.register_crd(yaml.safe_load(NODE_STATE_CRD.read_text()))
    else:
        install_crds(emu)
    emu.register("kubevirt.io", "v1", "kubevirts", "KubeVirt", True, True)
    emu.register(
        "kubevirt.io", "v1", "virtualmachineinstances", "VirtualMachineInstance", True, True
    )


def stored_kubevirt(emu: ApiServerEmulator, namespace: str = "harvester-system") -> dict[str, Any]:
    """The KubeVirt CR ``kubevirt`` as the emulator stores it."""
    kv = emu.get_object(*KUBEVIRTS, "kubevirt", namespace)
    assert kv is not None
    return kv


def mdev_selectors(emu: ApiServerEmulator, namespace: str = "harvester-system") -> list[str]:
    """The mdevNameSelectors of the stored KubeVirt CR's mediatedDevices allow-list, in order."""
    permitted = stored_kubevirt(emu, namespace)["spec"]["configuration"]["permittedHostDevices"]
    return [e["mdevNameSelector"] for e in permitted["mediatedDevices"]]


def kubevirt_cr(namespace: str = "harvester-system") -> dict[str, Any]:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": namespace},
        "spec": {
            "configuration": {
                "permittedHostDevices": {
                    "pciHostDevices": [
                        {"pciVendorSelector": "10DE:2236", "resourceName": "nvidia.com/A10"}
                    ],
                    "mediatedDevices": [
                        # Someone else's entry: vgpuctl must never remove it.
                        {"mdevNameSelector": "GRID T4-2Q", "resourceName": "nvidia.com/GRID_T4-2Q"}
                    ],
                }
            }
        },
    }


class ClusterNode(SimNode):
    kubeconfig: Path
    kubelet_dir: Path

    @property
    def flags(self) -> list[str]:
        return [
            *super().flags,
            "--kubeconfig",
            str(self.kubeconfig),
            "--kubelet-dir",
            str(self.kubelet_dir),
        ]


def cluster_node(tmp_path: Path, emu: ApiServerEmulator, name: str = NODE) -> ClusterNode:
    sim = make_sim(tmp_path / f"host-{name}", ["A2@0000:08:00.0"], node=name)
    node = ClusterNode(sim.dir, name)
    node.kubeconfig = emu.kubeconfig(tmp_path / "kubeconfig")
    node.kubelet_dir = tmp_path / f"kubelet-{name}"
    (node.kubelet_dir / "device-plugins").mkdir(parents=True)
    return node


def stored(emu: ApiServerEmulator, res: tuple[str, str, str], name: str) -> dict[str, Any]:
    found = emu.get_object(*res, name)
    assert found is not None, name
    return found
