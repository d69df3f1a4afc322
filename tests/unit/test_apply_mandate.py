"""The executors' own check of a plan (``apply/mandate.py``): what one run may touch.

Host: a GPU the desired state names, an NVIDIA vGPU GPU, a vGPU nobody uses at the moment of
acting (asked then, not before). Cluster: this node's objects vgpuctl manages (or adopts), and
the KubeVirt entries it added. Every plan the planner makes for the golden cases passes; every
edit of one that steps outside fails before anything is written.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_apply_fakes import (
    GPU,
    UUID_A,
    UUID_B,
    UUID_C,
    FakeKernel,
    FakeSriovManage,
    FakeTime,
    FakeWriter,
    vf_address,
)

from reconciler.apply import ApplyResult, Journal, MdevDriver, execute, execute_cluster
from reconciler.apply.errors import MandateError
from reconciler.apply.mandate import ClusterMandate, HostMandate, InUse
from reconciler.catalog import default_catalog
from reconciler.desired import load_desired
from reconciler.model import (
    Action,
    ActionKind,
    CrCreate,
    CrDelete,
    CrUpdate,
    DesiredNode,
    Inventory,
    KubevirtUpdate,
    MediatedDevice,
    Observation,
    PciAddress,
    PciHostDevice,
    Plan,
    SriovDisable,
    SriovEnable,
    VgpuCreate,
    VgpuRemove,
)
from reconciler.model.cluster import ClusterState, KubeObject, KubeVirtConfig
from reconciler.plan import plan_node, replan_object
from tests.doubles.cluster import FakeCluster

NODE = "n1"
VF0, VF1, VF2 = (vf_address(i) for i in range(3))
OTHER_GPU = PciAddress.parse("0000:41:00.0")
CASES = Path(__file__).resolve().parents[1] / "cases"


def _nobody(vf: PciAddress, uuid: str, type_name: str) -> str | None:
    return None


def host_mandate(
    *,
    managed: frozenset[PciAddress] = frozenset({GPU}),
    nvidia: frozenset[PciAddress] = frozenset({GPU}),
    in_use: InUse = _nobody,
) -> HostMandate:
    return HostMandate(managed=managed, nvidia=nvidia, in_use=in_use)


class Host:
    """Fake kernel + fake sriov-manage + the real MdevDriver, as the executor tests use them."""

    def __init__(self, tmp_path: Path) -> None:
        self.kernel = FakeKernel(tmp_path)
        self.sriov = FakeSriovManage(self.kernel)
        self.driver = MdevDriver(
            sysfs_root=self.kernel.root,
            writer=FakeWriter(self.kernel),
            runner=self.sriov,
            sriov_manage=["/usr/lib/nvidia/sriov-manage"],
        )
        self.journal = Journal(tmp_path / "state", NODE)
        self.time = FakeTime(on_sleep=self.sriov.tick)

    def apply(self, *actions: Action, mandate: HostMandate | None) -> ApplyResult:
        plan = Plan(node=NODE, interface="mdev", observed=Observation("sha256:x"), actions=actions)
        return execute(
            plan,
            driver=self.driver,
            journal=self.journal,
            verify_timeout=5.0,
            poll_interval=0.5,
            clock=self.time.clock,
            sleep=self.time.sleep,
            mandate=mandate,
        )


def enable(seq: int = 1) -> Action:
    return SriovEnable(seq=seq, target=str(GPU), reason="planned", gpu=GPU, num_vfs=4)


def create(seq: int, vf: PciAddress, index: int, uuid: str) -> Action:
    return VgpuCreate(
        seq=seq, target=str(vf), reason="planned", gpu=GPU, vf_index=index,
        type_name="NVIDIA A2-4Q", uuid=uuid,
    )  # fmt: skip


def remove(seq: int, vf: PciAddress, index: int, uuid: str) -> Action:
    return VgpuRemove(
        seq=seq, target=str(vf), reason="planned", gpu=GPU, vf_index=index,
        type_name="NVIDIA A2-4Q", uuid=uuid,
    )  # fmt: skip


# -- host -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mandate", "words"),
    [
        (
            host_mandate(managed=frozenset({OTHER_GPU})),
            f"GPU {GPU} is not in the desired state (rule: only the GPUs the desired state "
            "names are touched)",
        ),
        (
            host_mandate(nvidia=frozenset()),
            f"{GPU} is not an NVIDIA vGPU GPU of this host (rule: host actions act only on "
            "NVIDIA GPUs)",
        ),
    ],
)
def test_an_action_outside_the_mandate_is_refused_before_anything_runs(
    tmp_path: Path, mandate: HostMandate, words: str
) -> None:
    host = Host(tmp_path)
    with pytest.raises(MandateError) as raised:
        # The first action is fine by itself: nothing runs, not even it.
        host.apply(enable(1), create(2, VF0, 0, UUID_A), mandate=mandate)
    assert f"refused action 1 (sriov-enable {GPU}): {words}" in raised.value.message
    assert host.kernel.writes == []
    assert host.sriov.calls == []
    assert host.journal.last_run() == []


def test_a_vgpu_in_use_when_its_removal_comes_is_not_removed_and_the_run_stops(
    tmp_path: Path,
) -> None:
    host = Host(tmp_path)
    assert host.apply(
        enable(1), create(2, VF0, 0, UUID_A), create(3, VF1, 1, UUID_B), mandate=None
    ).ok
    asked: list[tuple[PciAddress, str, str]] = []

    def in_use(vf: PciAddress, uuid: str, type_name: str) -> str | None:
        asked.append((vf, uuid, type_name))
        return "pod 1234 (allocated by the kubelet)" if uuid == UUID_A else None

    writes = len(host.kernel.writes)
    result = host.apply(
        remove(1, VF0, 0, UUID_A), remove(2, VF1, 1, UUID_B), mandate=host_mandate(in_use=in_use)
    )
    failed = result.failed
    assert failed is not None and failed.action.seq == 1
    assert failed.message.startswith(
        f"refused action 1 (vgpu-remove {VF0}): vGPU {UUID_A} on {VF0} is in use by pod 1234 "
        "(allocated by the kubelet) (rule: a vGPU in use is never removed)"
    )
    assert [a.seq for a in result.not_run] == [2]
    assert asked == [(VF0, UUID_A, "NVIDIA A2-4Q")]
    assert len(host.kernel.writes) == writes
    assert host.driver.vgpu_on(VF0) == (UUID_A, "NVIDIA A2-4Q")
    assert host.driver.vgpu_on(VF1) == (UUID_B, "NVIDIA A2-4Q")


def test_in_use_is_asked_at_the_moment_of_acting_not_when_the_run_starts(tmp_path: Path) -> None:
    host = Host(tmp_path)
    assert host.apply(enable(1), create(2, VF0, 0, UUID_A), mandate=None).ok

    # A VM is given UUID_A while the run is under way (here: once VF2's vGPU exists).
    def in_use(vf: PciAddress, uuid: str, type_name: str) -> str | None:
        return "VM default/late" if host.driver.vgpu_on(VF2) is not None else None

    result = host.apply(
        create(1, VF2, 2, UUID_C), remove(2, VF0, 0, UUID_A), mandate=host_mandate(in_use=in_use)
    )
    assert [(o.action.seq, o.status.value) for o in result.outcomes] == [(1, "done"), (2, "failed")]
    failed = result.failed
    assert failed is not None and "in use by VM default/late" in failed.message
    assert host.driver.vgpu_on(VF0) == (UUID_A, "NVIDIA A2-4Q")


def test_a_vgpu_nobody_uses_is_removed_under_a_mandate(tmp_path: Path) -> None:
    host = Host(tmp_path)
    assert host.apply(enable(1), create(2, VF0, 0, UUID_A), mandate=None).ok
    result = host.apply(remove(1, VF0, 0, UUID_A), mandate=host_mandate())
    assert result.ok, result.failed
    assert host.driver.vgpu_on(VF0) is None


def test_a_removal_on_a_vf_the_named_gpu_does_not_have_is_refused(tmp_path: Path) -> None:
    host = Host(tmp_path)
    assert host.apply(enable(1), create(2, VF0, 0, UUID_A), mandate=None).ok
    # Another GPU's VF, hosting a vGPU the driver finds there, named with our GPU's address.
    foreign = PciAddress.parse("0000:41:00.4")
    (host.kernel.bus / str(foreign)).mkdir()
    (host.kernel.root / f"bus/pci/devices/{foreign}").symlink_to(host.kernel.bus / str(foreign))
    host.kernel.register(foreign)
    host.kernel.make_mdev(foreign, "nvidia-745", UUID_B)
    writes = len(host.kernel.writes)
    result = host.apply(remove(1, foreign, 0, UUID_B), mandate=None)
    failed = result.failed
    assert failed is not None
    assert f"{foreign} is not a VF of GPU {GPU} (rule: a vGPU is removed only from a VF" in (
        failed.message
    )
    assert len(host.kernel.writes) == writes


# -- cluster ----------------------------------------------------------------------------------


def _case(name: str) -> tuple[Plan, frozenset[PciAddress], ClusterState | None, Inventory, bool]:
    """A golden case planned: the plan, the GPUs its desired state names, the cluster, the host,
    and --adopt."""
    case = CASES / name
    catalog = default_catalog()
    inventory = Inventory.from_json(json.loads((case / "observed.json").read_text()))
    cluster_file = case / "cluster.json"
    cluster = (
        ClusterState.from_json(json.loads(cluster_file.read_text()))
        if cluster_file.is_file()
        else None
    )
    options_file = case / "options.json"
    adopt = bool(options_file.is_file() and json.loads(options_file.read_text()).get("adopt"))
    desired = load_desired([case / "desired.yaml"], catalog=catalog).node(inventory.node)
    plan = plan_node(desired, inventory, catalog=catalog, cluster=cluster, adopt=adopt)
    managed = frozenset(g.address for g in desired.gpus) if desired is not None else frozenset()
    return plan, managed, cluster, inventory, adopt


PLANNED = sorted(p.parent.name for p in CASES.glob("*/expected-plan.json"))


@pytest.mark.parametrize("name", PLANNED)
def test_every_plan_the_planner_makes_is_within_its_mandate(name: str) -> None:
    plan, managed, cluster, inventory, adopt = _case(name)
    hosts = host_mandate(managed=managed, nvidia=frozenset(g.address for g in inventory.gpus))
    for action in plan.actions:
        if isinstance(action, VgpuRemove | SriovDisable | SriovEnable | VgpuCreate):
            hosts.check_target(action, action.gpu)
    if cluster is not None:
        mandate = ClusterMandate.observed(
            cluster, managed=managed, adopt=adopt, inventory=inventory
        )
        mandate.check(plan.actions)


def test_the_golden_cases_exercise_every_cluster_write() -> None:
    kinds = {a.kind for name in PLANNED for a in _case(name)[0].actions}
    assert kinds >= {
        ActionKind.CR_CREATE, ActionKind.CR_UPDATE, ActionKind.CR_DELETE,
        ActionKind.KUBEVIRT_ALLOW, ActionKind.KUBEVIRT_UPDATE, ActionKind.VGPU_REMOVE,
        ActionKind.SRIOV_ENABLE,
    }  # fmt: skip


def _first(plan: Plan, kind: ActionKind) -> Action:
    return next(a for a in plan.actions if a.kind is kind)


def _body(action: Action, change: Callable[[dict[str, Any]], None]) -> Action:
    assert isinstance(action, CrCreate | CrUpdate)
    body = action.object.to_json()
    change(body)
    return replace(action, object=KubeObject.from_json(body))


def _refused(mandate: ClusterMandate, action: Action, words: str) -> None:
    with pytest.raises(MandateError) as raised:
        mandate.check([action])
    assert words in raised.value.message, raised.value.message


def test_a_delete_of_an_object_not_observed_on_this_node_is_refused() -> None:
    plan, managed, cluster, _, _ = _case("cluster-sriov-disabled")
    assert cluster is not None
    mandate = ClusterMandate.observed(cluster, managed=managed, adopt=False)
    delete = _first(plan, ActionKind.CR_DELETE)
    assert isinstance(delete, CrDelete)
    mandate.check([delete])
    _refused(
        mandate,
        replace(delete, target="gpu-node-2-000008004"),
        f"no {delete.object_kind} of that name was observed for node {cluster.node}",
    )
    _refused(
        mandate,
        replace(delete, resource_version="1"),
        "it was planned from resourceVersion 1",
    )


def _dropped_a2() -> tuple[ClusterMandate, ClusterState, Inventory]:
    """cluster-gpu-dropped: the A2 at 0000:08:00.0 is on the host (vGPUs on VFs 0-3 only,
    A2-4A, A2-4Q, A2-4A, A2-4Q) and vgpuctl's objects for it are stored; the desired state
    names only the L4."""
    _, managed, cluster, inventory, _ = _case("cluster-gpu-dropped")
    assert cluster is not None and GPU not in managed
    mandate = ClusterMandate.observed(cluster, managed=managed, adopt=False, inventory=inventory)
    return mandate, cluster, inventory


def _edited_spec(cluster: ClusterState, name: str, **spec: object) -> CrUpdate:
    """The update of the stored ``name`` to a spec with ``spec`` changed."""
    stored = cluster.vgpu_devices.get(name) or cluster.sriov_gpu_devices[name]
    update = replan_object(replace(stored, spec={**stored.spec, **spec}), stored, seq=1)
    assert isinstance(update, CrUpdate)
    return update


def test_an_unmanaged_gpus_objects_are_written_only_as_the_host_has_it() -> None:
    mandate, cluster, _ = _dropped_a2()
    # VF 4 (0000:08:01.0) has no vGPU: its object, edited by hand to ask for one, may be
    # reset to say so.
    stored = cluster.vgpu_devices["harvester-kgd9c-000008010"]
    hand_edited = replace(stored, spec={**stored.spec, "enabled": True, "vGPUTypeName": "X"})
    reset = replan_object(stored, hand_edited, seq=1)
    assert isinstance(reset, CrUpdate) and reset.object.spec["enabled"] is False
    mandate.check([reset])
    _refused(
        mandate,
        _edited_spec(
            cluster, "harvester-kgd9c-000008010", enabled=True, vGPUTypeName="NVIDIA A2-4Q"
        ),
        'asks for {"enabled": true, "vGPUTypeName": "NVIDIA A2-4Q"}, the host has '
        '{"enabled": false, "vGPUTypeName": ""} (rule: an unmanaged GPU\'s objects describe '
        "what the host has)",
    )
    # VF 0 hosts an A2-4A: another type is not what the host has.
    _refused(
        mandate,
        _edited_spec(cluster, "harvester-kgd9c-000008004", vGPUTypeName="NVIDIA A2-4Q"),
        'the host has {"enabled": true, "vGPUTypeName": "NVIDIA A2-4A"}',
    )
    # The GPU's SR-IOV is on.
    _refused(
        mandate,
        _edited_spec(cluster, "harvester-kgd9c-000008000", enabled=False),
        'asks for {"enabled": false}, the host has {"enabled": true}',
    )
    # Without the host's observation nothing tells what it has: nothing is written for it.
    _, managed, _, _, _ = _case("cluster-gpu-dropped")
    blind = ClusterMandate.observed(cluster, managed=managed, adopt=False)
    _refused(blind, reset, "which the desired state does not name")


def test_an_unmanaged_gpus_objects_are_deleted_only_once_it_is_gone_from_the_host() -> None:
    mandate, cluster, inventory = _dropped_a2()
    for name in ("harvester-kgd9c-000008004", "harvester-kgd9c-000008000"):
        stored = cluster.vgpu_devices.get(name) or cluster.sriov_gpu_devices[name]
        delete = CrDelete(
            seq=1,
            target=name,
            reason="edited",
            object_kind=stored.kind,
            resource_version=stored.resource_version,
        )
        _refused(
            mandate,
            delete,
            "is of a GPU or VF on the host that the desired state does not name (rule: an "
            "unmanaged GPU's objects are deleted only once it or the VF is gone from the host)",
        )
        # The A2 pulled from the host: its objects may go.
        pulled = replace(inventory, gpus=tuple(g for g in inventory.gpus if g.address != GPU))
        _, managed, _, _, _ = _case("cluster-gpu-dropped")
        ClusterMandate.observed(cluster, managed=managed, adopt=False, inventory=pulled).check(
            [delete]
        )


def test_another_controllers_object_is_deleted_never_and_updated_only_when_adopted() -> None:
    plan, managed, cluster, _, _ = _case("cluster-foreign-adopt")
    assert cluster is not None
    update = next(a for a in plan.actions if isinstance(a, CrUpdate) and a.adopt)
    ClusterMandate.observed(cluster, managed=managed, adopt=True).check([update])
    _refused(
        ClusterMandate.observed(cluster, managed=managed, adopt=False),
        update,
        "is managed by",
    )
    delete = CrDelete(
        seq=update.seq, target=update.target, reason="edited", object_kind=update.object.kind,
        resource_version=update.resource_version,
    )  # fmt: skip
    _refused(
        ClusterMandate.observed(cluster, managed=managed, adopt=True),
        delete,
        "(rule: vgpuctl deletes only objects it manages)",
    )


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            lambda b: b["metadata"]["labels"].update(nodename="gpu-node-2"),
            "is not for node",
        ),
        (lambda b: b["spec"].update(nodeName="gpu-node-2"), "is not for node"),
        (
            lambda b: b["metadata"]["labels"].pop("app.kubernetes.io/managed-by"),
            "is not labelled app.kubernetes.io/managed-by=vgpuctl",
        ),
        (lambda b: b["spec"].update(address="0000:41:00.0"), "does not belong to spec.address"),
    ],
)
def test_a_created_object_must_be_this_nodes_and_vgpuctls(
    change: Callable[[dict[str, Any]], None], words: str
) -> None:
    plan, managed, cluster, _, _ = _case("cluster-seed-fresh")
    assert cluster is not None
    mandate = ClusterMandate.observed(cluster, managed=managed, adopt=False)
    create_action = _first(plan, ActionKind.CR_CREATE)
    mandate.check([create_action])
    _refused(mandate, _body(create_action, change), words)


def test_objects_are_written_only_for_gpus_the_desired_state_names() -> None:
    plan, _, cluster, _, _ = _case("cluster-seed-fresh")
    assert cluster is not None
    mandate = ClusterMandate.observed(cluster, managed=frozenset({OTHER_GPU}), adopt=False)
    _refused(mandate, _first(plan, ActionKind.CR_CREATE), "which the desired state does not name")


def _kubevirt_case() -> tuple[KubevirtUpdate, ClusterMandate]:
    plan, managed, cluster, _, _ = _case("cluster-seed-fresh")
    assert cluster is not None and cluster.kubevirt is not None
    # Someone else's entry in the allow-list, besides whatever the case has.
    foreign = {"mdevNameSelector": "GRID T4-2Q", "resourceName": "nvidia.com/GRID_T4-2Q"}
    kubevirt = replace(
        cluster.kubevirt, mediated_devices=(*cluster.kubevirt.mediated_devices, foreign)
    )
    mandate = ClusterMandate.observed(
        replace(cluster, kubevirt=kubevirt), managed=managed, adopt=False
    )
    update = _first(plan, ActionKind.KUBEVIRT_ALLOW)
    assert isinstance(update, KubevirtUpdate)
    mandate.check([update])
    return update, mandate


def test_a_kubevirt_entry_must_be_the_one_vgpuctl_writes() -> None:
    update, mandate = _kubevirt_case()
    # An entry without externalResourceProvider: true cannot be an action at all: the codec
    # refuses it in a saved plan (test_plan_codec, tests/security/test_saved_plans).
    entry = update.add[0]
    _refused(
        mandate,
        replace(update, add=(replace(entry, resource_name="x/y"),)),
        '{"externalResourceProvider": true, "mdevNameSelector": "NVIDIA A2-4A", "resource…'
        " (rule: vgpuctl adds only",
    )
    _refused(
        mandate,
        replace(update, add=(MediatedDevice("GRID T4-2Q", "nvidia.com/GRID_T4-2Q"),)),
        "the allow-list already has an entry for GRID T4-2Q",
    )


def test_kubevirt_entries_vgpuctl_did_not_add_are_never_claimed_or_removed() -> None:
    update, mandate = _kubevirt_case()
    _refused(
        mandate,
        replace(update, owned=(*update.owned, "GRID T4-2Q")),
        "it claims GRID T4-2Q as vgpuctl's",
    )
    _refused(mandate, replace(update, remove=("GRID T4-2Q",)), "it removes GRID T4-2Q")
    _refused(
        mandate,
        replace(update, namespace="kube-system", target="kubevirt/kube-system/kubevirt"),
        "the KubeVirt CR observed is",
    )


def test_only_vgpuctls_own_entries_are_marked_retiring_and_a_present_one_only_made_sure_of() -> (
    None
):
    """The retirement (reconciler/model/retiring.py): a mark only on an entry vgpuctl added; an
    entry that is there may be named by a kubevirt-allow only to make sure of it before a
    create (its selector in unmark: nothing is added while it is there), never by a
    kubevirt-update's add. (Before, a present entry in an add was always refused.)"""
    update, mandate = _kubevirt_case()
    marking = KubevirtUpdate(
        seq=9, target=update.target, reason="r", namespace=update.namespace, name=update.name,
        resource_version=update.resource_version, retire=("GRID T4-2Q",),
    )  # fmt: skip
    _refused(mandate, marking, "it marks GRID T4-2Q retiring, an entry vgpuctl did not add")
    theirs = MediatedDevice("GRID T4-2Q", "nvidia.com/GRID_T4-2Q")
    ensure = replace(update, add=(*update.add, theirs), unmark=("GRID T4-2Q",))
    mandate.check([ensure])
    _refused(mandate, replace(ensure, unmark=()), "the allow-list already has an entry for")
    _refused(
        mandate,
        replace(ensure, owned=(*ensure.owned, "GRID T4-2Q")),
        "it claims GRID T4-2Q as vgpuctl's",
    )


