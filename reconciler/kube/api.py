"""The Kubernetes adapter: :class:`~reconciler.model.clusterapi.ClusterApi` over the unmodified
``kubernetes`` client.

Custom resources go through ``CustomObjectsApi``; the core group (``events``) through
the generic ``ApiClient`` request path, so every body stays the API's plain JSON (the typed core
models would be converted back and forth for nothing). Every request carries a timeout, and
everything the client raises is translated at this boundary (``errors.py``): the engine above
sees only :class:`~reconciler.model.ClusterError` and its subclasses.

``kubernetes`` is imported inside the methods: the CLI imports this package for every command,
and node-local commands must not pay for loading the client.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar
from urllib.parse import quote

from reconciler.kube.errors import (
    Request,
    from_api_exception,
    from_transport_error,
    is_object_not_found,
    server_message,
)
from reconciler.model import ClusterError, ConflictError, ExpiredError
from reconciler.model.background import in_background
from reconciler.model.clusterapi import ObjectList, WatchEvent, WatchStream

T = TypeVar("T")

_JSON_HEADERS = {"Accept": "application/json", "Content-Type": "application/json"}
#: Items per page of a list: four times client-go's pager default, so a fleet's 256,000
#: VGPUDevices (~800 bytes each) take 128 requests, not 512 (tests/bench: the list alone
#: 2.3–2.6 s → 1.3–1.6 s with the next page asked for ahead).
PAGE = 2000
#: The most items one list may hold before vgpuctl stops reading (a 1,000-node fleet of 8
#: GPUs × 32 VFs has 256,000 VGPUDevices).
MAX_ITEMS = 1_000_000
#: RFC 6902 JSON patch, as the API server names it.
JSON_PATCH = "application/json-patch+json"


def _collection_path(req: Request) -> str:
    """``/api/v1/...`` (core) or ``/apis/<group>/<version>/...``: a collection's URL."""
    if req.group:
        path = f"/apis/{quote(req.group, safe='')}/{quote(req.version, safe='')}"
    else:
        path = f"/api/{quote(req.version, safe='')}"
    if req.namespace is not None:
        path += f"/namespaces/{quote(req.namespace, safe='')}"
    return path + f"/{quote(req.plural, safe='')}"


def _items(page: Mapping[str, Any], req: Request, server: str) -> list[dict[str, Any]]:
    items = page.get("items")
    if items is None:
        return []
    if not isinstance(items, list):
        raise ClusterError(f"{server} answered list {req.resource} without a list")
    return [item for item in items if isinstance(item, dict)]


#: How far from each end of a page :func:`continue_hint` looks for the list's metadata.
_HINT_WINDOW = 4096


def continue_hint(body: bytes) -> str:
    """The ``continue`` token of a list page, read without decoding the page: from the list's
    metadata where API servers write it, near the start for a built-in kind (struct order:
    ``kind``, ``apiVersion``, ``metadata``, ``items``) and last for a custom resource (its list
    is a map, written with sorted keys: ``apiVersion``, ``items``, ``kind``, ``metadata``; both
    in k8s.io/apimachinery ``pkg/runtime/serializer/json/collections.go``). ListMeta holds only
    scalars, so the first ``}`` after its ``{`` closes it. Empty when not found there. Only a
    hint, which the caller checks against the page once decoded: an item's metadata met first
    has no ``continue`` (ObjectMeta has no such field), and anything else fails to parse."""
    import orjson

    head = body.find(b'"metadata"', 0, _HINT_WINDOW)
    tail = body.rfind(b'"metadata"', max(0, len(body) - _HINT_WINDOW))
    for at in (head, tail):
        if at < 0:
            continue
        start = body.find(b"{", at, at + 16)
        end = body.find(b"}", start) if start >= 0 else -1
        if end < 0 or end - start > _HINT_WINDOW:
            continue
        try:
            meta = orjson.loads(body[start : end + 1])
        except orjson.JSONDecodeError:
            continue
        token = meta.get("continue") if isinstance(meta, dict) else None
        if isinstance(token, str) and token:
            return token
    return ""


