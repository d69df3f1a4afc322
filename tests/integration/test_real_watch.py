"""A watch from a resourceVersion the server no longer keeps: vgpuctl's kube adapter gets 410
(:class:`~reconciler.model.errors.ExpiredError`), lists again and watches on from the list's
version, against the emulator and the real kube-apiserver alike (the ``api_server`` fixture;
the real one is ``just test-real``).

History is dropped on purpose: the emulator's ``compact``; on the real server, etcd compacted
(``RealApiServer.compact``) under a resource served without a watch cache (a watch cache keeps
its own window of events, which only time and traffic move on; its 410 is the same Status).

A watched resource *with* a watch cache meets 410 when that cache is rebuilt: a change to its CRD
(Harvester's pcidevices-controller re-applies its CRDs at every start) makes the API server drop
the resource's storage, its watches end, and the new cache starts at a newer version
(``api_servers.reapply_crd``): the agent's own watch code (``ClusterWatch``) lists again and
misses nothing. Bookmarks, as the watch cache sends them: 2 s before a watch's deadline (or a
minute after the last), carrying the version of the resource's last event, which a change the
watch's selector leaves out moves too, and only when that is newer than where the watch began;
the version a bookmark carries is a place to watch on from."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from reconciler.kube import connect
from reconciler.model.errors import ClusterError, ExpiredError
from reconciler.watch import clusterwatch
from reconciler.watch.clusterwatch import ClusterWatch
from tests.api_servers import (
    WATCH_PROBES,
    Served,
    harvester_cluster,
    preserving_crd,
    reapply_crd,
)

GROUP, VERSION, PLURAL = WATCH_PROBES
DEVICES, V1BETA1 = "devices.harvesterhci.io", "v1beta1"
NODE = "harvester-kgd9c"
PATIENCE_S = 30.0


def vgpu(name: str, node: str = NODE, enabled: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": f"{DEVICES}/{V1BETA1}",
        "kind": "VGPUDevice",
        "metadata": {"name": name, "labels": {"nodename": node}},
        "spec": {"address": "0000:08:00.4", "enabled": enabled, "nodeName": node},
    }


def eventually(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.05)


def probe(name: str, n: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "WatchProbe",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"n": n},
    }


def test_a_watch_from_a_compacted_version_is_410_and_a_relist_resumes(api_server: Served) -> None:
    api_server.install_crd(preserving_crd(GROUP, VERSION, PLURAL, "WatchProbe"))
    custom = api_server.custom
    where = {"group": GROUP, "version": VERSION, "plural": PLURAL, "namespace": "default"}
    created = custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, probe("a", 0)
    )
    old = created["metadata"]["resourceVersion"]
    latest = old
    for n in range(1, 4):
        latest = custom.replace_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, "a",
            {**probe("a", n), "metadata": {**probe("a", n)["metadata"], "resourceVersion": latest}},
        )["metadata"]["resourceVersion"]  # fmt: skip
    if api_server.emulator is not None:
        api_server.emulator.compact()
    else:
        assert api_server.real is not None
        api_server.real.compact(int(latest))

    api = connect(api_server.kubeconfig_path, timeout=30)
    with pytest.raises(ExpiredError) as expired:
        for _ in api.watch_objects(**where, resource_version=old, timeout_seconds=5):
            pass
    # etcd's answer, not the watch cache's (k8s.io/apiserver v0.37 pkg/storage/etcd3/errors.go,
    # interpretWatchError: ErrCompacted)
    assert expired.value.message.endswith(
        ": 410 Gone: The resourceVersion for the provided watch is too old."
    ), expired.value.message
    listed = api.list_collection(**where)
    assert [o["spec"] for o in listed.items] == [{"n": 3}]
    stream = api.watch_objects(**where, resource_version=listed.resource_version, timeout_seconds=5)
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "a", {"spec": {"n": 4}}
    )
    events = iter(stream)
    event = next(e for e in events if e.type != "BOOKMARK")
    assert (event.type, event.object["spec"]) == ("MODIFIED", {"n": 4})


def test_a_bookmark_carries_what_the_selector_left_out_and_is_a_place_to_resume(
    api_server: Served,
) -> None:
    """A watch of this node's VGPUDevices (a label selector, as the agent's) while another
    node's changes: 2 s before the watch's deadline a BOOKMARK carries that change's version
    (k8s.io/apiserver v0.37 cacher/cache_watcher.go nextBookmarkTime; cacher.go dispatchEvents
    sends the version of the resource's last event), before the stream ends. A watch from that
    version, with nothing newer, gets no bookmark (cache_watcher.go process: only events
    newer than where the watch began), and the change made next arrives on it."""
    harvester_cluster(api_server)
    custom = api_server.custom
    custom.create_cluster_custom_object(DEVICES, V1BETA1, "vgpudevices", vgpu(f"{NODE}-000008004"))
    api = connect(api_server.kubeconfig_path, timeout=30)
    where = {"group": DEVICES, "version": V1BETA1, "plural": "vgpudevices"}
    mine = f"nodename={NODE}"
    listed = api.list_collection(**where, label_selector=mine)
    started = time.monotonic()
    stream = api.watch_objects(
        **where, label_selector=mine, resource_version=listed.resource_version, timeout_seconds=6
    )
    theirs = custom.create_cluster_custom_object(
        DEVICES, V1BETA1, "vgpudevices", vgpu("harvester-other-000008004", node="harvester-other")
    )["metadata"]["resourceVersion"]
    seen = [(e.type, e.resource_version, time.monotonic() - started) for e in stream]
    ended = time.monotonic() - started
    assert seen, "no bookmark"
    # (the resource's last event: that change, unless the cache learnt of a later revision
    # from etcd meanwhile, which only moves it on)
    assert {kind for kind, _, _ in seen} == {"BOOKMARK"}
    assert int(seen[0][1]) >= int(theirs), seen
    assert seen[0][2] < ended - 1.0, f"the bookmark came with the end of the stream: {seen}"

    # Nothing newer than the bookmark's version: the next watch, from it, gets no bookmark;
    # this node's object edited meanwhile is its one event.
    resume = seen[-1][1]
    stream = api.watch_objects(
        **where, label_selector=mine, resource_version=resume, timeout_seconds=4
    )
    time.sleep(0.5)
    edited = custom.patch_cluster_custom_object(
        DEVICES, V1BETA1, "vgpudevices", f"{NODE}-000008004", {"spec": {"enabled": True}}
    )
    events = list(stream)
    first = events[0]
    assert (first.type, first.resource_version, first.object["spec"]["enabled"]) == (
        "MODIFIED",
        edited["metadata"]["resourceVersion"],
        True,
    )
    # (after it, a bookmark at most, of that very version)
    assert {(e.type, e.resource_version) for e in events[1:]} <= {
        ("BOOKMARK", edited["metadata"]["resourceVersion"])
    }
    idle = api.watch_objects(
        **where,
        label_selector=mine,
        resource_version=edited["metadata"]["resourceVersion"],
        timeout_seconds=4,
    )
    assert list(idle) == []


class HeldRewatch:
    """The kube adapter, but the second watch of ``plural`` waits until :meth:`release`: a test
    makes its changes while the agent's follower is between two watches (none sees them)."""

    def __init__(self, api: Any, plural: str) -> None:
        self.api, self.plural = api, plural
        self.watches = 0
        self.asking = threading.Event()
        self._gate = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)

    def watch_objects(self, **query: Any) -> Any:
        if query["plural"] == self.plural:
            self.watches += 1
            if self.watches == 2:
                self.asking.set()
                self._gate.wait(PATIENCE_S)
        return self.api.watch_objects(**query)

    def release(self) -> None:
        self._gate.set()


