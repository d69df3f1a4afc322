"""The KubeVirt allow-list a node agent's token may write (issue 28 item 6).

deploy/admission-policy.yaml already kept the agent to ``permittedHostDevices``; within it any
entry went. One stolen node token could then add ``{pciVendorSelector: 8086:1572,
resourceName: intel.com/nic}`` without ``externalResourceProvider``: virt-handler's own device
plugin would offer every node's Intel NIC (or disk controller, bound to vfio-pci) to any VM.
Now every entry the agent adds must be what vgpuctl writes: an NVIDIA vendor selector
(``10DE:`` and four upper-case hex digits), ``externalResourceProvider: true`` and a resource
name (and mdevNameSelector) that passes vgpuctl's own name check. The attacking patches go
through the API-server emulator as the agent's token and are refused; vgpuctl's own write is
admitted; entries that were there before stay anyone's to keep; and the policy's CEL and the
Python name check agree on hand-written good and bad names.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.model import ClusterError
from reconciler.model.cluster import is_resource_name, is_type_name, resource_name
from tests.agent_cluster import (
    KV_NS,
    AgentNode,
    agent,
    as_user,
    kubevirt,
    permitted,
    policed_emulator,
    shipped,
    stored_kubevirt,
)
from tests.doubles.admission import Attributes, admit
from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import NODE, run_vgpuctl

PCI = "/spec/configuration/permittedHostDevices/pciHostDevices"
MDEV = "/spec/configuration/permittedHostDevices/mediatedDevices"
PCI_OWNED = "/metadata/annotations/vgpu.reconciler.dev~1pci-host-devices"
REFUSED = "the vgpuctl agent may add to the KubeVirt CR's"
#: What vgpuctl writes (reconciler/model/plan.py: PciHostDevice, MediatedDevice).
GOOD_PCI = {
    "pciVendorSelector": "10DE:26B9",
    "resourceName": "nvidia.com/NVIDIA_L40S-8Q",
    "externalResourceProvider": True,
}
GOOD_MDEV = {
    "mdevNameSelector": "NVIDIA A2-4Q",
    "resourceName": "nvidia.com/NVIDIA_A2-4Q",
    "externalResourceProvider": True,
}


@pytest.fixture
def emu() -> Iterator[ApiServerEmulator]:
    with policed_emulator() as server:
        yield server


def _patch(emu: ApiServerEmulator, tmp_path: Path, ops: list[dict[str, Any]]) -> None:
    with as_user(emu, tmp_path, agent(), "agent") as api:
        api.patch_object(
            group="kubevirt.io", version="v1", plural="kubevirts", name="kubevirt",
            namespace=KV_NS, patch=ops,
        )  # fmt: skip


def _with(entry: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = {**entry, **changes}
    return {k: v for k, v in out.items() if v is not None}


# -- through the emulator, as a node agent's token -----------------------------------------------


@pytest.mark.parametrize(
    "entry",
    [
        # Another vendor's device, handed out by KubeVirt's own device plugin.
        {"pciVendorSelector": "8086:1572", "resourceName": "intel.com/nic"},
        _with(GOOD_PCI, pciVendorSelector="8086:1572"),
        # NVIDIA's, but KubeVirt's device plugin would allocate it (a whole GPU's PF too).
        _with(GOOD_PCI, externalResourceProvider=None),
        _with(GOOD_PCI, externalResourceProvider=False),
        _with(GOOD_PCI, externalResourceProvider="true"),
        # The selector as vgpuctl never writes it.
        _with(GOOD_PCI, pciVendorSelector="10de:26b9"),
        _with(GOOD_PCI, pciVendorSelector="10DE:26B9,8086:1572"),
        _with(GOOD_PCI, pciVendorSelector="10DE:26B"),
        _with(GOOD_PCI, pciVendorSelector="10DE"),
        # A resource name vgpuctl's name check refuses, or another prefix.
        _with(GOOD_PCI, resourceName="intel.com/NVIDIA_L40S-8Q"),
        _with(GOOD_PCI, resourceName="nvidia.com/x:y"),
        _with(GOOD_PCI, resourceName="nvidia.com/NVIDIA L40S-8Q"),
        _with(GOOD_PCI, resourceName="nvidia.com/NVIDIA_L40S-8Q\n"),
        _with(GOOD_PCI, resourceName="nvidia.com/" + "A" * 64),
        # A field vgpuctl never writes.
        _with(GOOD_PCI, note="x"),
    ],
    ids=lambda e: repr(e)[:60],
)
def test_the_agents_token_cannot_add_a_pci_host_device_vgpuctl_never_writes(
    tmp_path: Path, emu: ApiServerEmulator, entry: dict[str, Any]
) -> None:
    before = stored_kubevirt(emu)
    with pytest.raises(ClusterError) as err:
        _patch(
            emu,
            tmp_path,
            [
                {"op": "add", "path": f"{PCI}/-", "value": entry},
                {"op": "add", "path": PCI_OWNED, "value": str(entry.get("resourceName"))},
            ],
        )
    assert "ValidatingAdmissionPolicy 'vgpuctl-agent'" in err.value.message
    assert f"{REFUSED} pciHostDevices only NVIDIA vGPU entries" in err.value.message
    assert stored_kubevirt(emu) == before


@pytest.mark.parametrize(
    "entry",
    [
        _with(GOOD_MDEV, externalResourceProvider=None),
        _with(GOOD_MDEV, externalResourceProvider=False),
        _with(GOOD_MDEV, mdevNameSelector="NVIDIA A2-4Q\n"),
        _with(GOOD_MDEV, mdevNameSelector="x" * 64),
        _with(GOOD_MDEV, resourceName="nvidia.com/x:y"),
        _with(GOOD_MDEV, resourceName="example.com/NVIDIA_A2-4Q"),
    ],
    ids=lambda e: repr(e)[:60],
)
def test_the_agents_token_cannot_add_a_mediated_device_vgpuctl_never_writes(
    tmp_path: Path, emu: ApiServerEmulator, entry: dict[str, Any]
) -> None:
    before = stored_kubevirt(emu)
    with pytest.raises(ClusterError) as err:
        _patch(emu, tmp_path, [{"op": "add", "path": f"{MDEV}/-", "value": entry}])
    assert f"{REFUSED} mediatedDevices only vGPU entries" in err.value.message
    assert stored_kubevirt(emu) == before


def test_the_agents_token_cannot_turn_an_existing_entry_into_another(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """Someone else's entry, changed in place (a replace, not an add), is a new entry: the
    A10's selector widened to an Intel NIC is refused like an added one."""
    before = stored_kubevirt(emu)
    with pytest.raises(ClusterError, match=f"{REFUSED} pciHostDevices"):
        _patch(
            emu,
            tmp_path,
            [{"op": "replace", "path": f"{PCI}/0/pciVendorSelector", "value": "8086:1572"}],
        )
    assert stored_kubevirt(emu) == before