class _Watch:
    """The events of one watch response, one JSON object per line; ``ERROR`` events raise
    (410 Gone: :class:`ExpiredError`). :meth:`close` from another thread ends the stream."""

    def __init__(self, response: Any, req: Request, api: KubernetesApi) -> None:
        self._response = response
        self._req = req
        self._api = api

    def __iter__(self) -> Iterator[WatchEvent]:
        buffer = b""
        try:
            for chunk in self._api.call_quietly(self._req, self._chunks):
                buffer += chunk
                if len(buffer) > _MAX_EVENT:
                    raise ClusterError(
                        f"watch {self._req.resource}: an event of more than {_MAX_EVENT} bytes"
                    )
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield self._event(line)
            if buffer.strip():
                yield self._event(buffer)
        finally:
            self.close()

    def _chunks(self) -> Iterator[bytes]:
        raw = getattr(self._response, "response", self._response)  # the urllib3 response
        yield from raw.stream(amt=65536, decode_content=True)

    def _event(self, line: bytes) -> WatchEvent:
        import orjson

        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise ClusterError(
                f"{self._api.server} sent a watch event of {self._req.resource} that is not JSON"
            ) from None
        kind = doc.get("type") if isinstance(doc, dict) else None
        obj = doc.get("object") if isinstance(doc, dict) else None
        if not isinstance(kind, str) or not isinstance(obj, dict):
            raise ClusterError(
                f"{self._api.server} sent a malformed watch event of {self._req.resource}"
            )
        if kind == "ERROR":
            code = int(obj.get("code") or 0)
            raise from_api_exception(
                code, str(obj.get("reason") or ""), json.dumps(obj), request=self._req,
                server=self._api.server,
            )  # fmt: skip
        return WatchEvent(kind, obj)

    def close(self) -> None:
        raw = getattr(self._response, "response", self._response)
        with contextlib.suppress(Exception):
            raw.shutdown()  # unblocks a read in another thread (urllib3 >= 2.3)
        _release(self._response)


def _release(response: Any) -> None:
    """Give a response's connection back (or drop it), whatever state it is in."""
    raw = getattr(response, "response", response)
    with contextlib.suppress(Exception):
        raw.release_conn()


#: The largest watch event read (a VGPUNodeState of a 64-GPU node is well below).
_MAX_EVENT = 16 << 20


def _itself(item: dict[str, Any]) -> dict[str, Any]:
    return item


class _ObjectGone(Exception):
    """A request named an object the server does not have (404 naming it)."""


