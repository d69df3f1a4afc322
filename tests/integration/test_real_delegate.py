"""Delegate mode (issue 14) on both API servers (issue 32): ``vgpuctl apply/plan/status/assert
--delegate harvester`` and ``watch --delegate auto`` as a user runs them, as the delegate's own
service account with only its shipped role (deploy/harvester/rbac.yaml), against Harvester's
real CRDs and the double of pcidevices-controller (``tests/doubles/pcidevices.py``) acting on a
simulated A2 through informers over HTTP, its webhook called by the API server
(``tests/harvester_node.py`` ``served_harvester_node``). On the real kube-apiserver the role is
judged by the RBAC authorizer and the webhook is a real HTTPS admission webhook, so each test
shows the emulator and the real server give the same outcome.

Expected values from the facts: the A2's type ids (docs/domain.md §4: 4Q 746, 4A 751), object
names ``<node>-<address without ':' and '.'>`` (pcidevices pcidevice.go
``PCIDeviceNameForHostname``), the webhook's words (pkg/webhook/vgpu.go ``checkVGPUUsage``)
behind the API server's (k8s.io/apiserver pkg/admission/plugin/webhook/errors/statuserror.go
``ToStatusErr``: ``admission webhook "<name>" denied the request: <message>``).
"""

from __future__ import annotations

import errno
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes.client import ApiException, CustomObjectsApi

from tests.api_servers import Served, new_client_from_config
from tests.doubles.pcidevices import VGPUS
from tests.harvester_node import (
    NODE,
    SEED,
    SEED_VGPUS,
    VFS,
    ServedHarvester,
    delegate_kubeconfig,
    seed_with,
    served_harvester_node,
)
from tests.rbac import DELEGATE_ACCOUNT, DELEGATE_RBAC, grants
from tests.watch_agent import Watch, wait_for

#: The seed's vGPUs as the host has them: 4A is type 751, 4Q 746 (docs/domain.md §4).
SEED_TYPES = {VFS[0]: "751", VFS[1]: "746", VFS[2]: "751", VFS[3]: "746"}
TYPE_IDS = {"NVIDIA A2-4A": "751", "NVIDIA A2-4Q": "746"}
DELEGATE = ("--delegate", "harvester")


def vgpu_name(vf: str) -> str:
    """``<node>-<address without ':' and '.'>``."""
    return f"{NODE}-{vf.replace(':', '').replace('.', '')}"


@pytest.fixture
def harvester(api_server: Served, tmp_path: Path) -> Iterator[ServedHarvester]:
    with served_harvester_node(api_server, tmp_path) as node:
        yield node


def test_the_seed_converges_and_a_profile_change_follows(
    harvester: ServedHarvester, tmp_path: Path
) -> None:
    kubeconfig, _ = delegate_kubeconfig(harvester, tmp_path / "delegate.kubeconfig")
    res = harvester.ok("apply", SEED, *DELEGATE, "--yes", kubeconfig=kubeconfig)
    assert harvester.types() == SEED_TYPES, res.stdout + res.stderr
    for vf, profile in SEED_VGPUS.items():
        obj = harvester.vgpu(vgpu_name(vf))
        assert obj["spec"]["enabled"] is True
        assert obj["spec"]["vGPUTypeName"] == profile
        assert obj["status"]["vGPUStatus"] == "vGPUConfigured"
        assert obj["status"]["configureVGPUTypeName"] == profile
        assert obj["status"]["uuid"] == TYPE_IDS[profile]
    assert "No changes" in harvester.ok("plan", SEED, *DELEGATE, kubeconfig=kubeconfig).stdout
    status = harvester.ok("status", *DELEGATE, kubeconfig=kubeconfig)
    assert NODE in status.stdout
    # VF 5 from 4Q to 4A: its disable, then its enable, carried out by the controller.
    changed = tmp_path / "changed.yaml"
    changed.write_text(seed_with(VFS[1], "NVIDIA A2-4A"))
    harvester.ok("apply", changed, *DELEGATE, "--yes", kubeconfig=kubeconfig)
    assert harvester.types() == {**SEED_TYPES, VFS[1]: "751"}
    assert harvester.vgpu(vgpu_name(VFS[1]))["status"]["configureVGPUTypeName"] == "NVIDIA A2-4A"
    assert "No changes" in harvester.ok("plan", changed, *DELEGATE, kubeconfig=kubeconfig).stdout