def test_vgpuctls_own_entries_are_admitted_and_others_entries_stay_as_they_are(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """The legitimate write: vgpuctl's entries added to lists that hold someone else's (the
    A10's, without externalResourceProvider; a T4's), which the policy leaves alone, and later
    removed again."""
    _patch(
        emu,
        tmp_path,
        [
            {"op": "add", "path": f"{PCI}/-", "value": GOOD_PCI},
            {"op": "add", "path": PCI_OWNED, "value": GOOD_PCI["resourceName"]},
            {"op": "add", "path": f"{MDEV}/-", "value": GOOD_MDEV},
            {
                "op": "add",
                "path": "/metadata/annotations/vgpu.reconciler.dev~1mediated-devices",
                "value": GOOD_MDEV["mdevNameSelector"],
            },
        ],
    )
    lists = permitted(emu)
    theirs = kubevirt()["spec"]["configuration"]["permittedHostDevices"]
    assert lists["pciHostDevices"] == [*theirs["pciHostDevices"], GOOD_PCI]
    assert lists["mediatedDevices"] == [*theirs["mediatedDevices"], GOOD_MDEV]
    _patch(
        emu, tmp_path, [{"op": "remove", "path": f"{PCI}/1"}, {"op": "remove", "path": f"{MDEV}/1"}]
    )
    assert permitted(emu) == theirs


def test_vgpuctls_own_vfio_write_passes_the_policy(tmp_path: Path, emu: ApiServerEmulator) -> None:
    """vgpuctl itself, on an L40S on NVIDIA's vfio interface, with its node's token: the
    pciHostDevices entry it writes is admitted."""
    res = run_vgpuctl(
        "sim", "init", tmp_path / "host", "--gpu", "L40S@0000:08:00.0", "--interface", "vfio"
    )
    assert res.returncode == 0, res.stderr
    node = AgentNode(tmp_path / "host", NODE)
    node.kubeconfig = emu.kubeconfig(tmp_path / "kubeconfig", user=agent())
    node.kubelet_dir = tmp_path / "kubelet"
    (node.kubelet_dir / "device-plugins").mkdir(parents=True)
    desired = tmp_path / "vfio.yaml"
    desired.write_text(
        "apiVersion: vgpu.reconciler.dev/v1alpha1\nkind: VGPUDesiredState\n"
        "metadata: {name: vfio}\nspec:\n  nodes:\n"
        f"    {NODE}:\n      gpus:\n        - address: '0000:08:00.0'\n"
        "          sriov: enabled\n          profiles: {NVIDIA L40S-8Q: 2}\n"
    )
    res = node.run("apply", desired, "--yes")
    assert res.returncode == 0, res.stdout + res.stderr
    assert GOOD_PCI in permitted(emu)["pciHostDevices"]


# -- the policy's CEL and vgpuctl's name check agree ----------------------------------------------

#: Hand-written vGPU type names, good and bad for vgpuctl's check (reconciler/model/cluster.py).
TYPE_NAMES = [
    # NVIDIA's, old and new branches, MIG-backed, several words.
    "NVIDIA A2-4Q",
    "GRID A100D-4C",
    "NVIDIA L40S-3B",
    "NVIDIA A100-1-5CME",
    "NVIDIA RTX Pro 6000 Blackwell DC-4-24Q",
    "GRID T4-2Q",
    "a",
    "A" * 63,
    "x.y/z_w-1",
    "NVIDIA_A2-4Q",
    # Not names.
    "",
    "A" * 64,
    " NVIDIA A2-4Q",
    "NVIDIA A2-4Q ",
    "NVIDIA A2-4Q\n",
    "NVIDIA\tA2-4Q",
    "-A2",
    "A2-",
    "A2.",
    "_A2",
    "NVIDIA A2:4Q",
    "NVIDIA A2-4Q'",
    'NVIDIA "A2"',
    "NVIDIA A2\u00e9",
    "NVIDIA\u00a0A2-4Q",
    "evil\x1b[31m",
    "a,b",
]
#: Resource names: those of the type names above, and others.
RESOURCE_NAMES = sorted(
    {
        *(resource_name(n) for n in TYPE_NAMES),
        "nvidia.com/NVIDIA_A2-4Q",
        "nvidia.com/A10",
        "nvidia.com/",
        "nvidia.com",
        "nvidia.com/a/b",
        "nvidia.com/a.b",
        "nvidia.com/a b",
        "nvidia.com/a:b",
        "nvidia.com/NVIDIA_A2-4Q\n",
        "NVIDIA.com/NVIDIA_A2-4Q",
        "nvidiaXcom/NVIDIA_A2-4Q",
        "xnvidia.com/NVIDIA_A2-4Q",
        "intel.com/nic",
        "nvidia.com/" + "A" * 63,
        "nvidia.com/" + "A" * 64,
    }
)


def _admitted(new_entry: dict[str, Any], where: str) -> bool:
    """Whether the shipped policy admits the agent's token adding ``new_entry`` to the
    ``where`` list of the KubeVirt CR (evaluated as the emulator evaluates it)."""
    policies = shipped(("ValidatingAdmissionPolicy",))
    bindings = shipped(("ValidatingAdmissionPolicyBinding",))
    old = kubevirt()
    new = copy.deepcopy(old)
    new["spec"]["configuration"]["permittedHostDevices"][where].append(new_entry)
    attributes = Attributes("UPDATE", "kubevirt.io", "v1", "kubevirts", "KubeVirt", "", KV_NS,
                            "kubevirt", agent(), new, old)  # fmt: skip
    return admit(attributes, policies, bindings) is None


@pytest.mark.parametrize("name", TYPE_NAMES, ids=repr)
def test_the_policy_and_vgpuctl_agree_on_type_names(name: str) -> None:
    entry = _with(GOOD_MDEV, mdevNameSelector=name)
    assert _admitted(entry, "mediatedDevices") is is_type_name(name)


@pytest.mark.parametrize("name", RESOURCE_NAMES, ids=repr)
def test_the_policy_and_vgpuctl_agree_on_resource_names(name: str) -> None:
    python = is_resource_name(name)
    assert _admitted(_with(GOOD_PCI, resourceName=name), "pciHostDevices") is python
    assert _admitted(_with(GOOD_MDEV, resourceName=name), "mediatedDevices") is python


def test_the_names_hold_both_answers() -> None:
    """The hand-written sets are worth something only with good and bad names in each."""
    assert {is_type_name(n) for n in TYPE_NAMES} == {True, False}
    assert {is_resource_name(n) for n in RESOURCE_NAMES} == {True, False}
    # A type name passes exactly when its resource name does and the mapping lost nothing
    # but spaces, '/' and '.' (the rule the CEL's second pattern states).
    for name in TYPE_NAMES:
        if is_type_name(name):
            assert is_resource_name(resource_name(name)), name
