"""An in-process Kubernetes API server for tests: the unmodified ``kubernetes`` client talks to it.

It is also what ``vgpuctl sim cluster`` serves (``fleet.py``), so it lives in the package and
needs nothing the package does not depend on (the ``kubernetes`` client least of all: it is the
server; ``cel-python`` only for ValidatingAdmissionPolicies, which a simulated cluster has
none of). The tests import it as ``tests.doubles.emulator`` (an alias of this module).

The kube adapter, cluster observer and cluster executor are tested against this emulator, so it
enforces what real API servers do and our code relies on: a global, monotonically increasing
resourceVersion; 201 on create (409 AlreadyExists on a duplicate); optimistic concurrency on PUT
(409 Conflict for a stale resourceVersion, 422 Invalid for a missing one on custom resources);
the status subresource split from the main resource (status dropped on create and ignored on
PUT of a custom resource, only status taken on PUT of ``/status``); generation bumped only when
the spec changes; label and field selectors; watches resumable from a resourceVersion with a
bounded history (410 Gone when too old; a CRD installed again with another spec rebuilds its
resource's watch cache: open watches end, older versions are 410, as the real API server does),
bookmarks when and as the real watch cache sends them (``_watch_events``); 404 NotFound for a
resource whose CRD is not installed.
A CRD installed with its ``openAPIV3Schema`` prunes and validates every write to its resource as
the API server does (``structural.py``): a field the schema does not declare is dropped at any
depth, a wrong type, a missing required field, a value outside an enum or a pattern is 422
Invalid naming each field (``spec.address: Invalid value: ...``; each a ``details.causes``
entry), and nothing is written.

Patches: JSON merge patch, and JSON patch (RFC 6902) with the API server's semantics
(``jsonpatch.py``: evanphx/json-patch v4; an operation that does not apply, a failed ``test``
included, is 422 with the server's generic message and nothing is written).

Callers: a bearer token names the user (``kubeconfig(path, user=UserInfo(...))``); the default
token is ``DEFAULT_USER`` without extra. Admission: ValidatingAdmissionPolicies and their
bindings stored in the emulator (``seed`` them) judge every create, update, patch and delete
(``admission.py``), with that user in ``request.userInfo``.

Validating webhooks: ``register_webhook(name, judge, rules=[...])`` installs a Python callable
as one webhook of a ValidatingWebhookConfiguration (``rules`` as its ``RuleWithOperations``:
apiGroups, apiVersions, operations, ``resources`` with ``plural/subresource``; a status write
matches ``vgpudevices/status`` only, not ``vgpudevices``). It runs after the policies, as the
API server's ValidatingAdmissionWebhook plugin does after ValidatingAdmissionPolicy, with the
request's ``Attributes`` (``object`` null on DELETE, ``old_object`` null on CREATE). It answers
None to admit or a ``WebhookDenial`` (its AdmissionResponse's ``result`` Status: message, code,
reason), and the client gets what k8s.io/apiserver v0.34's ``webhookerrors.ToStatusErr``
(pkg/admission/plugin/webhook/errors/statuserror.go) makes of it: the webhook's code (below
400: 400), its reason as given, the message ``admission webhook "<name>" denied the request:
<message>`` (``… denied the request without explanation`` when it gave none), and nothing is
written. v0.37.2's ``ToStatusErr``, the real tier's kube-apiserver, is the same (no
``<resource> "<name>" is forbidden: `` prefix, no 403 default): a denial's code, reason, status
and message agree field for field with the real server's
(tests/integration/test_real_delegate.py ``test_the_webhooks_denial_as_the_server_words_it``,
a pcidevices webhook served over HTTPS to the real server). A judge raising
``WebhookUnavailable`` is a webhook the API server cannot call: ``failure_policy="Ignore"``
admits, ``"Fail"`` (the default) answers 500 ``Internal error occurred: failed calling webhook
"<name>": <why>``. Judges run under the emulator's lock: they read other objects through
``get_object``/``objects`` (their informer cache), never over HTTP.

Test hooks: every request is recorded as RBAC sees it (``requests``; JSON patch bodies also in
``patches``), requests can be denied (403 with the real message; ``authorize_with`` applies
an RBAC model per user), failed (``fail_next``), the server stopped and restarted on the same
port (an outage), and a hook can interleave a concurrent change before each write (409 races).

Lists in pages (``limit`` and ``continue``, as etcd-backed API servers serve them: every page of
one list at the first page's resourceVersion, ``remainingItemCount`` unless a label or field
selector filters, 410 Expired once that
version is compacted; a custom resource's last page, or its list not in pages, with
``"continue": ""``).

Server-side printing: a get or list of a custom resource that asks for a Table (kubectl get
does) is answered with one built from its CRD's printer columns (``tables.py``); built-in
resources answer with the object, which kubectl prints with its own default columns.

Not emulated: finalizers and graceful deletion, strategic-merge patches (415), managedFields,
mutating admission, dry runs, schema defaults, CEL validation rules and ``oneOf``/``anyOf`` (a CRD
using a keyword ``structural.py`` does not model is refused when installed).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import re
import secrets
import socket
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

from reconciler.model.record import record, replace
from reconciler.sim.cluster import jsonpatch, structural, tables
from reconciler.sim.cluster.admission import Attributes, UserInfo, admit, rule_matches

JsonObject = dict[str, Any]

DEFAULT_USER = "system:serviceaccount:vgpuctl-system:vgpuctl"
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_COMMON_FIELDS = ("metadata.name", "metadata.namespace")
_POD_FIELDS = (
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
)
_EVENT_FIELDS = (
    *(
        f"involvedObject.{f}"
        for f in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
    ),
    "reason",
    "reportingComponent",
    "source",
    "type",
)
_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
DEFAULT_TOKEN = "emulator-token"  # noqa: S105 (a test fixture's bearer token)
#: What the API server answers a JSON patch that does not apply (patch.go, applyJSPatch:
#: NewGenericServerResponse(422, ...) keeps none of the library's own message).
PATCH_NOT_APPLIED = "the server rejected our request due to an error in our request"
_ADMISSION = "admissionregistration.k8s.io"
_MISSING_RESOURCE = "the server could not find the requested resource"
#: The API server's answer to a continue token whose list version was compacted.
_CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter, or use the continue token in this "
    "response to retrieve the remainder of the results. Continuing with the provided token "
    "results in an inconsistent list - objects that were created, modified, or deleted between "
    "the time the first chunk was returned and now may show up in the list."
)
#: How many encoded objects the emulator keeps at most.
_ENCODINGS = 2_000_000


class _Page(dict[str, Any]):
    """A page of a list, with its JSON already made of the objects' cached encodings."""

    encoded: bytes = b""


#: A paged list's collection: (group, plural, resourceVersion, selection).
_SnapshotKey = tuple[str, str, int, "_Selection"]
#: How many paged lists the emulator keeps a snapshot of at once.
_SNAPSHOTS = 64


def _list_body(resource: Resource, metadata: JsonObject, items: bytes) -> bytes:
    """A list page's JSON as the API server writes it (k8s.io/apimachinery
    ``pkg/runtime/serializer/json/collections.go``): a built-in kind's list in its Go struct's
    order (``kind``, ``apiVersion``, ``metadata``, ``items``); a custom resource's list, an
    unstructured map, with its keys sorted (``apiVersion``, ``items``, ``kind``, ``metadata``,
    the list's metadata last and its own keys sorted)."""
    kind = json.dumps(f"{resource.kind}List").encode()
    api_version = json.dumps(resource.api_version).encode()
    if resource.built_in:
        meta = json.dumps(metadata).encode()
        return b'{"kind":%s,"apiVersion":%s,"metadata":%s,"items":[%s]}' % (
            kind, api_version, meta, items,
        )  # fmt: skip
    meta = json.dumps(metadata, sort_keys=True).encode()
    return b'{"apiVersion":%s,"items":[%s],"kind":%s,"metadata":%s}' % (
        api_version, items, kind, meta,
    )  # fmt: skip


def _next_bookmark(now: float, interval: float, deadline: float) -> float | None:
    """When a watch's next bookmark is due: ``interval`` from ``now``, or 2 s before the
    watch's deadline if that is sooner; None once that is past (k8s.io/apiserver v0.37
    pkg/storage/cacher/cache_watcher.go ``nextBookmarkTime``)."""
    due = min(now + interval, deadline - 2.0)
    return None if due <= now else due