class KubernetesApi:
    """Talks to one API server through its own ``ApiClient`` (the client's global default
    configuration is never read or changed, so two clusters can be used side by side)."""

    def __init__(self, api_client: Any, *, timeout: float = 10.0) -> None:
        # Typed as Any: parts of the client (close, read, sanitize_for_serialization) are not
        # annotated, and strict mypy would reject every call into them.
        self._client: Any = api_client
        self._timeout = timeout
        self._custom: Any = None

    @property
    def server(self) -> str:
        """The API server's URL (``https://10.53.0.1:443``), for messages."""
        return str(self._client.configuration.host)

    @property
    def timeout(self) -> float:
        return self._timeout

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> KubernetesApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- ClusterApi --------------------------------------------------------------------------

    def list_objects(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> list[dict[str, Any]]:
        """Every item, read in pages (:meth:`list_collection`)."""
        req = Request("list", group, version, plural, namespace)
        return self._paged(req, label_selector, field_selector, _itself)[0]

    def list_each(
        self,
        convert: Callable[[dict[str, Any]], T],
        *,
        group: str,
        version: str,
        plural: str,
        namespace: str | None = None,
        label_selector: str = "",
    ) -> list[T]:
        """Every item, each given to ``convert`` as soon as its page is decoded (the item is
        the caller's), and what ``convert`` made of it: the list of those, in the list's order.
        Read as :meth:`list_collection` reads (pages, their bound, a list read again from the
        start when its version expired: what was made of the first reading is dropped). No
        more than one page of decoded items is alive at once, so a caller that keeps a small
        record of each item never holds the collection as JSON (a fleet's 256,000
        VGPUDevices: ``docs/performance.md``)."""
        req = Request("list", group, version, plural, namespace)
        return self._paged(req, label_selector, "", convert)[0]

    def list_collection(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        namespace: str | None = None,
        label_selector: str = "",
    ) -> ObjectList:
        """Every item and the list's resourceVersion, read in pages of :data:`PAGE` (``limit``
        and ``continue``: every page of one list is the collection at one version), each
        page's body decoded as plain JSON (never the client's typed models). A list whose
        version expired between two pages (410) is read again from the start, once; a
        collection of more than :data:`MAX_ITEMS` items is refused (work is bounded)."""
        req = Request("list", group, version, plural, namespace)
        return ObjectList(*self._paged(req, label_selector, "", _itself))

    def _paged(
        self,
        req: Request,
        label_selector: str,
        field_selector: str,
        convert: Callable[[dict[str, Any]], T],
    ) -> tuple[list[T], str]:
        """Every page of a list, each item given to ``convert`` as its page is decoded (the
        page is dropped before the next one is: only the converted items accumulate), and the
        list's resourceVersion. The
        next page is asked for as soon as its ``continue`` token shows in this page's body
        (:func:`continue_hint`), on a thread of its own, while this page is decoded: the
        server's time on one page overlaps the client's on the one before (a fleet's 128 pages
        of VGPUDevices: most of a second). The token decoded from the page is the one followed;
        a request made on a hint that proves wrong is dropped, so a wrong hint costs a request,
        never an item. At most one page is asked for ahead."""
        for attempt in (1, 2):
            items: list[T] = []
            token = ""
            ahead: tuple[str, Future[bytes]] | None = None  # (its token, its body)
            while True:
                try:
                    if ahead is not None and ahead[0] == token:
                        body = ahead[1].result()
                    else:
                        body = self._page(req, label_selector, field_selector, token)
                except ExpiredError:
                    if attempt == 2 or not token:
                        raise
                    break  # the list's version was compacted: read it again from the start
                hint = continue_hint(body)
                ahead = None
                if hint:
                    ask = functools.partial(self._page, req, label_selector, field_selector, hint)
                    ahead = (hint, in_background(ask, name="vgpuctl-page"))
                page = self._json_object(body, f"list {req.resource}")
                del body
                raw = _items(page, req, self.server)
                meta = page.get("metadata")
                del page  # the items are converted one by one and dropped as they go
                if len(items) + len(raw) > MAX_ITEMS:
                    raise ClusterError(
                        f"list {req.resource}: more than {MAX_ITEMS} items; refusing to read on"
                    )
                raw.reverse()  # popped from the end: each raw item freed once converted
                while raw:
                    items.append(convert(raw.pop()))
                meta = meta if isinstance(meta, dict) else {}
                token = str(meta.get("continue") or "")
                if not token:
                    return items, str(meta.get("resourceVersion") or "")
        raise AssertionError("unreachable")  # pragma: no cover

    def watch_objects(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str = "",
        timeout_seconds: int = 300,
    ) -> WatchStream:
        """A watch from ``resource_version`` with bookmarks; the server ends it after
        ``timeout_seconds`` (the client gives up reading 30 s later than that)."""
        req = Request("watch", group, version, plural, namespace)
        query = [
            ("watch", "1"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(int(timeout_seconds))),
            ("labelSelector", label_selector),
        ]
        read_timeout = (self._timeout, float(timeout_seconds) + 30.0)
        path = _collection_path(req)
        response = self._call(req, lambda: self._get(path, query, timeout=read_timeout))
        return _Watch(response, req, self)

    def _page(self, req: Request, label_selector: str, field_selector: str, token: str) -> bytes:
        """One page of a list: the server's answer, not yet decoded."""
        query = [
            ("labelSelector", label_selector),
            ("fieldSelector", field_selector),
            ("limit", str(PAGE)),
            ("continue", token),
        ]
        path = _collection_path(req)
        return self._call(req, lambda: self._get_body(path, query))

    def _get(self, path: str, query: list[tuple[str, str]], *, timeout: Any = None) -> Any:
        """GET ``path`` with the body left unread (a watch streams it); an error answer is
        read, its connection released, and raised as the client's ``ApiException`` (which
        :meth:`_call` translates)."""
        params = self._client.param_serialize(
            method="GET",
            resource_path=path,
            query_params=[(k, v) for k, v in query if v] or None,
            header_params=dict(_JSON_HEADERS),
            auth_settings=["BearerToken"],
        )
        response = self._client.call_api(*params, _request_timeout=timeout or self._timeout)
        status = int(getattr(response, "status", 0) or 0)
        if not 200 <= status < 300:
            from kubernetes.client.exceptions import ApiException

            data = response.read()
            _release(response)
            raise ApiException(
                status=status,
                reason=str(getattr(response, "reason", "")),
                body=data.decode("utf-8", "replace") if isinstance(data, bytes) else None,
            )
        return response

    def _get_body(self, path: str, query: list[tuple[str, str]]) -> bytes:
        """GET ``path``: its body, read whole (never through the client's models)."""
        response = self._get(path, query)
        try:
            data = response.read()
        finally:
            _release(response)
        return bytes(data)

    def _json_object(self, data: bytes, what: str) -> dict[str, Any]:
        """``data`` decoded as a JSON object (orjson), or a one-line error naming ``what``."""
        import orjson

        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise ClusterError(
                f"{self.server} answered {what} with a body that is not JSON"
            ) from None
        if not isinstance(doc, dict):
            raise ClusterError(f"{self.server} answered {what} with a body that is no object")
        return doc

    def get_object(
        self, *, group: str, version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        req = Request("get", group, version, plural, namespace, name)
        try:
            if not group:
                return self._body(req, self._call(req, lambda: self._core("GET", req)))
            if namespace is None:
                fetched = self._call(
                    req,
                    lambda: self._objects().get_cluster_custom_object(
                        group, version, plural, name, _request_timeout=self._timeout
                    ),
                )
            else:
                fetched = self._call(
                    req,
                    lambda: self._objects().get_namespaced_custom_object(
                        group, version, namespace, plural, name, _request_timeout=self._timeout
                    ),
                )
        except _ObjectGone:
            return None
        return self._body(req, fetched)

    def create_object(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        body: Mapping[str, Any],
        namespace: str | None = None,
    ) -> dict[str, Any]:
        name = str((body.get("metadata") or {}).get("name", "")) or None
        req = Request("create", group, version, plural, namespace, name)
        plain = _plain(body)
        if not group:
            return self._body(req, self._call(req, lambda: self._core("POST", req, body=plain)))
        if namespace is None:
            created = self._call(
                req,
                lambda: self._objects().create_cluster_custom_object(
                    group, version, plural, plain, _request_timeout=self._timeout
                ),
                collection=True,
            )
        else:
            created = self._call(
                req,
                lambda: self._objects().create_namespaced_custom_object(
                    group, version, namespace, plural, plain, _request_timeout=self._timeout
                ),
                collection=True,
            )
        return self._body(req, created)

    def replace_object(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        name: str,
        body: Mapping[str, Any],
        namespace: str | None = None,
    ) -> dict[str, Any]:
        return self._replace(
            Request("update", group, version, plural, namespace, name), _plain(body)
        )

    def patch_object(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        name: str,
        patch: Sequence[Mapping[str, Any]],
        namespace: str | None = None,
    ) -> dict[str, Any]:
        req = Request("patch", group, version, plural, namespace, name)
        ops = [_plain(op) for op in patch]
        objects = self._objects() if group else None

        def send() -> Any:
            # The content type is named: the client's own choice for a custom object is a
            # merge patch whatever the body (kubernetes 37's select_header_content_type only
            # looks for "json" among the types its API lists).
            if objects is None:
                return self._core("PATCH", req, body=ops, content_type=JSON_PATCH)
            if namespace is None:
                return objects.patch_cluster_custom_object(
                    group,
                    version,
                    plural,
                    name,
                    ops,
                    _request_timeout=self._timeout,
                    _content_type=JSON_PATCH,
                )
            return objects.patch_namespaced_custom_object(
                group,
                version,
                namespace,
                plural,
                name,
                ops,
                _request_timeout=self._timeout,
                _content_type=JSON_PATCH,
            )

        try:
            return self._body(req, self._call(req, send))
        except _ObjectGone:
            raise ConflictError(f"{req.object} was deleted since it was read") from None

    def replace_status(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        name: str,
        body: Mapping[str, Any],
        namespace: str | None = None,
    ) -> dict[str, Any]:
        return self._replace(
            Request("update", group, version, plural, namespace, name, "status"), _plain(body)
        )

    def delete_object(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        name: str,
        namespace: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        from kubernetes.client import V1DeleteOptions, V1Preconditions

        req = Request("delete", group, version, plural, namespace, name)
        options = (
            V1DeleteOptions(preconditions=V1Preconditions(resource_version=resource_version))
            if resource_version
            else None
        )
        try:
            if not group:
                plain = self._client.sanitize_for_serialization(options)
                self._call(req, lambda: self._core("DELETE", req, body=plain))
            elif namespace is None:
                self._call(
                    req,
                    lambda: self._objects().delete_cluster_custom_object(
                        group, version, plural, name, body=options, _request_timeout=self._timeout
                    ),
                )
            else:
                self._call(
                    req,
                    lambda: self._objects().delete_namespaced_custom_object(
                        group,
                        version,
                        namespace,
                        plural,
                        name,
                        body=options,
                        _request_timeout=self._timeout,
                    ),
                )
        except _ObjectGone:
            return  # already gone: what a delete wants

    # -- plumbing ----------------------------------------------------------------------------

    def _objects(self) -> Any:
        if self._custom is None:
            from kubernetes.client import CustomObjectsApi

            self._custom = CustomObjectsApi(self._client)
        return self._custom

    def _replace(self, req: Request, body: dict[str, Any]) -> dict[str, Any]:
        objects = self._objects() if req.group else None
        status = req.subresource == "status"

        def put() -> Any:
            if objects is None:
                return self._core("PUT", req, body=body)
            g, v, p, n, t = req.group, req.version, req.plural, str(req.name), self._timeout
            ns = req.namespace
            if ns is None and status:
                return objects.replace_cluster_custom_object_status(
                    g, v, p, n, body, _request_timeout=t
                )
            if ns is None:
                return objects.replace_cluster_custom_object(g, v, p, n, body, _request_timeout=t)
            if status:
                return objects.replace_namespaced_custom_object_status(
                    g, v, ns, p, n, body, _request_timeout=t
                )
            return objects.replace_namespaced_custom_object(
                g, v, ns, p, n, body, _request_timeout=t
            )

        try:
            return self._body(req, self._call(req, put))
        except _ObjectGone:
            # Replacing is always planned from an object that was read: one deleted since is a
            # lost race like a stale resourceVersion, and is handled the same way (re-read).
            raise ConflictError(f"{req.object} was deleted since it was read") from None

    def _core(
        self,
        method: str,
        req: Request,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        """One request on the core group (``/api/v1/...``), answered as plain JSON."""
        path = _collection_path(req)
        if req.name and method != "POST":  # a create goes to the collection
            path += f"/{quote(req.name, safe='')}"
        if req.subresource:
            path += f"/{quote(req.subresource, safe='')}"
        params = self._client.param_serialize(
            method=method,
            resource_path=path,
            query_params=[(k, v) for k, v in (query or []) if v] or None,
            header_params={**_JSON_HEADERS, "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self._client.call_api(*params, _request_timeout=self._timeout)
        response.read()
        return self._client.response_deserialize(
            response_data=response, response_types_map={"2XX": "object"}
        ).data

    def _call(self, req: Request, fn: Callable[[], T], *, collection: bool = False) -> T:
        """Run one client call, translating whatever it raises.

        A 404 naming the object raises :class:`_ObjectGone` for the caller to interpret,
        unless the request is on the collection (``collection``: a create), where a 404 can
        only mean the resource type is not served.
        """
        import urllib3
        from kubernetes.client.exceptions import ApiException
        from kubernetes.config.config_exception import ConfigException

        try:
            return fn()
        except ApiException as e:
            code = int(e.status or 0)
            body = e.body if isinstance(e.body, str) else None
            if code == 404 and req.name and is_object_not_found(body):
                if not collection:
                    raise _ObjectGone from None
                # A create answered "not found" naming something: the namespace is missing.
                raise ClusterError(
                    f"cannot create {req.object}: {server_message(body, e.reason)}"
                ) from None
            raise from_api_exception(
                code, e.reason, body, request=req, server=self.server
            ) from None
        except urllib3.exceptions.HTTPError as e:
            raise from_transport_error(e, server=self.server, timeout=self._timeout) from None
        except ConfigException as e:
            # Credentials are refreshed lazily (exec plugins, token files) on a request.
            raise ClusterError(f"cannot authenticate to {self.server}: {e}") from None

    def call_quietly(self, req: Request, chunks: Callable[[], Iterator[bytes]]) -> Iterator[bytes]:
        """The chunks of a streamed answer, a connection lost midway translated as every
        other failure is (:class:`~reconciler.model.ClusterUnavailableError`)."""
        import urllib3

        try:
            yield from chunks()
        except urllib3.exceptions.HTTPError as e:
            raise from_transport_error(e, server=self.server, timeout=self._timeout) from None
        except (OSError, ValueError) as e:  # a socket shut down by close(), or torn
            raise ClusterError(f"watch {req.resource} ended: {e}") from None

    def _body(self, req: Request, answer: object) -> dict[str, Any]:
        if not isinstance(answer, dict):
            raise ClusterError(
                f"{self.server} answered {req.verb} {req.object} with something other than "
                "a JSON object"
            )
        return answer


def _plain(body: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON-ready deep copy (bodies may be read-only proxies from frozen model values)."""
    out: dict[str, Any] = {str(k): _plain_value(v) for k, v in body.items()}
    return out


def _plain_value(value: Any) -> Any:
    if isinstance(value, Mapping):
        return _plain(value)
    if isinstance(value, list | tuple):
        return [_plain_value(v) for v in value]
    return value
