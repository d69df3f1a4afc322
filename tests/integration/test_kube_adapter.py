"""The kube adapter, cluster observer and cluster executor over HTTP, through the unmodified
``kubernetes`` client, against the API-server emulator (tests/doubles/emulator.py)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from reconciler.apply.cluster import execute_cluster
from reconciler.kube import EventRecorder, KubernetesApi, connect
from reconciler.model import (
    ClusterError,
    ClusterUnavailableError,
    ConflictError,
    CrUpdate,
    ForbiddenError,
    KubevirtUpdate,
    MediatedDevice,
    ResourceMissingError,
)
from reconciler.model.cluster import (
    GROUP,
    KUBEVIRT_OWNED_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NODE_LABEL,
    VERSION,
    VGPU_KIND,
    DeviceUse,
    KubeObject,
    object_name,
)
from reconciler.observe.checkpoint import checkpoint_file
from reconciler.observe.cluster import observe_cluster
from tests.doubles.emulator import ApiServerEmulator, Request

REPO = Path(__file__).resolve().parents[2]
NODE = "harvester-kgd9c"
VGPUS = {"group": GROUP, "version": VERSION, "plural": "vgpudevices"}
KUBEVIRTS = {"group": "kubevirt.io", "version": "v1", "plural": "kubevirts"}
VF = "0000:08:00.4"
A2_4Q_RESOURCE = "nvidia.com/NVIDIA_A2-4Q"
NAME = object_name(NODE, VF)


def register_all(emu: ApiServerEmulator) -> None:
    for path in sorted((REPO / "schemas" / "crds").glob("*.yaml")):
        emu.register_crd(yaml.safe_load(path.read_text()))
    emu.register("kubevirt.io", "v1", "kubevirts", "KubeVirt", True, True)
    emu.register(
        "kubevirt.io", "v1", "virtualmachineinstances", "VirtualMachineInstance", True, True
    )


@pytest.fixture
def emu() -> Iterator[ApiServerEmulator]:
    with ApiServerEmulator() as server:
        register_all(server)
        yield server


@pytest.fixture
def api(emu: ApiServerEmulator, tmp_path: Path) -> Iterator[KubernetesApi]:
    with connect(emu.kubeconfig(tmp_path), timeout=5) as adapter:
        yield adapter


def vgpu_body(profile: str = "NVIDIA A2-4Q", *, uuid: str = "") -> dict[str, Any]:
    return KubeObject(
        kind=VGPU_KIND,
        name=NAME,
        labels={NODE_LABEL: NODE, MANAGED_BY_LABEL: MANAGED_BY},
        spec={
            "address": VF,
            "enabled": bool(profile),
            "nodeName": NODE,
            "parentGPUDeviceAddress": "0000:08:00.0",
            "vGPUTypeName": profile,
        },
        status={
            "vGPUStatus": "vGPUConfigured" if uuid else "",
            "uuid": uuid,
            "configureVGPUTypeName": profile if uuid else "",
            "availableTypes": {},
            "vfIndex": 0,
            "inUse": False,
            "holder": "",
        },
    ).to_json()


def kubevirt_body(*selectors: str, owned: str = "") -> dict[str, Any]:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {
            "name": "kubevirt",
            "namespace": "harvester-system",
            "annotations": {KUBEVIRT_OWNED_ANNOTATION: owned} if owned else {},
        },
        "spec": {
            "configuration": {
                "permittedHostDevices": {
                    "pciHostDevices": [{"pciVendorSelector": "10DE:2236", "resourceName": "a10"}],
                    "mediatedDevices": [
                        {
                            "mdevNameSelector": s,
                            "resourceName": "nvidia.com/" + s.replace(" ", "_"),
                            "externalResourceProvider": True,
                        }
                        for s in selectors
                    ],
                }
            }
        },
    }


# -- every ClusterApi method ----------------------------------------------------------------------


def test_create_get_replace_status_delete(api: KubernetesApi, emu: ApiServerEmulator) -> None:
    created = api.create_object(**VGPUS, body=vgpu_body(uuid="u-1"))
    rv = created["metadata"]["resourceVersion"]
    assert not created.get("status")  # dropped on create: the status subresource owns it
    assert api.get_object(**VGPUS, name=NAME) == created

    body = dict(created, status=vgpu_body(uuid="u-1")["status"])
    with_status = api.replace_status(**VGPUS, name=NAME, body=body)
    assert with_status["status"]["uuid"] == "u-1"
    assert with_status["spec"] == created["spec"]

    changed = vgpu_body("NVIDIA A2-8Q")
    changed["metadata"]["resourceVersion"] = with_status["metadata"]["resourceVersion"]
    replaced = api.replace_object(**VGPUS, name=NAME, body=changed)
    assert replaced["spec"]["vGPUTypeName"] == "NVIDIA A2-8Q"
    assert replaced["status"]["uuid"] == "u-1"  # a main PUT ignores status
    assert int(replaced["metadata"]["resourceVersion"]) > int(rv)

    api.delete_object(**VGPUS, name=NAME, resource_version=replaced["metadata"]["resourceVersion"])
    assert api.get_object(**VGPUS, name=NAME) is None
    api.delete_object(**VGPUS, name=NAME)  # already gone: fine
    assert [r.verb for r in emu.requests] == [
        "create",
        "get",
        "update",
        "update",
        "delete",
        "get",
        "delete",
    ]
    assert emu.requests[2].subresource == "status"


def test_lists_with_selectors_and_namespaces(api: KubernetesApi, emu: ApiServerEmulator) -> None:
    api.create_object(**VGPUS, body=vgpu_body())
    other = vgpu_body()
    other["metadata"]["name"] = "elsewhere-000008004"
    other["metadata"]["labels"][NODE_LABEL] = "elsewhere"
    api.create_object(**VGPUS, body=other)
    mine = api.list_objects(**VGPUS, label_selector=f"{NODE_LABEL}={NODE}")
    assert [o["metadata"]["name"] for o in mine] == [NAME]
    assert len(api.list_objects(**VGPUS)) == 2

    emu.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "harvester-system"}})
    api.create_object(**KUBEVIRTS, namespace="harvester-system", body=kubevirt_body())
    assert len(api.list_objects(**KUBEVIRTS)) == 1  # across namespaces
    assert api.list_objects(**KUBEVIRTS, namespace="kubevirt") == []
    kv = api.get_object(**KUBEVIRTS, name="kubevirt", namespace="harvester-system")
    assert kv is not None
    assert kv["metadata"]["namespace"] == "harvester-system"

    for pod, node, labels in [
        ("virt-launcher-a", NODE, {"kubevirt.io": "virt-launcher"}),
        ("virt-launcher-b", "elsewhere", {"kubevirt.io": "virt-launcher"}),
        ("web", NODE, {"app": "web"}),
    ]:
        emu.seed(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": pod, "namespace": "default", "labels": labels},
                "spec": {"nodeName": node, "containers": []},
            }
        )
    pods = api.list_objects(
        group="",
        version="v1",
        plural="pods",
        label_selector="kubevirt.io=virt-launcher",
        field_selector=f"spec.nodeName={NODE}",
    )
    assert [p["metadata"]["name"] for p in pods] == ["virt-launcher-a"]
    assert api.get_object(group="", version="v1", plural="pods", name="web", namespace="default")
    assert (
        api.get_object(group="", version="v1", plural="pods", name="nope", namespace="default")
        is None
    )


def test_events_are_created(api: KubernetesApi, emu: ApiServerEmulator) -> None:
    events = EventRecorder(api, node=NODE)
    events.event("VGPUDevice", NAME, reason="VGPUCreated", message="created NVIDIA A2-4Q u-1")
    events.event("VGPUDevice", NAME, reason="VGPURemovalBlocked", message="in use", type="Warning")
    stored = emu.objects("", "v1", "events", namespace="default")
    assert sorted((e["reason"], e["type"], e["involvedObject"]["name"]) for e in stored) == [
        ("VGPUCreated", "Normal", NAME),
        ("VGPURemovalBlocked", "Warning", NAME),
    ]
    assert all(e["source"] == {"component": "vgpuctl", "host": NODE} for e in stored)
    assert (events.recorded, events.dropped) == (2, 0)


# -- error mapping ------------------------------------------------------------------------------


def test_unreachable_server(api: KubernetesApi, emu: ApiServerEmulator) -> None:
    emu.stop()
    with pytest.raises(ClusterUnavailableError) as err:
        api.list_objects(**VGPUS)
    assert err.value.message == (
        f"cannot reach the Kubernetes API server at {emu.url}: connection refused"
    )
    emu.start()  # the outage ends: the same adapter works again
    assert api.list_objects(**VGPUS) == []


def test_server_that_never_answers(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)  # connections complete in the backlog; nothing ever answers
        port = listener.getsockname()[1]
        with ApiServerEmulator() as emu:
            config = json.loads(emu.kubeconfig(tmp_path).read_text())
        config["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{port}"
        path = tmp_path / "silent"
        path.write_text(json.dumps(config))
        with pytest.raises(ClusterUnavailableError) as err:
            connect(path, timeout=0.5).list_objects(**VGPUS)
    assert err.value.message == (
        f"cannot reach the Kubernetes API server at http://127.0.0.1:{port}: no answer within 0.5 s"
    )


def test_rbac_denial_names_verb_and_resource(api: KubernetesApi, emu: ApiServerEmulator) -> None:
    emu.deny("update", GROUP, "vgpudevices", "status")
    api.create_object(**VGPUS, body=vgpu_body())
    stored = api.get_object(**VGPUS, name=NAME)
    assert stored is not None
    with pytest.raises(ForbiddenError) as err:
        api.replace_status(**VGPUS, name=NAME, body=stored)
    assert err.value.message.startswith(
        "RBAC denies update on vgpudevices.devices.harvesterhci.io/status ("
        f'vgpudevices.devices.harvesterhci.io "{NAME}" is forbidden: User '
    )
    emu.deny("list", "", "pods")
    with pytest.raises(ForbiddenError, match=r"^RBAC denies list on pods \("):
        api.list_objects(group="", version="v1", plural="pods")


def test_missing_crds(tmp_path: Path) -> None:
    with ApiServerEmulator() as bare, connect(bare.kubeconfig(tmp_path)) as api:
        with pytest.raises(ResourceMissingError) as err:
            api.list_objects(**VGPUS)
        assert err.value.message == (
            "the API server does not serve vgpudevices.devices.harvesterhci.io/v1beta1: "
            "are the CRDs installed? kubectl apply -k deploy/"
        )
        with pytest.raises(ResourceMissingError):
            api.get_object(**VGPUS, name=NAME)  # not "None": the type itself is missing
        with pytest.raises(ResourceMissingError):
            api.create_object(**VGPUS, body=vgpu_body())
        with pytest.raises(ResourceMissingError, match="is KubeVirt installed"):
            api.list_objects(**KUBEVIRTS)


def test_stale_resource_version_and_duplicates_conflict(api: KubernetesApi) -> None:
    created = api.create_object(**VGPUS, body=vgpu_body())
    with pytest.raises(ConflictError, match="already exists"):
        api.create_object(**VGPUS, body=vgpu_body())
    edited = vgpu_body("NVIDIA A2-8Q")
    edited["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
    fresh = api.replace_object(**VGPUS, name=NAME, body=edited)
    with pytest.raises(ConflictError) as err:
        api.replace_object(**VGPUS, name=NAME, body=created)  # the old resourceVersion
    assert err.value.message.startswith(f"vgpudevices/{NAME} changed since it was read (409")
    with pytest.raises(ConflictError):
        api.delete_object(
            **VGPUS, name=NAME, resource_version=created["metadata"]["resourceVersion"]
        )
    api.delete_object(**VGPUS, name=NAME, resource_version=fresh["metadata"]["resourceVersion"])
    with pytest.raises(ConflictError, match="was deleted since it was read"):
        api.replace_object(**VGPUS, name=NAME, body=fresh)


def test_server_errors_are_unavailable(api: KubernetesApi, emu: ApiServerEmulator) -> None:
    emu.fail_next(1, status=503)
    with pytest.raises(ClusterUnavailableError, match="answered 503"):
        api.list_objects(**VGPUS)
    assert api.list_objects(**VGPUS) == []  # not retried behind our back, and recovered


def test_create_in_a_missing_namespace(api: KubernetesApi) -> None:
    # Only lists span namespaces; a create into one that does not exist is not "CRD missing".
    body = kubevirt_body()
    body["metadata"]["namespace"] = "nowhere"
    with pytest.raises(ClusterError) as err:
        api.create_object(**KUBEVIRTS, namespace="nowhere", body=body)
    assert not isinstance(err.value, ResourceMissingError)
    assert err.value.message.startswith("cannot create kubevirts/nowhere/kubevirt: ")


# -- the executor over HTTP ---------------------------------------------------------------------


def test_a_409_race_is_resolved_by_replanning(api: KubernetesApi, emu: ApiServerEmulator) -> None:
    from reconciler.plan.cluster import replan_object

    stored = emu.seed(vgpu_body("NVIDIA A2-4A", uuid="u-0"))
    planned = stored["metadata"]["resourceVersion"]
    want = KubeObject.from_json(vgpu_body("NVIDIA A2-4Q", uuid="u-1"))
    action = replan_object(want, KubeObject.from_json(stored), seq=7)
    assert action is not None
    assert isinstance(action, CrUpdate)
    assert action.resource_version == planned

    def someone_edits(request: Request) -> None:
        emu.on_before_write(None)  # once
        edited = emu.get_object(GROUP, VERSION, "vgpudevices", NAME)
        assert edited is not None
        edited["spec"]["vGPUTypeName"] = "NVIDIA A2-8Q"
        emu.seed(edited)

    emu.on_before_write(someone_edits)
    emu.requests.clear()
    result = execute_cluster([action], api=api, replan=partial(replan_object, seq=7))
    assert result.ok, result.failed
    assert result.outcomes[0].message.endswith("(after 1 conflict: re-read and re-planned)")
    final = emu.get_object(GROUP, VERSION, "vgpudevices", NAME)
    assert final is not None
    assert final["spec"]["vGPUTypeName"] == "NVIDIA A2-4Q"
    assert final["status"]["uuid"] == "u-1"
    assert [(r.verb, r.subresource) for r in emu.requests] == [
        ("update", None),  # 409: edited meanwhile
        ("get", None),
        ("update", None),  # re-planned with the fresh resourceVersion
        ("update", "status"),
    ]


def test_kubevirt_update_over_http(api: KubernetesApi, emu: ApiServerEmulator) -> None:
    stored = emu.seed(kubevirt_body("GRID T4-2Q", "NVIDIA A2-8Q", owned="NVIDIA A2-8Q"))
    action = KubevirtUpdate(
        seq=1,
        target="kubevirt/harvester-system/kubevirt",
        reason="allow-list",
        namespace="harvester-system",
        name="kubevirt",
        resource_version=stored["metadata"]["resourceVersion"],
        add=(MediatedDevice("NVIDIA A2-4Q", "nvidia.com/NVIDIA_A2-4Q"),),
        remove=("NVIDIA A2-8Q",),
        owned=("NVIDIA A2-4Q",),
    )
    emu.requests.clear()
    result = execute_cluster([action], api=api)
    assert result.ok, result.failed
    after = emu.get_object("kubevirt.io", "v1", "kubevirts", "kubevirt", "harvester-system")
    assert after is not None
    permitted = after["spec"]["configuration"]["permittedHostDevices"]
    assert [e["mdevNameSelector"] for e in permitted["mediatedDevices"]] == [
        "GRID T4-2Q",
        "NVIDIA A2-4Q",
    ]
    assert permitted["pciHostDevices"] == [
        {"pciVendorSelector": "10DE:2236", "resourceName": "a10"}
    ]
    assert after["metadata"]["annotations"][KUBEVIRT_OWNED_ANNOTATION] == "NVIDIA A2-4Q"
    assert [(r.verb, r.resource, r.namespace) for r in emu.requests] == [
        ("get", "kubevirts", "harvester-system"),
        ("patch", "kubevirts", "harvester-system"),
    ]
    ((_, ops),) = emu.patches
    assert {op["path"].split("/")[1] for op in ops} == {"spec", "metadata"}
    # It removes an entry: written with the CR's version, tested first; else only our paths.
    assert ops[0] == {
        "op": "test",
        "path": "/metadata/resourceVersion",
        "value": stored["metadata"]["resourceVersion"],
    }
    assert all(
        op["path"].startswith("/spec/configuration/permittedHostDevices/mediatedDevices/")
        or op["path"] == "/metadata/annotations/vgpu.reconciler.dev~1mediated-devices"
        for op in ops[1:]
    )


def test_json_patch_over_http(api: KubernetesApi, emu: ApiServerEmulator) -> None:
    emu.seed(kubevirt_body("GRID T4-2Q", owned=""))
    where = {**KUBEVIRTS, "name": "kubevirt", "namespace": "harvester-system"}
    entries = "/spec/configuration/permittedHostDevices/mediatedDevices"
    grid = {
        "mdevNameSelector": "GRID T4-2Q",
        "resourceName": "nvidia.com/GRID_T4-2Q",
        "externalResourceProvider": True,
    }
    out = api.patch_object(
        **where,
        patch=[
            {"op": "test", "path": f"{entries}/0", "value": grid},
            {"op": "remove", "path": f"{entries}/0"},
        ],
    )
    assert out["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"] == []
    # The entry tested is gone now: the same patch is a stale view, a conflict (422 from the
    # server), and writes nothing.
    before = emu.get_object("kubevirt.io", "v1", "kubevirts", "kubevirt", "harvester-system")
    with pytest.raises(ConflictError) as err:
        api.patch_object(
            **where,
            patch=[
                {"op": "test", "path": f"{entries}/0", "value": grid},
                {"op": "remove", "path": f"{entries}/0"},
            ],
        )
    assert err.value.message == (
        "kubevirts/harvester-system/kubevirt changed since it was read (a JSON patch test "
        "failed: 422): the server rejected our request due to an error in our request"
    )
    assert (
        emu.get_object("kubevirt.io", "v1", "kubevirts", "kubevirt", "harvester-system") == before
    )
    with pytest.raises(ConflictError, match="was deleted since it was read"):
        api.patch_object(**{**where, "name": "gone"}, patch=[])


# -- the observer over HTTP ---------------------------------------------------------------------


def test_observe_cluster_end_to_end(
    api: KubernetesApi, emu: ApiServerEmulator, tmp_path: Path
) -> None:
    emu.seed(vgpu_body(uuid="9b4a6c1e-2f0d-5e3a-8c7b-1d2e3f4a5b6c"))
    emu.seed(kubevirt_body("NVIDIA A2-4Q", owned="NVIDIA A2-4Q"))
    pod_uid = "5d7e3c1a-0000-4000-8000-00000000beef"
    emu.seed(
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": {
                "name": "win11",
                "namespace": "vms",
                "labels": {"kubevirt.io/nodeName": NODE},
            },
            "spec": {
                "domain": {
                    "devices": {"gpus": [{"name": "g", "deviceName": "nvidia.com/NVIDIA_A2-4Q"}]}
                }
            },
            # KubeVirt's VirtualMachineInstanceStatus.ActivePods: launcher pod UID → node.
            "status": {"phase": "Running", "activePods": {pod_uid: NODE}},
        }
    )
    kubelet = tmp_path / "kubelet"
    checkpoint_file(kubelet).parent.mkdir(parents=True)
    checkpoint_file(kubelet).write_text(
        json.dumps(
            {
                "Data": {
                    "PodDeviceEntries": [
                        {
                            "PodUID": pod_uid,
                            "ContainerName": "compute",
                            "ResourceName": "nvidia.com/NVIDIA_A2-4Q",
                            "DeviceIDs": {"0": ["9b4a6c1e-2f0d-5e3a-8c7b-1d2e3f4a5b6c"]},
                            "AllocResp": "",
                        }
                    ],
                    "RegisteredDevices": {},
                },
                "Checksum": 1,
            }
        )
    )
    emu.requests.clear()
    state = observe_cluster(api, node=NODE, kubelet_dir=kubelet)
    assert state.device_uses == {
        "9b4a6c1e-2f0d-5e3a-8c7b-1d2e3f4a5b6c": DeviceUse(
            "9b4a6c1e-2f0d-5e3a-8c7b-1d2e3f4a5b6c",
            "nvidia.com/NVIDIA_A2-4Q",
            f"VM vms/win11 (pod {pod_uid})",
        )
    }
    assert state.vmi_resources == {}
    assert list(state.vgpu_devices) == [NAME]
    assert state.kubevirt is not None
    assert state.kubevirt.owned == frozenset({"NVIDIA A2-4Q"})
    assert emu.requests == [
        Request("list", GROUP, "sriovgpudevices", None, None, None),
        Request("list", GROUP, "vgpudevices", None, None, None),
        # The KubeVirt CR before the summaries (a retiring mark: reconciler/model/retiring.py).
        Request("list", "kubevirt.io", "kubevirts", None, None, None),
        Request("list", "vgpu.reconciler.dev", "vgpunodestates", None, None, None),
        Request("list", "kubevirt.io", "virtualmachineinstances", None, None, None),
    ]


def test_observe_without_kubevirt_and_with_rbac_denied(tmp_path: Path) -> None:
    with ApiServerEmulator() as emu, connect(emu.kubeconfig(tmp_path)) as api:
        for path in sorted((REPO / "schemas" / "crds").glob("*.yaml")):
            emu.register_crd(yaml.safe_load(path.read_text()))
        state = observe_cluster(api, node=NODE)
        assert state.kubevirt is None
        assert "KubeVirt is not installed" in state.notes[0]
        emu.deny("list", GROUP, "vgpudevices")
        with pytest.raises(ForbiddenError, match=r"^RBAC denies list on vgpudevices"):
            observe_cluster(api, node=NODE)


# -- lists in pages -------------------------------------------------------------------------------


def _many(emu: ApiServerEmulator, n: int) -> None:
    for i in range(n):
        emu.seed(
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": VGPU_KIND,
                "metadata": {"name": f"n{i:03d}-000008004", "labels": {NODE_LABEL: f"n{i:03d}"}},
                "spec": {"address": VF, "enabled": False, "nodeName": f"n{i:03d}"},
            }
        )


def test_a_list_is_read_in_pages(
    api: KubernetesApi, emu: ApiServerEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    import reconciler.kube.api as kube_api

    monkeypatch.setattr(kube_api, "PAGE", 4)
    _many(emu, 10)
    emu.requests.clear()
    items = api.list_objects(**VGPUS)
    assert [o["metadata"]["name"] for o in items] == [f"n{i:03d}-000008004" for i in range(10)]
    # 10 items, 4 a page: three list requests.
    assert [r.verb for r in emu.requests] == ["list"] * 3


def test_a_list_whose_version_expired_between_pages_is_read_again(
    api: KubernetesApi, emu: ApiServerEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    import reconciler.kube.api as kube_api

    monkeypatch.setattr(kube_api, "PAGE", 4)
    _many(emu, 10)
    compacted = []

    original = emu.handle

    def compact_after_the_first_page(*args: Any, **kwargs: Any) -> Any:
        answer = original(*args, **kwargs)
        if not compacted:
            compacted.append(True)
            # A write, then compaction: the first page's version is gone before the second
            # page is asked for.
            emu.seed({**emu.objects(*VGPUS.values())[0], "spec": {"address": VF, "enabled": True}})
            emu.compact()
        return answer

    monkeypatch.setattr(emu, "handle", compact_after_the_first_page)
    emu.requests.clear()
    items = api.list_objects(**VGPUS)
    assert len(items) == 10
    # The first page, the 410, then the whole list again: 1 + 1 + 3.
    assert [r.verb for r in emu.requests] == ["list"] * 5


def test_the_next_page_is_asked_for_while_this_one_is_decoded(
    api: KubernetesApi, emu: ApiServerEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    import reconciler.kube.api as kube_api

    monkeypatch.setattr(kube_api, "PAGE", 4)
    _many(emu, 10)
    asked: list[str] = []  # each list request's continue token ("" for the first page)
    second_asked = threading.Event()
    original = emu.handle

    def record(method: str, raw_path: str, *args: Any, **kwargs: Any) -> Any:
        query = parse_qs(urlsplit(raw_path).query)
        asked.append(query.get("continue", [""])[0])
        if len(asked) == 2:
            second_asked.set()
        return original(method, raw_path, *args, **kwargs)

    decode = KubernetesApi._json_object
    waited: list[bool] = []

    def decode_when_the_next_page_is_asked(self: KubernetesApi, data: bytes, what: str) -> Any:
        if not waited:  # the first page: sequential paging would ask for no other page now
            waited.append(second_asked.wait(timeout=5))
        return decode(self, data, what)

    monkeypatch.setattr(emu, "handle", record)
    monkeypatch.setattr(KubernetesApi, "_json_object", decode_when_the_next_page_is_asked)
    items = api.list_objects(**VGPUS)
    assert waited == [True]
    assert [o["metadata"]["name"] for o in items] == [f"n{i:03d}-000008004" for i in range(10)]
    assert len(asked) == 3  # 10 items, 4 a page: nothing asked twice


def test_a_wrong_continue_hint_costs_a_request_never_an_item(
    api: KubernetesApi, emu: ApiServerEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    import reconciler.kube.api as kube_api

    monkeypatch.setattr(kube_api, "PAGE", 4)
    hint = kube_api.continue_hint
    # Wrong wherever there is a next page (the emulator answers 400 to that token).
    monkeypatch.setattr(kube_api, "continue_hint", lambda body: hint(body) and "not-a-token")
    _many(emu, 10)
    emu.requests.clear()
    items = api.list_objects(**VGPUS)
    assert [o["metadata"]["name"] for o in items] == [f"n{i:03d}-000008004" for i in range(10)]
    # The first two pages' hints were asked for, their 400s dropped with the requests, and
    # the pages the decoded tokens name read: 3 + 2 (a request on a hint may still be on its
    # way when the list returns).
    deadline = time.monotonic() + 5
    while len(emu.requests) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [r.verb for r in emu.requests] == ["list"] * 5


def test_a_list_page_that_is_not_json_is_one_clear_error(
    api: KubernetesApi, emu: ApiServerEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(KubernetesApi, "_page", lambda self, *args: b"<html>proxy error</html>")
    with pytest.raises(ClusterError) as err:
        api.list_objects(**VGPUS)
    assert err.value.message == (
        f"{api.server} answered list vgpudevices.devices.harvesterhci.io with a body that is "
        "not JSON"
    )


def test_a_list_past_the_bound_is_refused(
    api: KubernetesApi, emu: ApiServerEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    import reconciler.kube.api as kube_api

    monkeypatch.setattr(kube_api, "PAGE", 2)
    monkeypatch.setattr(kube_api, "MAX_ITEMS", 5)
    _many(emu, 10)
    with pytest.raises(ClusterError) as err:
        api.list_objects(**VGPUS)
    assert err.value.message == (
        "list vgpudevices.devices.harvesterhci.io: more than 5 items; refusing to read on"
    )
