"""Turn what the ``kubernetes`` client raises into one-line :class:`ClusterError` messages.

The client raises ``ApiException`` for an HTTP answer it did not like (``status`` 0 for a TLS
failure or a request it could not build) and lets urllib3's exceptions through when there was
no answer at all. Each becomes the error class the engine sorts on (model/clusterapi.py), with a
message that names the server, the verb and the resource, so an operator can act on it without
a traceback: ``RBAC denies update on vgpudevices.devices.harvesterhci.io/status (…)``.

The exception types are matched by module and name rather than imported, so this module (and
the adapter's import) stays free of ``kubernetes`` until a request is actually made.
"""

from __future__ import annotations

from typing import Any

from reconciler.model import (
    AdmissionDeniedError,
    ClusterError,
    ClusterUnavailableError,
    ConflictError,
    ExpiredError,
    ForbiddenError,
    ReconcilerError,
    ResourceMissingError,
)
from reconciler.model.cluster import GROUP, KUBEVIRT_GROUP, NODE_STATE_GROUP
from reconciler.model.clustertext import ClusterTextError, parse_json
from reconciler.model.record import record

#: What to do about a resource type the server does not serve, by API group.
_MISSING_HINTS = {
    GROUP: "are the CRDs installed? kubectl apply -k deploy/",
    # New with vgpuctl's per-node summary: a cluster set up by an older vgpuctl lacks it.
    NODE_STATE_GROUP: "is vgpuctl's VGPUNodeState CRD installed? kubectl apply -k deploy/",
    KUBEVIRT_GROUP: "is KubeVirt installed?",
}

#: Longest server message quoted in an error; API servers can answer with whole HTML pages.
_MAX_QUOTE = 300
#: The largest error body read as a ``Status`` (a real one is a few hundred bytes; an admission
#: webhook's message is quoted in it, and the API server trims those to a few KiB), and the
#: deepest (a ``Status`` nests four levels: details, causes, one cause).
_MAX_STATUS = 64 << 10
_STATUS_DEPTH = 8


@record(frozen=True, slots=True)
class Request:
    """One API request as RBAC sees it: verb, resource, and where."""

    verb: str  # get | list | create | update | patch | delete
    group: str
    version: str
    plural: str
    namespace: str | None = None
    name: str | None = None
    subresource: str = ""

    @property
    def resource(self) -> str:
        """``vgpudevices.devices.harvesterhci.io`` (``pods`` for the core group), with
        ``/status`` for the subresource, as ``kubectl auth can-i`` spells it."""
        base = f"{self.plural}.{self.group}" if self.group else self.plural
        return f"{base}/{self.subresource}" if self.subresource else base

    @property
    def object(self) -> str:
        """``vgpudevices/harvester-kgd9c-000008004`` or ``kubevirts/harvester-system/kubevirt``."""
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.plural}/{where}{self.name}" if self.name else self.resource

    @property
    def scope(self) -> str:
        return f" in namespace {self.namespace}" if self.namespace else ""


def server_status(body: str | None) -> dict[str, Any] | None:
    """The ``Status`` object an API server answers errors with, if the body is one: read within
    bounds (``model.clustertext``), so a body too long, too deep or not JSON is no ``Status``
    and is quoted as text, trimmed, by :func:`server_message`."""
    if not body:
        return None
    try:
        doc = parse_json(body, limit=_MAX_STATUS, depth=_STATUS_DEPTH)
    except ClusterTextError:
        return None
    if isinstance(doc, dict) and doc.get("kind") == "Status":
        return doc
    return None


def is_object_not_found(body: str | None) -> bool:
    """Whether a 404 says the named object is missing (a ``Status`` naming it), as opposed
    to the whole resource type not being served (``404 page not found``, or a ``Status``
    without details when the group exists but the resource does not)."""
    status = server_status(body)
    if status is None:
        return False
    details = status.get("details")
    return isinstance(details, dict) and bool(details.get("name"))


def is_patch_not_applied(body: str | None) -> bool:
    """Whether a 422 says a JSON patch could not be applied (a ``test`` operation failed, a
    path it names is gone) rather than that the patched object is invalid or was denied.

    The API server answers a patch that does not apply with a bare generic Status (its patch
    handler, ``applyJSPatch``: ``NewGenericServerResponse(422, …)``, no name, no causes), while
    schema validation and admission denials name the object and list causes.
    """
    status = server_status(body)
    if status is None or status.get("reason") != "Invalid":
        return False
    details = status.get("details")
    if details is None:
        return True
    return isinstance(details, dict) and not details.get("name") and not details.get("causes")


