"""A Harvester node for delegate-mode tests: the API-server emulator serving Harvester's CRDs,
the double of pcidevices-controller and its webhook (``tests/doubles/pcidevices.py``) running in
its thread on a simulated A2 (NVIDIA's vendor-specific VFIO interface; or another model, such as
a MIG-capable A100), and the seed's node.

Shared by ``tests/integration/test_cli_delegate.py`` and ``test_watch_delegate.py``.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from reconciler.catalog import Catalog, default_catalog
from reconciler.sim import SimHost, build_host
from tests.doubles.emulator import ApiServerEmulator, Request
from tests.doubles.pcidevices import PciDevicesController, driver_pod, install, node_object, vm
from tests.simnode import REPO, run_vgpuctl

NODE = "harvester-kgd9c"
SEED = REPO / "desired-state" / "harvester-kgd9c.yaml"
VFS = ["0000:08:00.4", "0000:08:00.5", "0000:08:00.6", "0000:08:00.7"]
#: The node's pod of Harvester's NVIDIA driver DaemonSet (:func:`driver_pod_on`).
DRIVER_POD = "nvidia-driver-runtime-x7k2p"


@dataclass
class Cluster:
    emu: ApiServerEmulator
    host: SimHost
    ctl: PciDevicesController
    kubeconfig: Path

    def run(self, *args: str | Path) -> subprocess.CompletedProcess[str]:
        return run_vgpuctl(*args, "--kubeconfig", self.kubeconfig, timeout=300)

    def ok(self, *args: str | Path) -> subprocess.CompletedProcess[str]:
        res = self.run(*args)
        assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
        return res

    def types(self) -> dict[str, str]:
        """Each VF's current_vgpu_type that is not 0, as the host has it."""
        out = {}
        for vf in sorted((self.host.sysfs_root / "bus/pci/devices").glob("0000:08:0*")):
            current = vf / "nvidia" / "current_vgpu_type"
            if current.exists() and current.read_text().strip() != "0":
                out[vf.name] = current.read_text().strip()
        return out


def layout(tmp_path: Path, vgpus: dict[str, str]) -> Path:
    """The seed's desired state with another VF layout."""
    doc = yaml.safe_load(SEED.read_text())
    doc["spec"]["nodes"][NODE]["gpus"][0]["vgpus"] = vgpus
    path = tmp_path / "changed.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@contextmanager
def harvester_node(
    emu: ApiServerEmulator,
    tmp_path: Path,
    *,
    vf_offset: int | None = None,
    model: str = "A2",
) -> Iterator[Cluster]:
    """The seed's node on Harvester, SR-IOV off, pcidevices-controller running; its GPU at
    0000:08:00.0 is an A2 unless ``model`` names another simulator model (``A100``: an
    A100 40GB, MIG-capable).

    ``vf_offset``: the GPU's ``sriov_offset`` on this host when not the catalogue's (4). The
    First VF Offset is the device's own (its SR-IOV capability, which the kernel reads), and
    the catalogue only records what public captures showed (docs/domain.md §1: VF addresses
    cannot be computed reliably; some boards show 2): a board or firmware that differs makes
    its VFs, and so pcidevices-controller's VGPUDevice names, other than predicted."""
    install(emu)
    emu.seed(node_object(NODE))
    gpu = {"model": model, "address": "0000:08:00.0", "interface": "vfio", "sriov": "disabled"}
    catalog = default_catalog()
    if vf_offset is not None:
        chosen = catalog.model(model)
        catalog = Catalog(
            tuple(replace(m, vf_offset=vf_offset) if m is chosen else m for m in catalog.models)
        )
    host = build_host(tmp_path / "host", {"gpus": [gpu]}, catalog=catalog)
    kubeconfig = emu.kubeconfig(tmp_path / "kubeconfig")
    with PciDevicesController(emu, host, NODE, kubeconfig) as ctl:
        ctl.resync()
        ctl.run_until_idle()
        ctl.start(resync_seconds=0.5)
        yield Cluster(emu, host, ctl, kubeconfig)
        ctl.stop()


def seed_with(vf: str, profile: str) -> str:
    """The seed's desired state with ``vf`` (one of :data:`VFS`) given ``profile`` instead."""
    text = SEED.read_text()
    line = re.search(rf'"{re.escape(vf)}": (NVIDIA A2-\w+)', text)
    assert line is not None, vf
    return text.replace(line.group(0), f'"{vf}": {profile}')


def vm_holds(cluster: Cluster, vf: str) -> str:
    """A running VM ``default/win11`` whose allocation annotation lists ``vf``'s VGPUDevice (a
    4Q, as the seed has it), as Harvester's VM webhook writes it; returns the object's name."""
    name = f"{NODE}-0000{vf[5:7]}{vf[8:10]}{vf[11]}"
    cluster.emu.seed(vm("win11", "default", hostdevices={"nvidia.com/NVIDIA_A2-4Q": [name]}))
    return name