L40S_8Q = "nvidia.com/NVIDIA_L40S-8Q"
L40S_4Q = "nvidia.com/NVIDIA_L40S-4Q"


def _pci_case() -> tuple[KubevirtUpdate, ClusterMandate]:
    """An allow-list with someone else's PCI entry (an A10 passed through whole) and one
    vgpuctl added (L40S-4Q), and the update vgpuctl plans: L40S-8Q in, L40S-4Q out."""
    kubevirt = KubeVirtConfig(
        "harvester-system",
        "kubevirt",
        "7",
        pci_host_devices=(
            {"pciVendorSelector": "10DE:2236", "resourceName": "nvidia.com/A10"},
            {"pciVendorSelector": "10DE:26B9", "resourceName": L40S_4Q},
        ),
        owned_pci=frozenset({L40S_4Q}),
    )
    mandate = ClusterMandate(node=NODE, managed=frozenset(), kubevirt=kubevirt)
    update = KubevirtUpdate(
        seq=1, target=kubevirt.target, reason="r", namespace="harvester-system",
        name="kubevirt", resource_version="7",
        add_pci=(PciHostDevice("10DE:26B9", L40S_8Q),), remove_pci=(L40S_4Q,),
        owned_pci=(L40S_8Q,),
    )  # fmt: skip
    mandate.check([update])
    return update, mandate


