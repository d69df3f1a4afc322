"""The kube adapter's pure parts: error translation, finding the cluster, Event bodies.

Requests over HTTP are in tests/integration/test_kube_adapter.py (against the emulator).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.kube import EventRecorder, KubernetesApi, Request, connect
from reconciler.kube.errors import (
    from_api_exception,
    from_transport_error,
    is_object_not_found,
)
from reconciler.model import (
    AdmissionDeniedError,
    ClusterError,
    ClusterUnavailableError,
    ConflictError,
    ForbiddenError,
    ResourceMissingError,
)
from tests.doubles.cluster import FakeCluster

SERVER = "https://10.53.0.1:443"
VGPU = Request("update", "devices.harvesterhci.io", "v1beta1", "vgpudevices", None, "n-1")


def status(code: int, message: str, **details: str) -> str:
    return json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": message,
            "reason": "x",
            "details": details,
            "code": code,
        }
    )


# -- HTTP errors --------------------------------------------------------------------------------


def test_forbidden_names_verb_and_resource_with_the_server_message() -> None:
    req = Request(
        "update", "devices.harvesterhci.io", "v1beta1", "vgpudevices", None, "n-1", "status"
    )
    said = 'vgpudevices.devices.harvesterhci.io "n-1" is forbidden: User "sa" cannot update'
    err = from_api_exception(403, "Forbidden", status(403, said), request=req, server=SERVER)
    assert isinstance(err, ForbiddenError)
    assert err.message == (
        f"RBAC denies update on vgpudevices.devices.harvesterhci.io/status ({said})"
    )


@pytest.mark.parametrize("code", [400, 403, 422])
def test_a_webhook_denial_is_quoted_whatever_its_code(code: int) -> None:
    # k8s.io/apiserver's ToStatusErr: the webhook's own code (400 when it gives none) and
    # 'admission webhook "<name>" denied the request: <why>'. Not RBAC's fault, nor a schema's.
    req = Request("patch", "devices.harvesterhci.io", "v1beta1", "vgpudevices", None, "n-1")
    said = (
        'admission webhook "validator.harvesterhci.io" denied the request: device n-1 is in '
        "use with VM win11 in namespace default"
    )
    err = from_api_exception(code, "Bad Request", status(code, said), request=req, server=SERVER)
    assert isinstance(err, AdmissionDeniedError)
    assert err.message.endswith(f"was refused: {said}")


def test_forbidden_in_a_namespace_says_so() -> None:
    req = Request("list", "", "v1", "pods", "default")
    err = from_api_exception(403, "Forbidden", None, request=req, server=SERVER)
    assert err.message == "RBAC denies list on pods in namespace default (Forbidden)"


def test_missing_crd_says_what_to_install() -> None:
    req = Request("list", "devices.harvesterhci.io", "v1beta1", "vgpudevices")
    err = from_api_exception(404, "Not Found", "404 page not found", request=req, server=SERVER)
    assert isinstance(err, ResourceMissingError)
    assert err.message == (
        "the API server does not serve vgpudevices.devices.harvesterhci.io/v1beta1: "
        "are the CRDs installed? kubectl apply -k deploy/"
    )
    kv = Request("list", "kubevirt.io", "v1", "kubevirts")
    assert from_api_exception(404, None, None, request=kv, server=SERVER).message == (
        "the API server does not serve kubevirts.kubevirt.io/v1: is KubeVirt installed?"
    )
    summaries = Request("list", "vgpu.reconciler.dev", "v1alpha1", "vgpunodestates")
    assert from_api_exception(404, None, None, request=summaries, server=SERVER).message == (
        "the API server does not serve vgpunodestates.vgpu.reconciler.dev/v1alpha1: "
        "is vgpuctl's VGPUNodeState CRD installed? kubectl apply -k deploy/"
    )


def test_conflict_and_unavailable_and_others() -> None:
    conflict = from_api_exception(
        409, "Conflict", status(409, "the object has been modified"), request=VGPU, server=SERVER
    )
    assert isinstance(conflict, ConflictError)
    assert conflict.transient
    assert conflict.message == (
        "vgpudevices/n-1 changed since it was read (409 Conflict): the object has been modified"
    )
    down = from_api_exception(503, "Service Unavailable", "", request=VGPU, server=SERVER)
    assert isinstance(down, ClusterUnavailableError)
    assert down.transient
    assert down.message == (
        f"the Kubernetes API server at {SERVER} answered 503 Service Unavailable to "
        "update vgpudevices/n-1: Service Unavailable"
    )
    invalid = from_api_exception(
        422,
        "Unprocessable Entity",
        status(422, 'spec.enabled: Invalid value: "x"\nmore'),
        request=VGPU,
        server=SERVER,
    )
    assert type(invalid) is ClusterError
    assert invalid.message == (
        "the API server refused update vgpudevices/n-1 (422 Unprocessable Entity): "
        'spec.enabled: Invalid value: "x" more'
    )
    auth = from_api_exception(401, "Unauthorized", None, request=VGPU, server=SERVER)
    assert "rejected our credentials (401 Unauthorized)" in auth.message


def test_tls_failure_is_one_permanent_line() -> None:
    reason = "SSLError\n[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed (_ssl.c:1006)"
    err = from_api_exception(0, reason, None, request=VGPU, server=SERVER)
    assert type(err) is ClusterError
    assert not err.transient
    assert err.message == (
        f"TLS handshake with the Kubernetes API server at {SERVER} failed: "
        "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed (_ssl.c:1006)"
    )


def test_long_server_messages_are_cut() -> None:
    err = from_api_exception(500, "x", "<html>" + "a" * 1000, request=VGPU, server=SERVER)
    assert len(err.message) < 500
    assert err.message.endswith("…")


@pytest.mark.parametrize(
    "body", ["[" * 200_000, '{"kind": "Status", "message": "' + "m" * (1 << 20) + '"}']
)
def test_an_error_body_too_deep_or_too_long_is_quoted_as_text_not_decoded(body: str) -> None:
    # A body the JSON decoder could not take (issue 28): one line, cut, never an internal error.
    err = from_api_exception(500, "x", body, request=VGPU, server=SERVER)
    assert len(err.message) < 500
    assert err.message.endswith("…")


@pytest.mark.parametrize(
    ("body", "missing_object"),
    [
        (status(404, 'vgpudevices "x" not found', name="x", kind="vgpudevices"), True),
        (status(404, "the server could not find the requested resource"), False),
        ("404 page not found", False),
        (None, False),
    ],
)
def test_object_missing_versus_resource_missing(body: str | None, missing_object: bool) -> None:
    assert is_object_not_found(body) is missing_object


# -- no answer ----------------------------------------------------------------------------------


def test_transport_errors_name_the_server_and_the_reason() -> None:
    import urllib3
    from urllib3.exceptions import MaxRetryError, NewConnectionError, ReadTimeoutError

    pool = urllib3.HTTPConnectionPool("10.53.0.1", 443)
    conn = urllib3.connection.HTTPConnection("10.53.0.1", 443)
    try:
        raise NewConnectionError(conn, "Failed to establish a new connection") from (
            ConnectionRefusedError(111, "Connection refused")
        )
    except NewConnectionError as e:
        refused = MaxRetryError(pool, "/api", e)
    err = from_transport_error(refused, server=SERVER, timeout=10)
    assert isinstance(err, ClusterUnavailableError)
    assert err.message == (
        f"cannot reach the Kubernetes API server at {SERVER}: connection refused"
    )
    slow = ReadTimeoutError(pool, "/api", "read timed out")
    assert from_transport_error(slow, server=SERVER, timeout=2.5).message.endswith(
        "no answer within 2.5 s"
    )


# -- connect ------------------------------------------------------------------------------------


def test_no_cluster_configured() -> None:
    with pytest.raises(ClusterError) as err:
        connect(None, environ={})
    assert err.value.message == (
        "no cluster configured: pass --kubeconfig, or run in a pod "
        "(KUBERNETES_SERVICE_HOST is not set)"
    )


def test_kubeconfig_missing(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match=f"^kubeconfig {tmp_path}/nope: no such file$"):
        connect(tmp_path / "nope")


@pytest.mark.parametrize(
    "text",
    [
        "clusters: [unterminated",  # not YAML
        "just a string",  # YAML, not a mapping
        "apiVersion: v1\nkind: Config\ncurrent-context: nowhere\n",  # no such context
        '{"apiVersion": "v1", "clusters": 3, "contexts": [], "current-context": "x"}',
    ],
)
def test_bad_kubeconfig_names_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "config"
    path.write_text(text)
    with pytest.raises(ClusterError) as err:
        connect(path)
    assert err.value.message.startswith(f"kubeconfig {path}: ")
    assert "\n" not in err.value.message


def test_kubeconfig_builds_a_client_of_its_own(tmp_path: Path) -> None:
    from kubernetes.client import Configuration

    path = tmp_path / "config"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "clusters": [{"name": "c", "cluster": {"server": "https://10.9.8.7:6443"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    before = Configuration.get_default_copy().host
    api = connect(path, timeout=3)
    assert isinstance(api, KubernetesApi)
    assert api.server == "https://10.9.8.7:6443"
    assert api.timeout == 3
    # The process-wide default configuration is not touched.
    assert Configuration.get_default_copy().host == before


def test_in_cluster_without_a_service_account(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.53.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(ClusterError, match=r"^cannot use the pod's service account: "):
        connect(None)  # the token file under /var/run/secrets does not exist here


def test_in_cluster_and_kubeconfig_together_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="either a kubeconfig or the in-cluster"):
        connect(tmp_path / "config", in_cluster=True)


def test_importing_the_adapter_does_not_load_the_client() -> None:
    code = "import sys, reconciler.kube; print('kubernetes' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


# -- events -------------------------------------------------------------------------------------


def recorder(api: FakeCluster) -> EventRecorder:
    return EventRecorder(
        api,  # type: ignore[arg-type]
        node="harvester-kgd9c",
        clock=lambda: 1_700_000_000.0,
        unique=lambda: 0x17A2B3C4D5E6F,
    )


def test_event_body_as_client_go_records_it() -> None:
    api = FakeCluster()
    recorder(api).event(
        "VGPUDevice",
        "harvester-kgd9c-000008004",
        reason="VGPUCreated",
        message="created NVIDIA A2-4Q u-1",
        uid="uid-7",
    )
    (write,) = api.writes
    assert (write.verb, write.group, write.version, write.plural) == ("create", "", "v1", "events")
    assert write.namespace == "default"
    assert write.body == {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "harvester-kgd9c-000008004.17a2b3c4d5e6f", "namespace": "default"},
        "involvedObject": {
            "apiVersion": "devices.harvesterhci.io/v1beta1",
            "kind": "VGPUDevice",
            "name": "harvester-kgd9c-000008004",
            "uid": "uid-7",
        },
        "reason": "VGPUCreated",
        "message": "created NVIDIA A2-4Q u-1",
        "type": "Normal",
        "source": {"component": "vgpuctl", "host": "harvester-kgd9c"},
        "reportingComponent": "vgpuctl",
        "reportingInstance": "harvester-kgd9c",
        "firstTimestamp": "2023-11-14T22:13:20Z",
        "lastTimestamp": "2023-11-14T22:13:20Z",
        "count": 1,
    }


def test_event_failures_are_logged_and_stop_trying(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = FakeCluster()
    api.fail["events"] = ForbiddenError("RBAC denies create on events in namespace default (…)")
    events = recorder(api)
    events.event("VGPUDevice", "a", reason="VGPUCreated", message="m")
    events.event("VGPUDevice", "b", reason="VGPUCreated", message="m", type="Warning")
    assert events.disabled == "RBAC denies create on events in namespace default (…)"
    assert (events.recorded, events.dropped) == (0, 2)
    assert "could not record event VGPUCreated on VGPUDevice a: RBAC denies" in caplog.text
    assert caplog.text.count("could not record") == 1


def test_a_name_clash_does_not_stop_events() -> None:
    api = FakeCluster()
    api.fail["events"] = ConflictError("events/default/a.1 already exists")
    events = recorder(api)
    events.event("VGPUDevice", "a", reason="r", message="m")
    assert events.disabled is None


def test_event_type_is_checked() -> None:
    with pytest.raises(ValueError, match="Normal or Warning"):
        recorder(FakeCluster()).event("VGPUDevice", "a", reason="r", message="m", type="Error")


# -- a list page's continue token, read before the page is decoded -----------------------------
# Bodies as k8s.io/apimachinery pkg/runtime/serializer/json/collections.go writes them: a
# built-in kind's list in struct order, a custom resource's (unstructured) list keys sorted.

CONTINUE = "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTIzLCJzdGFydCI6Im4tMDAwMDA4MDA0XHUwMDAwIn0"
NODES_PAGE = (
    b'{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"123",'
    b'"continue":"' + CONTINUE.encode() + b'","remainingItemCount":7},"items":['
    b'{"metadata":{"name":"n-1","labels":{"a":"b"}},"spec":{},"status":{}}]}\n'
)
VGPUS_PAGE = (
    b'{"apiVersion":"devices.harvesterhci.io/v1beta1","items":[{"apiVersion":'
    b'"devices.harvesterhci.io/v1beta1","kind":"VGPUDevice","metadata":{"name":"n-000008004",'
    b'"resourceVersion":"9"},"spec":{"address":"0000:08:00.4"}}],"kind":"VGPUDeviceList",'
    b'"metadata":{"continue":"' + CONTINUE.encode() + b'","remainingItemCount":7,'
    b'"resourceVersion":"123"}}\n'
)


LAST_PAGE = VGPUS_PAGE.replace(b'"continue":"' + CONTINUE.encode() + b'",', b"")


@pytest.mark.parametrize("body", [NODES_PAGE, VGPUS_PAGE], ids=["built-in", "custom"])
def test_the_continue_token_is_read_where_the_server_writes_it(body: bytes) -> None:
    from reconciler.kube.api import continue_hint

    assert continue_hint(body) == CONTINUE
    assert json.loads(body)["metadata"]["continue"] == CONTINUE  # the bodies are what they say


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(
            VGPUS_PAGE.replace(b'"continue":"' + CONTINUE.encode() + b'",', b""), id="last"
        ),
        pytest.param(b'{"kind":"List","items":[]}', id="no-metadata"),
        pytest.param(b'{"metadata":{"continue":', id="torn"),
        pytest.param(b'{"metadata":{"continue":7}}', id="not-a-string"),
        pytest.param(b'{"metadata":["continue"]}', id="not-an-object"),
        pytest.param(b"", id="empty"),
        pytest.param(
            b'{"metadata":{"continue":"' + b"x" * 5000 + b'"},"items":[]}', id="beyond-the-window"
        ),
    ],
)
def test_no_continue_token_is_guessed_where_none_is_seen(body: bytes) -> None:
    from reconciler.kube.api import continue_hint

    assert continue_hint(body) == ""


def test_an_item_metadata_met_first_is_passed_over() -> None:
    """A custom resource's page begins with its first item: that item's metadata is found
    first, holds no token, and the list's own, last, is read."""
    from reconciler.kube.api import continue_hint

    flat = VGPUS_PAGE.replace(b'"metadata":{"name":"n-000008004",', b'"metadata":{')
    assert flat.index(b'"metadata":{"resourceVersion":"9"}') < 200
    assert continue_hint(flat) == CONTINUE
