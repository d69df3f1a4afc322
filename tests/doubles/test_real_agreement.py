"""The emulator and the real kube-apiserver answer the same: each test runs once against each
(the ``api_server`` fixture; the real one is the ``realapi`` tier, ``just test-real``).

Behaviours vgpuctl relies on and the emulator models: Harvester's real CRDs prune fields their
schema does not declare and refuse values it does not allow; a JSON patch's ``test`` of a key that
is not there; resourceVersion preconditions (409); lists in pages with ``limit`` and
``continue``. Expected answers are the API server's, written from its source (the files are
named beside each), not taken from either server's output.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from tests.api_servers import Served, crd_manifests
from tests.real_apiserver import KUBERNETES_VERSION, RealApiServer

GROUP, VERSION = "devices.harvesterhci.io", "v1beta1"
VGPUS = (GROUP, VERSION, "vgpudevices")
ADDONS = ("harvesterhci.io", "v1beta1", "addons")
JSON_PATCH = "application/json-patch+json"
NAMESPACE = "harvester-system"
#: A write at a stale resourceVersion: k8s.io/apiserver pkg/storage/errors.go
#: (NewResourceVersionConflictsError) made an errors.NewConflict by the generic registry.
MODIFIED = (
    'Operation cannot be fulfilled on vgpudevices.devices.harvesterhci.io "{name}": the object '
    "has been modified; please apply your changes to the latest version and try again"
)


@pytest.fixture
def served(api_server: Served) -> Served:
    """The server with Harvester's CRDs and the harvester-system namespace."""
    for crd in crd_manifests():
        api_server.install_crd(crd)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    try:
        client.CoreV1Api(api_server.api).create_namespace(namespace)
    except client.ApiException as error:
        if error.status != 409:  # the real server's, made by an earlier test of this process
            raise
    return api_server


def vgpu(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VGPUDevice",
        "metadata": {"name": name, "labels": {"nodename": "harvester-kgd9c"}},
        "spec": {"address": "0000:08:00.4", "vGPUTypeName": "", "enabled": False, **spec},
    }


