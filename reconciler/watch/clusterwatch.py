"""The cluster as the watch mode follows it: list once, then watch, never a list per rescan.

Each collection a node's reconcile depends on is kept current in memory by a thread of its own,
the way client-go's reflector does it: a list (in pages) gives the objects and the version to
watch from; the watch's events keep the copy current and move that version on (bookmarks move
it while only objects the watch does not select change: the API server's watch cache sends one
2 s before the watch's deadline and about every minute, with the version of the resource's last
event); a ``410 Gone`` (the version was compacted, or is older than the resource's watch cache,
which a change to its CRD rebuilds) lists again; a lost connection or a refused request waits
(exponential backoff with jitter, 1 s doubling to 60 s) and watches again from the last version.
The server ends every watch after :data:`WATCH_TIMEOUT_S` and the thread watches again from
where it was, so a watch never outlives a silently dead connection by long.

Collections (issue 12, item 5):

- this node's SRIOVGPUDevices and VGPUDevices (label ``nodename``) and this node's
  VGPUNodeState: by resourceVersion, so any write (ours, a hand edit, a deletion) is a change;
- the other nodes' VGPUNodeStates: only the profiles each shows configured (what this node's
  KubeVirt allow-list depends on), so another node's vGPU going in or out of use does not make
  every node of the fleet reconcile;
- the KubeVirt CR (all namespaces, or the one pinned): by resourceVersion.

:meth:`ClusterWatch.signature` is what the loop's :class:`~reconciler.watch.changes.ClusterDrift`
compares between rescans: computed from memory, no request. While a collection is not in sync
(not listed yet, or its last attempt failed) it raises that failure, so the loop reports the
cluster as unreadable rather than taking a stale copy for the truth.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
from collections.abc import Callable, Mapping
from typing import Any

from reconciler.model import ClusterError, ExpiredError, ReconcilerError, ResourceMissingError
from reconciler.model.cluster import (
    GROUP,
    KUBEVIRT_GROUP,
    KUBEVIRT_PLURAL,
    KUBEVIRT_VERSION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NODE_LABEL,
    NODE_STATE_GROUP,
    NODE_STATE_PLURAL,
    NODE_STATE_VERSION,
    SRIOV_GPU_PLURAL,
    VERSION,
    VGPU_PLURAL,
)
from reconciler.model.clusterapi import ClusterApi, WatchEvent, WatchStream
from reconciler.model.nodestate import configured_profiles
from reconciler.model.record import record

log = logging.getLogger("vgpuctl.watch")

#: How long the server keeps one watch open (it ends it; the thread watches again).
WATCH_TIMEOUT_S = 300
#: Backoff after a failure: first wait, ceiling.
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
#: The most objects one collection holds in memory (work is bounded).
MAX_OBJECTS = 1_000_000

#: What an object contributes to the signature: its key and a digest-worthy text, or None
#: to leave it out.
Projection = Callable[[Mapping[str, Any]], str | None]


@record(frozen=True, slots=True)
class Collection:
    """One collection to follow and what of each object matters."""

    name: str  # for logs: "this node's VGPUDevices"
    group: str
    version: str
    plural: str
    namespace: str | None = None
    label_selector: str = ""
    project: Projection | None = None  # None: the resourceVersion


def collections(node: str, *, kubevirt_namespace: str | None = None) -> tuple[Collection, ...]:
    """What a node's reconcile depends on in the cluster."""
    mine = f"{NODE_LABEL}={node}"
    return (
        Collection("this node's SRIOVGPUDevices", GROUP, VERSION, SRIOV_GPU_PLURAL, None, mine),
        Collection("this node's VGPUDevices", GROUP, VERSION, VGPU_PLURAL, None, mine),
        Collection(
            "the nodes' VGPUNodeStates",
            NODE_STATE_GROUP,
            NODE_STATE_VERSION,
            NODE_STATE_PLURAL,
            project=lambda obj: _node_state_projection(obj, node),
        ),
        Collection(
            "the KubeVirt CR", KUBEVIRT_GROUP, KUBEVIRT_VERSION, KUBEVIRT_PLURAL, kubevirt_namespace
        ),
    )


def delegate_collections() -> tuple[Collection, ...]:
    """What delegate mode's reconcile depends on: Harvester's two vGPU kinds, every node's
    (the desired state names the nodes; pcidevices-controller writes their status)."""
    return (
        Collection("the SRIOVGPUDevices", GROUP, VERSION, SRIOV_GPU_PLURAL),
        Collection("the VGPUDevices", GROUP, VERSION, VGPU_PLURAL),
    )