def server_message(body: str | None, reason: str | None) -> str:
    status = server_status(body)
    if status is not None and status.get("message"):
        text = str(status["message"])
    elif body and body.strip():
        text = body.strip()
    else:
        text = reason or "no details"
    text = " ".join(text[: 4 * _MAX_QUOTE].split())  # one line, whatever the server sent
    return text if len(text) <= _MAX_QUOTE else text[: _MAX_QUOTE - 1] + "…"


#: How the API server words a validating webhook's denial (k8s.io/apiserver
#: ``webhook/errors.ToStatusErr``: ``admission webhook "<name>" denied the request: <why>``).
_WEBHOOK_DENIAL = "denied the request"


def from_api_exception(
    status: int, reason: str | None, body: str | None, *, request: Request, server: str
) -> ReconcilerError:
    """The error for an HTTP error answer (``ApiException``); ``status`` 0 means the client
    failed before any answer (TLS, or a request it could not prepare)."""
    said = server_message(body, reason)
    if status == 0:
        first = next((ln for ln in (reason or "").splitlines()[1:] if ln.strip()), reason or "")
        if (reason or "").startswith("SSLError"):
            # A certificate problem does not go away by retrying: not "unavailable".
            return ClusterError(
                f"TLS handshake with the Kubernetes API server at {server} failed: "
                f"{' '.join(first.split())}"
            )
        return ClusterError(f"cannot send {request.verb} {request.object} to {server}: {said}")
    if status >= 400 and _WEBHOOK_DENIAL in said:
        # An admission webhook said no (its own code: 400 by default, 403 or 422 as it
        # chooses): its words, not RBAC's or a schema's.
        return AdmissionDeniedError(f"{request.verb} {request.object} was refused: {said}")
    if status == 401:
        return ClusterError(
            f"the Kubernetes API server at {server} rejected our credentials "
            f"(401 Unauthorized): {said}"
        )
    if status == 403:
        return ForbiddenError(
            f"RBAC denies {request.verb} on {request.resource}{request.scope} ({said})"
        )
    if status == 404:
        hint = _MISSING_HINTS.get(request.group, "")
        return ResourceMissingError(
            f"the API server does not serve {request.plural}.{request.group or 'core'}"
            f"/{request.version}" + (f": {hint}" if hint else f" ({said})")
        )
    if status == 410:
        return ExpiredError(f"{request.verb} {request.object}: 410 Gone: {said}")
    if status == 409:
        return ConflictError(f"{request.object} changed since it was read (409 Conflict): {said}")
    if status == 422 and request.verb == "patch" and is_patch_not_applied(body):
        return ConflictError(
            f"{request.object} changed since it was read (a JSON patch test failed: 422): {said}"
        )
    if status == 429 or status >= 500:
        return ClusterUnavailableError(
            f"the Kubernetes API server at {server} answered {status} {reason or ''}".rstrip()
            + f" to {request.verb} {request.object}: {said}"
        )
    return ClusterError(
        f"the API server refused {request.verb} {request.object} ({status} {reason or ''}): "
        f"{said}".replace(" ()", "")
    )


def from_transport_error(exc: BaseException, *, server: str, timeout: float) -> ClusterError:
    """The error for no answer at all (a urllib3 exception, possibly wrapped in
    ``MaxRetryError`` after the configured retries)."""
    cause: BaseException = getattr(exc, "reason", None) or exc
    if not isinstance(cause, BaseException):
        cause = exc
    return ClusterUnavailableError(
        f"cannot reach the Kubernetes API server at {server}: {_why(cause, timeout)}"
    )


def _why(exc: BaseException, timeout: float) -> str:
    name = type(exc).__name__
    if name == "ReadTimeoutError":
        return f"no answer within {timeout:g} s"
    if name == "ConnectTimeoutError":
        return f"connection timed out after {timeout:g} s"
    # urllib3 raises NewConnectionError / NameResolutionError "from" the socket's OSError,
    # whose strerror is the plain reason ("Connection refused").
    chain: BaseException | None = exc
    while chain is not None:
        if isinstance(chain, OSError) and chain.strerror:
            text = chain.strerror
            return text[0].lower() + text[1:]
        chain = chain.__cause__ or chain.__context__
    if name == "ProtocolError":
        inner = exc.args[1] if len(exc.args) > 1 else exc
        return f"connection lost ({inner})"
    return " ".join(str(exc).split()) or name
