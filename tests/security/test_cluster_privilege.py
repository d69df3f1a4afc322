"""Least privilege in the cluster: what one stolen agent token can and cannot do.

The agent (``vgpuctl`` as a subprocess, its token's user the vgpuctl service account with the
``authentication.kubernetes.io/node-name`` claim of its node) talks to the API-server emulator,
which holds exactly what deploy/ ships: RBAC (deploy/rbac.yaml, enforced per request for that
user) and the ValidatingAdmissionPolicy with its binding (deploy/admission-policy.yaml,
evaluated by cel-python). Attacks and their expected failures:

- a whole-object write of the KubeVirt CR changing the image registry or
  ``customizeComponents`` (one token reconfiguring virt-handler on every node): refused;
- writes to another node's SRIOVGPUDevice / VGPUDevice (create, spec, status, delete,
  relabelling): refused, and so is running vgpuctl for another node with this node's token;
- the agent's own writes go through, as a JSON patch that names only its KubeVirt entries and
  tests each value it replaces, so a concurrent change elsewhere survives and a change to
  what it touches fails the write cleanly;
- nothing is read that the job does not need: no pods, Events only where they are written;
- other users (an administrator, another service account) are not affected.

tests/security/test_real_admission.py runs the same attacks against the real kube-apiserver's
CEL as well as this emulator (``just test-real``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.model import ClusterError
from tests import rbac
from tests.agent_cluster import (
    KUBEVIRTS,
    KV_NS,
    POLICY_KINDS,
    agent,
    agent_node,
    as_user,
    kubevirt,
    policed_emulator,
    shipped,
    stored_kubevirt,
)
from tests.doubles.admission import UserInfo
from tests.doubles.emulator import ApiServerEmulator, Request
from tests.simnode import NODE, SEED

OTHER = "harvester-other"
GROUP, VERSION = "devices.harvesterhci.io", "v1beta1"
VGPUS = (GROUP, VERSION, "vgpudevices")
SRIOV = (GROUP, VERSION, "sriovgpudevices")
OWNED = "/metadata/annotations/vgpu.reconciler.dev~1mediated-devices"
ENTRIES = "/spec/configuration/permittedHostDevices/mediatedDevices"
ADMIN = UserInfo("kubernetes-admin", groups=("system:masters", "system:authenticated"))
HARVESTER = UserInfo("system:serviceaccount:harvester-system:harvester")


@pytest.fixture
def emu() -> Iterator[ApiServerEmulator]:
    """The emulator with deploy/'s CRDs, KubeVirt, and deploy/'s RBAC and admission policy."""
    with policed_emulator() as server:
        yield server


def mediated(emu: ApiServerEmulator) -> list[dict[str, Any]]:
    permitted = stored_kubevirt(emu)["spec"]["configuration"]["permittedHostDevices"]
    return list(permitted["mediatedDevices"])


def kubevirt_writes(emu: ApiServerEmulator) -> list[str]:
    return [
        r.verb
        for r in emu.requests
        if r.resource == "kubevirts" and r.verb not in ("get", "list", "watch")
    ]


def other_nodes_vgpu(name: str = f"{OTHER}-000008004") -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VGPUDevice",
        "metadata": {
            "name": name,
            "labels": {"nodename": OTHER, "app.kubernetes.io/managed-by": "vgpuctl"},
        },
        "spec": {
            "address": "0000:08:00.4",
            "enabled": True,
            "nodeName": OTHER,
            "parentGPUDeviceAddress": "0000:08:00.0",
            "vGPUTypeName": "NVIDIA A2-4Q",
        },
        "status": {"uuid": "0b0e4f51-1b7f-5a4e-9f64-d7b0a7a9a001"},
    }


# -- the agent's own work -----------------------------------------------------------------------


def test_the_agents_own_life_cycle_is_allowed_and_reads_no_pods(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """Create, change, disable: every request is one deploy/rbac.yaml grants, every write
    passes the admission policy, no pod is ever read and Events go to one namespace."""
    node = agent_node(tmp_path, emu)
    emu.requests.clear()
    node.ok("apply", SEED, "--yes")
    # A running VM holding a vGPU, per the kubelet checkpoint and the VMI's activePods.
    uuid = json.loads(node.ok("status", "-o", "json").stdout)["gpus"][0]["vfs"][1]["vgpu"]["uuid"]
    pod_uid = "3e0c4b8a-0000-4000-8000-0000000000aa"
    emu.seed(
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": {"name": "win11", "namespace": "vdi",
                         "labels": {"kubevirt.io/nodeName": NODE}},
            "spec": {"domain": {"devices": {"gpus": [
                {"name": "g", "deviceName": "nvidia.com/NVIDIA_A2-4Q"}]}}},
            "status": {"phase": "Running", "nodeName": NODE, "activePods": {pod_uid: NODE}},
        }
    )  # fmt: skip
    (node.kubelet_dir / "device-plugins" / "kubelet_internal_checkpoint").write_text(
        json.dumps(
            {
                "Data": {
                    "PodDeviceEntries": [
                        {"PodUID": pod_uid, "ContainerName": "compute",
                         "ResourceName": "nvidia.com/NVIDIA_A2-4Q", "DeviceIDs": {"-1": [uuid]},
                         "AllocResp": ""}
                    ],
                    "RegisteredDevices": {"nvidia.com/NVIDIA_A2-4Q": [uuid]},
                },
                "Checksum": 1,
            }
        )
    )  # fmt: skip
    changed = tmp_path / "changed.yaml"
    changed.write_text(SEED.read_text().replace("NVIDIA A2-4A", "NVIDIA A2-4C"))
    res = node.run("apply", changed, "--yes")
    assert res.returncode == 0, res.stdout + res.stderr
    disabled = tmp_path / "disabled.yaml"
    disabled.write_text(
        SEED.read_text().replace("sriov: enabled", "sriov: disabled").split("vgpus:")[0]
    )
    res = node.run("apply", disabled, "--yes")  # the held vGPU blocks: exit 2, nothing refused
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"in use by VM vdi/win11 (pod {pod_uid})" in res.stdout + res.stderr
    assert "forbidden" not in (res.stdout + res.stderr).lower()

    granted = rbac.grants()
    refused = sorted({rbac.needed(r) for r in emu.requests if not rbac.allows(granted, r)})
    assert refused == []
    assert not [r for r in emu.requests if r.resource == "pods"]
    assert {r.namespace for r in emu.requests if r.resource == "events"} == {"default"}
    assert kubevirt_writes(emu) and set(kubevirt_writes(emu)) == {"patch"}
    assert any(e["reason"] == "VGPURemovalBlocked" for e in emu.objects("", "v1", "events"))


def test_the_kubevirt_write_names_only_our_entries_and_a_change_elsewhere_survives(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    node = agent_node(tmp_path, emu)
    raced: list[Request] = []

    def someone_else(request: Request) -> None:
        # An administrator edits the CR between the agent's read and its write.
        if request.resource != "kubevirts" or raced:
            return
        raced.append(request)
        edited = stored_kubevirt(emu)
        edited["spec"]["imageTag"] = "1.1.1"
        edited["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"][0][
            "resourceName"
        ] = "nvidia.com/GRID_T4-2Q"
        emu.seed(edited)

    emu.on_before_write(someone_else)
    res = node.run("apply", SEED, "--yes")
    emu.on_before_write(None)
    assert res.returncode == 0, res.stdout + res.stderr
    assert raced, "the concurrent edit never happened"
    after = stored_kubevirt(emu)
    assert after["spec"]["imageTag"] == "1.1.1"
    assert after["spec"]["imageRegistry"] == "registry.suse.com/suse/sles/15.5"
    selectors = [e["mdevNameSelector"] for e in mediated(emu)]
    assert selectors == ["GRID T4-2Q", "NVIDIA A2-4A", "NVIDIA A2-4Q"]
    assert mediated(emu)[0]["resourceName"] == "nvidia.com/GRID_T4-2Q"
    # JSON patches only, their operations all on our entries and our annotation. The
    # allow-list write tests the version it read (so this run's removals can tell its write
    # from another's): the edit in between fails the first, which wrote nothing, and the
    # second, on the CR as edited, goes through.
    assert kubevirt_writes(emu) == ["patch", "patch"]
    (_, first), (_, second) = emu.patches
    assert first[0]["path"] == "/metadata/resourceVersion" and first[0]["op"] == "test"
    assert second, "an empty patch"
    assert all(op["path"] == OWNED or op["path"].startswith(f"{ENTRIES}/") for op in second)


def test_a_change_to_an_entry_the_agent_removes_fails_its_patch_cleanly(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    node = agent_node(tmp_path, emu)
    node.ok("apply", SEED, "--yes")
    emu.patches.clear()
    emu.requests.clear()

    def keep_editing(request: Request) -> None:
        # Before every write to the CR, someone edits the entry the agent is removing.
        if request.resource != "kubevirts":
            return
        edited = stored_kubevirt(emu)
        for entry in edited["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]:
            if entry["mdevNameSelector"] == "NVIDIA A2-4Q":
                entry["resourceName"] += "x"
        emu.seed(edited)

    emu.on_before_write(keep_editing)
    no_a2_4q = tmp_path / "no-4q.yaml"
    no_a2_4q.write_text(
        "\n".join(line for line in SEED.read_text().splitlines() if "A2-4Q" not in line) + "\n"
    )
    # A grace of 0: the removal is planned at once (the two-phase retirement is
    # tests/integration/test_allow_list_race.py's).
    res = node.run("apply", no_a2_4q, "--yes", "--allow-list-grace", "0")
    emu.on_before_write(None)
    assert "Traceback" not in res.stderr
    # The patch tested the entry as read and wrote nothing; read again, the CR is no longer
    # the version the removal was decided from: it waits for the next run.
    assert "removal of NVIDIA A2-4Q waits for the next run" in res.stdout + res.stderr
    assert res.returncode == 1, res.stdout + res.stderr  # not converged: the removal remains
    ((_, ops),) = emu.patches
    assert any(op["op"] == "test" and op["path"].startswith(f"{ENTRIES}/") for op in ops)
    entry = next(e for e in mediated(emu) if e["mdevNameSelector"] == "NVIDIA A2-4Q")
    assert entry["resourceName"] == "nvidia.com/NVIDIA_A2-4Qx"
    owned = stored_kubevirt(emu)["metadata"]["annotations"]["vgpu.reconciler.dev/mediated-devices"]
    assert owned == "NVIDIA A2-4A,NVIDIA A2-4Q"


# -- a stolen token -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (("spec", "imageRegistry"), "registry.attacker.example/kubevirt"),
        (("spec", "imageTag"), "backdoored"),
        (
            ("spec", "customizeComponents"),
            {"patches": [{"resourceName": "virt-handler", "resourceType": "DaemonSet",
                          "patch": '{"spec":{"template":{"spec":{"hostPID":true}}}}',
                          "type": "strategic"}]},
        ),
        (("spec", "configuration", "permittedHostDevices", "usb"), [{"vendor": "46d"}]),
        (("spec", "configuration", "developerConfiguration", "featureGates"), ["Root"]),
        (("metadata", "annotations", "kubevirt.io/latest-observed-api-version"), "v9"),
        # vgpuctl's prefix does not open the metadata: only its three annotations are its own.
        (("metadata", "annotations", "vgpu.reconciler.dev/anything"), "x"),
    ],
)  # fmt: skip
def test_the_agents_token_cannot_change_the_kubevirt_cr_beyond_its_allow_list(
    tmp_path: Path, emu: ApiServerEmulator, field: tuple[str, ...], value: Any
) -> None:
    before = stored_kubevirt(emu)
    with as_user(emu, tmp_path, agent(), "agent") as api:
        changed = copy.deepcopy(before)
        target = changed
        for key in field[:-1]:
            target = target.setdefault(key, {})
        target[field[-1]] = value
        # Whole-object update (what RBAC's `update` would allow) and a JSON patch alike.
        with pytest.raises(ClusterError) as put:
            api.replace_object(
                group="kubevirt.io", version="v1", plural="kubevirts", name="kubevirt",
                namespace=KV_NS, body=changed,
            )  # fmt: skip
        pointer = "".join("/" + key.replace("~", "~0").replace("/", "~1") for key in field)
        with pytest.raises(ClusterError) as patch:
            api.patch_object(
                group="kubevirt.io", version="v1", plural="kubevirts", name="kubevirt",
                namespace=KV_NS, patch=[{"op": "add", "path": pointer, "value": value}],
            )  # fmt: skip
    assert "RBAC denies update on kubevirts.kubevirt.io" in put.value.message
    assert "ValidatingAdmissionPolicy 'vgpuctl-agent'" in patch.value.message
    assert "the vgpuctl agent may change only" in patch.value.message
    assert stored_kubevirt(emu) == before


def test_the_agents_token_may_allow_list_a_vfio_profile_as_a_pci_host_device(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """What the vfio interface needs (docs/domain.md §8): a pciHostDevices entry and vgpuctl's
    annotation naming it. The policy admits exactly that write from the agent's token."""
    entry = {
        "pciVendorSelector": "10DE:26B9",
        "resourceName": "nvidia.com/NVIDIA_L40S-24Q",
        "externalResourceProvider": True,
    }
    with as_user(emu, tmp_path, agent(), "agent") as api:
        api.patch_object(
            group="kubevirt.io", version="v1", plural="kubevirts", name="kubevirt",
            namespace=KV_NS,
            patch=[
                {"op": "add", "path": "/spec/configuration/permittedHostDevices/pciHostDevices/-",
                 "value": entry},
                {"op": "add",
                 "path": "/metadata/annotations/vgpu.reconciler.dev~1pci-host-devices",
                 "value": "nvidia.com/NVIDIA_L40S-24Q"},
            ],
        )  # fmt: skip
    stored = stored_kubevirt(emu)
    assert entry in stored["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]
    assert (
        stored["metadata"]["annotations"]["vgpu.reconciler.dev/pci-host-devices"]
        == "nvidia.com/NVIDIA_L40S-24Q"
    )


def test_the_agents_token_may_mark_and_unmark_an_entry_retiring(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """The two-phase retirement (reconciler/model/retiring.py) writes its marks in one more
    annotation of vgpuctl's, vgpu.reconciler.dev/retiring: the policy admits setting it,
    changing it and removing it from the agent's token (and nothing else of the metadata, the
    test above). (Before, the policy refused it.)"""
    pointer = "/metadata/annotations/vgpu.reconciler.dev~1retiring"
    marks = json.dumps({"NVIDIA A2-4Q": "2026-12-07T19:00:00Z"})
    for op in (
        {"op": "add", "path": pointer, "value": marks},
        {"op": "replace", "path": pointer, "value": "{}"},
        {"op": "remove", "path": pointer},
    ):
        with as_user(emu, tmp_path, agent(), "agent") as api:
            api.patch_object(
                group="kubevirt.io", version="v1", plural="kubevirts", name="kubevirt",
                namespace=KV_NS, patch=[op],
            )  # fmt: skip
        stored = stored_kubevirt(emu)["metadata"].get("annotations") or {}
        if op["op"] == "remove":
            assert "vgpu.reconciler.dev/retiring" not in stored
        else:
            assert stored["vgpu.reconciler.dev/retiring"] == op["value"]


def test_the_agents_token_cannot_create_or_delete_a_kubevirt_cr(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    emu.authorize_with(None)  # even were RBAC to allow it (a widened role), admission refuses
    with as_user(emu, tmp_path, agent(), "agent") as api:
        with pytest.raises(ClusterError, match="may not create or delete a KubeVirt CR"):
            api.delete_object(
                group="kubevirt.io", version="v1", plural="kubevirts", name="kubevirt",
                namespace=KV_NS,
            )  # fmt: skip
        second = kubevirt()
        second["metadata"]["name"] = "evil"
        with pytest.raises(ClusterError, match="may not create or delete a KubeVirt CR"):
            api.create_object(
                group="kubevirt.io", version="v1", plural="kubevirts", namespace=KV_NS, body=second
            )
    assert emu.get_object(*KUBEVIRTS, "kubevirt", KV_NS) is not None
    assert emu.get_object(*KUBEVIRTS, "evil", KV_NS) is None


def test_the_agents_token_cannot_write_another_nodes_objects(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    theirs = emu.seed(other_nodes_vgpu())
    name = theirs["metadata"]["name"]
    refusal = "the vgpuctl agent may write only its own node's objects"
    with as_user(emu, tmp_path, agent(), "agent") as api:
        where = {"group": GROUP, "version": VERSION, "plural": "vgpudevices"}
        spec_edit = copy.deepcopy(theirs)
        spec_edit["spec"]["vGPUTypeName"] = "NVIDIA A2-16Q"
        status_edit = copy.deepcopy(theirs)
        status_edit["status"]["uuid"] = ""
        # Claiming it: relabelled to this node (the old object is still another node's).
        claimed = copy.deepcopy(theirs)
        claimed["metadata"]["labels"]["nodename"] = NODE
        claimed["spec"]["nodeName"] = NODE
        new = other_nodes_vgpu(f"{OTHER}-000008005")
        attempts = {
            "update": lambda: api.replace_object(**where, name=name, body=spec_edit),
            "status": lambda: api.replace_status(**where, name=name, body=status_edit),
            "claim": lambda: api.replace_object(**where, name=name, body=claimed),
            "delete": lambda: api.delete_object(**where, name=name),
            "create": lambda: api.create_object(**where, body=new),
        }
        for what, attempt in attempts.items():
            with pytest.raises(ClusterError) as err:
                attempt()
            assert refusal in err.value.message, what
        # Its own node's label with another node in spec.nodeName (what Harvester's
        # controllers act on) is refused too.
        mixed = other_nodes_vgpu(f"{NODE}-000008009")
        mixed["metadata"]["labels"]["nodename"] = NODE
        with pytest.raises(ClusterError, match=refusal):
            api.create_object(**where, body=mixed)
    assert emu.get_object(*VGPUS, name) == theirs
    assert [o["metadata"]["name"] for o in emu.objects(*VGPUS)] == [name]


def test_vgpuctl_for_another_node_with_this_nodes_token_is_refused(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """A stolen token, used to run vgpuctl as another node: its objects are never written."""
    node = agent_node(tmp_path, emu, node=OTHER, token_node=NODE)
    seed = SEED.read_text().replace(NODE, OTHER)
    desired = tmp_path / "other.yaml"
    desired.write_text(seed)
    res = node.run("apply", desired, "--yes")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "may write only its own node's objects" in res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert emu.objects(*SRIOV) == [] and emu.objects(*VGPUS) == []


def test_a_token_without_the_node_claim_writes_no_device_objects(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    node = agent_node(tmp_path, emu, token_node=None)
    res = node.run("apply", SEED, "--yes")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "carries no authentication.kubernetes.io/node-name claim" in res.stdout + res.stderr
    assert emu.objects(*SRIOV) == [] and emu.objects(*VGPUS) == []


def test_the_no_node_claim_fallback_drops_only_the_node_check(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    for doc in shipped(POLICY_KINDS, components=("no-node-claim",)):
        emu.seed(doc)
    node = agent_node(tmp_path, emu, token_node=None)
    node.ok("apply", SEED, "--yes")
    assert len(emu.objects(*VGPUS)) == 16
    # The KubeVirt CR is still limited to the allow-list.
    with as_user(emu, tmp_path, agent(None), "agent") as api, pytest.raises(ClusterError) as err:
        api.patch_object(
            group="kubevirt.io", version="v1", plural="kubevirts", name="kubevirt",
            namespace=KV_NS, patch=[{"op": "replace", "path": "/spec/imageTag", "value": "x"}],
        )  # fmt: skip
    assert "the vgpuctl agent may change only" in err.value.message


# -- everyone else ------------------------------------------------------------------------------


@pytest.mark.parametrize("user", [ADMIN, HARVESTER], ids=["admin", "harvester"])
def test_other_users_are_not_affected(
    tmp_path: Path, emu: ApiServerEmulator, user: UserInfo
) -> None:
    with as_user(emu, tmp_path, user, "other") as api:
        changed = stored_kubevirt(emu)
        changed["spec"]["imageRegistry"] = "registry.example/kubevirt"
        changed["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"] = []
        api.replace_object(
            group="kubevirt.io", version="v1", plural="kubevirts", name="kubevirt",
            namespace=KV_NS, body=changed,
        )  # fmt: skip
        where = {"group": GROUP, "version": VERSION, "plural": "vgpudevices"}
        created = api.create_object(**where, body=other_nodes_vgpu())
        created["spec"]["vGPUTypeName"] = "NVIDIA A2-8Q"
        api.replace_object(**where, name=created["metadata"]["name"], body=created)
        api.delete_object(**where, name=created["metadata"]["name"])
    assert stored_kubevirt(emu)["spec"]["imageRegistry"] == "registry.example/kubevirt"
    assert emu.objects(*VGPUS) == []