def _node_state_projection(obj: Mapping[str, Any], node: str) -> str | None:
    """This node's summary by version (a hand edit is a change); another node's by the
    profiles it shows configured, and only when it is vgpuctl's."""
    meta = _meta(obj)
    if meta.get("name") == node:
        return f"rv={meta.get('resourceVersion')}"
    labels = meta.get("labels")
    if not isinstance(labels, Mapping) or labels.get(MANAGED_BY_LABEL) != MANAGED_BY:
        return None
    status = obj.get("status")
    if not isinstance(status, Mapping):
        return "profiles="
    profiles = configured_profiles(status)
    # The kind of each GPU too: a profile moving between mdev and vfio GPUs changes which
    # KubeVirt allow-list it belongs in (mediatedDevices or pciHostDevices).
    gpus = status.get("gpus")
    kinds = sorted(
        f"{g.get('address')}:{g.get('interface')}:{_vf_device(g)}"
        for g in (gpus if isinstance(gpus, list | tuple) else ())
        if isinstance(g, Mapping)
    )
    return "profiles=" + ",".join(sorted(profiles)) + ";kinds=" + ",".join(kinds)


def _vf_device(gpu: Mapping[str, Any]) -> object:
    sriov = gpu.get("sriov")
    return sriov.get("vfDevice") if isinstance(sriov, Mapping) else None


class _Follower:
    """One collection, kept current by list-then-watch in a daemon thread."""

    def __init__(
        self,
        api: ClusterApi,
        spec: Collection,
        *,
        on_change: Callable[[], None],
        stopping: threading.Event,
        rng: Callable[[], float],
    ) -> None:
        self.api = api
        self.spec = spec
        self._on_change = on_change
        self._stopping = stopping
        self._rng = rng
        self._lock = threading.Lock()
        self._objects: dict[tuple[str, str], str] = {}  # (namespace, name) → projection
        self._served = True
        self._synced = False
        self._failure: ReconcilerError | None = None
        self._stream: WatchStream | None = None
        #: Set once the collection is followed (listed and watched), not served, or failed.
        self.tried = threading.Event()
        self.lists = 0  # how many times the collection was listed (tests, logs)
        self.watches = 0
        self.thread = threading.Thread(
            target=self._run, name=f"vgpuctl-watch-{spec.plural}", daemon=True
        )

    # -- read by the loop ---------------------------------------------------------------------

    def state(self) -> tuple[str, ...]:
        """The collection's part of the signature; raises while it is not in sync."""
        with self._lock:
            if not self._synced:
                raise self._failure or ClusterError(f"{self.spec.name}: not listed yet")
            if not self._served:
                return (self.spec.plural, "not served")
            return (
                self.spec.plural,
                *(f"{k[0]}/{k[1]}@{v}" for k, v in sorted(self._objects.items())),
            )

    def close(self) -> None:
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.close()

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        version = ""
        delay = 0.0
        while not self._stopping.is_set():
            if delay and self._stopping.wait(delay):
                return
            try:
                if not version:
                    version = self._list()
                version = self._watch(version)
                delay = 0.0
            except ExpiredError:
                log.info("%s: the watch's version expired: listing again", self.spec.name)
                version, delay = "", 0.0
            except ResourceMissingError as e:
                self._set(served=False, synced=True, failure=None)
                self.tried.set()
                version, delay = "", self._next(delay)
                log.debug("%s: %s", self.spec.name, e.message)
            except ReconcilerError as e:
                if self._stopping.is_set():
                    return
                self._fail(e)
                delay = self._next(delay)
            except Exception as e:  # a bug must not kill the thread silently: report, retry
                if self._stopping.is_set():
                    return
                self._fail(ClusterError(f"{self.spec.name}: {type(e).__name__}: {e}"))
                delay = self._next(delay)

    def _next(self, delay: float) -> float:
        base = min(BACKOFF_MAX_S, delay * 2 if delay else BACKOFF_FIRST_S)
        return base * (0.5 + self._rng() / 2)  # jitter: a fleet does not reconnect in step

    def _list(self) -> str:
        spec = self.spec
        listed = self.api.list_collection(
            group=spec.group,
            version=spec.version,
            plural=spec.plural,
            namespace=spec.namespace,
            label_selector=spec.label_selector,
        )
        objects: dict[tuple[str, str], str] = {}
        for item in listed.items:
            key, value = self._key(item), self._project(item)
            if key is not None and value is not None:
                objects[key] = value
        if len(objects) > MAX_OBJECTS:
            raise ClusterError(f"{spec.name}: more than {MAX_OBJECTS} objects")
        with self._lock:
            self.lists += 1
            changed = not self._synced or objects != self._objects or not self._served
            self._objects = objects
        self._set(served=True, synced=True, failure=None)
        if changed:
            self._on_change()
        return listed.resource_version

    def _watch(self, version: str) -> str:
        spec = self.spec
        stream = self.api.watch_objects(
            group=spec.group,
            version=spec.version,
            plural=spec.plural,
            namespace=spec.namespace,
            label_selector=spec.label_selector,
            resource_version=version,
            timeout_seconds=WATCH_TIMEOUT_S,
        )
        with self._lock:
            self._stream = stream
            self.watches += 1
        # Watching again from where it was: whatever changed meanwhile arrives as events.
        self._set(served=True, synced=True, failure=None)
        self.tried.set()
        try:
            for event in stream:
                if self._stopping.is_set():
                    break
                version = event.resource_version or version
                self._apply(event)
        finally:
            with self._lock:
                self._stream = None
            stream.close()
        self._set(served=True, synced=True, failure=None)
        return version

    def _apply(self, event: WatchEvent) -> None:
        if event.type == "BOOKMARK":
            return
        key = self._key(event.object)
        if key is None:
            return
        value = None if event.type == "DELETED" else self._project(event.object)
        with self._lock:
            before = self._objects.get(key)
            if value is None:
                self._objects.pop(key, None)
            else:
                if before is None and len(self._objects) >= MAX_OBJECTS:
                    raise ClusterError(f"{self.spec.name}: more than {MAX_OBJECTS} objects")
                self._objects[key] = value
        if before != value:
            self._on_change()

    def _key(self, obj: Mapping[str, Any]) -> tuple[str, str] | None:
        meta = _meta(obj)
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            return None
        return (str(meta.get("namespace") or ""), name)

    def _project(self, obj: Mapping[str, Any]) -> str | None:
        if self.spec.project is not None:
            return self.spec.project(obj)
        return f"rv={_meta(obj).get('resourceVersion')}"

    def _set(self, *, served: bool, synced: bool, failure: ReconcilerError | None) -> None:
        with self._lock:
            recovered = self._failure is not None and failure is None
            self._served, self._synced, self._failure = served, synced, failure
        if recovered:
            log.info("%s: in sync again", self.spec.name)

    def _fail(self, error: ReconcilerError) -> None:
        with self._lock:
            first = self._failure is None
            self._failure = error
            self._synced = False
        self.tried.set()
        if first:
            log.warning("%s: %s (retrying)", self.spec.name, error.message)


