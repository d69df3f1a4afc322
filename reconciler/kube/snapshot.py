"""A cluster's observed state in a file: ``export --observed cluster -o snapshot`` writes it,
``plan --observed snapshot.json`` plans from it, with no cluster credentials (a CI runner
outside the network plans a pull request from a snapshot an in-cluster job refreshes).

A snapshot is what ``plan --observed cluster`` reads, as it read it: every collection it lists
(the Nodes, vgpuctl's VGPUNodeStates, Harvester's SRIOVGPUDevices and VGPUDevices, the KubeVirt
CRs, the VMIs) whole, and the objects it gets by name (pcidevices-controller's Addon, DaemonSet
and webhook configuration), each resource with whether it was served, denied, or which names
were absent. :class:`RecordingApi` records those reads through the real adapter;
:class:`SnapshotApi` answers the same reads from the file, read-only, so the planner runs
unchanged and sees what it would have seen then (``schemas/cluster-snapshot.schema.json``).

Everything in a snapshot came from an API server: untrusted, checked by the same readers as
a live answer. The envelope is checked against the schema and each item must be an object.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from reconciler.model.clusterapi import ClusterApi, ObjectList, WatchStream
from reconciler.model.errors import ClusterError, ForbiddenError, ResourceMissingError

API_VERSION = "vgpu.reconciler.dev/v1alpha1"
KIND = "ClusterSnapshot"
#: The largest snapshot file read (1,000 nodes of 256 VGPUDevices each: a few hundred MB).
MAX_SNAPSHOT_BYTES = 1 << 30
#: ``plan --max-snapshot-age``'s default (examples/gitops/snapshot.md says why).
DEFAULT_MAX_AGE_S = 3600.0
#: A snapshot from this far in the future is refused (clocks of the job and the runner differ
#: by less than this, or the file's time is wrong).
CLOCK_SKEW_S = 300.0

Key = tuple[str, str, str]  # group, version, plural


def _key(group: str, version: str, plural: str) -> str:
    return f"{group}/{version}/{plural}" if group else f"{version}/{plural}"


class _Resource:
    __slots__ = ("absent", "complete", "forbidden", "items", "namespaces", "served")

    def __init__(self) -> None:
        self.served = True
        self.forbidden = ""
        self.complete = False  # a whole list was read: a name not among the items is absent
        self.namespaces: set[str] = set()  # namespaces listed whole (not complete)
        self.items: dict[tuple[str, str], dict[str, Any]] = {}
        self.absent: set[tuple[str, str]] = set()


def _ident(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class RecordingApi:
    """A read-only view of ``api`` that records every list and get it answers (thread-safe: the
    fleet reader lists VGPUDevices on a thread of its own). Writes and watches are refused."""

    def __init__(self, api: ClusterApi) -> None:
        self._api = api
        self._lock = threading.Lock()
        self._resources: dict[Key, _Resource] = {}

    def _resource(self, group: str, version: str, plural: str) -> _Resource:
        with self._lock:
            return self._resources.setdefault((group, version, plural), _Resource())

    def _failed(self, resource: _Resource, error: ClusterError) -> None:
        with self._lock:
            if isinstance(error, ResourceMissingError):
                resource.served = False
            elif isinstance(error, ForbiddenError):
                resource.forbidden = error.message

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
        resource = self._resource(group, version, plural)
        try:
            items = self._api.list_objects(
                group=group,
                version=version,
                plural=plural,
                namespace=namespace,
                label_selector=label_selector,
                field_selector=field_selector,
            )
        except ClusterError as error:
            self._failed(resource, error)
            raise
        if not label_selector and not field_selector:
            with self._lock:
                if namespace is None:
                    resource.complete = True
                else:
                    resource.namespaces.add(namespace)
                for item in items:
                    resource.items[_ident(item)] = copy.deepcopy(item)
        return items

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
        return ObjectList(items=items)

    def get_object(
        self, *, group: str, version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        resource = self._resource(group, version, plural)
        try:
            obj = self._api.get_object(
                group=group, version=version, plural=plural, name=name, namespace=namespace
            )
        except ClusterError as error:
            self._failed(resource, error)
            raise
        with self._lock:
            if obj is None:
                resource.absent.add((namespace or "", name))
            else:
                resource.items[_ident(obj)] = copy.deepcopy(obj)
        return obj

    def watch_objects(self, **_: Any) -> WatchStream:
        raise ClusterError("a snapshot is taken from lists and gets, never a watch")

    def create_object(self, **_: Any) -> dict[str, Any]:
        raise ClusterError("taking a snapshot writes nothing")

    replace_object = patch_object = replace_status = create_object

    def delete_object(self, **_: Any) -> None:
        raise ClusterError("taking a snapshot writes nothing")

    def snapshot(self, *, taken_at: float, version: str) -> dict[str, Any]:
        """The snapshot document (``schemas/cluster-snapshot.schema.json``)."""
        resources = []
        with self._lock:
            for (group, ver, plural), r in sorted(self._resources.items()):
                entry: dict[str, Any] = {
                    "group": group,
                    "version": ver,
                    "plural": plural,
                    "served": r.served,
                    "complete": r.complete,
                    "items": [r.items[k] for k in sorted(r.items)],
                }
                if r.namespaces and not r.complete:
                    entry["namespaces"] = sorted(r.namespaces)
                if r.forbidden:
                    entry["forbidden"] = r.forbidden
                if r.absent:
                    entry["absent"] = [
                        {"namespace": ns, "name": name} for ns, name in sorted(r.absent)
                    ]
                resources.append(entry)
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "takenAt": rfc3339(taken_at),
            "takenBy": f"vgpuctl {version}",
            "resources": resources,
        }


def rfc3339(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def taken_at(doc: Mapping[str, Any]) -> float:
    """The snapshot's ``takenAt`` as seconds since the epoch (ValueError if it is no RFC 3339
    UTC time)."""
    text = doc.get("takenAt")
    if not isinstance(text, str):
        raise ValueError("takenAt: expected an RFC 3339 time")
    try:
        when = datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise ValueError(f"takenAt: {text[:40]!r} is not an RFC 3339 UTC time") from None
    return when.timestamp()


class SnapshotApi:
    """The ``ClusterApi`` port answered from a snapshot document (already checked against its
    schema): lists and gets as they were answered when it was taken; writes and watches
    refused. A read the snapshot did not record is a :class:`ClusterError` naming the file."""

    def __init__(self, doc: Mapping[str, Any], *, source: str) -> None:
        self._source = source
        self._resources: dict[Key, _Resource] = {}
        for entry in doc["resources"]:
            r = _Resource()
            r.served = bool(entry["served"])
            r.complete = bool(entry["complete"])
            r.forbidden = str(entry.get("forbidden") or "")
            r.namespaces = set(entry.get("namespaces", ()))
            for item in entry["items"]:
                r.items[_ident(item)] = item
            r.absent = {(str(a["namespace"]), str(a["name"])) for a in entry.get("absent", ())}
            self._resources[(entry["group"], entry["version"], entry["plural"])] = r

    def _resource(self, group: str, version: str, plural: str, what: str) -> _Resource:
        r = self._resources.get((group, version, plural))
        if r is None:
            raise ClusterError(
                f"{self._source}: the snapshot has no {_key(group, version, plural)} "
                f"({what}): take it again with this version of vgpuctl "
                "(vgpuctl export --observed cluster -o snapshot)"
            )
        if not r.served:
            raise ResourceMissingError(
                f"{_key(group, version, plural)} was not served when {self._source} was taken"
            )
        if r.forbidden:
            raise ForbiddenError(r.forbidden)
        return r

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
        r = self._resource(group, version, plural, "a list")
        whole = r.complete or (namespace is not None and namespace in r.namespaces)
        if not whole or label_selector or field_selector:
            raise ClusterError(
                f"{self._source}: the snapshot cannot answer a list of "
                f"{_key(group, version, plural)}"
                + (
                    f" selected by {selector!r}"
                    if (selector := label_selector or field_selector)
                    else ""
                )
            )
        return [
            copy.deepcopy(item)
            for (ns, _), item in r.items.items()
            if namespace is None or ns == namespace
        ]

    def list_collection(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        namespace: str | None = None,
        label_selector: str = "",
    ) -> ObjectList:
        return ObjectList(
            items=self.list_objects(
                group=group,
                version=version,
                plural=plural,
                namespace=namespace,
                label_selector=label_selector,
            )
        )

    def get_object(
        self, *, group: str, version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        r = self._resource(group, version, plural, f"a get of {name!r}")
        ident = (namespace or "", name)
        found = r.items.get(ident)
        if found is not None:
            return copy.deepcopy(found)
        if r.complete or ident in r.absent or (namespace or "") in r.namespaces:
            return None
        raise ClusterError(
            f"{self._source}: the snapshot did not record {_key(group, version, plural)} "
            f"{'/'.join(filter(None, ident))}"
        )

    def watch_objects(self, **_: Any) -> WatchStream:
        raise ClusterError(f"{self._source}: a snapshot cannot be watched")

    def _read_only(self, **_: Any) -> dict[str, Any]:
        raise ClusterError(f"{self._source}: a snapshot is read-only")

    create_object = replace_object = patch_object = replace_status = _read_only

    def delete_object(self, **_: Any) -> None:
        raise ClusterError(f"{self._source}: a snapshot is read-only")


def check_items(doc: Mapping[str, Any]) -> Sequence[str]:
    """Each item of each resource must be an object with a name (what the schema, checked
    without the items for speed, leaves to this)."""
    problems = []
    for i, entry in enumerate(doc["resources"]):
        for j, item in enumerate(entry["items"]):
            meta = item.get("metadata") if isinstance(item, dict) else None
            if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
                problems.append(f"resources[{i}].items[{j}]: expected an object with metadata.name")
                if len(problems) >= 5:
                    return problems
    return problems