def status_of(error: client.ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(error.body or "{}")
    return body


def api_error(call: Any, *args: Any, **kwargs: Any) -> client.ApiException:
    with pytest.raises(client.ApiException) as caught:
        call(*args, **kwargs)
    return caught.value


# --- the real server itself --------------------------------------------------------------------


@pytest.mark.realapi
def test_the_real_api_server_is_the_pinned_release(real_api: RealApiServer) -> None:
    """Its /version is the release tests/realapi/go.mod pins (the build stamps it), and its
    admin is the cluster's admin while a shipped role's identity is RBAC's to judge."""
    assert real_api.version["gitVersion"] == KUBERNETES_VERSION
    assert real_api.get("/api/v1/namespaces")[0] == 200
    status, body = real_api.get("/api/v1/namespaces", identity="ci")
    assert status == 403, body
    assert body["message"] == (
        'namespaces is forbidden: User "system:serviceaccount:vgpuctl-system:vgpuctl-ci" '
        'cannot list resource "namespaces" in API group "" at the cluster scope'
    )


# --- Harvester's CRDs: pruning and validation ---------------------------------------------------


def test_fields_the_schema_does_not_declare_are_pruned(served: Served) -> None:
    """apiextensions-apiserver pkg/apiserver/schema/pruning: unknown fields are dropped at any
    depth, silently (no error), and ``status`` is not written by a create (the status
    subresource: customresource/strategy.go PrepareForCreate)."""
    obj = vgpu("harvester-kgd9c-000008004", extra="dropped")
    obj["extra"] = {"also": "dropped"}
    obj["status"] = {"uuid": "u", "bogus": 1}
    created = served.custom.create_cluster_custom_object(*VGPUS, obj)
    assert created["spec"] == {"address": "0000:08:00.4", "vGPUTypeName": "", "enabled": False}
    assert "extra" not in created
    assert "status" not in created
    assert served.custom.get_cluster_custom_object(*VGPUS, "harvester-kgd9c-000008004") == created


def test_a_value_of_the_wrong_type_is_422_naming_the_field(served: Served) -> None:
    """apiextensions-apiserver validation (kube-openapi validate): ``<Kind>.<group> "<name>" is
    invalid: <field>: Invalid value: "<type>": <field> in body must be of type <type>: "<type>"``,
    and nothing is written."""
    error = api_error(
        served.custom.create_cluster_custom_object, *VGPUS, vgpu("wrong", enabled="yes")
    )
    assert error.status == 422
    status = status_of(error)
    assert status["reason"] == "Invalid"
    assert status["message"] == (
        'VGPUDevice.devices.harvesterhci.io "wrong" is invalid: spec.enabled: Invalid value: '
        '"string": spec.enabled in body must be of type boolean: "string"'
    )
    # apimachinery errors.NewInvalid: each field error a cause (vgpuctl tells an invalid object
    # from a JSON patch that did not apply by its name and causes: kube/errors.py).
    assert status["details"] == {
        "name": "wrong",
        "group": GROUP,
        "kind": "VGPUDevice",
        "causes": [
            {
                "reason": "FieldValueTypeInvalid",
                "message": 'Invalid value: "string": spec.enabled in body must be of type '
                'boolean: "string"',
                "field": "spec.enabled",
            }
        ],
    }
    assert served.custom.list_cluster_custom_object(*VGPUS)["items"] == []


def test_a_missing_required_field_is_422_naming_it(served: Served) -> None:
    """The Addon CRD requires spec.version (harvester/harvester harvesterhci.io_addons.yaml)."""
    addon = {
        "apiVersion": "harvesterhci.io/v1beta1",
        "kind": "Addon",
        "metadata": {"name": "pcidevices-controller", "namespace": NAMESPACE},
        "spec": {"chart": "harvester-pcidevices-controller", "enabled": True, "repo": "r",
                 "valuesContent": ""},
    }  # fmt: skip
    error = api_error(
        served.custom.create_namespaced_custom_object,
        ADDONS[0], ADDONS[1], NAMESPACE, ADDONS[2], addon,
    )  # fmt: skip
    assert error.status == 422
    status = status_of(error)
    assert status["message"] == (
        'Addon.harvesterhci.io "pcidevices-controller" is invalid: spec.version: Required value'
    )
    assert status["details"]["causes"] == [
        {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.version"}
    ]


# --- JSON patch ------------------------------------------------------------------------------


def test_a_json_patch_test_of_a_missing_key_against_null_passes(served: Served) -> None:
    """gopkg.in/evanphx/json-patch.v4 v4.13.0 (k8s.io/apiserver handlers/patch.go applyJSPatch),
    patch.go: ``test`` of a missing key with ``"value": null`` passes (``partialDoc.get`` of a
    missing key is nil, and so is a null value's raw message), and ``replace`` of a missing key
    adds it (``get`` never fails on an object)."""
    served.custom.create_cluster_custom_object(*VGPUS, vgpu("a"))
    patch = [
        {"op": "test", "path": "/spec/parentGPUDeviceAddress", "value": None},
        {"op": "replace", "path": "/spec/nodeName", "value": "harvester-kgd9c"},
    ]
    out = served.custom.patch_cluster_custom_object(*VGPUS, "a", patch, _content_type=JSON_PATCH)
    assert out["spec"]["nodeName"] == "harvester-kgd9c"
    assert "parentGPUDeviceAddress" not in out["spec"]


@pytest.mark.parametrize(
    "failing",
    [
        {"op": "test", "path": "/spec/nodeName", "value": "harvester-kgd9c"},  # missing
        {"op": "test", "path": "/spec/nowhere/deeper", "value": None},  # a missing parent
        {"op": "test", "path": "/spec/vGPUTypeName", "value": "NVIDIA A2-4Q"},  # it is ""
        {"op": "remove", "path": "/spec/nodeName"},
    ],
)
def test_a_json_patch_that_does_not_apply_is_422_and_writes_nothing(
    served: Served, failing: dict[str, Any]
) -> None:
    created = served.custom.create_cluster_custom_object(*VGPUS, vgpu("a"))
    patch = [{"op": "replace", "path": "/spec/enabled", "value": True}, failing]
    error = api_error(
        served.custom.patch_cluster_custom_object, *VGPUS, "a", patch, _content_type=JSON_PATCH
    )
    assert error.status == 422, error.body
    # handlers/patch.go applyJSPatch: NewGenericServerResponse(422, "", GroupResource{}, "",
    # err.Error(), 0, false): a generic message, no name, no causes (the library's own error
    # is dropped), which is how vgpuctl tells it from an invalid object
    # (reconciler/kube/errors.py is_patch_not_applied).
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
    assert served.custom.get_cluster_custom_object(*VGPUS, "a") == created


# --- resourceVersion preconditions ---------------------------------------------------------------


def test_a_stale_put_is_409_conflict(served: Served) -> None:
    created = served.custom.create_cluster_custom_object(*VGPUS, vgpu("a"))
    fresh = served.custom.replace_cluster_custom_object(*VGPUS, "a", vgpu("a", enabled=True) | {
        "metadata": {**created["metadata"]}})  # fmt: skip
    assert fresh["spec"]["enabled"] is True
    stale = vgpu("a", vGPUTypeName="NVIDIA A2-4Q") | {"metadata": created["metadata"]}
    error = api_error(served.custom.replace_cluster_custom_object, *VGPUS, "a", stale)
    assert error.status == 409
    status = status_of(error)
    assert (status["reason"], status["message"]) == ("Conflict", MODIFIED.format(name="a"))
    assert served.custom.get_cluster_custom_object(*VGPUS, "a") == fresh


def test_a_json_patch_of_a_stale_resource_version_is_409_conflict(served: Served) -> None:
    created = served.custom.create_cluster_custom_object(*VGPUS, vgpu("a"))
    served.custom.patch_cluster_custom_object(*VGPUS, "a", {"spec": {"enabled": True}})
    stale = [
        {"op": "replace", "path": "/metadata/resourceVersion",
         "value": created["metadata"]["resourceVersion"]},
        {"op": "replace", "path": "/spec/vGPUTypeName", "value": "NVIDIA A2-4Q"},
    ]  # fmt: skip
    error = api_error(
        served.custom.patch_cluster_custom_object, *VGPUS, "a", stale, _content_type=JSON_PATCH
    )
    assert error.status == 409
    status = status_of(error)
    assert (status["reason"], status["message"]) == ("Conflict", MODIFIED.format(name="a"))


def test_a_delete_with_a_stale_resource_version_is_409_conflict(served: Served) -> None:
    created = served.custom.create_cluster_custom_object(*VGPUS, vgpu("a"))
    served.custom.patch_cluster_custom_object(*VGPUS, "a", {"spec": {"enabled": True}})
    options = client.V1DeleteOptions(
        preconditions=client.V1Preconditions(
            resource_version=created["metadata"]["resourceVersion"]
        )
    )
    error = api_error(served.custom.delete_cluster_custom_object, *VGPUS, "a", body=options)
    assert error.status == 409
    current = served.custom.get_cluster_custom_object(*VGPUS, "a")
    assert current["spec"]["enabled"] is True
    # k8s.io/apiserver registry/rest/delete.go BeforeDelete: a Conflict on the Kind.
    status = status_of(error)
    assert status["reason"] == "Conflict"
    assert status["message"] == (
        'Operation cannot be fulfilled on VGPUDevice.devices.harvesterhci.io "a": the '
        f"ResourceVersion in the precondition ({created['metadata']['resourceVersion']}) does not "
        f"match the ResourceVersion in record ({current['metadata']['resourceVersion']}). The "
        "object might have been modified"
    )
    assert status["details"] == {"name": "a", "group": GROUP, "kind": "VGPUDevice"}


def test_a_delete_with_another_uid_is_409_conflict(served: Served) -> None:
    created = served.custom.create_cluster_custom_object(*VGPUS, vgpu("a"))
    options = client.V1DeleteOptions(
        preconditions=client.V1Preconditions(uid="0e0e0e0e-0000-4000-8000-000000000000")
    )
    error = api_error(served.custom.delete_cluster_custom_object, *VGPUS, "a", body=options)
    assert error.status == 409
    assert status_of(error)["message"] == (
        'Operation cannot be fulfilled on VGPUDevice.devices.harvesterhci.io "a": the UID in the '
        "precondition (0e0e0e0e-0000-4000-8000-000000000000) does not match the UID in record "
        f"({created['metadata']['uid']}). The object might have been deleted and then recreated"
    )


def test_a_put_without_a_resource_version_is_422_on_the_resource(served: Served) -> None:
    """registry/store.go Update: a custom resource's update must name a resourceVersion; the
    error is NewInvalid on GroupKind{Kind: <the resource>}, its value the uint64 0."""
    served.custom.create_cluster_custom_object(*VGPUS, vgpu("a"))
    error = api_error(served.custom.replace_cluster_custom_object, *VGPUS, "a", vgpu("a"))
    assert error.status == 422
    body = "Invalid value: 0: must be specified for an update"
    status = status_of(error)
    assert status["message"] == (
        f'vgpudevices.devices.harvesterhci.io "a" is invalid: metadata.resourceVersion: {body}'
    )
    assert status["details"] == {
        "name": "a",
        "group": GROUP,
        "kind": "vgpudevices",
        "causes": [
            {"reason": "FieldValueInvalid", "message": body, "field": "metadata.resourceVersion"}
        ],
    }


# --- lists in pages ------------------------------------------------------------------------------


def names(page: dict[str, Any]) -> list[str]:
    return [o["metadata"]["name"] for o in page["items"]]


def test_a_list_in_pages_is_the_collection_at_the_first_pages_version(served: Served) -> None:
    """k8s.io/apiserver storage/etcd3 store.go GetList: pages of ``limit`` objects in key order,
    each continuing at the first page's revision (writes in between do not show),
    ``remainingItemCount`` on every page but the last, no ``continue`` on the last."""
    custom = served.custom
    for i in range(5):
        custom.create_cluster_custom_object(*VGPUS, vgpu(f"n1-{i}"))
    first = custom.list_cluster_custom_object(*VGPUS, limit=2)
    assert names(first) == ["n1-0", "n1-1"]
    assert first["metadata"]["remainingItemCount"] == 3
    custom.delete_cluster_custom_object(*VGPUS, "n1-3")
    custom.create_cluster_custom_object(*VGPUS, vgpu("n1-25"))
    second = custom.list_cluster_custom_object(
        *VGPUS, limit=2, _continue=first["metadata"]["continue"]
    )
    assert names(second) == ["n1-2", "n1-3"]
    assert second["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert second["metadata"]["remainingItemCount"] == 1
    last = custom.list_cluster_custom_object(
        *VGPUS, limit=2, _continue=second["metadata"]["continue"]
    )
    assert names(last) == ["n1-4"]
    assert "remainingItemCount" not in last["metadata"]


def test_the_last_page_of_a_custom_resource_list_has_an_empty_continue(served: Served) -> None:
    """A custom resource's list is an UnstructuredList, whose SetContinue (apimachinery
    unstructured_list.go) writes the token even when it is empty: the last page, and a list not
    in pages, say ``"continue": ""``; a built-in kind's ListMeta (``omitempty``) leaves it out."""
    for i in range(3):
        served.custom.create_cluster_custom_object(*VGPUS, vgpu(f"n1-{i}"))
    whole = served.custom.list_cluster_custom_object(*VGPUS)
    assert whole["metadata"]["continue"] == ""
    first = served.custom.list_cluster_custom_object(*VGPUS, limit=2)
    last = served.custom.list_cluster_custom_object(
        *VGPUS, limit=2, _continue=first["metadata"]["continue"]
    )
    assert names(last) == ["n1-2"]
    assert last["metadata"] == {
        "continue": "",
        "resourceVersion": first["metadata"]["resourceVersion"],
    }
    answer = client.CoreV1Api(served.api).list_namespace(_preload_content=False)
    assert "continue" not in json.loads(answer.data)["metadata"]


def test_a_list_in_pages_with_a_label_selector(served: Served) -> None:
    """With a label selector, each page still holds ``limit`` matching objects (store.go GetList
    reads on until it has them) but has no ``remainingItemCount``: storage/continue.go
    PrepareContinueToken sets it only "if the predicate is empty" (etcd's count would include
    the objects the selector drops)."""
    custom = served.custom
    for i in range(6):
        obj = vgpu(f"n1-{i}")
        obj["metadata"]["labels"]["parity"] = "even" if i % 2 == 0 else "odd"
        custom.create_cluster_custom_object(*VGPUS, obj)
    first = custom.list_cluster_custom_object(*VGPUS, limit=2, label_selector="parity=even")
    assert names(first) == ["n1-0", "n1-2"]
    assert first["metadata"]["continue"]
    assert "remainingItemCount" not in first["metadata"]
    last = custom.list_cluster_custom_object(
        *VGPUS, limit=2, label_selector="parity=even", _continue=first["metadata"]["continue"]
    )
    assert names(last) == ["n1-4"]
    assert last["metadata"]["continue"] == ""
