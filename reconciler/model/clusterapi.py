"""The port through which the engine talks to a Kubernetes API server.

The real adapter (``reconciler.kube``) wraps the unmodified ``kubernetes`` client; tests point it
at an API-server emulator over HTTP. Bodies are the API's JSON as plain dicts. Errors raised:
``ClusterUnavailableError`` (no answer), ``ForbiddenError`` (403, naming verb and resource),
``ResourceMissingError`` (the resource type is not served: 404 on a collection),
``ConflictError`` (409: stale resourceVersion or already exists; a JSON patch whose ``test``
failed), ``ClusterError`` (anything else, an admission policy's denial included).
A missing object on ``get_object`` is ``None``, not an error.

A large collection read to be kept goes through :func:`list_each`: each item made into what the
caller keeps of it as soon as its page is read, where the adapter can (:class:`ListsEach`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from reconciler.model.record import field, record

T = TypeVar("T")


@record(frozen=True, slots=True)
class ObjectList:
    """A whole collection and the resourceVersion it was read at (a watch resumes there)."""

    items: list[dict[str, Any]] = field(default_factory=list)
    resource_version: str = ""


@record(frozen=True, slots=True)
class WatchEvent:
    """One event of a watch: ``ADDED``, ``MODIFIED``, ``DELETED`` with the object, or
    ``BOOKMARK`` (only ``metadata.resourceVersion`` is meaningful: where to resume)."""

    type: str
    object: dict[str, Any]

    @property
    def resource_version(self) -> str:
        meta = self.object.get("metadata")
        return str(meta.get("resourceVersion") or "") if isinstance(meta, dict) else ""


class WatchStream(Protocol):
    """The events of one watch request, until the server ends it (its timeout) or
    :meth:`close` is called from any thread. A 410 Gone raises ``ExpiredError``."""

    def __iter__(self) -> Iterator[WatchEvent]: ...

    def close(self) -> None: ...


class ClusterApi(Protocol):
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
        """Items of a collection (all namespaces when ``namespace`` is None for a namespaced
        resource), fresh: the caller's to keep or change. ``group`` "" means the core API
        (``/api/v1``)."""
        ...

    def list_collection(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        namespace: str | None = None,
        label_selector: str = "",
    ) -> ObjectList:
        """:meth:`list_objects` with the resourceVersion the list was read at."""
        ...

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
        """Watch a collection from ``resource_version`` (bookmarks asked for), for at most
        ``timeout_seconds``."""
        ...

    def get_object(
        self, *, group: str, version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None: ...

    def create_object(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        body: Mapping[str, Any],
        namespace: str | None = None,
    ) -> dict[str, Any]: ...

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
        """PUT; ``body.metadata.resourceVersion`` must be the version the change was planned
        from (a stale one raises ``ConflictError``)."""
        ...

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
        """PATCH with a JSON patch (RFC 6902, ``application/json-patch+json``): only the paths
        its operations name change. A ``test`` operation that fails (the object changed since
        it was read) raises ``ConflictError`` and nothing is written."""
        ...

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
        """PUT on the ``/status`` subresource (only ``status`` is written)."""
        ...

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
        """DELETE with a resourceVersion precondition when given; a missing object is fine."""
        ...


@runtime_checkable
class ListsEach(Protocol):
    """An adapter that converts a list's items page by page (``reconciler.kube``): the items
    of one page are all that is held as JSON at any time, not the whole collection."""

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
        """``[convert(item) for item in list_objects(...)]``, each item converted as soon as
        its page is read (the item is ``convert``'s to keep or change)."""
        ...


def list_each(
    api: ClusterApi,
    convert: Callable[[dict[str, Any]], T],
    *,
    group: str,
    version: str,
    plural: str,
    namespace: str | None = None,
    label_selector: str = "",
) -> list[T]:
    """What ``convert`` makes of each item of a collection, in the list's order: page by page
    where the adapter can (:class:`ListsEach`), else from :meth:`ClusterApi.list_objects`
    (a fake's list is in memory already). The same items either way."""
    if isinstance(api, ListsEach):
        return api.list_each(
            convert,
            group=group,
            version=version,
            plural=plural,
            namespace=namespace,
            label_selector=label_selector,
        )
    items = api.list_objects(
        group=group,
        version=version,
        plural=plural,
        namespace=namespace,
        label_selector=label_selector,
    )
    return [convert(item) for item in items]