def test_the_agents_watch_lists_again_when_the_crd_is_reapplied_and_misses_nothing(
    api_server: Served, caplog: Any
) -> None:
    """The node agent's own watch code (``ClusterWatch``, as ``vgpuctl watch`` runs it) on a
    cached resource whose CRD is re-applied with a change: the API server tears the resource's
    storage down (apiextensions-apiserver customresource_handler.go
    updateCustomResourceDefinition, tearDown), the watch ends, the agent watches again from
    its last version and gets 410 ``too old resource version`` from the new watch cache
    (k8s.io/apiserver v0.37 cacher/watch_cache_history.go GetIntervalLocked), lists again, and
    has every change made meanwhile; later changes arrive by the watch (no more lists)."""
    harvester_cluster(api_server)
    custom = api_server.custom
    for name in ("000008004", "000008005"):
        custom.create_cluster_custom_object(DEVICES, V1BETA1, "vgpudevices", vgpu(f"{NODE}-{name}"))
    api = connect(api_server.kubeconfig_path, timeout=30)
    held = HeldRewatch(api, "vgpudevices")
    watch = ClusterWatch(held, node=NODE, rng=lambda: 0.5)
    caplog.set_level(logging.INFO, logger="vgpuctl.watch")
    try:
        watch.start(wait=PATIENCE_S)
        vgpus = next(f for f in watch.followers if f.spec.plural == "vgpudevices")
        eventually(lambda: vgpus.watches >= 1, "the VGPUDevices watched")
        assert vgpus.lists == 1

        def followed() -> set[str]:
            try:
                return set(vgpus.state()[1:])
            except ClusterError:
                return set()

        def stored() -> set[str]:
            listed = custom.list_cluster_custom_object(
                DEVICES, V1BETA1, "vgpudevices", label_selector=f"nodename={NODE}"
            )
            return {
                f"/{o['metadata']['name']}@rv={o['metadata']['resourceVersion']}"
                for o in listed["items"]
            }

        reapply_crd(api_server, "vgpudevices")
        # The watch ends; while the follower is between watches: one object edited, one
        # deleted, one created.
        assert held.asking.wait(PATIENCE_S), "the watch never ended"
        assert vgpus.lists == 1
        custom.patch_cluster_custom_object(
            DEVICES, V1BETA1, "vgpudevices", f"{NODE}-000008004", {"spec": {"enabled": True}}
        )
        custom.delete_cluster_custom_object(DEVICES, V1BETA1, "vgpudevices", f"{NODE}-000008005")
        custom.create_cluster_custom_object(
            DEVICES, V1BETA1, "vgpudevices", vgpu(f"{NODE}-000008006")
        )
        held.release()
        eventually(lambda: vgpus.lists >= 2, "listed again after 410")
        eventually(lambda: followed() == stored(), "every change held")
        assert [r.getMessage() for r in caplog.records if "listing again" in r.getMessage()] == [
            "this node's VGPUDevices: the watch's version expired: listing again"
        ]
        lists = vgpus.lists
        custom.patch_cluster_custom_object(
            DEVICES, V1BETA1, "vgpudevices", f"{NODE}-000008006", {"spec": {"enabled": True}}
        )
        eventually(lambda: followed() == stored(), "the next change held")
        assert vgpus.lists == lists  # by the watch
    finally:
        held.release()
        watch.stop()
        api.close()


