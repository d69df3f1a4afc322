"""The API-server emulator behaves as a real API server does, through the ``kubernetes`` client.

Every call goes through the unmodified client and a kubeconfig, exactly as production code makes it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client, config, watch

from tests.doubles.admission import Attributes
from tests.doubles.emulator import (
    DEFAULT_TOKEN,
    ApiError,
    ApiServerEmulator,
    Request,
    WebhookDenial,
    WebhookUnavailable,
)
from tests.doubles.kubevirt_crd import kubevirt_crd

GROUP, VERSION, PLURAL, KIND = "devices.harvesterhci.io", "v1beta1", "vgpudevices", "VGPUDevice"
CR = (GROUP, VERSION, PLURAL)
KV = ("kubevirt.io", "v1", "kubevirts")
# The client is only partly typed: its untyped entry points are used as Any
new_client_from_config: Any = config.new_client_from_config
Watch: Any = watch.Watch


@pytest.fixture
def emulator() -> Iterator[ApiServerEmulator]:
    with ApiServerEmulator() as emu:
        emu.register(GROUP, VERSION, PLURAL, KIND, False, True)
        emu.register("kubevirt.io", "v1", "kubevirts", "KubeVirt", True, True)
        yield emu


@pytest.fixture
def api_client(emulator: ApiServerEmulator, tmp_path: Path) -> Iterator[Any]:
    # A client of its own: the global default configuration is never touched (xdist, other tests)
    api = new_client_from_config(config_file=str(emulator.kubeconfig(tmp_path)))
    yield api
    api.close()


@pytest.fixture
def custom(api_client: Any) -> Any:
    return client.CustomObjectsApi(api_client)


@pytest.fixture
def core(api_client: Any) -> Any:
    return client.CoreV1Api(api_client)


def vgpu(name: str, *, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "labels": labels or {"nodename": "n1"}},
        "spec": {"address": "0000:08:00.4", "vGPUTypeName": "", **spec},
        "status": {"uuid": ""},
    }


def status_of(error: client.ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(error.body or "{}")
    return body


def api_error(call: Any, *args: Any, **kwargs: Any) -> client.ApiException:
    with pytest.raises(client.ApiException) as caught:
        call(*args, **kwargs)
    return caught.value


# --- create / get / delete ---------------------------------------------------------------------


def test_create_answers_201_and_sets_server_fields(custom: Any) -> None:
    data, status, _ = custom.create_cluster_custom_object_with_http_info(*CR, vgpu("n1-0000080004"))
    assert status == 201
    meta = data["metadata"]
    assert meta["uid"]
    assert meta["creationTimestamp"].endswith("Z")
    assert meta["generation"] == 1
    assert int(meta["resourceVersion"]) > 0
    # the status subresource is written separately: status in a create is dropped
    assert "status" not in data
    assert custom.get_cluster_custom_object(*CR, "n1-0000080004") == data


def test_resource_versions_increase_across_objects(custom: Any) -> None:
    first = custom.create_cluster_custom_object(*CR, vgpu("a"))
    second = custom.create_cluster_custom_object(*CR, vgpu("b"))
    assert int(second["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])
    assert isinstance(second["metadata"]["resourceVersion"], str)


def test_duplicate_create_is_409_already_exists(custom: Any) -> None:
    custom.create_cluster_custom_object(*CR, vgpu("a"))
    error = api_error(custom.create_cluster_custom_object, *CR, vgpu("a"))
    assert error.status == 409
    assert status_of(error)["reason"] == "AlreadyExists"
    assert status_of(error)["message"] == f'{PLURAL}.{GROUP} "a" already exists'


def test_get_missing_is_404_not_found(custom: Any) -> None:
    error = api_error(custom.get_cluster_custom_object, *CR, "nope")
    assert error.status == 404
    body = status_of(error)
    assert (body["kind"], body["reason"]) == ("Status", "NotFound")
    assert body["details"] == {"name": "nope", "group": GROUP, "kind": PLURAL}


def test_delete_answers_success_then_404(custom: Any) -> None:
    created = custom.create_cluster_custom_object(*CR, vgpu("a"))
    data, status, _ = custom.delete_cluster_custom_object_with_http_info(*CR, "a")
    assert status == 200
    assert data["status"] == "Success"
    assert data["details"]["uid"] == created["metadata"]["uid"]
    assert api_error(custom.get_cluster_custom_object, *CR, "a").status == 404
    assert api_error(custom.delete_cluster_custom_object, *CR, "a").status == 404


def test_delete_honours_resource_version_precondition(custom: Any) -> None:
    created = custom.create_cluster_custom_object(*CR, vgpu("a"))
    stale = client.V1DeleteOptions(preconditions=client.V1Preconditions(resource_version="1"))
    error = api_error(custom.delete_cluster_custom_object, *CR, "a", body=stale)
    assert error.status == 409
    assert (
        "the ResourceVersion in the precondition (1) does not match" in status_of(error)["message"]
    )
    rv = created["metadata"]["resourceVersion"]
    fresh = client.V1DeleteOptions(preconditions=client.V1Preconditions(resource_version=rv))
    custom.delete_cluster_custom_object(*CR, "a", body=fresh)
    assert custom.list_cluster_custom_object(*CR)["items"] == []


# --- update: optimistic concurrency, status subresource, generation ------------------------------


def test_stale_put_is_409_and_fresh_put_succeeds(custom: Any) -> None:
    created = custom.create_cluster_custom_object(*CR, vgpu("a"))
    updated = custom.replace_cluster_custom_object(*CR, "a", {**created, "spec": {"enabled": True}})
    error = api_error(custom.replace_cluster_custom_object, *CR, "a", created)  # created is stale
    assert error.status == 409
    assert status_of(error)["reason"] == "Conflict"
    assert status_of(error)["message"] == (
        f'Operation cannot be fulfilled on {PLURAL}.{GROUP} "a": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    again = custom.replace_cluster_custom_object(*CR, "a", {**updated, "spec": {"enabled": False}})
    assert again["spec"] == {"enabled": False}


def test_put_without_resource_version_is_422_for_custom_resources(custom: Any) -> None:
    custom.create_cluster_custom_object(*CR, vgpu("a"))
    error = api_error(custom.replace_cluster_custom_object, *CR, "a", vgpu("a"))
    assert error.status == 422
    assert status_of(error)["reason"] == "Invalid"
    assert "metadata.resourceVersion" in status_of(error)["message"]


def test_put_with_another_name_than_the_url_is_400(custom: Any) -> None:
    created = custom.create_cluster_custom_object(*CR, vgpu("a"))
    body = {**created, "metadata": {**created["metadata"], "name": "b"}}
    assert api_error(custom.replace_cluster_custom_object, *CR, "a", body).status == 400


def test_put_on_the_main_resource_ignores_status(custom: Any) -> None:
    created = custom.create_cluster_custom_object(*CR, vgpu("a"))
    with_status = custom.replace_cluster_custom_object_status(
        *CR, "a", {**created, "status": {"uuid": "u1"}}
    )
    body = {**with_status, "spec": {"vGPUTypeName": "NVIDIA A2-4Q"}, "status": {"uuid": "forged"}}
    updated = custom.replace_cluster_custom_object(*CR, "a", body)
    assert updated["spec"] == {"vGPUTypeName": "NVIDIA A2-4Q"}
    assert updated["status"] == {"uuid": "u1"}


def test_put_on_status_changes_only_status_and_keeps_generation(custom: Any) -> None:
    created = custom.create_cluster_custom_object(*CR, vgpu("a"))
    body = {
        **created,
        "metadata": {**created["metadata"], "labels": {"nodename": "other"}},
        "spec": {"vGPUTypeName": "forged"},
        "status": {"uuid": "u1"},
    }
    updated = custom.replace_cluster_custom_object_status(*CR, "a", body)
    assert updated["status"] == {"uuid": "u1"}
    assert updated["spec"] == created["spec"]
    assert updated["metadata"]["labels"] == {"nodename": "n1"}
    assert updated["metadata"]["generation"] == 1
    assert int(updated["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])


def test_put_on_status_needs_a_fresh_resource_version(custom: Any) -> None:
    created = custom.create_cluster_custom_object(*CR, vgpu("a"))
    custom.replace_cluster_custom_object_status(*CR, "a", {**created, "status": {"uuid": "u1"}})
    stale = {**created, "status": {"uuid": "u2"}}
    error = api_error(custom.replace_cluster_custom_object_status, *CR, "a", stale)
    assert error.status == 409


def test_generation_counts_spec_changes_only(custom: Any) -> None:
    created = custom.create_cluster_custom_object(*CR, vgpu("a"))
    relabelled = custom.replace_cluster_custom_object(
        *CR, "a", {**created, "metadata": {**created["metadata"], "labels": {"x": "y"}}}
    )
    assert relabelled["metadata"]["generation"] == 1
    respecced = custom.replace_cluster_custom_object(
        *CR, "a", {**relabelled, "spec": {"vGPUTypeName": "NVIDIA A2-4Q"}}
    )
    assert respecced["metadata"]["generation"] == 2
    assert respecced["metadata"]["uid"] == created["metadata"]["uid"]
    assert respecced["metadata"]["creationTimestamp"] == created["metadata"]["creationTimestamp"]


def test_noop_put_keeps_the_resource_version(custom: Any) -> None:
    created = custom.create_cluster_custom_object(*CR, vgpu("a"))
    same = custom.replace_cluster_custom_object(*CR, "a", created)
    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_merge_patch_respects_the_status_split(custom: Any) -> None:
    custom.create_cluster_custom_object(*CR, vgpu("a"))
    patched = custom.patch_cluster_custom_object(
        *CR, "a", {"spec": {"enabled": True}, "status": {"uuid": "forged"}}
    )
    assert patched["spec"]["enabled"] is True
    assert "status" not in patched
    assert patched["metadata"]["generation"] == 2
    status = custom.patch_cluster_custom_object_status(*CR, "a", {"status": {"uuid": "u1"}})
    assert status["status"] == {"uuid": "u1"}
    assert status["metadata"]["generation"] == 2


JSON_PATCH = "application/json-patch+json"


def test_json_patch_applies_its_operations_in_order(
    emulator: ApiServerEmulator, custom: Any
) -> None:
    created = custom.create_cluster_custom_object(*CR, vgpu("a", note=["x", "y"]))
    patch = [
        {"op": "test", "path": "/spec/note/1", "value": "y"},
        {"op": "remove", "path": "/spec/note/0"},
        {"op": "add", "path": "/spec/note/-", "value": "z"},
        {"op": "test", "path": "/spec/missing", "value": None},  # json-patch v4: passes
        {"op": "add", "path": "/metadata/labels/team~1gpu", "value": "vdi"},
        {"op": "replace", "path": "/spec/enabled", "value": True},  # v4: a missing key is added
    ]
    out = custom.patch_cluster_custom_object(*CR, "a", patch, _content_type=JSON_PATCH)
    assert out["spec"]["note"] == ["y", "z"]
    assert out["spec"]["enabled"] is True
    assert out["metadata"]["labels"] == {"nodename": "n1", "team/gpu": "vdi"}
    assert int(out["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert out["metadata"]["generation"] == 2
    assert emulator.requests[-1] == ("patch", GROUP, PLURAL, None, None, "a")
    assert emulator.patches[-1][1] == patch


@pytest.mark.parametrize(
    "failing",
    [
        {"op": "test", "path": "/spec/vGPUTypeName", "value": "NVIDIA A2-4Q"},  # it is ""
        {"op": "test", "path": "/spec/enabled", "value": True},  # missing, not null
        {"op": "test", "path": "/spec/nowhere/deeper", "value": None},  # a missing parent
        {"op": "remove", "path": "/spec/absent"},
        {"op": "remove", "path": "/spec/note/5"},
        {"op": "add", "path": "/spec/note/9", "value": 1},
        {"op": "replace", "path": "/spec/note/2", "value": 1},
        {"op": "test", "path": "/spec/note", "value": ["x", "y", "z"]},
        {"op": "frobnicate", "path": "/spec"},
    ],
)
def test_a_json_patch_that_does_not_apply_is_422_and_writes_nothing(
    emulator: ApiServerEmulator, custom: Any, failing: dict[str, Any]
) -> None:
    custom.create_cluster_custom_object(*CR, vgpu("a", note=["x", "y"]))
    before = emulator.get_object(*CR, "a")
    # The operations before the failing one would apply: none of them may be written.
    patch = [{"op": "replace", "path": "/spec/vGPUTypeName", "value": "NVIDIA A2-4C"}, failing]
    error = api_error(custom.patch_cluster_custom_object, *CR, "a", patch, _content_type=JSON_PATCH)
    assert error.status == 422
    # The API server's own answer (patch.go: NewGenericServerResponse(422, ...)).
    assert status_of(error) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "the server rejected our request due to an error in our request",
        "reason": "Invalid",
        "details": {},
        "code": 422,
    }
    assert emulator.get_object(*CR, "a") == before


def test_json_patch_body_and_media_types(emulator: ApiServerEmulator, custom: Any) -> None:
    custom.create_cluster_custom_object(*CR, vgpu("a"))
    url = f"/apis/{GROUP}/{VERSION}/{PLURAL}/a"
    with pytest.raises(ApiError) as caught:  # the body of a JSON patch is an array
        emulator.handle("PATCH", url, b'{"op": "remove", "path": "/spec"}', JSON_PATCH)
    assert caught.value.code == 400
    # Custom resources have no strategic merge patch. The client turns a JSON patch whose
    # body is not a list into one (rest.py), and sends a custom-object patch as a merge patch
    # unless told otherwise (its select_header_content_type looks only for "json").
    not_a_list = {"op": "replace", "path": "/spec/enabled", "value": True}
    error = api_error(
        custom.patch_cluster_custom_object, *CR, "a", not_a_list, _content_type=JSON_PATCH
    )
    assert error.status == 415
    assert api_error(custom.patch_cluster_custom_object, *CR, "a", [not_a_list]).status == 400


def test_json_patch_of_resource_version_is_a_precondition(custom: Any) -> None:
    created = custom.create_cluster_custom_object(*CR, vgpu("a"))
    stale = [{"op": "replace", "path": "/metadata/resourceVersion", "value": "1"}]
    error = api_error(custom.patch_cluster_custom_object, *CR, "a", stale, _content_type=JSON_PATCH)
    assert error.status == 409
    same = [
        {
            "op": "replace",
            "path": "/metadata/resourceVersion",
            "value": created["metadata"]["resourceVersion"],
        },
        {"op": "replace", "path": "/spec/enabled", "value": True},
    ]
    assert custom.patch_cluster_custom_object(*CR, "a", same, _content_type=JSON_PATCH)["spec"][
        "enabled"
    ]


def test_json_patch_of_status_is_ignored_on_the_main_resource(
    emulator: ApiServerEmulator, custom: Any
) -> None:
    custom.create_cluster_custom_object(*CR, vgpu("a"))
    patch = [{"op": "add", "path": "/status", "value": {"uuid": "u"}}]
    custom.patch_cluster_custom_object(*CR, "a", patch, _content_type=JSON_PATCH)
    assert "status" not in (emulator.get_object(*CR, "a") or {})


def test_a_write_racing_the_before_write_hook_is_409(
    emulator: ApiServerEmulator, custom: Any
) -> None:
    created = custom.create_cluster_custom_object(*CR, vgpu("a"))
    seen: list[Request] = []

    def concurrent_edit(request: Request) -> None:
        seen.append(request)
        emulator.seed({**created, "spec": {"vGPUTypeName": "edited by someone else"}})

    emulator.on_before_write(concurrent_edit)
    body = {**created, "spec": {"vGPUTypeName": "NVIDIA A2-4Q"}}
    error = api_error(custom.replace_cluster_custom_object, *CR, "a", body)
    emulator.on_before_write(None)
    assert error.status == 409
    assert seen == [Request("update", GROUP, PLURAL, None, None, "a")]
    stored = emulator.get_object(*CR, "a")
    assert stored is not None
    assert stored["spec"] == {"vGPUTypeName": "edited by someone else"}
    assert stored["metadata"]["generation"] == 2


# --- namespaced resources ------------------------------------------------------------------------


def kubevirt(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": namespace},
        "spec": {"configuration": {}},
    }


def _raw_list(emulator: ApiServerEmulator, path: str) -> bytes:
    answer = urllib3.request(
        "GET", emulator.url + path, headers={"Authorization": f"Bearer {DEFAULT_TOKEN}"}
    )
    assert answer.status == 200
    return answer.data


def test_list_pages_are_written_in_the_api_servers_key_order(
    emulator: ApiServerEmulator,
) -> None:
    """k8s.io/apimachinery pkg/runtime/serializer/json/collections.go: a built-in kind's list is
    written in its Go struct's order; a custom resource's list is an unstructured map, written
    with its keys sorted, so its metadata (continue token and all) comes after the items."""
    for i in range(3):
        emulator.seed(vgpu(f"n1-00000800{i + 4}"))
    cr_page = _raw_list(emulator, f"/apis/{GROUP}/{VERSION}/{PLURAL}?limit=2")
    keys = list(json.loads(cr_page))
    assert keys == ["apiVersion", "items", "kind", "metadata"]
    assert list(json.loads(cr_page)["metadata"]) == [
        "continue",
        "remainingItemCount",
        "resourceVersion",
    ]
    core_page = _raw_list(emulator, "/api/v1/namespaces?limit=1")
    assert list(json.loads(core_page)) == ["kind", "apiVersion", "metadata", "items"]


def test_namespaced_resources_list_across_namespaces(
    emulator: ApiServerEmulator, custom: Any
) -> None:
    emulator.seed(kubevirt("harvester-system"))  # seeding creates the namespace
    custom.create_namespaced_custom_object(*KV[:2], "default", KV[2], kubevirt("default"))
    everywhere = custom.list_cluster_custom_object(*KV)
    assert everywhere["kind"] == "KubeVirtList"
    assert [o["metadata"]["namespace"] for o in everywhere["items"]] == [
        "default",
        "harvester-system",
    ]
    one = custom.list_namespaced_custom_object(*KV[:2], "harvester-system", KV[2])
    assert [o["metadata"]["namespace"] for o in one["items"]] == ["harvester-system"]
    got = custom.get_namespaced_custom_object(*KV[:2], "harvester-system", KV[2], "kubevirt")
    assert got["metadata"]["namespace"] == "harvester-system"
    assert [o["metadata"]["namespace"] for o in emulator.objects(*KV, namespace="default")] == [
        "default"
    ]


def test_namespaced_replace_and_status(custom: Any) -> None:
    created = custom.create_namespaced_custom_object(*KV[:2], "default", KV[2], kubevirt("default"))
    body = {**created, "spec": {"configuration": {"mediatedDevicesConfiguration": {}}}}
    updated = custom.replace_namespaced_custom_object(*KV[:2], "default", KV[2], "kubevirt", body)
    assert updated["metadata"]["generation"] == 2
    stale = {**created, "status": {"phase": "Deployed"}}
    error = api_error(
        custom.replace_namespaced_custom_object_status,
        *KV[:2],
        "default",
        KV[2],
        "kubevirt",
        stale,
    )
    assert error.status == 409


def test_create_in_a_missing_namespace_is_404(custom: Any) -> None:
    error = api_error(
        custom.create_namespaced_custom_object, *KV[:2], "nope", KV[2], kubevirt("nope")
    )
    assert error.status == 404
    assert status_of(error)["message"] == 'namespaces "nope" not found'


def test_a_namespaced_object_needs_its_namespace_in_the_url(custom: Any) -> None:
    error = api_error(custom.get_cluster_custom_object, *KV, "kubevirt")
    assert error.status == 404


# --- selectors -----------------------------------------------------------------------------------

LABELLED = {
    "a": {"nodename": "n1", "tier": "gold"},
    "b": {"nodename": "n2", "tier": "silver"},
    "c": {"nodename": "n3"},
    "d": {"other": "x"},
}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("nodename=n1", ["a"]),
        ("nodename==n1", ["a"]),
        ("nodename!=n1", ["b", "c", "d"]),
        ("nodename", ["a", "b", "c"]),
        ("!nodename", ["d"]),
        ("nodename in (n1,n2)", ["a", "b"]),
        ("nodename in (n1, n3)", ["a", "c"]),
        ("nodename notin (n1,n2)", ["c", "d"]),
        ("nodename,tier!=gold", ["b", "c"]),
        ("nodename in (n1,n2),tier=silver", ["b"]),
        ("tier,!other", ["a", "b"]),
        ("", ["a", "b", "c", "d"]),
    ],
)
def test_label_selectors(
    emulator: ApiServerEmulator, custom: Any, selector: str, expected: list[str]
) -> None:
    for name, labels in LABELLED.items():
        emulator.seed(vgpu(name, labels=labels))
    listed = custom.list_cluster_custom_object(*CR, label_selector=selector)
    assert [o["metadata"]["name"] for o in listed["items"]] == expected


@pytest.mark.parametrize("selector", ["nodename in n1", "a=b=c", "x in (a", "=x"])
def test_a_malformed_label_selector_is_400(custom: Any, selector: str) -> None:
    assert api_error(custom.list_cluster_custom_object, *CR, label_selector=selector).status == 400


def pod(name: str, node: str, *, namespace: str = "default", app: str = "virt-launcher") -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"kubevirt.io": app}},
        "spec": {"nodeName": node, "containers": [{"name": "compute", "image": "x"}]},
        "status": {"phase": "Running"},
    }


def test_pods_by_node_and_label_across_namespaces(emulator: ApiServerEmulator, core: Any) -> None:
    emulator.seed(pod("p1", "n1"))
    emulator.seed(pod("p2", "n1", namespace="vms"))
    emulator.seed(pod("p3", "n2"))
    emulator.seed(pod("p4", "n1", app="other"))
    pods = core.list_pod_for_all_namespaces(
        field_selector="spec.nodeName=n1", label_selector="kubevirt.io=virt-launcher"
    )
    assert sorted((p.metadata.namespace, p.metadata.name) for p in pods.items) == [
        ("default", "p1"),
        ("vms", "p2"),
    ]
    assert pods.items[0].spec.containers[0].name == "compute"


def test_field_selectors_on_names_and_namespaces(emulator: ApiServerEmulator, custom: Any) -> None:
    for name in "abc":
        emulator.seed(vgpu(name))
    named = custom.list_cluster_custom_object(*CR, field_selector="metadata.name=b")
    assert [o["metadata"]["name"] for o in named["items"]] == ["b"]
    others = custom.list_cluster_custom_object(*CR, field_selector="metadata.name!=b")
    assert [o["metadata"]["name"] for o in others["items"]] == ["a", "c"]
    emulator.seed(kubevirt("harvester-system"))
    emulator.seed(kubevirt("default"))
    kv = custom.list_cluster_custom_object(*KV, field_selector="metadata.namespace=default")
    assert [o["metadata"]["namespace"] for o in kv["items"]] == ["default"]


def test_events_by_involved_object(core: Any) -> None:
    for name in ("n1-0000080004", "n1-0000080005"):
        core.create_namespaced_event(
            "default",
            client.CoreV1Event(
                metadata=client.V1ObjectMeta(generate_name=f"{name}."),
                involved_object=client.V1ObjectReference(kind=KIND, name=name),
                reason="VGPUCreated",
                message="vGPU created",
                type="Normal",
            ),
        )
    events = core.list_namespaced_event(
        "default", field_selector="involvedObject.name=n1-0000080005"
    )
    assert [e.involved_object.name for e in events.items] == ["n1-0000080005"]
    assert events.items[0].metadata.name.startswith("n1-0000080005.")


def test_an_unknown_field_selector_is_400(custom: Any, core: Any) -> None:
    error = api_error(custom.list_cluster_custom_object, *CR, field_selector="spec.nodeName=n1")
    assert error.status == 400
    assert status_of(error)["reason"] == "BadRequest"
    assert api_error(core.list_namespaced_event, "default", field_selector="x=y").status == 400


def test_lists_carry_kind_api_version_and_resource_version(
    emulator: ApiServerEmulator, custom: Any
) -> None:
    emulator.seed(vgpu("a"))
    listed = custom.list_cluster_custom_object(*CR)
    assert listed["kind"] == "VGPUDeviceList"
    assert listed["apiVersion"] == f"{GROUP}/{VERSION}"
    assert listed["metadata"]["resourceVersion"] == emulator.resource_version
    assert {(o["apiVersion"], o["kind"]) for o in listed["items"]} == {(f"{GROUP}/{VERSION}", KIND)}


# --- watch ---------------------------------------------------------------------------------------


def watched(custom: Any, **kwargs: Any) -> list[tuple[str, str]]:
    stream = Watch().stream(custom.list_cluster_custom_object, *CR, **kwargs)
    return [(e["type"], e["object"]["metadata"]["name"]) for e in stream]


def test_watch_resumes_from_a_resource_version_in_order(custom: Any) -> None:
    start = custom.list_cluster_custom_object(*CR)["metadata"]["resourceVersion"]
    created = custom.create_cluster_custom_object(*CR, vgpu("a"))
    custom.create_cluster_custom_object(*CR, vgpu("b"))
    custom.replace_cluster_custom_object(*CR, "a", {**created, "spec": {"enabled": True}})
    custom.delete_cluster_custom_object(*CR, "b")
    events = watched(custom, resource_version=start, timeout_seconds=1)
    assert events == [("ADDED", "a"), ("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]


def test_watch_without_a_resource_version_starts_with_the_current_state(
    emulator: ApiServerEmulator, custom: Any
) -> None:
    emulator.seed(vgpu("a"))
    emulator.seed(vgpu("b"))
    assert watched(custom, timeout_seconds=1) == [("ADDED", "a"), ("ADDED", "b")]


def test_watch_delivers_live_changes(custom: Any) -> None:
    start = custom.list_cluster_custom_object(*CR)["metadata"]["resourceVersion"]
    events: list[dict[str, Any]] = []
    watcher = Watch()

    def consume() -> None:
        for event in watcher.stream(
            custom.list_cluster_custom_object, *CR, resource_version=start, timeout_seconds=10
        ):
            events.append(event)
            if event["type"] == "DELETED":
                watcher.stop()

    thread = threading.Thread(target=consume)
    thread.start()
    created = custom.create_cluster_custom_object(*CR, vgpu("a"))
    updated = custom.replace_cluster_custom_object_status(
        *CR, "a", {**created, "status": {"uuid": "u1"}}
    )
    custom.delete_cluster_custom_object(*CR, "a")
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert events[1]["object"]["status"] == {"uuid": "u1"}
    assert (
        events[1]["object"]["metadata"]["resourceVersion"] == updated["metadata"]["resourceVersion"]
    )


def test_watch_with_a_label_selector_sees_objects_enter_and_leave(custom: Any) -> None:
    start = custom.list_cluster_custom_object(*CR)["metadata"]["resourceVersion"]
    created = custom.create_cluster_custom_object(*CR, vgpu("a", labels={"nodename": "n2"}))
    moved = custom.replace_cluster_custom_object(
        *CR, "a", {**created, "metadata": {**created["metadata"], "labels": {"nodename": "n1"}}}
    )
    custom.replace_cluster_custom_object(
        *CR, "a", {**moved, "metadata": {**moved["metadata"], "labels": {"nodename": "n3"}}}
    )
    custom.create_cluster_custom_object(*CR, vgpu("b", labels={"nodename": "n2"}))
    events = watched(
        custom, resource_version=start, label_selector="nodename=n1", timeout_seconds=1
    )
    assert events == [("ADDED", "a"), ("DELETED", "a")]


def test_watch_from_a_compacted_resource_version_is_410_gone(
    emulator: ApiServerEmulator, custom: Any
) -> None:
    start = custom.list_cluster_custom_object(*CR)["metadata"]["resourceVersion"]
    custom.create_cluster_custom_object(*CR, vgpu("a"))
    emulator.compact()
    with pytest.raises(client.ApiException) as caught:
        watched(custom, resource_version=start, timeout_seconds=1)
    assert caught.value.status == 410
    # etcd's words (k8s.io/apiserver v0.37 pkg/storage/etcd3/errors.go, interpretWatchError),
    # as kube-apiserver v1.37.2 answers a compacted version (tests/integration/test_real_watch.py)
    assert caught.value.reason == "Expired: The resourceVersion for the provided watch is too old."


def test_watch_history_is_bounded(tmp_path: Path) -> None:
    with ApiServerEmulator(history=2) as emulator:
        emulator.register(GROUP, VERSION, PLURAL, KIND, False, True)
        api = new_client_from_config(config_file=str(emulator.kubeconfig(tmp_path)))
        custom = client.CustomObjectsApi(api)
        start = emulator.resource_version
        for name in "abc":
            emulator.seed(vgpu(name))
        with pytest.raises(client.ApiException) as caught:
            watched(custom, resource_version=start, timeout_seconds=1)
        assert caught.value.status == 410
        # a watch cache's words for a version its window dropped (k8s.io/apiserver v0.37
        # pkg/storage/cacher/watch_cache_history.go, GetIntervalLocked)
        assert caught.value.reason.startswith(f"Expired: too old resource version: {start} (")
        recent = str(int(emulator.resource_version) - 1)
        assert watched(custom, resource_version=recent, timeout_seconds=1) == [("ADDED", "c")]
        api.close()


def test_watch_of_pods_deserialises_into_models(emulator: ApiServerEmulator, core: Any) -> None:
    start = emulator.resource_version
    emulator.seed(pod("p1", "n1"))
    stream = Watch().stream(
        core.list_pod_for_all_namespaces,
        field_selector="spec.nodeName=n1",
        resource_version=start,
        timeout_seconds=1,
    )
    assert [(e["type"], e["object"].metadata.name) for e in stream] == [("ADDED", "p1")]


# --- missing CRDs, RBAC, outages -----------------------------------------------------------------


def test_an_unregistered_resource_is_404_like_a_missing_crd(custom: Any) -> None:
    error = api_error(custom.list_cluster_custom_object, GROUP, VERSION, "sriovgpudevices")
    assert error.status == 404
    body = status_of(error)
    assert body["reason"] == "NotFound"
    assert body["message"] == "the server could not find the requested resource"
    assert api_error(custom.get_cluster_custom_object, "nope.io", "v1", "things", "x").status == 404


def test_deny_answers_403_with_the_real_message(emulator: ApiServerEmulator, custom: Any) -> None:
    created = custom.create_cluster_custom_object(*CR, vgpu("x"))
    emulator.deny("update", GROUP, PLURAL)
    error = api_error(custom.replace_cluster_custom_object, *CR, "x", created)
    assert error.status == 403
    assert status_of(error)["reason"] == "Forbidden"
    assert status_of(error)["message"] == (
        f'{PLURAL}.{GROUP} "x" is forbidden: User "system:serviceaccount:vgpuctl-system:vgpuctl" '
        f'cannot update resource "{PLURAL}" in API group "{GROUP}" at the cluster scope'
    )
    # the status subresource is a separate RBAC resource
    custom.replace_cluster_custom_object_status(*CR, "x", {**created, "status": {"uuid": "u"}})
    emulator.deny("update", GROUP, PLURAL, "status")
    error = api_error(custom.replace_cluster_custom_object_status, *CR, "x", created)
    assert f'cannot update resource "{PLURAL}/status"' in status_of(error)["message"]


def test_deny_in_a_namespace_names_it(emulator: ApiServerEmulator, core: Any) -> None:
    emulator.deny("list", "", "pods")
    error = api_error(core.list_namespaced_pod, "vms")
    assert status_of(error)["message"] == (
        'pods is forbidden: User "system:serviceaccount:vgpuctl-system:vgpuctl" cannot list '
        'resource "pods" in API group "" in the namespace "vms"'
    )
    emulator.allow_all()
    assert core.list_namespaced_pod("vms").items == []


def test_requests_are_recorded_as_rbac_sees_them(
    emulator: ApiServerEmulator, custom: Any, core: Any
) -> None:
    created = custom.create_cluster_custom_object(*CR, vgpu("a"))
    custom.get_cluster_custom_object(*CR, "a")
    custom.list_cluster_custom_object(*CR, label_selector="nodename=n1")
    watched(custom, timeout_seconds=1)
    updated = custom.replace_cluster_custom_object(*CR, "a", {**created, "spec": {"x": 1}})
    custom.replace_cluster_custom_object_status(*CR, "a", {**updated, "status": {"uuid": "u"}})
    custom.patch_cluster_custom_object(*CR, "a", {"spec": {"x": 2}})
    custom.delete_cluster_custom_object(*CR, "a")
    custom.list_cluster_custom_object(*KV)
    core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1")
    core.list_namespaced_event("default")
    assert emulator.requests == [
        ("create", GROUP, PLURAL, None, None, None),
        ("get", GROUP, PLURAL, None, None, "a"),
        ("list", GROUP, PLURAL, None, None, None),
        ("watch", GROUP, PLURAL, None, None, None),
        ("update", GROUP, PLURAL, None, None, "a"),
        ("update", GROUP, PLURAL, "status", None, "a"),
        ("patch", GROUP, PLURAL, None, None, "a"),
        ("delete", GROUP, PLURAL, None, None, "a"),
        ("list", "kubevirt.io", "kubevirts", None, None, None),
        ("list", "", "pods", None, None, None),
        ("list", "", "events", None, "default", None),
    ]


def test_stop_refuses_connections_and_start_serves_the_same_state(
    emulator: ApiServerEmulator, custom: Any
) -> None:
    custom.create_cluster_custom_object(*CR, vgpu("a"))
    url = emulator.url
    emulator.stop()
    with pytest.raises(urllib3.exceptions.MaxRetryError) as caught:
        custom.list_cluster_custom_object(*CR, _request_timeout=2)
    assert isinstance(caught.value.reason, urllib3.exceptions.NewConnectionError)
    emulator.start()
    assert emulator.url == url
    listed = custom.list_cluster_custom_object(*CR)
    assert [o["metadata"]["name"] for o in listed["items"]] == ["a"]


def test_stop_cuts_an_open_watch(emulator: ApiServerEmulator, custom: Any) -> None:
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            list(Watch().stream(custom.list_cluster_custom_object, *CR, timeout_seconds=30))
        except Exception as error:  # what the client raises for a cut stream
            errors.append(error)

    thread = threading.Thread(target=consume)
    thread.start()
    # wait until the watch is being served, then go away
    for _ in range(100):
        if any(r.verb == "watch" for r in emulator.requests):
            break
        threading.Event().wait(0.05)
    emulator.stop()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert errors, "a cut watch must not look like a clean end of stream"


def test_fail_next_fails_that_many_requests(emulator: ApiServerEmulator, custom: Any) -> None:
    emulator.fail_next(2, status=503)
    for _ in range(2):
        error = api_error(custom.list_cluster_custom_object, *CR)
        assert error.status == 503
        assert status_of(error)["reason"] == "ServiceUnavailable"
    assert custom.list_cluster_custom_object(*CR)["items"] == []
    emulator.fail_next()
    assert api_error(custom.get_cluster_custom_object, *CR, "a").status == 500


# --- direct access -------------------------------------------------------------------------------


def test_register_crd_serves_the_manifest(api_client: Any, emulator: ApiServerEmulator) -> None:
    emulator.register_crd(
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "spec": {
                "group": GROUP,
                "names": {"plural": "sriovgpudevices", "kind": "SRIOVGPUDevice"},
                "scope": "Cluster",
                "versions": [{"name": VERSION, "served": True, "subresources": {"status": {}}}],
            },
        }
    )
    custom: Any = client.CustomObjectsApi(api_client)
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SRIOVGPUDevice",
        "metadata": {"name": "n1-000008000"},
        "spec": {"enabled": True},
        "status": {"numVFs": 16},
    }
    created: dict[str, Any] = custom.create_cluster_custom_object(
        GROUP, VERSION, "sriovgpudevices", body
    )
    assert "status" not in created  # the manifest declared the status subresource


def test_the_kubevirt_crd_takes_pci_host_devices_as_kubevirts_own_does(
    emulator: ApiServerEmulator, custom: Any
) -> None:
    """KubeVirt's CRD declares ``permittedHostDevices.pciHostDevices[]`` ``{pciVendorSelector,
    resourceName, externalResourceProvider}`` (the first two required): what vgpuctl writes
    for a vGPU on NVIDIA's vfio interface is kept as written, a field KubeVirt does not know
    is pruned, an entry without its selector refused; the rest of the CR is kept."""
    emulator.register_crd(kubevirt_crd())
    emulator.seed(
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "KubeVirt",
            "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
            "spec": {"imageTag": "v1.5.0", "configuration": {"permittedHostDevices": {}}},
        }
    )
    entry = {
        "pciVendorSelector": "10DE:26B9",
        "resourceName": "nvidia.com/NVIDIA_L40S-8Q",
        "externalResourceProvider": True,
    }
    path = "/spec/configuration/permittedHostDevices/pciHostDevices"
    where = ("kubevirt.io", "v1", "kubevirt", "kubevirts", "kubevirt")
    patched = custom.patch_namespaced_custom_object(
        *where,
        [{"op": "add", "path": path, "value": [{**entry, "pciDeviceId": "x"}]}],
        _content_type=JSON_PATCH,
    )
    assert patched["spec"]["configuration"]["permittedHostDevices"] == {"pciHostDevices": [entry]}
    assert patched["spec"]["imageTag"] == "v1.5.0"
    no_selector = {k: v for k, v in entry.items() if k != "pciVendorSelector"}
    error = api_error(
        custom.patch_namespaced_custom_object,
        *where,
        [{"op": "add", "path": f"{path}/-", "value": no_selector}],
        _content_type=JSON_PATCH,
    )
    assert error.status == 422
    assert "pciVendorSelector" in status_of(error)["message"]


def test_seed_keeps_status_and_replaces_existing(emulator: ApiServerEmulator) -> None:
    first = emulator.seed(vgpu("a"))
    assert first["status"] == {"uuid": ""}
    second = emulator.seed({**vgpu("a"), "spec": {"enabled": True}})
    assert second["metadata"]["uid"] == first["metadata"]["uid"]
    assert second["metadata"]["generation"] == 2
    assert [o["spec"] for o in emulator.objects(*CR)] == [{"enabled": True}]
    emulator.delete_object(*CR, "a")
    assert emulator.objects(*CR) == []


# --- lists in pages ----------------------------------------------------------------------------


def test_a_list_in_pages_is_one_collection_at_the_first_pages_version(
    custom: Any, emulator: ApiServerEmulator
) -> None:
    for i in range(5):
        custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, vgpu(f"n1-{i}"))
    first = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=2)
    assert [o["metadata"]["name"] for o in first["items"]] == ["n1-0", "n1-1"]
    assert first["metadata"]["remainingItemCount"] == 3
    version = first["metadata"]["resourceVersion"]
    # Writes between pages do not show: the pages are the collection at the first version.
    custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, "n1-3")
    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, vgpu("n1-9"))
    token = first["metadata"]["continue"]
    second = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=2, _continue=token)
    assert [o["metadata"]["name"] for o in second["items"]] == ["n1-2", "n1-3"]
    assert second["metadata"]["resourceVersion"] == version
    token = second["metadata"]["continue"]
    last = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=2, _continue=token)
    assert [o["metadata"]["name"] for o in last["items"]] == ["n1-4"]
    # A custom resource's list is unstructured: its empty token is written, not omitted.
    assert last["metadata"]["continue"] == "" and "remainingItemCount" not in last["metadata"]
    # Each page is a list request, as RBAC sees it.
    assert [r.verb for r in emulator.requests if r.resource == PLURAL][-2:] == ["list"] * 2


def test_a_continue_token_of_a_compacted_version_is_410_expired(
    custom: Any, emulator: ApiServerEmulator
) -> None:
    for i in range(3):
        custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, vgpu(f"n1-{i}"))
    first = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=1)
    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, vgpu("n1-8"))
    emulator.compact()
    error = api_error(
        custom.list_cluster_custom_object,
        GROUP,
        VERSION,
        PLURAL,
        limit=1,
        _continue=first["metadata"]["continue"],
    )
    assert (error.status, status_of(error)["reason"]) == (410, "Expired")
    assert "continue parameter is too old" in status_of(error)["message"]


def test_a_list_without_a_limit_or_with_a_large_one_is_one_page(custom: Any) -> None:
    for i in range(3):
        custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, vgpu(f"n1-{i}"))
    for kwargs in ({}, {"limit": 3}, {"limit": 500}):
        page = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, **kwargs)
        assert len(page["items"]) == 3 and page["metadata"]["continue"] == ""


# --- validating webhooks -----------------------------------------------------------------------

VGPU_RULE = {
    "operations": ["UPDATE", "DELETE"],
    "apiGroups": [GROUP],
    "apiVersions": [VERSION],
    "resources": [PLURAL],
    "scope": "Cluster",
}


def test_a_webhook_denial_is_its_status_prefixed_and_nothing_is_written(
    emulator: ApiServerEmulator, custom: Any
) -> None:
    seen: list[Attributes] = []

    def judge(a: Attributes) -> WebhookDenial | None:
        seen.append(a)
        if a.operation == "DELETE" or (a.object or {})["spec"].get("enabled"):
            return WebhookDenial("no, not that", code=500, reason="InternalError")
        return None

    emulator.register_webhook("check.example.io", judge, rules=[VGPU_RULE])
    custom.create_cluster_custom_object(*CR, vgpu("a"))
    assert seen == []  # CREATE is not among the rule's operations
    stored = custom.get_cluster_custom_object(*CR, "a")
    before = emulator.resource_version

    error = api_error(custom.patch_cluster_custom_object, *CR, "a", {"spec": {"enabled": True}})
    assert error.status == 500
    assert status_of(error) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'admission webhook "check.example.io" denied the request: no, not that',
        "reason": "InternalError",
        "code": 500,
    }
    assert emulator.resource_version == before
    assert emulator.get_object(*CR, "a") == stored
    update = seen[-1]
    assert (update.operation, update.name, update.subresource) == ("UPDATE", "a", "")
    assert update.old_object is not None and update.old_object["spec"].get("enabled") is None
    assert update.object is not None and update.object["spec"]["enabled"] is True

    error = api_error(custom.delete_cluster_custom_object, *CR, "a")
    assert error.status == 500
    assert seen[-1].object is None and seen[-1].old_object == stored
    assert emulator.get_object(*CR, "a") == stored

    # The rule names the main resource: a status write is not the webhook's to judge.
    custom.patch_cluster_custom_object_status(*CR, "a", {"status": {"uuid": "1"}})
    assert seen[-1].operation == "DELETE"
    assert emulator.get_object(*CR, "a")["status"] == {"uuid": "1"}


def test_a_webhook_denial_below_400_is_400_and_without_a_message_says_so(
    emulator: ApiServerEmulator, custom: Any
) -> None:
    emulator.register_webhook("a.example.io", lambda a: WebhookDenial(), rules=[VGPU_RULE])
    custom.create_cluster_custom_object(*CR, vgpu("a"))
    error = api_error(custom.patch_cluster_custom_object, *CR, "a", {"spec": {"enabled": True}})
    assert error.status == 400
    body = status_of(error)
    assert (
        body["message"] == 'admission webhook "a.example.io" denied the request without explanation'
    )
    assert "reason" not in body
    emulator.remove_webhook("a.example.io")
    custom.patch_cluster_custom_object(*CR, "a", {"spec": {"enabled": True}})
    assert emulator.get_object(*CR, "a")["spec"]["enabled"] is True


def test_an_unreachable_webhook_follows_its_failure_policy(
    emulator: ApiServerEmulator, custom: Any
) -> None:
    def down(a: Attributes) -> WebhookDenial | None:
        raise WebhookUnavailable("connection refused")

    custom.create_cluster_custom_object(*CR, vgpu("a"))
    emulator.register_webhook("down.example.io", down, rules=[VGPU_RULE])
    error = api_error(custom.patch_cluster_custom_object, *CR, "a", {"spec": {"enabled": True}})
    assert error.status == 500
    assert status_of(error)["message"] == (
        'Internal error occurred: failed calling webhook "down.example.io": connection refused'
    )
    emulator.register_webhook("down.example.io", down, rules=[VGPU_RULE], failure_policy="Ignore")
    custom.patch_cluster_custom_object(*CR, "a", {"spec": {"enabled": True}})
    assert emulator.get_object(*CR, "a")["spec"]["enabled"] is True