def test_a_disable_the_webhook_refuses_is_reported_in_the_servers_words(
    harvester: ServedHarvester, tmp_path: Path
) -> None:
    """A VM takes VF 5 after vgpuctl's last look and before its write: pcidevices' webhook
    refuses the disable, and the user reads the API server's denial, the VM named."""
    harvester.ok("apply", SEED, *DELEGATE, "--yes")
    name = harvester.vm_appears_on_disable(VFS[1])
    changed = tmp_path / "changed.yaml"
    changed.write_text(seed_with(VFS[1], "NVIDIA A2-4A"))
    res = harvester.run("apply", changed, *DELEGATE, "--yes", "--timeout", "20")
    assert res.returncode != 0, res.stdout + res.stderr
    assert (
        f'admission webhook "pcidevices.harvesterhci.io" denied the request: device {name} is '
        "in use with VM win11 in namespace default"
    ) in res.stdout + res.stderr
    assert harvester.types() == SEED_TYPES  # VF 5 keeps its 4Q
    assert harvester.vgpu(name)["spec"]["enabled"] is True
    # Now vgpuctl sees the VM too: the change is blocked, not written.
    plan = json.loads(harvester.ok("plan", changed, *DELEGATE, "-o", "json").stdout)
    (node_plan,) = plan["plans"]
    assert node_plan["actions"] == []
    assert "in use by VM default/win11" in node_plan["blocked"][0]["reason"]


def test_the_webhooks_denial_as_the_server_words_it(harvester: ServedHarvester) -> None:
    """An admin's own disable of a VGPUDevice a VM uses: the webhook's error (vgpu.go
    ``checkVGPUUsage``, a plain error: harvester's AdmissionHandler answers it as an internal
    error, 500) as the API server returns it (statuserror.go ``ToStatusErr``: the webhook's
    code and reason, its message after ``admission webhook "<name>" denied the request: ``),
    and nothing written."""
    harvester.ok("apply", SEED, *DELEGATE, "--yes")
    name = harvester.vm_holds(VFS[1])
    patch = [{"op": "replace", "path": "/spec/enabled", "value": False}]
    with pytest.raises(ApiException) as caught:
        harvester.served.custom.patch_cluster_custom_object(
            *VGPUS, name, patch, _content_type="application/json-patch+json"
        )
    body = json.loads(caught.value.body or "{}")
    assert (caught.value.status, body["code"], body["reason"], body["status"]) == (
        500, 500, "InternalError", "Failure"
    )  # fmt: skip
    assert set(body) == {"kind", "apiVersion", "metadata", "status", "message", "reason", "code"}
    assert body["message"] == (
        f'admission webhook "pcidevices.harvesterhci.io" denied the request: device {name} is '
        "in use with VM win11 in namespace default"
    )
    assert harvester.vgpu(name)["spec"]["enabled"] is True
    harvester.delete_vm()


def test_an_enable_the_host_refuses_after_admission_is_pending_not_success(
    harvester: ServedHarvester, tmp_path: Path
) -> None:
    one = tmp_path / "one.yaml"
    doc = SEED.read_text()
    for vf in VFS[1:]:
        doc = "\n".join(line for line in doc.splitlines() if f'"{vf}"' not in line) + "\n"
    one.write_text(doc)
    name = vgpu_name(VFS[0])
    harvester.ctl.refuse_enable = errno.EPERM
    res = harvester.run("apply", one, *DELEGATE, "--yes", "--timeout", "4")
    assert res.returncode == 1, res.stdout + res.stderr
    assert (
        f"pcidevices-controller has not carried out the enable of NVIDIA A2-4A on {name} after "
        "4 s (spec.enabled: true; status.vGPUStatus: empty"
    ) in res.stderr
    assert harvester.types() == {}
    res = harvester.run("assert", one, *DELEGATE)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "(1 pending: written, not carried out)" in res.stdout
    shown = harvester.ok("plan", one, *DELEGATE).stdout
    assert f"+ vgpu {VFS[0]}  NVIDIA A2-4A  (VGPUDevice {name})  pending" in shown
    # The host is fixed: the controller's next retry makes the vGPU.
    harvester.ctl.refuse_enable = None
    wait_for(lambda: harvester.types() == {VFS[0]: "751"}, "the controller's retry", 60)
    wait_for(lambda: harvester.run("assert", one, *DELEGATE).returncode == 0, "converged", 60)