class RecordedWatches:
    """The kube adapter, each watch of ``plural`` recorded: the version it starts from."""

    def __init__(self, api: Any, plural: str) -> None:
        self.api, self.plural = api, plural
        self.versions: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)

    def watch_objects(self, **query: Any) -> Any:
        if query["plural"] == self.plural:
            self.versions.append(query["resource_version"])
        return self.api.watch_objects(**query)


def test_the_agents_watch_resumes_from_the_version_a_bookmark_carried(
    api_server: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's follower of its node's VGPUDevices, its watches ended by the server after
    4 s: another node's VGPUDevice created meanwhile moves no object it holds, but the
    bookmark sent 2 s before the deadline carries its version, and the next watch starts from
    there, not from the list's version (no list again)."""
    monkeypatch.setattr(clusterwatch, "WATCH_TIMEOUT_S", 4)
    harvester_cluster(api_server)
    custom = api_server.custom
    custom.create_cluster_custom_object(DEVICES, V1BETA1, "vgpudevices", vgpu(f"{NODE}-000008004"))
    api = connect(api_server.kubeconfig_path, timeout=30)
    recorded = RecordedWatches(api, "vgpudevices")
    watch = ClusterWatch(recorded, node=NODE, rng=lambda: 0.5)
    try:
        watch.start(wait=PATIENCE_S)
        vgpus = next(f for f in watch.followers if f.spec.plural == "vgpudevices")
        eventually(lambda: len(recorded.versions) >= 1, "the VGPUDevices watched")
        before = watch.signature()
        theirs = custom.create_cluster_custom_object(
            DEVICES, V1BETA1, "vgpudevices", vgpu("harvester-other-000008004", "harvester-other")
        )["metadata"]["resourceVersion"]
        eventually(lambda: len(recorded.versions) >= 2, "the VGPUDevices watched again")
        assert int(recorded.versions[1]) >= int(theirs), recorded.versions
        assert int(recorded.versions[0]) < int(theirs)
        assert vgpus.lists == 1
        assert watch.signature() == before
    finally:
        watch.stop()
        api.close()