@pytest.mark.parametrize(
    ("selector", "resource"),
    [
        ("10DE:26b9", L40S_8Q),  # not as vgpuctl writes it
        ("1AF4:1041", L40S_8Q),  # not NVIDIA's: a virtio NIC
        ("10DE:26B9,1AF4:1041", L40S_8Q),
        ("10DE", L40S_8Q),
        ("10DE:26B9", "example.com/NVIDIA_L40S-8Q"),  # not a vGPU resource
        ("10DE:26B9", "nvidia.com/NVIDIA L40S-8Q"),  # not a resource name vgpuctl makes
        ("10DE:26B9", "nvidia.com/../x"),
        ("10DE:26B9", "nvidia.com/"),
    ],
)
def test_a_pci_entry_vgpuctl_would_never_write_is_refused(selector: str, resource: str) -> None:
    update, mandate = _pci_case()
    _refused(
        mandate,
        replace(update, add_pci=(PciHostDevice(selector, resource),), owned_pci=()),
        "(rule: vgpuctl adds only {pciVendorSelector: 10DE:<VF device id>",
    )


def test_pci_entries_vgpuctl_did_not_add_are_never_claimed_replaced_or_removed() -> None:
    update, mandate = _pci_case()
    a10 = "nvidia.com/A10"
    _refused(
        mandate,
        replace(update, remove_pci=(a10,)),
        "it removes PCI host device nvidia.com/A10, an entry vgpuctl did not add",
    )
    _refused(
        mandate,
        replace(update, owned_pci=(L40S_8Q, a10)),
        "it claims PCI host device nvidia.com/A10 as vgpuctl's",
    )
    _refused(
        mandate,
        replace(update, add_pci=(PciHostDevice("10DE:2236", a10),)),
        "the allow-list already has a PCI host device entry for nvidia.com/A10",
    )
    # Ownership of the mediated-devices kind is not ownership of a PCI entry.
    kv = mandate.kubevirt
    assert kv is not None
    mdev_owner = replace(mandate, kubevirt=replace(kv, owned=frozenset({a10})))
    _refused(mdev_owner, replace(update, remove_pci=(a10,)), "it removes PCI host device")


