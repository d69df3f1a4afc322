"""The in-memory ``ClusterApi`` (``reconciler.model.clusterapi``): the one fake of the port.

Unit tests of the cluster observer, the cluster executor, the watch agent's cluster fingerprint
and the Event recorder hand it to the code under test instead of an API server. It keeps the API
server's rules that code relies on (the HTTP-level model, with watches and admission, is
``emulator.py``):

- one resourceVersion counter for every object; a PUT, status PUT or delete naming another
  version than the stored one is a ``ConflictError`` (409), as is a create of a name that exists;
- the status subresource: status dropped on create, kept on a PUT of one of our CRs (group
  ``devices.harvesterhci.io``), only status taken on a PUT of ``/status``;
- JSON patches applied as the API server does (``jsonpatch.py``); a failed ``test`` is a conflict;
- our CRDs' schemas (``schemas/crds``): a write is pruned to the schema and validated, a 422
  being a ``ClusterError`` naming every field that is wrong (``structural.py``, as the emulator);
- lists filtered by namespace, label selector (the emulator's parser: the API server's grammar)
  and ``a.b=v`` field selectors, returned as copies in the order stored; a plural named in
  ``unserved`` is a resource the server does not serve (``ResourceMissingError``).

Tests steer it with ``down`` (every call: ``ClusterUnavailableError``), ``fail`` (plural → the
error every call on it raises), ``before_write`` (called before each write, to play another
actor) and ``on_get``; ``read_only`` makes any write fail the test. It records every call
(``calls``: verb, plural, resourceVersion sent), the details of each list (``lists``), each
write's body as sent (``writes``) and each JSON patch (``patches``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from reconciler.model.cluster import GROUP
from reconciler.model.clusterapi import ObjectList, WatchStream
from reconciler.model.errors import (
    ClusterError,
    ClusterUnavailableError,
    ConflictError,
    ResourceMissingError,
)
from tests.doubles import jsonpatch, structural
from tests.doubles.emulator import parse_label_selector

Key = tuple[str, str | None, str]  # plural, namespace, name
CRDS = Path(__file__).resolve().parents[2] / "schemas" / "crds"


@cache
def crd_schemas() -> dict[str, Any]:
    """Our CRDs' openAPIV3Schema by plural (the version each serves: one)."""
    schemas = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text(encoding="utf-8"))
        (version,) = crd["spec"]["versions"]
        structural.check_schema(version["schema"]["openAPIV3Schema"])
        schemas[crd["spec"]["names"]["plural"]] = version["schema"]["openAPIV3Schema"]
    return schemas


def conform(verb: str, plural: str, obj: dict[str, Any]) -> None:
    """Prune ``obj`` to its CRD's schema in place and validate it (``ClusterError``, as the
    product reports a 422)."""
    schema = crd_schemas().get(plural)
    if schema is None:
        return
    structural.prune(obj, schema)
    causes = structural.validate(obj, schema)
    if causes:
        name = obj["metadata"]["name"]
        raise ClusterError(
            f"the API server refused {verb} {plural}/{name} (422 Unprocessable Entity): "
            + "; ".join(causes)
        )


class ListCall(NamedTuple):
    group: str
    version: str
    plural: str
    namespace: str | None
    label_selector: str
    field_selector: str


class Write(NamedTuple):
    verb: str  # create, update, update/status
    group: str
    version: str
    plural: str
    namespace: str | None
    name: str
    body: dict[str, Any]