#: The seed's layout from a node group (the Nodes are listed).
GROUPED = (
    "apiVersion: vgpu.reconciler.dev/v1alpha1\nkind: VGPUDesiredState\n"
    "metadata: {name: lab}\nspec:\n  nodeGroups:\n    - name: a2\n"
    '      selector: {names: ["harvester-*"]}\n'
    "      gpus:\n        - match: {deviceId: 25b6}\n          sriov: enabled\n"
    "          vgpus: {0: NVIDIA A2-4A, 1: NVIDIA A2-4Q, 2: NVIDIA A2-4A, 3: NVIDIA A2-4Q}\n"
)


def test_the_delegate_role_is_enough_and_every_rule_is_used(
    harvester: ServedHarvester, tmp_path: Path
) -> None:
    """deploy/harvester/rbac.yaml alone grants the delegate's identity what plan, apply,
    status, assert and a replica of the watch (auto-detection, its Lease, its watches, an
    Event for a blocked step) ask; and each of them asks for every verb on every resource the
    role grants (so no rule is there for nothing)."""
    kubeconfig, asked = delegate_kubeconfig(harvester, tmp_path / "delegate.kubeconfig")
    grouped = tmp_path / "grouped.yaml"
    grouped.write_text(GROUPED)
    for args in (
        ("plan", SEED, *DELEGATE),
        ("apply", SEED, *DELEGATE, "--yes"),
        ("status", *DELEGATE),
        ("assert", grouped, *DELEGATE),
    ):
        harvester.ok(*args, kubeconfig=kubeconfig)
    assert harvester.types() == SEED_TYPES
    desired = tmp_path / "desired"
    desired.mkdir()
    (desired / "harvester-kgd9c.yaml").write_text(SEED.read_text())
    home = tmp_path / "replica"
    home.mkdir()
    watch = Watch(
        _Replica(["--kubeconfig", str(kubeconfig)], home),
        desired,
        "--lease-duration", "6", "--lease-namespace", "vgpuctl-delegate", "--timeout", "60",
        "--delegate", "auto",
    )  # fmt: skip
    try:
        watch.wait_log(lambda d: str(d.get("msg", "")).startswith("converged"), "converged", 120)
        harvester.vm_holds(VFS[1])
        (desired / "harvester-kgd9c.yaml").write_text(seed_with(VFS[1], "NVIDIA A2-4A"))
        watch.wait_log(
            lambda d: "change(s) blocked" in str(d.get("msg", "")), "the blocked change", 60
        )
        wait_for(lambda: any(r[2] == "events" for r in asked()), "the Event", 20)
        assert watch.stop() == 0
    finally:
        watch.kill()
        harvester.delete_vm()
    used = {
        (verb, group, resource + (f"/{sub}" if sub else ""))
        for verb, group, resource, sub in asked()
    }
    granted = {(g.verb, g.group, g.resource) for g in grants(DELEGATE_RBAC, DELEGATE_ACCOUNT)}
    assert used - granted == set()  # nothing asked beyond the role (each flow succeeded too)
    assert granted - used == set()  # and every rule of it asked for
    # The role is what judges the identity: a write it does not grant (a whole-object update;
    # vgpuctl only patches) is refused.
    api = new_client_from_config(config_file=str(kubeconfig))
    try:
        custom = CustomObjectsApi(api)
        name = vgpu_name(VFS[0])
        obj = custom.get_cluster_custom_object(*VGPUS, name)
        with pytest.raises(ApiException) as caught:
            custom.replace_cluster_custom_object(*VGPUS, name, obj)
        assert caught.value.status == 403
    finally:
        api.close()


class _Replica:
    """What ``tests/watch_agent.Watch`` needs of a node: its flags and directory."""

    def __init__(self, flags: list[str], directory: Path) -> None:
        self.flags, self.dir = flags, directory
