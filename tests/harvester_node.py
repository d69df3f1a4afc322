"""A Harvester node for delegate-mode tests: the API-server emulator serving Harvester's CRDs,
the double of pcidevices-controller and its webhook (``tests/doubles/pcidevices.py``) running in
its thread on a simulated A2 (NVIDIA's vendor-specific VFIO interface; or another model, such as
a MIG-capable A100), and the seed's node.

Shared by ``tests/integration/test_cli_delegate.py`` and ``test_watch_delegate.py``.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from reconciler.catalog import Catalog, default_catalog
from reconciler.sim import SimHost, build_host
from tests.api_servers import (
    Served,
    create_ignoring_conflict,
    harvester_cluster,
    install_rbac,
    preserving_crd,
)
from tests.doubles.emulator import ApiServerEmulator, Request
from tests.doubles.pcidevices import (
    VGPUS,
    VMS,
    PciDevicesController,
    PciDevicesWebhook,
    WebhookServer,
    driver_pod,
    install,
    install_crds,
    node_object,
    serve_webhook,
    stop_webhook,
    vm,
)
from tests.rbac import DELEGATE_ACCOUNT, DELEGATE_RBAC, enforce
from tests.real_apiserver import IDENTITIES
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


# --- the same node on either API server (issue 32): the emulator or the real kube-apiserver ---


@dataclass
class ServedHarvester:
    """The seed's Harvester node on a :class:`tests.api_servers.Served` server: Harvester's
    CRDs, KubeVirt's CR, the double of pcidevices-controller acting on a simulated A2 through
    its informers over HTTP, and its webhook: on the real server an HTTPS admission webhook the
    server calls (``pcidevices-validator``), on the emulator the same validators in-process."""

    served: Served
    host: SimHost
    ctl: PciDevicesController
    #: The validators (in-process on the emulator, behind :attr:`webhook` on the real server).
    validator: PciDevicesWebhook
    webhook: WebhookServer | None

    @property
    def kubeconfig(self) -> Path:
        return self.served.kubeconfig_path

    def run(
        self, *args: str | Path, kubeconfig: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return run_vgpuctl(*args, "--kubeconfig", kubeconfig or self.kubeconfig, timeout=300)

    def ok(
        self, *args: str | Path, kubeconfig: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        res = self.run(*args, kubeconfig=kubeconfig)
        assert res.returncode == 0, f"{args}: exit {res.returncode}\n{res.stdout}\n{res.stderr}"
        return res

    def types(self) -> dict[str, str]:
        """Each VF's current_vgpu_type that is not 0, as the host has it."""
        return Cluster.types(self)  # type: ignore[arg-type]

    def vgpu(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.served.custom.get_cluster_custom_object(*VGPUS, name)
        return found

    def vm_holds(self, vf: str) -> str:
        """:func:`vm_holds` on this server: a VM ``default/win11`` listing ``vf``'s VGPUDevice
        under ``hostdevices``; the webhook's caches have it when this returns."""
        name = f"{NODE}-0000{vf[5:7]}{vf[8:10]}{vf[11]}"
        body = vm("win11", "default", hostdevices={"nvidia.com/NVIDIA_A2-4Q": [name]})
        self.served.custom.create_namespaced_custom_object(*VMS[:2], "default", VMS[2], body)
        if self.webhook is not None:
            self.webhook.sync()
        return name

    def vm_appears_on_disable(self, vf: str) -> str:
        """The moment the webhook is asked to admit the disable of ``vf``'s VGPUDevice (after
        vgpuctl's last look at the VMs), a VM takes it (:meth:`vm_holds`): the webhook
        refuses the write. Returns the VGPUDevice's name."""
        name = f"{NODE}-0000{vf[5:7]}{vf[8:10]}{vf[11]}"
        taken: list[bool] = []

        def take(operation: str, resource: str, target: str) -> None:
            if (operation, resource, target) != ("UPDATE", "vgpudevices", name) or taken:
                return
            taken.append(True)
            body = vm("win11", "default", hostdevices={"nvidia.com/NVIDIA_A2-4Q": [name]})
            if self.served.emulator is not None:  # the judge runs under the emulator's lock
                self.served.emulator.seed(body)
                return
            self.vm_holds(vf)

        self.validator.before_review = take
        return name

    def delete_vm(self) -> None:
        with contextlib.suppress(client.ApiException):
            self.served.custom.delete_namespaced_custom_object(*VMS[:2], "default", VMS[2], "win11")
        if self.webhook is not None:
            self.webhook.sync()


@contextmanager
def served_harvester_node(served: Served, tmp_path: Path) -> Iterator[ServedHarvester]:
    """:func:`harvester_node` on ``served`` (the ``api_server`` fixture's): SR-IOV off, the
    double's first resync done and its thread running; everything it made is deleted after
    (``Served.clean``: the real server is shared by the tests of a process)."""
    harvester_cluster(served)
    install_crds(served.install_crd)
    served.install_crd(preserving_crd(*VMS[:2], VMS[2], "VirtualMachine"))
    core: Any = client.CoreV1Api(served.api)
    create_ignoring_conflict(core.create_node, node_object(NODE))
    webhook = None
    if served.emulator is not None:
        validator = install(served.emulator)
    else:
        webhook = serve_webhook(served.api, served.kubeconfig_path, tmp_path / "webhook")
        validator = webhook.webhook
    gpu = {"model": "A2", "address": "0000:08:00.0", "interface": "vfio", "sriov": "disabled"}
    host = build_host(tmp_path / "host", {"gpus": [gpu]}, catalog=default_catalog())
    try:
        with PciDevicesController(None, host, NODE, served.kubeconfig_path) as ctl:
            ctl.resync()
            ctl.run_until_idle()
            ctl.start(resync_seconds=0.5)
            yield ServedHarvester(served, host, ctl, validator, webhook)
            ctl.stop()
    finally:
        if webhook is not None:
            stop_webhook(served.api, webhook)


def delegate_kubeconfig(
    harvester: ServedHarvester, path: Path
) -> tuple[Path, Callable[[], list[tuple[str, str, str, str | None]]]]:
    """A kubeconfig of the delegate's own identity (``system:serviceaccount:vgpuctl-delegate:
    vgpuctl-delegate``) with only its shipped role (deploy/harvester/rbac.yaml) granting it
    anything: on the real server the role installed and judged by the RBAC authorizer, on the
    emulator judged by ``tests/rbac.py``'s model of it. Also a function giving what that
    identity has asked since: (verb, group, resource, subresource) of each request."""
    served = harvester.served
    core: Any = client.CoreV1Api(served.api)
    for namespace in ("vgpuctl-delegate", "default"):  # the Lease's, the Events'
        create_ignoring_conflict(core.create_namespace, {"metadata": {"name": namespace}})
    if served.real is not None:
        install_rbac(served, DELEGATE_RBAC)
        real = served.real
        kubeconfig = real.kubeconfig(path, "delegate")
        since = real.audit_mark()

        def asked_real() -> list[tuple[str, str, str, str | None]]:
            user = IDENTITIES["delegate"][0]
            lines = real.audit_log.read_text().splitlines()[since:]
            events = [json.loads(line) for line in lines]
            refused = [
                (e["verb"], e.get("objectRef"))
                for e in events
                if e.get("user", {}).get("username") == user
                and (e.get("responseStatus") or {}).get("code") == 403
            ]
            assert refused == [], f"refused by the RBAC authorizer: {refused}"
            return [r[:4] for r in real.requests("delegate", since)]

        return kubeconfig, asked_real
    assert served.emulator is not None
    role = enforce(served.emulator, DELEGATE_RBAC, DELEGATE_ACCOUNT)
    kubeconfig = served.emulator.kubeconfig(path, user=role.user)

    def asked_emulated() -> list[tuple[str, str, str, str | None]]:
        refused = role.refused()
        assert refused == [], f"refused by the role: {refused}"
        return [(r.verb, r.group, r.resource, r.subresource) for r in role.requests]

    return kubeconfig, asked_emulated