class ClusterWatch:
    """Every collection a node's reconcile depends on, followed by list-then-watch."""

    def __init__(
        self,
        api: ClusterApi,
        *,
        node: str = "",
        kubevirt_namespace: str | None = None,
        specs: tuple[Collection, ...] | None = None,
        on_change: Callable[[], None] | None = None,
        rng: Callable[[], float] = random.random,
    ) -> None:
        """The collections of ``node``'s reconcile, or ``specs`` when given."""
        if specs is None:
            specs = collections(node, kubevirt_namespace=kubevirt_namespace)
        self._stopping = threading.Event()
        self.followers = [
            _Follower(
                api,
                spec,
                on_change=on_change or (lambda: None),
                stopping=self._stopping,
                rng=rng,
            )
            for spec in specs
        ]

    def start(self, *, wait: float = 0.0) -> None:
        """Start following; with ``wait``, return once every collection is followed (listed
        and watched), not served, or failed its first attempt (at most ``wait`` seconds for
        each), so the first rescan compares what the cluster holds."""
        for follower in self.followers:
            follower.thread.start()
        for follower in self.followers:
            follower.tried.wait(wait)

    def stop(self, timeout: float = 5.0) -> None:
        """End every watch (closing its connection) and wait for the threads."""
        self._stopping.set()
        for follower in self.followers:
            follower.close()
        for follower in self.followers:
            if follower.thread.is_alive():
                follower.thread.join(timeout)

    def signature(self) -> str:
        """A digest of what the collections hold now (no request); raises the failure of a
        collection that is not in sync."""
        digest = hashlib.sha256()
        for follower in self.followers:
            for part in follower.state():
                digest.update(part.encode())
                digest.update(b"\0")
            digest.update(b"\1")
        return digest.hexdigest()


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}
