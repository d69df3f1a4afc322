"""The in-memory ClusterApi agrees with the API-server emulator reached over HTTP.

Unit tests trust ``FakeCluster`` where integration tests use the emulator through the real
``kubernetes`` client (``reconciler.kube``). The same calls, in the same order, must give both
the same answers: the same objects (server-set metadata aside) and the same kind of error.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.kube import KubernetesApi, connect
from reconciler.model import ReconcilerError
from reconciler.model.cluster import GROUP, NODE_LABEL, VERSION, VGPU_KIND
from reconciler.model.clusterapi import ClusterApi
from tests.cluster_node import install_crds
from tests.doubles.cluster import FakeCluster
from tests.doubles.emulator import ApiServerEmulator

REPO = Path(__file__).resolve().parents[2]
VGPUS = {"group": GROUP, "version": VERSION, "plural": "vgpudevices"}
KUBEVIRTS = {"group": "kubevirt.io", "version": "v1", "plural": "kubevirts"}


def vgpu(name: str, node: str, profile: str = "", uuid: str = "") -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": VGPU_KIND,
        "metadata": {"name": name, "labels": {NODE_LABEL: node}},
        "spec": {
            "address": "0000:08:00.4",
            "enabled": bool(profile),
            "vGPUTypeName": profile,
            "nodeName": node,
            "parentGPUDeviceAddress": "0000:08:00.0",
        },
        "status": {"uuid": uuid},
    }


def kept(obj: Any) -> Any:
    """An answer without what only a server sets (versions, uids, timestamps)."""
    if not isinstance(obj, dict):
        return obj
    meta = {
        k: v
        for k, v in obj.get("metadata", {}).items()
        if k in ("name", "namespace", "labels", "annotations")
    }
    return {**obj, "metadata": meta}


def scenario(api: ClusterApi) -> list[Any]:
    """Every port method, its rules, and each error vgpuctl handles; returns what was answered."""
    trace: list[Any] = []

    def call(method: Callable[..., Any], **kw: Any) -> Any:
        try:
            answer = method(**kw)
        except ReconcilerError as err:
            trace.append(type(err).__name__)
            return None
        trace.append(
            sorted((kept(o) for o in answer), key=lambda o: o["metadata"]["name"])
            if isinstance(answer, list)
            else kept(answer)
        )
        return answer

    a = call(api.create_object, **VGPUS, body=vgpu("n1-a", "n1", "NVIDIA A2-4Q", "u-1"))
    call(api.create_object, **VGPUS, body=vgpu("n1-a", "n1"))  # exists
    call(api.create_object, **VGPUS, body=vgpu("n2-b", "n2"))
    invalid = vgpu("n3-c", "n3")
    invalid["spec"]["enabled"] = "yes"  # the CRD says boolean: refused (422), nothing stored
    call(api.create_object, **VGPUS, body=invalid)
    pruned = vgpu("n3-d", "n3")
    pruned["spec"]["colour"] = "blue"  # not in the CRD: dropped
    call(api.create_object, **VGPUS, body=pruned)
    call(api.get_object, **VGPUS, name="n1-a")  # status dropped on create
    call(api.get_object, **VGPUS, name="missing")
    call(api.list_objects, **VGPUS, label_selector=f"{NODE_LABEL}=n1")
    call(api.list_objects, **VGPUS, label_selector=f"{NODE_LABEL} in (n1,n2)")
    call(api.list_objects, **VGPUS)
    edited = vgpu("n1-a", "n1", "NVIDIA A2-8Q", "ignored")
    edited["metadata"]["resourceVersion"] = a["metadata"]["resourceVersion"]
    b = call(api.replace_object, **VGPUS, name="n1-a", body=edited)  # status kept
    call(api.replace_object, **VGPUS, name="n1-a", body=edited)  # stale version
    status = {**b, "status": {"uuid": "u-2"}}
    c = call(api.replace_status, **VGPUS, name="n1-a", body=status)
    call(api.replace_status, **VGPUS, name="n1-a", body=status)  # stale version
    test_old = {"op": "test", "path": "/spec/vGPUTypeName", "value": "NVIDIA A2-4Q"}
    call(api.patch_object, **VGPUS, name="n1-a", patch=[test_old])  # the test fails
    test_now = {**test_old, "value": "NVIDIA A2-8Q"}
    set_off = {"op": "replace", "path": "/spec/enabled", "value": False}
    d = call(api.patch_object, **VGPUS, name="n1-a", patch=[test_now, set_off])
    stale = c["metadata"]["resourceVersion"]
    call(api.delete_object, **VGPUS, name="n1-a", resource_version=stale)
    call(api.delete_object, **VGPUS, name="n1-a", resource_version=d["metadata"]["resourceVersion"])
    call(api.get_object, **VGPUS, name="n1-a")
    call(api.replace_object, **VGPUS, name="n1-a", body=d)  # deleted since read
    call(api.list_objects, **KUBEVIRTS)  # not served
    return trace


@pytest.fixture
def over_http(tmp_path: Path) -> Iterator[KubernetesApi]:
    with ApiServerEmulator() as server:
        install_crds(server)
        with connect(server.kubeconfig(tmp_path), timeout=5) as api:
            yield api


def test_the_fake_answers_as_the_emulator_does(over_http: KubernetesApi) -> None:
    fake = FakeCluster()
    fake.unserved.add("kubevirts")
    expected = scenario(over_http)
    assert scenario(fake) == expected
    # The scenario means something: each rule it exercises answered as written here.
    errors = [t for t in expected if isinstance(t, str)]
    assert errors == [
        "ConflictError",  # create of an existing name
        "ClusterError",  # create of an object the CRD's schema refuses (422)
        "ConflictError",  # replace with a stale resourceVersion
        "ConflictError",  # status replace with a stale resourceVersion
        "ConflictError",  # a JSON patch whose test fails
        "ConflictError",  # delete with a stale resourceVersion
        "ConflictError",  # replace of an object deleted since it was read
        "ResourceMissingError",  # a resource the server does not serve
    ]
    assert "colour" not in expected[4]["spec"]  # pruned: the CRD does not declare it
    assert "status" not in expected[5]  # dropped on create


def test_the_fake_has_the_ports_methods_and_signatures() -> None:
    port = {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(ClusterApi, inspect.isfunction)
        if not name.startswith("_")
    }
    assert port
    for name, signature in port.items():
        assert inspect.signature(getattr(FakeCluster, name)) == signature, name
