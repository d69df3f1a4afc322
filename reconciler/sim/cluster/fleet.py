"""A simulated fleet to try vgpuctl's cluster side on: ``vgpuctl sim cluster DIR --nodes N``.

One API server (``emulator.py``, the one the test suite runs the unmodified ``kubernetes``
client against) on 127.0.0.1, serving what a Harvester cluster serves vgpuctl:

- Harvester's ``SRIOVGPUDevice`` and ``VGPUDevice`` CRDs (ours, ``schemas/crds/``, *are*
  Harvester's: the same schema and printer columns) and vgpuctl's ``VGPUNodeState``;
- KubeVirt's ``kubevirts`` CRD with its ``permittedHostDevices`` schema (``kubevirt_crd.py``)
  and the CR ``harvester-system/kubevirt`` with an empty allow-list, and
  ``virtualmachineinstances`` (none running);
- one ``Node`` per simulated host, ``node-1`` … ``node-N``, labelled ``kubernetes.io/hostname``
  and as ``--labels`` says, each host built under ``DIR/nodes/<name>`` as ``vgpuctl sim init``
  builds one (an A2 at 0000:08:00.0 unless told otherwise; SR-IOV off).

Nothing runs on the nodes: no device plugin (so a Node's allocatable lists no vGPU resource
until one runs) and no pcidevices-controller (vgpuctl writes Harvester's objects itself, as on a
cluster without it). The kubeconfig ``DIR/kubeconfig`` carries a random bearer token; requests
without one are refused (401). The state lives in memory: a restart starts an empty cluster
(the hosts under ``DIR/nodes`` stay as they were: the next ``apply`` writes their objects again).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from reconciler.model.record import record
from reconciler.sim.cluster.admission import UserInfo
from reconciler.sim.cluster.emulator import ApiServerEmulator
from reconciler.sim.cluster.kubevirt_crd import kubevirt_crd

#: The most nodes one simulated cluster has: the fleet size vgpuctl's own benchmarks plan
#: (README, "Performance": 1,000 nodes), each host about 160 files.
MAX_NODES = 1000
DEFAULT_GPUS = ("A2@0000:08:00.0",)
KUBEVIRT_NAMESPACE = "harvester-system"
#: Who the kubeconfig's token authenticates as (the emulator authorises everyone: no RBAC).
ADMIN = UserInfo("vgpuctl-sim-admin", groups=("system:masters", "system:authenticated"))
_CRDS = "crds"


def node_names(count: int) -> list[str]:
    """``node-1`` … ``node-<count>``."""
    return [f"node-{i}" for i in range(1, count + 1)]


def _crd_directory() -> Path:
    """``schemas/crds``: inside the wheel (``reconciler/_schemas``) or in a source checkout."""
    here = Path(__file__).resolve()
    for candidate in (here.parents[2] / "_schemas" / _CRDS, here.parents[3] / "schemas" / _CRDS):
        if candidate.is_dir():
            return candidate
    raise OSError(f"the CRDs are missing: no {here.parents[2] / '_schemas' / _CRDS}")


def kubevirt_cr() -> dict[str, Any]:
    """The KubeVirt CR as a fresh Harvester has it for vgpuctl: no device allow-listed."""
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": KUBEVIRT_NAMESPACE},
        "spec": {"configuration": {"permittedHostDevices": {}}},
    }


def node_object(name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """A Ready Node as the kubelet registers it (the fields vgpuctl reads: labels, status)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "status": {
            "capacity": {"cpu": "32", "memory": "128Gi", "pods": "110"},
            "allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


@record
class SimCluster:
    """A running simulated cluster: its API server, kubeconfig and hosts (``stop()`` ends it)."""

    emulator: ApiServerEmulator
    kubeconfig: Path
    hosts: dict[str, Path]

    @property
    def url(self) -> str:
        return self.emulator.url

    def stop(self) -> None:
        self.emulator.stop()


def start_cluster(
    directory: Path,
    *,
    nodes: int,
    gpus: Sequence[str] = DEFAULT_GPUS,
    labels: Mapping[str, str] | None = None,
    node_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> SimCluster:
    """Build the hosts (those already under ``DIR/nodes`` are kept as they are), start the API
    server and write ``DIR/kubeconfig``. ``labels`` go on every Node, ``node_labels[name]`` on
    that one (over ``labels``). Raises ValueError for a count or node name out of range, OSError
    when a directory cannot be written."""
    from reconciler.sim import init_host

    if not 1 <= nodes <= MAX_NODES:
        raise ValueError(f"--nodes must be between 1 and {MAX_NODES}, got {nodes}")
    names = node_names(nodes)
    unknown = sorted(set(node_labels or {}) - set(names))
    if unknown:
        raise ValueError(
            f"--labels names node {unknown[0]!r}, which this cluster does not have "
            f"(its nodes are node-1 … node-{nodes})"
        )
    directory.mkdir(parents=True, exist_ok=True)
    hosts: dict[str, Path] = {}
    for name in names:
        host = directory / "nodes" / name
        if not (host / "sys").is_dir():
            init_host(host, gpus)
        hosts[name] = host
    emulator = ApiServerEmulator(user=ADMIN.username, record=False)
    emulator.require_tokens()
    for path in sorted(_crd_directory().glob("*.yaml")):
        emulator.register_crd(yaml.safe_load(path.read_text()))
    emulator.register_crd(kubevirt_crd())
    emulator.register(
        "kubevirt.io", "v1", "virtualmachineinstances", "VirtualMachineInstance", True, True
    )
    emulator.seed(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "harvester-system"}}
    )
    emulator.seed(kubevirt_cr())
    for name in names:
        emulator.seed(node_object(name, {**(labels or {}), **(node_labels or {}).get(name, {})}))
    emulator.start()
    try:
        kubeconfig = directory / "kubeconfig"
        # Its token is the way in: readable by its owner only, from the start.
        os.close(os.open(kubeconfig, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        kubeconfig.chmod(0o600)
        emulator.kubeconfig(kubeconfig, user=ADMIN)
    except OSError:
        emulator.stop()
        raise
    return SimCluster(emulator, kubeconfig, hosts)