def test_the_cluster_executor_checks_before_writing_anything() -> None:
    plan, managed, cluster, _, _ = _case("cluster-sriov-disabled")
    assert cluster is not None
    mandate = ClusterMandate.observed(cluster, managed=managed, adopt=False)
    actions = [a for a in plan.actions if not a.kind.is_host and a.kind.value.startswith("cr-")]
    stranger = replace(_first(plan, ActionKind.CR_DELETE), seq=99, target="gpu-node-2-000008004")
    api = FakeCluster()
    with pytest.raises(MandateError):
        execute_cluster([*actions, stranger], api=api, node=cluster.node, mandate=mandate)
    assert api.calls == []  # a refused plan does not reach the API server at all


def test_a_cluster_mandate_without_an_observed_cluster_allows_no_write() -> None:
    plan, managed, cluster, _, _ = _case("cluster-seed-fresh")
    assert cluster is not None
    empty = ClusterMandate(node=cluster.node, managed=managed)
    _refused(empty, _first(plan, ActionKind.KUBEVIRT_ALLOW), "no KubeVirt CR was observed")
    stored = KubeObject(kind="VGPUDevice", name=f"{cluster.node}-000008004", resource_version="5")
    delete = CrDelete(
        seq=1, target=stored.name, reason="edited", object_kind="VGPUDevice", resource_version="5"
    )
    _refused(empty, delete, "no VGPUDevice of that name was observed")