def driver_pod_on(cluster: Cluster, *, running: bool) -> str:
    """The node's NVIDIA driver pod (``harvester-system/``:data:`DRIVER_POD`), its container
    running or crash-looping (``tests/doubles/pcidevices.py`` ``driver_pod``), created or
    changed; the controller's pod informer makes it its executor. Returns its name."""
    cluster.emu.seed(driver_pod(DRIVER_POD, NODE, running=running))
    return DRIVER_POD


#: The seed's four vGPUs (desired-state/harvester-kgd9c.yaml).
SEED_VGPUS = {
    VFS[0]: "NVIDIA A2-4A",
    VFS[1]: "NVIDIA A2-4Q",
    VFS[2]: "NVIDIA A2-4A",
    VFS[3]: "NVIDIA A2-4Q",
}


@dataclass
class Fleet:
    """Several Harvester nodes on one API server: each its own simulated A2 host (at
    0000:08:00.0, SR-IOV off) and its own double of pcidevices-controller, which acts on its
    own node's objects only (as the real one, which runs on every node)."""

    emu: ApiServerEmulator
    nodes: dict[str, Cluster]
    kubeconfig: Path

    def run(self, *args: str | Path) -> subprocess.CompletedProcess[str]:
        """vgpuctl against the fleet's API server; unless ``--qps`` is given, with a rate limit
        well above what the emulator and its doubles need (the default, 20 a second, would
        make each node's ~70 requests take about 3.5 s)."""
        pace = () if "--qps" in args else ("--qps", "1000", "--burst", "1000")
        return run_vgpuctl(*args, *pace, "--kubeconfig", self.kubeconfig, timeout=300)

    def desired(
        self,
        path: Path,
        vgpus: Mapping[str, str] = SEED_VGPUS,
        *,
        rollout: Mapping[str, int] | None = None,
    ) -> Path:
        """A desired state giving every node of the fleet the seed's GPU with ``vgpus``."""
        gpu = {"address": "0000:08:00.0", "model": "NVIDIA A2", "sriov": "enabled"}
        spec: dict[str, object] = {
            "nodes": {n: {"gpus": [{**gpu, "vgpus": dict(vgpus)}]} for n in self.nodes}
        }
        if rollout is not None:
            spec["rollout"] = dict(rollout)
        doc = {
            "apiVersion": "vgpu.reconciler.dev/v1alpha1",
            "kind": "VGPUDesiredState",
            "metadata": {"name": "fleet"},
            "spec": spec,
        }
        path.write_text(yaml.safe_dump(doc))
        return path

    def writes(self, node: str) -> list[int]:
        """Where in the emulator's request log vgpuctl wrote ``node``'s objects: the JSON
        patches on its SRIOVGPUDevices and VGPUDevices (the double of the controller writes
        statuses with PUTs and never patches). Objects are named ``<node>-<address>``."""
        return [i for i, r in enumerate(self.emu.requests) if _patches(r, node)]


def _patches(r: Request, node: str) -> bool:
    return (
        r.verb == "patch"
        and r.resource in ("sriovgpudevices", "vgpudevices")
        and r.subresource is None
        and (r.name or "").startswith(f"{node}-")
    )


def in_flight_at_once(spans: Sequence[tuple[int, int]]) -> int:
    """The most of ``spans`` (first and last index in a request log) that share an index."""
    return max(sum(first <= i <= last for first, last in spans) for s in spans for i in s)


@contextmanager
def harvester_fleet(
    emu: ApiServerEmulator, tmp_path: Path, nodes: Sequence[str]
) -> Iterator[Fleet]:
    """:func:`harvester_node` for each of ``nodes`` on one API server."""
    install(emu)
    kubeconfig = emu.kubeconfig(tmp_path / "kubeconfig")
    gpu = {"model": "A2", "address": "0000:08:00.0", "interface": "vfio", "sriov": "disabled"}
    with ExitStack() as stack:
        clusters: dict[str, Cluster] = {}
        for node in nodes:
            emu.seed(node_object(node))
            host = build_host(tmp_path / node, {"gpus": [gpu]}, catalog=default_catalog())
            ctl = stack.enter_context(PciDevicesController(emu, host, node, kubeconfig))
            stack.callback(ctl.stop)
            ctl.resync()
            ctl.run_until_idle()
            clusters[node] = Cluster(emu, host, ctl, kubeconfig)
        for cluster in clusters.values():
            cluster.ctl.start(resync_seconds=0.5)
        yield Fleet(emu, clusters, kubeconfig)