class FakeCluster:
    """An API server's store in memory, behind the ``ClusterApi`` port."""

    def __init__(self, *, read_only: bool = False) -> None:
        self.store: dict[Key, dict[str, Any]] = {}
        self.unserved: set[str] = set()
        self.read_only = read_only
        self.calls: list[tuple[str, str, str | None]] = []  # verb, plural, rv sent
        self.lists: list[ListCall] = []
        self.writes: list[Write] = []
        self.patches: list[list[dict[str, Any]]] = []
        self.rv = 100
        self.before_write: Callable[[str, Key], object] | None = None
        self.on_get: Callable[[Key], object] | None = None
        self.down = False
        self.fail: dict[str, Exception] = {}

    # -- for the test: the store as another actor sees it ----------------------------------------

    def put(self, plural: str, body: Mapping[str, Any], namespace: str | None = None) -> str:
        """Store directly (another actor); returns the new resourceVersion."""
        obj = copy.deepcopy(dict(body))
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        self.store[(plural, namespace, obj["metadata"]["name"])] = obj
        return str(self.rv)

    def seed(self, plural: str, objects: Sequence[Mapping[str, Any]]) -> None:
        """Store objects as given (their own resourceVersion kept, when they have one), each in
        its own ``metadata.namespace`` (None when it has none)."""
        for obj in objects:
            meta = obj.get("metadata") or {}
            key = (plural, meta.get("namespace"), meta["name"])
            if "resourceVersion" in meta:
                self.store[key] = copy.deepcopy(dict(obj))
            else:
                self.put(plural, obj, key[1])

    def objects(self, plural: str) -> list[dict[str, Any]]:
        """The stored objects of a plural, in the order stored (not copies)."""
        return [obj for (p, _, _), obj in self.store.items() if p == plural]

    def _enter(self, verb: str, plural: str, rv: str | None, key: Key | None = None) -> None:
        self.calls.append((verb, plural, rv))
        if self.down:
            raise ClusterUnavailableError("cannot reach the Kubernetes API server at x: refused")
        if plural in self.fail:
            raise self.fail[plural]
        if plural in self.unserved:
            raise ResourceMissingError(f"the API server does not serve {plural}")
        if verb not in ("get", "list"):
            if self.read_only:
                raise AssertionError(f"{verb} {plural}: this code must only read the cluster")
            if key is not None and self.before_write is not None:
                self.before_write(verb, key)

    # -- the port --------------------------------------------------------------------------------

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
        self.lists.append(
            ListCall(group, version, plural, namespace, label_selector, field_selector)
        )
        self._enter("list", plural, None)
        labels = parse_label_selector(label_selector)
        fields = [term.split("=", 1) for term in filter(None, field_selector.split(","))]
        out = []
        for (stored_plural, stored_namespace, _), obj in self.store.items():
            if stored_plural != plural or namespace not in (None, stored_namespace):
                continue
            if not all(r.matches(obj["metadata"].get("labels") or {}) for r in labels):
                continue
            if not all(_field(obj, path) == value for path, value in fields):
                continue
            out.append(json.loads(json.dumps(obj)))
        return out

    def list_collection(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        namespace: str | None = None,
        label_selector: str = "",
    ) -> ObjectList:
        items = self.list_objects(
            group=group,
            version=version,
            plural=plural,
            namespace=namespace,
            label_selector=label_selector,
        )
        return ObjectList(items, str(self.rv))

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
        """Not modelled in memory: watches are the API-server emulator's (over HTTP)."""
        self._enter("watch", plural, None)
        raise ClusterError("FakeCluster does not serve watches: use the API-server emulator")

    def get_object(
        self, *, group: str, version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        self._enter("get", plural, None)
        if self.on_get is not None:
            self.on_get((plural, namespace, name))
        found = self.store.get((plural, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def create_object(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        body: Mapping[str, Any],
        namespace: str | None = None,
    ) -> dict[str, Any]:
        key = (plural, namespace, body["metadata"]["name"])
        self._enter("create", plural, body["metadata"].get("resourceVersion"), key)
        self._sent("create", group, version, key, body)
        if key in self.store:
            raise ConflictError(f"{plural}/{key[2]} already exists")
        obj = copy.deepcopy(dict(body))
        obj.pop("status", None)
        conform("create", plural, obj)
        obj["metadata"]["uid"] = f"uid-{key[2]}"
        self.put(plural, obj, namespace)
        return copy.deepcopy(self.store[key])

    def _sent(self, verb: str, group: str, version: str, key: Key, body: Mapping[str, Any]) -> None:
        plural, namespace, name = key
        self.writes.append(
            Write(verb, group, version, plural, namespace, name, copy.deepcopy(dict(body)))
        )

    def _stored(self, plural: str, namespace: str | None, name: str, rv: str | None) -> Key:
        key = (plural, namespace, name)
        current = self.store.get(key)
        if current is None:
            raise ConflictError(f"{plural}/{name} was deleted since it was read")
        if rv != current["metadata"]["resourceVersion"]:
            raise ConflictError(f"{plural}/{name} changed since it was read (409 Conflict)")
        return key

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
        rv = body["metadata"].get("resourceVersion")
        self._enter("update", plural, rv, (plural, namespace, name))
        self._sent("update", group, version, (plural, namespace, name), body)
        key = self._stored(plural, namespace, name, rv)
        obj = copy.deepcopy(dict(body))
        if group == GROUP:  # the status subresource: a PUT keeps the stored status (or none)
            obj.pop("status", None)
            if "status" in self.store[key]:
                obj["status"] = copy.deepcopy(self.store[key]["status"])
        obj["metadata"]["uid"] = self.store[key]["metadata"].get("uid")
        conform("update", plural, obj)
        self.put(plural, obj, namespace)
        return copy.deepcopy(self.store[key])

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
        key = (plural, namespace, name)
        self._enter("patch", plural, None, key)
        self.patches.append([dict(op) for op in patch])
        current = self.store.get(key)
        if current is None:
            raise ConflictError(f"{plural}/{name} was deleted since it was read")
        try:
            obj = jsonpatch.apply(current, patch)
        except jsonpatch.JsonPatchError:
            raise ConflictError(f"{plural}/{name} changed since it was read (422)") from None
        conform("patch", plural, obj)
        self.put(plural, obj, namespace)
        return copy.deepcopy(self.store[key])

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
        rv = body["metadata"].get("resourceVersion")
        self._enter("update/status", plural, rv, (plural, namespace, name))
        self._sent("update/status", group, version, (plural, namespace, name), body)
        key = self._stored(plural, namespace, name, rv)
        obj = copy.deepcopy(self.store[key])
        obj["status"] = copy.deepcopy(body.get("status"))
        conform("update", plural, obj)
        self.put(plural, obj, namespace)
        return copy.deepcopy(self.store[key])

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
        key = (plural, namespace, name)
        self._enter("delete", plural, resource_version, key)
        current = self.store.get(key)
        if current is None:
            return
        if resource_version and resource_version != current["metadata"]["resourceVersion"]:
            raise ConflictError(f"{plural}/{name}: precondition failed (409 Conflict)")
        del self.store[key]


def _field(obj: Mapping[str, Any], path: str) -> Any:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node