# -- the engine: what apply and watch both run -------------------------------------------------

SEED = Path(__file__).resolve().parents[2] / "desired-state" / "harvester-kgd9c.yaml"
SEED_NODE = "harvester-kgd9c"
HELD_VF = PciAddress.parse("0000:08:00.5")


class Engine:
    """A simulated seed node driven through the engine's acting half (``carry_out``), which
    hands the executors whatever plan it is given: here, plans edited after planning."""

    def __init__(self, tmp_path: Path, *, cluster: ClusterState | None = None) -> None:
        from reconciler.cli.host import Host
        from reconciler.cli.options import GlobalOptions
        from reconciler.engine import observe_and_plan
        from reconciler.sim import init_host

        self.sim = init_host(tmp_path / "host", ["A2@0000:08:00.0"])
        self.kubelet_dir = tmp_path / "kubelet"
        host = Host(
            GlobalOptions(
                sysfs_root=self.sim.sysfs_root, sriov_manage=None, node=SEED_NODE,
                state_dir=None, no_color=True, kubelet_dir=self.kubelet_dir,
            )
        )  # fmt: skip
        ports = host.ports(write_timeout=5.0)
        if cluster is not None:  # a cluster that says nothing: the baseline rule applies
            ports = replace(ports, observe_cluster=lambda: cluster)
        self.ports = ports
        self.desired = load_desired([SEED], catalog=host.catalog).node(SEED_NODE)
        assert self.desired is not None
        self.plan_for = observe_and_plan
        assert self.apply(self.plan()).ok

    def plan(self) -> Any:
        return self.plan_for(self.ports, self.desired)

    def apply(self, planned: Any, desired: DesiredNode | None = None) -> Any:
        from reconciler.engine import RunSettings
        from reconciler.engine.pipeline import carry_out

        desired = desired or self.desired
        assert desired is not None
        return carry_out(self.ports, desired, planned, settings=RunSettings(verify_timeout=5.0))

    def vgpu(self, vf: PciAddress) -> str | None:
        gpu = self.plan().inventory.gpus[0]
        found = gpu.vf(vf)
        return found.vgpu.uuid if found and found.vgpu else None

    def with_removal(self, planned: Any, vf: PciAddress) -> Any:
        """``planned`` with one more action: removing the vGPU on ``vf`` (an edited plan)."""
        uuid = self.vgpu(vf)
        assert uuid is not None
        action = VgpuRemove(
            seq=len(planned.plan.actions) + 1, target=str(vf), reason="planned",
            gpu=PciAddress.parse("0000:08:00.0"), vf_index=1, type_name="NVIDIA A2-4Q", uuid=uuid,
        )  # fmt: skip
        return replace(planned, plan=replace(planned.plan, actions=(action,)))

    def allocate(self, vf: PciAddress, pod: str = "pod-uid-1") -> None:
        """The kubelet gives the vGPU on ``vf`` to a pod (its checkpoint says so)."""
        entry = {"PodUID": pod, "ContainerName": "compute",
                 "ResourceName": "nvidia.com/NVIDIA_A2-4Q",
                 "DeviceIDs": {"-1": [self.vgpu(vf)]}, "AllocResp": ""}  # fmt: skip
        path = self.kubelet_dir / "device-plugins" / "kubelet_internal_checkpoint"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"Data": {"PodDeviceEntries": [entry]}, "Checksum": 1}))