def _continue_token(rv: int, start: int) -> str:
    """An opaque continue token (the API server's encodes a version and a key, base64)."""
    doc = json.dumps({"rv": rv, "start": start}, separators=(",", ":"))
    return base64.urlsafe_b64encode(doc.encode()).decode()


class Call(NamedTuple):
    """One request as recorded with its sender and query string."""

    request: Request
    user: str
    query: dict[str, str]


class Request(NamedTuple):
    """One API request as RBAC authorises it (a tuple, so tests may compare with plain tuples)."""

    verb: str  # get list watch create update patch delete deletecollection
    group: str  # "" for the core group
    resource: str  # plural
    subresource: str | None
    namespace: str | None
    name: str | None


@record(frozen=True)
class Resource:
    """A served resource: what a CRD (or the core API) declares."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    status_subresource: bool
    field_selectors: frozenset[str] = frozenset(_COMMON_FIELDS)
    #: Served from Go types (built in), not from a CRD: a list is written in its struct's
    #: field order; a custom resource's list is a map, written with its keys sorted.
    built_in: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """The group-qualified name used in error messages: ``vgpudevices.devices.example.io``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def custom(self) -> bool:
        return self.group != ""


class ApiError(Exception):
    """A request the API server answers with a ``Status`` failure body."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str | None = None,
        details: JsonObject | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or _REASONS.get(code, "Unknown")
        self.details = details

    def status(self) -> JsonObject:
        body: JsonObject = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _webhook_status_error(webhook: str, denial: WebhookDenial) -> ApiError:
    """k8s.io/apiserver v0.34 ``webhookerrors.ToStatusErr``: the webhook's Status, its code
    raised to 400 at least, its message prefixed with who denied."""
    denied_by = f'admission webhook "{webhook}" denied the request'
    if denial.message:
        message = f"{denied_by}: {denial.message}"
    elif denial.reason:
        message = f"{denied_by}: {denial.reason}"
    else:
        message = f"{denied_by} without explanation"
    code = max(denial.code, 400)
    return _WebhookError(code, message, reason=denial.reason)


class _WebhookError(ApiError):
    """A webhook's denial: its Status carries the webhook's reason as given (empty: none)."""

    def status(self) -> JsonObject:
        body = super().status()
        if not self.given_reason:
            body.pop("reason")
        return body

    def __init__(self, code: int, message: str, *, reason: str) -> None:
        super().__init__(code, message, reason=reason or None)
        self.given_reason = reason


@record(frozen=True)
class WebhookDenial:
    """A validating webhook's refusal: the ``result`` Status of its AdmissionResponse."""

    message: str = ""
    code: int = 0
    reason: str = ""


class WebhookUnavailable(Exception):
    """Raised by a webhook judge: the API server could not call the webhook (its failure
    policy decides)."""


#: A validating webhook as the emulator runs it: the request in, a denial or None out.
WebhookJudge = Callable[[Attributes], "WebhookDenial | None"]


@record(frozen=True)
class _Webhook:
    name: str
    judge: WebhookJudge
    rules: tuple[Mapping[str, Any], ...]
    failure_policy: str


@record(frozen=True)
class _Change:
    """One write, kept in the bounded history that watches resume from."""

    rv: int
    type: str  # ADDED MODIFIED DELETED
    store: tuple[str, str]  # (group, plural)
    obj: JsonObject
    old: JsonObject | None


# --- selectors ---------------------------------------------------------------------------------

_KEY = r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_NOT_EXISTS = re.compile(rf"!\s*({_KEY})")
_SET = re.compile(rf"({_KEY})\s+(in|notin)\s*\((.*)\)")
_EQUALITY = re.compile(rf"({_KEY})\s*(==|=|!=)\s*({_VALUE})")
_EXISTS = re.compile(_KEY)
_FIELD_TERM = re.compile(r"([A-Za-z][A-Za-z.]*)\s*(==|=|!=)\s*(.*)")


@record(frozen=True)
class LabelRequirement:
    key: str
    op: str  # in notin exists !exists (equality is "in" with one value, "!=" is "notin")
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op == "in":
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside parentheses (``a in (x,y),b`` has two requirements)."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def parse_label_selector(text: str) -> tuple[LabelRequirement, ...]:
    """Parse a label selector as the API server does; raise 400 BadRequest when malformed."""
    if not text.strip():
        return ()
    requirements = []
    for raw in _split_top_level(text):
        part = raw.strip()
        if match := _NOT_EXISTS.fullmatch(part):
            requirements.append(LabelRequirement(match[1], "!exists"))
        elif match := _SET.fullmatch(part):
            values = [v.strip() for v in match[3].split(",")]
            if not all(re.fullmatch(_VALUE, v) for v in values):
                raise ApiError(400, f"unable to parse requirement: invalid values in {part!r}")
            requirements.append(LabelRequirement(match[1], match[2], frozenset(values)))
        elif match := _EQUALITY.fullmatch(part):
            op = "notin" if match[2] == "!=" else "in"
            requirements.append(LabelRequirement(match[1], op, frozenset({match[3]})))
        elif _EXISTS.fullmatch(part):
            requirements.append(LabelRequirement(part, "exists"))
        else:
            raise ApiError(400, f"unable to parse requirement: {part!r}")
    return tuple(requirements)


def parse_field_selector(text: str, resource: Resource) -> tuple[tuple[str, bool, str], ...]:
    """Parse ``field=value,field!=value``; a field the resource does not index is 400."""
    if not text.strip():
        return ()
    terms = []
    for raw in text.split(","):
        match = _FIELD_TERM.fullmatch(raw.strip())
        if not match:
            raise ApiError(400, f"invalid field selector: {raw!r}")
        field, op, value = match[1], match[2], match[3]
        if field not in resource.field_selectors:
            raise ApiError(400, f'field label not supported: {field} ("{resource.qualified}")')
        terms.append((field, op != "!=", value))
    return tuple(terms)


def _field_value(obj: JsonObject, field: str) -> str:
    value: Any = obj
    for part in field.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


@record(frozen=True)
class _Selection:
    namespace: str | None
    labels: tuple[LabelRequirement, ...]
    fields: tuple[tuple[str, bool, str], ...]

    @property
    def everything(self) -> bool:
        """No namespace, label or field to select by: every object matches."""
        return self.namespace is None and not self.labels and not self.fields

    def matches(self, obj: JsonObject) -> bool:
        meta = obj.get("metadata", {})
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        labels = meta.get("labels") or {}
        if not all(r.matches(labels) for r in self.labels):
            return False
        return all((_field_value(obj, f) == v) == eq for f, eq, v in self.fields)


# --- object helpers ----------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _spec_part(obj: JsonObject, resource: Resource) -> JsonObject:
    """What a generation counts: everything but metadata (and status when it is a subresource)."""
    skip = {"metadata", "apiVersion", "kind"} | (
        {"status"} if resource.status_subresource else set()
    )
    return {k: v for k, v in obj.items() if k not in skip}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _core_resources() -> list[Resource]:
    def built_in(  # noqa: PLR0917 (a table row)
        group: str,
        plural: str,
        kind: str,
        namespaced: bool,
        status: bool,
        extra: Sequence[str] = (),
    ) -> Resource:
        fields = frozenset((*_COMMON_FIELDS, *extra))
        return Resource(group, "v1", plural, kind, namespaced, status, fields, built_in=True)

    return [
        built_in("", "namespaces", "Namespace", False, True, ("status.phase",)),
        built_in("", "nodes", "Node", False, True, ("spec.unschedulable",)),
        built_in("", "pods", "Pod", True, True, _POD_FIELDS),
        built_in("", "events", "Event", True, False, _EVENT_FIELDS),
        built_in("", "configmaps", "ConfigMap", True, False),
        # Leader election (delegate mode's watch): built in since Kubernetes 1.14, no status.
        built_in("coordination.k8s.io", "leases", "Lease", True, False),
        # Built in everywhere (no CRD): what vgpuctl reads to tell whether Harvester's
        # pcidevices-controller runs (reconciler/observe/harvester.py).
        built_in("apps", "daemonsets", "DaemonSet", True, True),
        built_in(
            _ADMISSION,
            "validatingwebhookconfigurations",
            "ValidatingWebhookConfiguration",
            False,
            False,
        ),
        built_in(
            _ADMISSION, "validatingadmissionpolicies", "ValidatingAdmissionPolicy", False, True
        ),
        built_in(
            _ADMISSION,
            "validatingadmissionpolicybindings",
            "ValidatingAdmissionPolicyBinding",
            False,
            False,
        ),
    ]