def test_the_engine_refuses_to_remove_a_vgpu_a_process_holds(tmp_path: Path) -> None:
    from reconciler.sim import hold

    engine = Engine(tmp_path)
    uuid = engine.vgpu(HELD_VF)
    assert uuid is not None
    edited = engine.with_removal(engine.plan(), HELD_VF)
    hold(engine.sim.directory, uuid)  # a VM opens it after the plan was made
    report = engine.apply(edited)
    failed = report.failed
    assert failed is not None
    assert f"vGPU {uuid} on {HELD_VF} is in use by " in failed.message
    assert "(rule: a vGPU in use is never removed)" in failed.message
    assert engine.vgpu(HELD_VF) == uuid


def test_the_engine_refuses_a_gpu_the_desired_state_does_not_name(tmp_path: Path) -> None:
    engine = Engine(tmp_path)
    planned = engine.plan()
    assert engine.desired is not None
    unnamed = replace(engine.desired, gpus=())
    edited = engine.with_removal(planned, HELD_VF)
    with pytest.raises(MandateError, match="is not in the desired state"):
        engine.apply(edited, unnamed)
    assert engine.vgpu(HELD_VF) is not None


def test_an_allocation_made_after_the_plan_stops_the_removal_without_a_cluster(
    tmp_path: Path,
) -> None:
    engine = Engine(tmp_path)
    edited = engine.with_removal(engine.plan(), HELD_VF)
    engine.allocate(HELD_VF)
    failed = engine.apply(edited).failed
    assert failed is not None and "in use by pod pod-uid-1" in failed.message
    assert engine.vgpu(HELD_VF) is not None


def test_with_a_cluster_only_allocations_made_since_the_plan_count(tmp_path: Path) -> None:
    """The cluster observation discounts a finished pod's stale checkpoint entry; the executor
    must not count it again (an entry already there when the plan was made), but must count
    one made since."""
    engine = Engine(tmp_path, cluster=ClusterState(node=SEED_NODE))
    engine.allocate(HELD_VF, pod="finished-pod")  # stale: the cluster said nobody uses it
    stale = engine.with_removal(engine.plan(), HELD_VF)
    assert engine.apply(stale).ok
    assert engine.vgpu(HELD_VF) is None

    engine = Engine(tmp_path / "again", cluster=ClusterState(node=SEED_NODE))
    edited = engine.with_removal(engine.plan(), HELD_VF)
    engine.allocate(HELD_VF, pod="new-pod")
    failed = engine.apply(edited).failed
    assert failed is not None and "in use by pod new-pod" in failed.message
    assert engine.vgpu(HELD_VF) is not None