# --- the server ---------------------------------------------------------------------------------


@record(frozen=True)
class _Target:
    """A parsed resource URL."""

    group: str
    version: str
    plural: str
    namespace: str | None
    name: str | None
    subresource: str | None


def _parse_path(path: str) -> _Target | None:
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    # /namespaces/{ns}/{plural}... unless it addresses a namespace itself (or its subresource)
    if (
        rest[0] == "namespaces"
        and len(rest) >= 3
        and not (group == "" and len(rest) == 3 and rest[2] in ("status", "finalize"))
    ):
        namespace, rest = rest[1], rest[2:]
    if len(rest) > 3:
        return None
    plural, name, subresource = [*rest, None, None][:3]
    if plural is None:
        return None
    return _Target(group, version, plural, namespace, name, subresource)


class ApiServerEmulator:
    """A Kubernetes API server on 127.0.0.1 (a free port) serving JSON over plain HTTP/1.1.

    Use as a context manager; ``kubeconfig(path)`` writes a kubeconfig for the real client.
    """

    def __init__(
        self, *, user: str = DEFAULT_USER, history: int = 1000, record: bool = True
    ) -> None:
        self.user = user
        #: Whether requests are kept (``requests``, ``calls``, ``patches``): a test's hooks. A
        #: long-running ``vgpuctl sim cluster`` keeps none, or its memory would grow with each.
        self.record = record
        self.requests: list[Request] = []
        #: Every request with who sent it and its query (label selectors, limits, versions):
        #: what a recorded load is judged by.
        self.calls: list[Call] = []
        #: The operations of every JSON patch received, with its request.
        self.patches: list[tuple[Request, list[JsonObject]]] = []
        self._users: dict[str, UserInfo] = {DEFAULT_TOKEN: UserInfo(user)}
        self._anonymous = True  # a request without a token is the default user's
        self._cond = threading.Condition(threading.RLock())
        self._resources: dict[tuple[str, str, str], Resource] = {}
        #: A CRD's openAPIV3Schema, by the resource it serves: writes are pruned and validated.
        self._schemas: dict[Resource, JsonObject] = {}
        #: Each CRD version's additionalPrinterColumns (Tables for kubectl get).
        self._printer_columns: dict[Resource, list[JsonObject]] = {}
        self._store: dict[tuple[str, str], dict[tuple[str, str], JsonObject]] = {}
        self._rv = 0
        self._history: deque[_Change] = deque(maxlen=history)
        self._floor = 0  # watches from a resourceVersion below this get 410 Gone
        self._compacted = 0  # the part of that history compaction dropped (:meth:`compact`)
        #: How often a watch that asked for bookmarks gets one while nothing else happens (the
        #: API server's watch cache sends one about every minute).
        self.bookmark_interval = 60.0
        #: Each resource's watch cache (by store): the version it was (re)built at (a watch from
        #: an older one is 410), how many times it was rebuilt (its open watches end), the
        #: version of its last event (what its bookmarks carry). :meth:`_rebuild_watch_cache`.
        self._cache_floor: dict[tuple[str, str], int] = {}
        self._cache_epoch: dict[tuple[str, str], int] = {}
        self._cache_ended: dict[tuple[str, str], int] = {}  # watches of older epochs end
        #: How long a rebuilt watch cache's old watches go on (the real API server's tearDown
        #: waits a second before it destroys the old storage).
        self.crd_teardown_s = 1.0
        self._cache_rv: dict[tuple[str, str], int] = {}
        #: The spec of each CRD installed, by name: installed again with another, its
        #: resources' watch caches are rebuilt.
        self._crd_specs: dict[str, JsonObject] = {}
        #: Stored objects as JSON, by identity (:meth:`_encoded`).
        self._encodings: dict[int, tuple[JsonObject, bytes]] = {}
        #: Paged lists in progress: the collection at a version, by (group, plural, version,
        #: selection), so every page of one list is the same collection (bounded).
        self._snapshots: dict[
            tuple[str, str, int, _Selection], tuple[list[Any], dict[Any, Any]]
        ] = {}
        self._denied: list[tuple[str, str, str, str | None]] = []
        self._failures: deque[int] = deque()
        self._before_write: Callable[[Request], None] | None = None
        self._authorizer: Callable[[Request, UserInfo], bool] | None = None
        self._webhooks: list[_Webhook] = []
        self._server: _HttpServer | None = None
        self._thread: threading.Thread | None = None
        self._port = 0
        self._epoch = 0  # bumped by stop(): open watches of an older epoch end
        for resource in _core_resources():
            self._add_resource(resource)
        for name in DEFAULT_NAMESPACES:
            self.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    # --- lifecycle ---

    def __enter__(self) -> ApiServerEmulator:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if not self._port:
            raise RuntimeError("the emulator has not been started")
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> None:
        """Serve (again): the first start picks a free port, later ones reuse it."""
        if self._server is not None:
            return
        server = _HttpServer(("127.0.0.1", self._port), self)
        self._port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True, name="kube-emu")
        self._thread.start()

    def stop(self) -> None:
        """Stop serving (state is kept): new connections are refused, open ones are cut."""
        server, self._server = self._server, None
        if server is None:
            return
        with self._cond:
            self._epoch += 1
            self._cond.notify_all()
        server.shutdown()
        server.server_close()
        server.cut_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def kubeconfig(self, path: Path, *, user: UserInfo | None = None) -> Path:
        """Write a kubeconfig for this server (JSON is YAML) and return its path; with
        ``user``, its token authenticates as that user (else as ``DEFAULT_USER``)."""
        token = DEFAULT_TOKEN
        if user is not None:
            with self._cond:
                token = f"token-{len(self._users)}-{secrets.token_hex(16)}"
                self._users[token] = user
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "emulator", "user": {"token": token}}],
            "contexts": [
                {"name": "emulator", "context": {"cluster": "emulator", "user": "emulator"}}
            ],
            "current-context": "emulator",
        }
        path = path / "kubeconfig" if path.is_dir() else path
        path.write_text(json.dumps(config, indent=2))
        return path

    # --- registration and direct access (no HTTP, not recorded) ---

    def register(  # noqa: PLR0917 (positional, as agreed in contracts-cluster.md)
        self,
        group: str,
        version: str,
        plural: str,
        kind: str,
        namespaced: bool,
        status_subresource: bool,
        *,
        field_selectors: Sequence[str] = (),
    ) -> Resource:
        """Serve a resource, as installing its CRD does."""
        fields = frozenset((*_COMMON_FIELDS, *field_selectors))
        resource = Resource(group, version, plural, kind, namespaced, status_subresource, fields)
        self._add_resource(resource)
        return resource

    def register_crd(self, crd: Mapping[str, Any]) -> list[Resource]:
        """Serve every served version of a CustomResourceDefinition manifest; its schema then
        prunes and validates every write (``structural.py``).

        A CRD installed again with another spec (an update, as Harvester's pcidevices-controller
        re-applies its CRDs at every start) rebuilds its resource's watch cache, as the real
        API server does: k8s.io/apiextensions-apiserver pkg/apiserver/customresource_handler.go
        ``updateCustomResourceDefinition`` drops the resource's storage when the spec changed
        and ``tearDown`` destroys it (its cacher stopped: every open watch of the resource ends,
        a clean end of stream); the new storage's cacher lists at the current version, so a
        watch from an older one is 410 (:meth:`_rebuild_watch_cache`)."""
        spec = crd["spec"]
        name = str((crd.get("metadata") or {}).get("name") or "")
        name = name or f"{spec['names']['plural']}.{spec['group']}"
        with self._cond:
            before = self._crd_specs.get(name)
            self._crd_specs[name] = copy.deepcopy(dict(spec))
        served = []
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            resource = self.register(
                spec["group"],
                version["name"],
                spec["names"]["plural"],
                spec["names"]["kind"],
                spec["scope"] == "Namespaced",
                "status" in (version.get("subresources") or {}),
            )
            printed = version.get("additionalPrinterColumns") or []
            tables.columns(printed)  # a column this emulator cannot evaluate: refused here
            with self._cond:
                self._printer_columns[resource] = copy.deepcopy(printed)
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            if schema is not None:
                structural.check_schema(schema)
                self._schemas[resource] = copy.deepcopy(schema)
            served.append(resource)
        if before is not None and before != spec:
            self._rebuild_watch_cache((spec["group"], spec["names"]["plural"]))
        return served

    def _rebuild_watch_cache(self, store: tuple[str, str]) -> None:
        """A resource's watch cache built again, as a CRD update makes the API server do. New
        watches go to the new cache at once; it starts from a list at the current version, so a
        watch from an older version gets ``410 Expired`` ``too old resource version: <rv> (<list
        rv>)`` (k8s.io/apiserver v0.37 pkg/storage/cacher/watch_cache_history.go
        ``GetIntervalLocked``: with no event dropped since the list, the oldest deliverable is
        the list's version + 1, and ``resourceVersion < oldest-1`` is too old). The old
        storage's watches go on delivering events for :attr:`crd_teardown_s` (a second:
        apiextensions-apiserver customresource_handler.go ``tearDown`` sleeps one before it
        destroys the old storage, whose cacher ``Stop`` then terminates every watcher: a clean
        end of stream). A watch that saw an event after the update so resumes without 410.
        Not emulated: the few hundred milliseconds the real new cache answers 429 ``storage is
        (re)initializing`` first.

        The CRD's own update is a write to storage (its resourceVersion is one of the cluster's):
        the new cache lists after it, so every version given out before the update is older."""
        with self._cond:
            self._rv += 1
            self._cache_floor[store] = self._rv
            self._cache_rv[store] = self._rv
            epoch = self._cache_epoch[store] = self._cache_epoch.get(store, 0) + 1

        def tear_down() -> None:
            with self._cond:
                self._cache_ended[store] = max(self._cache_ended.get(store, 0), epoch)
                self._cond.notify_all()

        timer = threading.Timer(self.crd_teardown_s, tear_down)
        timer.daemon = True
        timer.start()

    def serves(self, group: str, version: str, plural: str) -> bool:
        """Whether the resource is served (built in, registered or by an installed CRD)."""
        with self._cond:
            return (group, version, plural) in self._resources

    def seed(self, obj: Mapping[str, Any]) -> JsonObject:
        """Store an object as given (status included), creating or replacing it; returns it stored.

        A namespaced object's namespace is created when missing. Watches see the change.
        """
        body = copy.deepcopy(dict(obj))
        resource = self._resource_of(body)
        meta = body.setdefault("metadata", {})
        with self._cond:
            if resource.namespaced:
                meta.setdefault("namespace", "default")
                if not self._namespace_exists(meta["namespace"]):
                    self.seed(
                        {
                            "apiVersion": "v1",
                            "kind": "Namespace",
                            "metadata": {"name": meta["namespace"]},
                        }
                    )
            key = (meta.get("namespace", ""), meta["name"])
            current = self._bucket(resource).get(key)
            if current is None:
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", _now())
                meta.setdefault("generation", 1)
                return copy.deepcopy(self._write(resource, key, body, None))
            for field in ("uid", "creationTimestamp"):
                meta.setdefault(field, current["metadata"].get(field))
            generation = current["metadata"].get("generation", 1)
            changed = _spec_part(body, resource) != _spec_part(current, resource)
            meta["generation"] = generation + 1 if changed else generation
            return copy.deepcopy(self._write(resource, key, body, current))

    def objects(
        self, group: str, version: str, plural: str, namespace: str | None = None
    ) -> list[JsonObject]:
        """The stored objects of a resource (in one namespace if given), by namespace and name."""
        resource = self._lookup(group, version, plural)
        with self._cond:
            bucket = self._bucket(resource)
            return [
                copy.deepcopy(bucket[key])
                for key in sorted(bucket)
                if namespace is None or key[0] == namespace
            ]

    def get_object(
        self, group: str, version: str, plural: str, name: str, namespace: str | None = None
    ) -> JsonObject | None:
        resource = self._lookup(group, version, plural)
        with self._cond:
            found = self._bucket(resource).get((namespace or "", name))
            return copy.deepcopy(found) if found is not None else None

    def delete_object(
        self, group: str, version: str, plural: str, name: str, namespace: str | None = None
    ) -> None:
        """Delete an object directly (another actor did it); watches see DELETED."""
        resource = self._lookup(group, version, plural)
        with self._cond:
            self._remove(resource, (namespace or "", name))

    def compact(self) -> None:
        """Forget the watch history, as etcd compaction does: older resourceVersions get 410."""
        with self._cond:
            self._history.clear()
            self._floor = self._compacted = self._rv

    @property
    def resource_version(self) -> str:
        with self._cond:
            return str(self._rv)

    # --- fault injection ---

    def deny(self, verb: str, group: str, resource: str, subresource: str | None = None) -> None:
        """Answer matching requests 403 Forbidden, as RBAC does.

        ``subresource=None`` matches the main resource only (RBAC treats ``vgpudevices/status``
        as a separate resource); ``"*"`` matches any verb, resource or subresource.
        """
        with self._cond:
            self._denied.append((verb, group, resource, subresource))

    def allow_all(self) -> None:
        with self._cond:
            self._denied.clear()
            self._authorizer = None

    def authorize_with(self, authorizer: Callable[[Request, UserInfo], bool] | None) -> None:
        """Answer 403, as RBAC does, every request ``authorizer(request, user)`` refuses
        (None: everything allowed again). The tests give it deploy/rbac.yaml's grants."""
        with self._cond:
            self._authorizer = authorizer

    def fail_next(self, n: int = 1, status: int = 500) -> None:
        """Answer the next ``n`` requests (of any kind) with a ``status`` failure."""
        with self._cond:
            self._failures.extend([status] * n)

    def on_before_write(self, hook: Callable[[Request], None] | None) -> None:
        """Call ``hook(request)`` before each create/update/patch/delete is applied (None clears).

        The hook runs outside the emulator's lock, after the request is authorised and parsed and
        before the stored object is read, so a change it makes (``seed``, or a request through a
        client) is what the write then conflicts with.
        """
        self._before_write = hook

    # --- validating webhooks ---

    def register_webhook(
        self,
        name: str,
        judge: WebhookJudge,
        *,
        rules: Sequence[Mapping[str, Any]],
        failure_policy: str = "Fail",
    ) -> None:
        """Install a validating webhook named ``name`` (the ``webhooks[].name`` of its
        configuration, as denials quote it) judging the requests its ``rules`` match; webhooks
        run in the order registered, the first denial wins. Replaces one of the same name."""
        if failure_policy not in ("Fail", "Ignore"):
            raise ValueError(f"failurePolicy {failure_policy!r}: Fail or Ignore")
        hook = _Webhook(name, judge, tuple(copy.deepcopy(list(rules))), failure_policy)
        with self._cond:
            self._webhooks = [w for w in self._webhooks if w.name != name] + [hook]

    def remove_webhook(self, name: str) -> None:
        with self._cond:
            self._webhooks = [w for w in self._webhooks if w.name != name]

    # --- request handling (called by the HTTP handler) ---

    def handle(
        self,
        method: str,
        raw_path: str,
        body: bytes,
        content_type: str,
        authorization: str | None = None,
        *,
        accept: str | None = None,
    ) -> tuple[int, JsonObject] | Iterator[JsonObject]:
        """Answer one request: a (status code, JSON body) pair, or watch events to stream.

        ``authorization`` is the ``Authorization`` header: ``Bearer <token>`` of a known user
        (none at all: the default user), anything else is 401 as the authenticator answers.
        ``accept``: a get or list of a custom resource asking for a ``meta.k8s.io/v1`` Table
        (kubectl's ``Accept``) gets one, its columns the CRD's printer columns (``tables.py``).
        """
        user = self._authenticate(authorization)
        url = urlsplit(raw_path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        target = _parse_path(url.path)
        if target is None:
            with self._cond:
                failure = self._failures.popleft() if self._failures else None
            if failure is not None:
                raise ApiError(failure, "injected failure")
            return self._discovery(url.path)
        request = self._request_of(method, target, query)
        with self._cond:
            if self.record:
                self.requests.append(request)
                self.calls.append(Call(request, user.username, dict(query)))
            failure = self._failures.popleft() if self._failures else None
            denied = any(self._matches_rule(rule, request) for rule in self._denied)
            authorizer = self._authorizer
        if authorizer is not None and not authorizer(request, user):
            denied = True
        if failure is not None:
            raise ApiError(failure, f"Internal error occurred: injected failure ({failure})")
        if denied:
            raise self._forbidden(request, user)
        resource = self._resources.get((target.group, target.version, target.plural))
        if resource is None or (target.namespace is not None and not resource.namespaced):
            raise ApiError(404, _MISSING_RESOURCE, details={})
        if (
            resource.namespaced
            and target.namespace is None
            and request.verb not in ("list", "watch")
        ):
            raise ApiError(404, _MISSING_RESOURCE, details={})  # only lists span namespaces
        if target.subresource is not None and not (
            target.subresource == "status" and resource.status_subresource
        ):
            raise ApiError(404, _MISSING_RESOURCE, details={})
        verb = request.verb
        if verb in ("list", "watch"):
            selection = _Selection(
                target.namespace,
                parse_label_selector(query.get("labelSelector", "")),
                parse_field_selector(query.get("fieldSelector", ""), resource),
            )
            if verb == "watch":
                return self._watch(resource, selection, query)
            listed = self._list(resource, selection, query)
            if resource in self._printer_columns and tables.wants_table(accept):
                return 200, tables.table(
                    self._printer_columns[resource],
                    listed["items"],
                    list_metadata=listed["metadata"],
                )
            return 200, listed
        if verb == "get":
            got = self._get(resource, target)
            if resource in self._printer_columns and tables.wants_table(accept):
                meta = got.get("metadata") or {}
                return 200, tables.table(
                    self._printer_columns[resource],
                    [got],
                    list_metadata={"resourceVersion": meta.get("resourceVersion", "")},
                )
            return 200, got
        patch_type = content_type.split(";", maxsplit=1)[0].strip()
        if verb == "patch" and patch_type not in (MERGE_PATCH, JSON_PATCH):
            raise ApiError(
                415,
                f"the body of the request was in an unknown format - accepted media types "
                f"include: {JSON_PATCH}, {MERGE_PATCH}",
            )
        if verb == "patch" and patch_type == JSON_PATCH:
            return 200, self._json_patch(resource, target, body, request, user)
        parsed = self._parse_body(body) if body else {}
        if verb == "create":
            return 201, self._create(resource, target, parsed, request, user)
        if verb == "update":
            return 200, self._update(resource, target, parsed, request, user)
        if verb == "patch":
            return 200, self._patch(resource, target, parsed, request, user)
        if verb == "delete":
            return 200, self._delete(resource, target, parsed, request, user)
        raise ApiError(
            405, f"the server does not allow this method on the requested resource ({verb})"
        )

    def _request_of(self, method: str, target: _Target, query: Mapping[str, str]) -> Request:
        if method == "GET" and target.name is None:
            verb = "watch" if query.get("watch") in ("true", "1") else "list"
        else:
            verbs = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch"}
            verbs["DELETE"] = "delete" if target.name is not None else "deletecollection"
            verb = verbs.get(method, method.lower())
        return Request(
            verb, target.group, target.plural, target.subresource, target.namespace, target.name
        )

    @staticmethod
    def _matches_rule(rule: tuple[str, str, str, str | None], request: Request) -> bool:
        verb, group, resource, subresource = rule
        return (
            verb in ("*", request.verb)
            and group in ("*", request.group)
            and resource in ("*", request.resource)
            and subresource in ("*", request.subresource)
        )

    def require_tokens(self) -> None:
        """Authenticate only the tokens of :meth:`kubeconfig` with a ``user``: a request without
        one, or with the default token, is 401 (``vgpuctl sim cluster``: not every local process
        may write to it)."""
        with self._cond:
            self._users.pop(DEFAULT_TOKEN, None)
            self._anonymous = False

    def _authenticate(self, authorization: str | None) -> UserInfo:
        if authorization is None:
            if not self._anonymous:
                raise ApiError(401, "Unauthorized", reason="Unauthorized")
            return self._users[DEFAULT_TOKEN]
        scheme, _, token = authorization.partition(" ")
        with self._cond:
            user = self._users.get(token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            raise ApiError(401, "Unauthorized", reason="Unauthorized")
        return user

    def _forbidden(self, request: Request, user: UserInfo) -> ApiError:
        qualified = f"{request.resource}.{request.group}" if request.group else request.resource
        subject = f'{qualified} "{request.name}"' if request.name else qualified
        resource = request.resource + (f"/{request.subresource}" if request.subresource else "")
        scope = (
            f'in the namespace "{request.namespace}"'
            if request.namespace
            else "at the cluster scope"
        )
        message = (
            f'{subject} is forbidden: User "{user.username}" cannot {request.verb} resource '
            f'"{resource}" in API group "{request.group}" {scope}'
        )
        details = {"group": request.group, "kind": request.resource}
        if request.name:
            details["name"] = request.name
        return ApiError(403, message, details=details)

    # --- verbs ---

    def _get(self, resource: Resource, target: _Target) -> JsonObject:
        with self._cond:
            return copy.deepcopy(self._existing(resource, target))

    def _list(
        self, resource: Resource, selection: _Selection, query: Mapping[str, str]
    ) -> JsonObject:
        """A list, in pages when ``limit`` is given, as the API server serves them from etcd:
        every page of one list is the collection at the first page's resourceVersion (kept
        here as a snapshot), ``metadata.continue`` carries that version and where the next page
        starts, ``remainingItemCount`` says how many follow, and a token whose version was
        compacted since (or is not one this server gave) is 410 Expired."""
        limit_text = query.get("limit", "")
        token = query.get("continue", "")
        if limit_text and not limit_text.isdigit():
            raise ApiError(400, f"invalid limit: {limit_text!r}")
        limit = int(limit_text or 0)
        with self._cond:
            if token:
                rv, start = self._continue_from(token)
                snapshot = self._snapshots.get((resource.group, resource.plural, rv, selection))
                if snapshot is None or rv < self._floor:
                    raise ApiError(410, _CONTINUE_EXPIRED, reason="Expired")
                keys, objects = snapshot
            else:
                bucket = self._bucket(resource)
                keys = sorted(bucket)
                if not selection.everything:  # a fleet's list of 256,000 selects nothing
                    keys = [k for k in keys if selection.matches(bucket[k])]
                # Stored objects are never changed in place (a write stores a new one, as the
                # watch history relies on too): the snapshot keeps them, not copies.
                objects = {k: bucket[k] for k in keys}
                rv, start = self._rv, 0
                if limit and len(keys) > limit:
                    self._snapshots[(resource.group, resource.plural, rv, selection)] = (
                        keys,
                        objects,
                    )
                    while len(self._snapshots) > _SNAPSHOTS:
                        del self._snapshots[next(iter(self._snapshots))]
            end = start + limit if limit else len(keys)
            # Encoded as JSON at once by the HTTP layer; a caller in process must not change them.
            items = [objects[k] for k in keys[start:end]]
            metadata: JsonObject = {"resourceVersion": str(rv)}
            if end < len(keys):
                metadata["continue"] = _continue_token(rv, end)
                if not selection.labels and not selection.fields:
                    # k8s.io/apiserver storage/continue.go PrepareContinueToken counts only
                    # when the predicate is empty (etcd's count includes objects a selector
                    # drops); a namespace is the key prefix, not the predicate. Real
                    # kube-apiserver v1.37.2 left it out of a labelSelector page.
                    metadata["remainingItemCount"] = len(keys) - end
            elif not resource.built_in:
                # A custom resource's list is unstructured: the API server sets its continue
                # token even when empty (apimachinery unstructured_list.go SetContinue has no
                # omitempty), so a last page, or a list not in pages, says "continue": "" (as
                # kube-apiserver v1.37.2 answered in tests/doubles/test_real_agreement.py); a
                # built-in kind's ListMeta omits it.
                metadata["continue"] = ""
            page = _Page(
                kind=f"{resource.kind}List",
                apiVersion=resource.api_version,
                metadata=metadata,
                items=items,
            )
            page.encoded = _list_body(resource, metadata, b",".join(map(self._encoded, items)))
            return page

    def _encoded(self, obj: JsonObject) -> bytes:
        """``obj`` as JSON, encoded once: stored objects never change in place (callers hold
        the lock). Bounded: the cache is emptied when it outgrows the store a few times."""
        entry = self._encodings.get(id(obj))
        if entry is not None and entry[0] is obj:
            return entry[1]
        if len(self._encodings) > _ENCODINGS:
            self._encodings.clear()
        data = json.dumps(obj).encode()
        self._encodings[id(obj)] = (obj, data)
        return data

    @staticmethod
    def _continue_from(token: str) -> tuple[int, int]:
        try:
            doc = json.loads(base64.urlsafe_b64decode(token.encode()))
            return int(doc["rv"]), int(doc["start"])
        except (ValueError, KeyError, TypeError):
            raise ApiError(400, "continue key is not valid") from None

    def _create(
        self,
        resource: Resource,
        target: _Target,
        body: JsonObject,
        request: Request,
        user: UserInfo,
    ) -> JsonObject:
        if target.name is not None:
            raise ApiError(405, "the server does not allow this method on the requested resource")
        self._check_type(resource, body)
        meta = body.setdefault("metadata", {})
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise self._invalid(
                    resource, "?", "metadata.name: Required value: name or generateName is required"
                )
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        self._check_namespace(resource, target, meta)
        if resource.custom and resource.status_subresource:
            body.pop("status", None)  # status is written through the subresource only
        elif (resource.group, resource.plural) == ("", "pods"):
            # A Pod is created Pending whatever status it was sent with (kubernetes
            # pkg/registry/core/pod/strategy.go, podStrategy.PrepareForCreate; the kubelet
            # writes the rest through /status). Kube-apiserver v1.37.2 answered a create
            # without status with {"phase": "Pending"}, where this emulator had no status
            # (tests/integration/test_real_cli_commands.py, the capacity test).
            body["status"] = {"phase": "Pending"}
        self._conform(resource, body, meta["name"])
        self._call_hook(request)
        with self._cond:
            if resource.namespaced and not self._namespace_exists(target.namespace or ""):
                raise ApiError(
                    404,
                    f'namespaces "{target.namespace}" not found',
                    details={"name": target.namespace, "kind": "namespaces"},
                )
            key = (target.namespace or "", meta["name"])
            for field in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
                meta.pop(field, None)
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
            body["apiVersion"], body["kind"] = resource.api_version, resource.kind
            # Admission judges a create before the store finds its name taken (k8s.io/apiserver
            # pkg/registry/generic/registry/store.go, Store.Create: createValidation, then
            # Storage.Create's AlreadyExists). Kube-apiserver v1.37.2 answered an agent's create
            # of another node's existing VGPUDevice with the policy's 422 where this emulator
            # answered 409 (tests/security/test_real_admission.py, another node's objects).
            self._admit("CREATE", resource, target, user, new=body, old=None)
            if key in self._bucket(resource):
                raise ApiError(
                    409,
                    f'{resource.qualified} "{meta["name"]}" already exists',
                    reason="AlreadyExists",
                    details=self._details(resource, meta["name"]),
                )
            return copy.deepcopy(self._write(resource, key, body, None))

    def _update(
        self,
        resource: Resource,
        target: _Target,
        body: JsonObject,
        request: Request,
        user: UserInfo,
    ) -> JsonObject:
        if target.name is None:
            raise ApiError(405, "the server does not allow this method on the requested resource")
        self._check_type(resource, body)
        meta = body.setdefault("metadata", {})
        if meta.get("name") != target.name:
            raise ApiError(
                400,
                f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                f"({target.name})",
            )
        self._check_namespace(resource, target, meta)
        self._call_hook(request)
        with self._cond:
            current = self._existing(resource, target)
            self._check_resource_version(
                resource, current, meta.get("resourceVersion"), required=True
            )
            return self._replace(resource, target, current, body, user)

    def _patch(
        self,
        resource: Resource,
        target: _Target,
        patch: JsonObject,
        request: Request,
        user: UserInfo,
    ) -> JsonObject:
        self._call_hook(request)
        with self._cond:
            current = self._existing(resource, target)
            wanted = (patch.get("metadata") or {}).get("resourceVersion")
            self._check_resource_version(resource, current, wanted, required=False)
            body = merge_patch(current, patch)
            self._check_type(resource, body)
            return self._replace(resource, target, current, body, user)

    def _json_patch(
        self, resource: Resource, target: _Target, raw: bytes, request: Request, user: UserInfo
    ) -> JsonObject:
        """RFC 6902 as the API server applies it: to the object stored when the write lands,
        all operations or none (422 when one does not apply), then as an update."""
        try:
            ops = jsonpatch.decode(raw)
        except jsonpatch.JsonPatchDecodeError as error:
            raise ApiError(400, str(error)) from None
        if len(ops) > jsonpatch.MAX_OPERATIONS:
            raise ApiError(
                413,
                "Request entity too large: The allowed maximum operations in a JSON patch is "
                f"{jsonpatch.MAX_OPERATIONS}, got {len(ops)}",
                reason="RequestEntityTooLarge",
            )
        if self.record:
            with self._cond:
                self.patches.append((request, copy.deepcopy(ops)))
        self._call_hook(request)
        with self._cond:
            current = self._existing(resource, target)
            try:
                body = jsonpatch.apply(current, ops)
            except jsonpatch.JsonPatchError:
                raise ApiError(422, PATCH_NOT_APPLIED, reason="Invalid", details={}) from None
            if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
                raise ApiError(422, PATCH_NOT_APPLIED, reason="Invalid", details={})
            self._check_type(resource, body)
            if body["metadata"].get("name") != target.name:
                raise ApiError(
                    400,
                    f"the name of the object ({body['metadata'].get('name')}) does not match "
                    f"the name on the URL ({target.name})",
                )
            self._check_namespace(resource, target, body["metadata"])
            wanted = body["metadata"].get("resourceVersion")
            self._check_resource_version(resource, current, wanted, required=False)
            return self._replace(resource, target, current, body, user)

    def _delete(
        self,
        resource: Resource,
        target: _Target,
        options: JsonObject,
        request: Request,
        user: UserInfo,
    ) -> JsonObject:
        if target.name is None:
            raise ApiError(405, "the emulator does not serve deletecollection")
        self._call_hook(request)
        with self._cond:
            current = self._existing(resource, target)
            preconditions = options.get("preconditions") or {}
            meta = current["metadata"]
            # k8s.io/apiserver pkg/registry/rest/delete.go BeforeDelete: the UID, then the
            # resourceVersion, a Conflict on the object's Kind (GroupResource{Resource: Kind}),
            # as kube-apiserver v1.37.2 answered (and v1.34's delete.go words it alike).
            for field, label, then in (
                ("uid", "UID", "deleted and then recreated"),
                ("resourceVersion", "ResourceVersion", "modified"),
            ):
                wanted = preconditions.get(field)
                if wanted is not None and wanted != meta.get(field):
                    qualified = (
                        f"{resource.kind}.{resource.group}" if resource.group else resource.kind
                    )
                    raise ApiError(
                        409,
                        f'Operation cannot be fulfilled on {qualified} "{target.name}": the '
                        f"{label} in the precondition ({wanted}) does not match the {label} in "
                        f"record ({meta.get(field)}). The object might have been {then}",
                        details={
                            "name": target.name,
                            "group": resource.group,
                            "kind": resource.kind,
                        },
                    )
            self._admit("DELETE", resource, target, user, new=None, old=current)
            removed = self._remove(resource, (target.namespace or "", target.name))
        if not resource.custom:
            return copy.deepcopy(removed)  # core storage returns the deleted object
        details = self._details(resource, target.name)
        details["uid"] = meta.get("uid")
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": details,
        }

    def _watch(
        self, resource: Resource, selection: _Selection, query: Mapping[str, str]
    ) -> Iterator[JsonObject]:
        since = query.get("resourceVersion", "")
        if since not in ("", "0") and not since.isdigit():
            raise ApiError(400, f"invalid resource version: {since!r}")
        try:
            timeout = float(query.get("timeoutSeconds") or 1800)
        except ValueError:
            raise ApiError(400, "invalid timeoutSeconds") from None
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        return self._watch_events(
            resource, selection, since, time.monotonic() + timeout, bookmarks=bookmarks
        )

    def _bookmark(self, resource: Resource, cursor: int) -> JsonObject:
        """A BOOKMARK: where a watch is, with nothing else of an object."""
        return {
            "type": "BOOKMARK",
            "object": {
                "kind": resource.kind,
                "apiVersion": resource.api_version,
                "metadata": {"resourceVersion": str(cursor)},
            },
        }

    def _watch_events(
        self,
        resource: Resource,
        selection: _Selection,
        since: str,
        deadline: float,
        *,
        bookmarks: bool = False,
    ) -> Iterator[JsonObject]:
        """The events of one watch, as the API server's watch cache (k8s.io/apiserver v0.37
        pkg/storage/cacher) sends them: the changes after ``since``; ``410 Expired`` (an ERROR
        event, then the end) from a version compacted away or older than the resource's watch
        cache (:meth:`_rebuild_watch_cache`); a clean end when that cache is rebuilt.

        Bookmarks (``allowWatchBookmarks``) follow cache_watcher.go: one is due
        ``bookmark_interval`` after the last (a minute, ``defaultBookmarkFrequency``) or 2 s
        before the watch's deadline, whichever comes first (``nextBookmarkTime``; none once
        that is past, so none at the end of the stream), and carries the version of the
        resource's last event (cacher.go ``dispatchEvents``' ``lastProcessedResourceVersion``:
        a change to an object the watch's selector leaves out moves it too); it is sent only
        when that version is newer than the one the watch started from (``process``: "only
        send events newer than resourceVersion"), so an idle resource sends none."""
        store = (resource.group, resource.plural)
        with self._cond:
            epoch = self._epoch
            cache_epoch = self._cache_epoch.get(store, 0)
            floor = self._cache_floor.get(store, 0)  # where this watch's cache began
            if since in ("", "0"):
                # Start from now, with the current state as synthetic ADDED events
                bucket = self._bucket(resource)
                current = sorted(
                    (o for o in bucket.values() if selection.matches(o)),
                    key=lambda o: int(o["metadata"]["resourceVersion"]),
                )
                pending = [{"type": "ADDED", "object": copy.deepcopy(o)} for o in current]
                cursor = self._rv
            else:
                cursor, pending = int(since), []
        start = cursor
        now = time.monotonic()
        next_bookmark: float | None = _next_bookmark(now, self.bookmark_interval, deadline)
        while True:
            yield from pending  # never while holding the lock: the client may be slow
            pending, expired = [], None
            with self._cond:
                while not pending:
                    if self._epoch != epoch:
                        raise ConnectionAbortedError("the emulator was stopped")
                    if self._cache_ended.get(store, 0) > cache_epoch:
                        return  # the resource's watch cache was rebuilt: the watch ends
                    if cursor < self._compacted:
                        # etcd's answer, read without a watch cache (k8s.io/apiserver v0.37
                        # pkg/storage/etcd3/errors.go, interpretWatchError: ErrCompacted);
                        # kube-apiserver v1.37.2 said so where this emulator gave the watch
                        # cache's words (tests/integration/test_real_watch.py, the compaction)
                        message = "The resourceVersion for the provided watch is too old."
                        expired = ApiError(410, message, reason="Expired")
                        break
                    if cursor < self._floor:
                        # the bounded history: a watch cache's window (watch_cache_history.go)
                        message = f"too old resource version: {cursor} ({self._floor})"
                        expired = ApiError(410, message, reason="Expired")
                        break
                    if cursor < floor:
                        message = f"too old resource version: {cursor} ({floor})"
                        expired = ApiError(410, message, reason="Expired")
                        break
                    now = time.monotonic()
                    remaining = deadline - now
                    if remaining <= 0:
                        break
                    changes = [c for c in self._history if c.rv > cursor and c.store == store]
                    cursor = self._rv
                    pending = [e for c in changes if (e := self._event_for(c, selection))]
                    if (
                        not pending
                        and bookmarks
                        and next_bookmark is not None
                        and now >= next_bookmark
                    ):
                        rv = self._cache_rv.get(store, 0)
                        if rv > start:
                            pending = [self._bookmark(resource, rv)]
                        next_bookmark = _next_bookmark(now, self.bookmark_interval, deadline)
                    if not pending:
                        wait = remaining
                        if bookmarks and next_bookmark is not None:
                            wait = min(wait, max(next_bookmark - now, 0.001))
                        self._cond.wait(wait)
            if not pending and expired is None:
                return  # the watch timed out (its last bookmark, if any, came 2 s before)
            if expired is not None:
                # Tell the client, then end the stream, as real servers do
                yield {"type": "ERROR", "object": expired.status()}
                return

    @staticmethod
    def _event_for(change: _Change, selection: _Selection) -> JsonObject | None:
        """The event a selective watch sees: entering the selection is ADDED, leaving is DELETED."""
        now = selection.matches(change.obj)
        before = change.old is not None and selection.matches(change.old)
        if change.type == "MODIFIED" and now != before:
            kind = "ADDED" if now else "DELETED"
        elif now:
            kind = change.type
        else:
            return None
        return {"type": kind, "object": copy.deepcopy(change.obj)}

    # --- storage (callers hold the lock) ---

    def _add_resource(self, resource: Resource) -> None:
        with self._cond:
            self._resources[(resource.group, resource.version, resource.plural)] = resource
            self._store.setdefault((resource.group, resource.plural), {})
            # The watch cache lists when the resource is first served: its bookmarks carry
            # that version until the resource's first event (cacher.go dispatchEvents).
            self._cache_rv.setdefault((resource.group, resource.plural), self._rv)

    def _lookup(self, group: str, version: str, plural: str) -> Resource:
        try:
            return self._resources[(group, version, plural)]
        except KeyError:
            raise KeyError(f"{plural}.{group}/{version} is not registered") from None

    def _resource_of(self, obj: JsonObject) -> Resource:
        group, _, version = obj.get("apiVersion", "").rpartition("/")
        for resource in self._resources.values():
            if (resource.group, resource.version, resource.kind) == (
                group,
                version,
                obj.get("kind"),
            ):
                return resource
        raise KeyError(f"{obj.get('kind')} {obj.get('apiVersion')} is not registered")

    def _bucket(self, resource: Resource) -> dict[tuple[str, str], JsonObject]:
        return self._store[(resource.group, resource.plural)]

    def _namespace_exists(self, namespace: str) -> bool:
        return ("", namespace) in self._store[("", "namespaces")]

    def _existing(self, resource: Resource, target: _Target) -> JsonObject:
        found = self._bucket(resource).get((target.namespace or "", target.name or ""))
        if found is None:
            raise ApiError(
                404,
                f'{resource.qualified} "{target.name}" not found',
                details=self._details(resource, target.name or ""),
            )
        return found

    def _write(
        self, resource: Resource, key: tuple[str, str], obj: JsonObject, old: JsonObject | None
    ) -> JsonObject:
        self._rv += 1
        obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._bucket(resource)[key] = obj
        self._record(resource, "ADDED" if old is None else "MODIFIED", obj, old)
        return obj

    def _remove(self, resource: Resource, key: tuple[str, str]) -> JsonObject:
        removed = self._bucket(resource).pop(key, None)
        if removed is None:
            raise ApiError(
                404,
                f'{resource.qualified} "{key[1]}" not found',
                details=self._details(resource, key[1]),
            )
        self._rv += 1
        removed["metadata"]["resourceVersion"] = str(self._rv)
        self._record(resource, "DELETED", removed, None)
        return removed

    def _record(
        self, resource: Resource, kind: str, obj: JsonObject, old: JsonObject | None
    ) -> None:
        if len(self._history) == self._history.maxlen:
            self._floor = self._history[0].rv
        self._history.append(
            _Change(self._rv, kind, (resource.group, resource.plural), copy.deepcopy(obj), old)
        )
        self._cache_rv[(resource.group, resource.plural)] = self._rv
        self._cond.notify_all()

    def _replace(
        self,
        resource: Resource,
        target: _Target,
        current: JsonObject,
        body: JsonObject,
        user: UserInfo,
    ) -> JsonObject:
        """Store ``body`` over ``current`` as a PUT on ``target`` would (after validating
        admission, which sees the object as it would be stored); a no-op writes nothing."""
        if target.subresource == "status":
            new = copy.deepcopy(current)
            if "status" in body:
                new["status"] = copy.deepcopy(body["status"])
            else:
                new.pop("status", None)
        else:
            new = copy.deepcopy(body)
            meta, old_meta = new["metadata"], current["metadata"]
            for field in ("uid", "creationTimestamp", "generation", "resourceVersion", "namespace"):
                if field in old_meta:
                    meta[field] = old_meta[field]
                else:
                    meta.pop(field, None)
            if resource.status_subresource:
                if "status" in current:
                    new["status"] = copy.deepcopy(current["status"])
                else:
                    new.pop("status", None)
            if _spec_part(new, resource) != _spec_part(current, resource):
                meta["generation"] = old_meta.get("generation", 1) + 1
        new["apiVersion"], new["kind"] = resource.api_version, resource.kind
        self._conform(resource, new, target.name or "")
        self._admit("UPDATE", resource, target, user, new=new, old=current)
        if new == current:
            return copy.deepcopy(current)  # real servers skip no-op writes: no new resourceVersion
        key = (target.namespace or "", target.name or "")
        return copy.deepcopy(self._write(resource, key, new, current))

    # --- validating admission ---

    def _admit(
        self,
        operation: str,
        resource: Resource,
        target: _Target,
        user: UserInfo,
        *,
        new: JsonObject | None,
        old: JsonObject | None,
    ) -> None:
        """Run the stored ValidatingAdmissionPolicies (callers hold the lock); a denial is the
        API server's 422 (or the reason's code) naming policy, binding and message."""
        if resource.group == _ADMISSION:
            return
        bindings = list(self._store[(_ADMISSION, "validatingadmissionpolicybindings")].values())
        if not bindings and not self._webhooks:
            return
        policies = list(self._store[(_ADMISSION, "validatingadmissionpolicies")].values())
        name = target.name or str(((new or old or {}).get("metadata") or {}).get("name") or "")
        namespace_object = None
        if target.namespace:
            namespace_object = self._store[("", "namespaces")].get(("", target.namespace))
        attributes = Attributes(
            operation=operation,
            group=resource.group,
            version=resource.version,
            resource=resource.plural,
            kind=resource.kind,
            subresource=target.subresource or "",
            namespace=target.namespace or "",
            name=name,
            user=user,
            object=new,
            old_object=old,
        )
        denial = admit(attributes, policies, bindings, namespace_object=namespace_object)
        if denial is None:
            self._call_webhooks(attributes)
            return
        raise ApiError(
            denial.code,
            denial.message,
            reason=denial.reason,
            details={
                "name": name,
                "group": resource.group,
                "kind": resource.plural,
                "causes": [{"message": denial.cause}],
            },
        )

    def _call_webhooks(self, attributes: Attributes) -> None:
        """Each matching webhook in turn (each gets its own copy of the objects, as each gets
        its own AdmissionReview); the first denial is the API server's StatusError."""
        for hook in list(self._webhooks):
            if not any(rule_matches(rule, attributes) for rule in hook.rules):
                continue
            review = replace(
                attributes,
                object=copy.deepcopy(attributes.object),
                old_object=copy.deepcopy(attributes.old_object),
            )
            try:
                denial = hook.judge(review)
            except WebhookUnavailable as why:
                if hook.failure_policy == "Ignore":
                    continue
                message = f'failed calling webhook "{hook.name}": {why}'
                raise ApiError(
                    500,
                    f"Internal error occurred: {message}",
                    reason="InternalError",
                    details={"causes": [{"message": message}]},
                ) from None
            if denial is None:
                continue
            raise _webhook_status_error(hook.name, denial)

    # --- validation ---

    def _check_resource_version(
        self, resource: Resource, current: JsonObject, given: Any, *, required: bool
    ) -> None:
        name = current["metadata"]["name"]
        if not given:
            if required and resource.custom:
                # registry/store.go Update: NewInvalid on GroupKind{Kind: the resource}, the
                # uint64 0 shown by field.ErrorBody as JSON (``0``), as kube-apiserver v1.37.2
                # answered (v1.34's store.go and errors.go alike).
                cause = (
                    "metadata.resourceVersion: Invalid value: 0: must be specified for an update"
                )
                raise ApiError(
                    422,
                    f'{resource.qualified} "{name}" is invalid: {cause}',
                    details={
                        "name": name,
                        "group": resource.group,
                        "kind": resource.plural,
                        "causes": [structural.status_cause(cause)],
                    },
                )
            return
        if given != current["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                f'Operation cannot be fulfilled on {resource.qualified} "{name}": the object has '
                "been modified; please apply your changes to the latest version and try again",
                details=self._details(resource, name),
            )

    def _check_type(self, resource: Resource, body: JsonObject) -> None:
        for field, expected in (("apiVersion", resource.api_version), ("kind", resource.kind)):
            if body.get(field) not in (None, expected):
                raise ApiError(
                    400, f"the body {field} {body.get(field)!r} does not match {expected!r}"
                )
        if not isinstance(body.get("metadata", {}), dict):
            raise ApiError(400, "metadata must be an object")

    @staticmethod
    def _check_namespace(resource: Resource, target: _Target, meta: JsonObject) -> None:
        if not resource.namespaced:
            meta.pop("namespace", None)
            return
        if meta.get("namespace") not in (None, "", target.namespace):
            raise ApiError(
                400,
                "the namespace of the provided object does not match the namespace sent on the "
                "request",
            )
        meta["namespace"] = target.namespace

    def _conform(self, resource: Resource, body: JsonObject, name: str) -> None:
        """Prune ``body`` to its CRD's schema and validate it, as the API server does before
        admission: 422 naming every field that is wrong."""
        schema = self._schemas.get(resource)
        if schema is None:
            return
        structural.prune(body, schema)
        causes = structural.validate(body, schema)
        if causes:
            raise self._invalid(resource, name, *causes)

    def _invalid(self, resource: Resource, name: str, *causes: str) -> ApiError:
        """apimachinery ``errors.NewInvalid``: the causes in the message (``[a, b]`` when more
        than one, as an aggregate prints them) and each in ``details.causes``."""
        qualified_kind = f"{resource.kind}.{resource.group}" if resource.group else resource.kind
        text = causes[0] if len(causes) == 1 else f"[{', '.join(causes)}]"
        return ApiError(
            422,
            f'{qualified_kind} "{name}" is invalid: {text}',
            details={
                "name": name,
                "group": resource.group,
                "kind": resource.kind,
                "causes": [structural.status_cause(c) for c in causes],
            },
        )

    @staticmethod
    def _details(resource: Resource, name: str) -> JsonObject:
        return {"name": name, "group": resource.group, "kind": resource.plural}

    @staticmethod
    def _parse_body(body: bytes) -> JsonObject:
        try:
            parsed = json.loads(body)
        except ValueError as error:
            raise ApiError(400, f"the request body is not JSON: {error}") from None
        if not isinstance(parsed, dict):
            raise ApiError(400, "the request body must be a JSON object")
        return parsed

    def _call_hook(self, request: Request) -> None:
        hook = self._before_write
        if hook is not None:
            hook(request)

    def _discovery(self, path: str) -> tuple[int, JsonObject]:
        with self._cond:
            resources = list(self._resources.values())
        if path == "/version":
            return 200, {"major": "1", "minor": "30", "gitVersion": "v1.30.0-emulator"}
        if path == "/api":
            return 200, {"kind": "APIVersions", "versions": ["v1"]}
        if path == "/apis":
            groups: dict[str, list[str]] = {}
            for r in resources:
                if r.group and r.version not in groups.setdefault(r.group, []):
                    groups[r.group].append(r.version)
            return 200, {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {
                        "name": g,
                        "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                        "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
                    }
                    for g, vs in sorted(groups.items())
                ],
            }
        group_version = path.removeprefix("/apis/").removeprefix("/api/").strip("/")
        served = [r for r in resources if r.api_version == group_version]
        if served and path.startswith(("/api/", "/apis/")):
            return 200, {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": group_version,
                "resources": [
                    {"name": r.plural, "kind": r.kind, "namespaced": r.namespaced, "verbs": []}
                    for r in served
                ],
            }
        raise ApiError(404, _MISSING_RESOURCE, details={})


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], emulator: ApiServerEmulator) -> None:
        self.emulator = emulator
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def track(self, connection: socket.socket, *, open_: bool) -> None:
        with self._connections_lock:
            if open_:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    def cut_connections(self) -> None:
        """Break kept-alive and streaming connections, as a server going away does."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HttpServer

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes: without TCP_NODELAY, Nagle's algorithm holds
        # the body until the client's delayed ACK (40 ms a response on Linux).
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.track(self.connection, open_=True)

    def finish(self) -> None:
        self.server.track(self.connection, open_=False)
        with contextlib.suppress(OSError):  # the peer may have gone already
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        try:
            answer = self.server.emulator.handle(
                method,
                self.path,
                body,
                self.headers.get("Content-Type") or "application/json",
                self.headers.get("Authorization"),
                accept=self.headers.get("Accept"),
            )
        except ApiError as error:
            answer = (error.code, error.status())
        except Exception:  # a bug in the emulator: say so in the response, not a hung client
            answer = (500, ApiError(500, traceback.format_exc()).status())
        if isinstance(answer, tuple):
            self._send_json(*answer)
        else:
            self._stream(answer)

    def _send_json(self, code: int, payload: JsonObject) -> None:
        data = payload.encoded if isinstance(payload, _Page) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, events: Iterator[JsonObject]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for event in events:
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            # The client went away, or the emulator stopped (ConnectionAbortedError): cut the
            # stream without its final chunk, as a server going away does
            self.close_connection = True
