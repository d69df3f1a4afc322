"""The watch mode's view of the cluster (reconciler/watch/clusterwatch.py) over HTTP, through the
unmodified ``kubernetes`` client and the kube adapter, against the API-server emulator: list
once, then watch; bookmarks; 410 Gone lists again; a lost server is reconnected to with backoff;
and no request at all per rescan (issue 12, item 5)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.kube import KubernetesApi, connect
from reconciler.model import ClusterError
from reconciler.watch import clusterwatch
from reconciler.watch.clusterwatch import ClusterWatch
from tests.cluster_node import NODE_STATES, SRIOV, VGPUS, kubevirt_cr, register_crds
from tests.doubles.emulator import ApiServerEmulator, Request

NODE = "n1"
PATIENCE_S = 15.0


def vgpu(name: str, node: str = NODE, enabled: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "devices.harvesterhci.io/v1beta1",
        "kind": "VGPUDevice",
        "metadata": {"name": name, "labels": {"nodename": node}},
        "spec": {"address": "0000:08:00.4", "enabled": enabled, "nodeName": node},
    }


def summary(
    node: str, profiles: dict[str, int], *, in_use: int = 0, interface: str = ""
) -> dict[str, Any]:
    """A node's VGPUNodeState; ``interface``: its one GPU's (none: a summary without GPUs)."""
    gpus = [] if not interface else [
        {"address": "0000:08:00.0", "interface": interface, "sriov": {"vfDevice": "25b6"}}
    ]  # fmt: skip
    return {
        "apiVersion": "vgpu.reconciler.dev/v1alpha1",
        "kind": "VGPUNodeState",
        "metadata": {
            "name": node,
            "labels": {"nodename": node, "app.kubernetes.io/managed-by": "vgpuctl"},
        },
        "spec": {"nodeName": node},
        "status": {
            "counts": {"inUse": in_use},
            "profiles": [{"name": p, "wanted": n, "vgpus": n} for p, n in profiles.items()],
            **({"gpus": gpus} if gpus else {}),
        },
    }


@pytest.fixture
def emu() -> Iterator[ApiServerEmulator]:
    with ApiServerEmulator() as server:
        register_crds(server)
        server.seed(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "harvester-system"}}
        )
        server.seed(kubevirt_cr())
        server.seed(vgpu("n1-000008004"))
        server.seed(vgpu("n2-000008004", node="n2"))
        server.seed(summary("n2", {"NVIDIA A2-4Q": 1}))
        server.bookmark_interval = 0.2
        yield server


@pytest.fixture
def api(emu: ApiServerEmulator, tmp_path: Path) -> Iterator[KubernetesApi]:
    with connect(emu.kubeconfig(tmp_path / "kubeconfig"), timeout=5.0) as client:
        yield client


@pytest.fixture
def follow(api: KubernetesApi) -> Iterator[Callable[..., ClusterWatch]]:
    started: list[ClusterWatch] = []

    def start(**kwargs: Any) -> ClusterWatch:
        watch = ClusterWatch(api, node=NODE, rng=lambda: 0.5, **kwargs)
        watch.start(wait=PATIENCE_S)
        started.append(watch)
        return watch

    yield start
    for watch in started:
        watch.stop()


def eventually(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.02)


def changes_to(watch: ClusterWatch, before: str) -> Callable[[], bool]:
    def changed() -> bool:
        try:
            return watch.signature() != before
        except ClusterError:
            return False

    return changed


def lists(emu: ApiServerEmulator) -> list[Request]:
    return [r for r in emu.requests if r.verb == "list"]


def test_one_list_per_collection_then_watches_and_no_request_per_rescan(
    emu: ApiServerEmulator, follow: Callable[..., ClusterWatch]
) -> None:
    emu.requests.clear()
    watch = follow()
    assert sorted((r.group, r.resource) for r in lists(emu)) == sorted(
        [
            ("devices.harvesterhci.io", "sriovgpudevices"),
            ("devices.harvesterhci.io", "vgpudevices"),
            ("vgpu.reconciler.dev", "vgpunodestates"),
            ("kubevirt.io", "kubevirts"),
        ]
    )
    eventually(lambda: all(f.watches for f in watch.followers), "every collection watched")
    before = len(emu.requests)
    signatures = {watch.signature() for _ in range(50)}  # fifty rescans
    assert len(signatures) == 1
    time.sleep(0.6)  # bookmarks arrive meanwhile (every 0.2 s here): they change nothing
    assert watch.signature() in signatures
    assert [r for r in emu.requests[before:] if r.verb != "watch"] == []


@pytest.mark.parametrize(
    ("change", "what"),
    [
        (lambda emu: emu.seed(vgpu("n1-000008004", enabled=True)), "this node's object edited"),
        (lambda emu: emu.seed(vgpu("n1-000008005")), "this node's object created"),
        (lambda emu: emu.delete_object(*VGPUS, "n1-000008004"), "this node's object deleted"),
        (lambda emu: emu.seed(summary("n2", {"NVIDIA A2-8Q": 1})), "another node's profiles"),
        (
            # The same profile, now on a vfio GPU: it moves to pciHostDevices in the allow-list.
            lambda emu: emu.seed(summary("n2", {"NVIDIA A2-4Q": 1}, interface="vfio")),
            "another node's profile changes kind",
        ),
        (lambda emu: emu.seed(summary(NODE, {})), "this node's summary written"),
        (
            lambda emu: emu.seed(
                {**kubevirt_cr(), "metadata": {**kubevirt_cr()["metadata"], "labels": {"x": "y"}}}
            ),
            "the KubeVirt CR edited",
        ),
    ],
    ids=[
        "edited",
        "created",
        "deleted",
        "profiles-elsewhere",
        "kind-elsewhere",
        "own-summary",
        "kubevirt",
    ],
)
def test_what_a_reconcile_depends_on_changes_the_signature(
    emu: ApiServerEmulator,
    follow: Callable[..., ClusterWatch],
    change: Callable[[ApiServerEmulator], None],
    what: str,
) -> None:
    watch = follow()
    before = watch.signature()
    change(emu)
    eventually(changes_to(watch, before), what)


def test_what_no_reconcile_depends_on_does_not(
    emu: ApiServerEmulator, follow: Callable[..., ClusterWatch]
) -> None:
    watch = follow()
    eventually(lambda: all(f.watches for f in watch.followers), "every collection watched")
    before = watch.signature()
    # Another node's object, and another node's vGPU going into use (its profiles unchanged):
    # the fleet does not reconcile for them.
    emu.seed(vgpu("n2-000008004", node="n2", enabled=True))
    emu.seed(summary("n2", {"NVIDIA A2-4Q": 1}, in_use=1))
    emu.seed(vgpu("n1-000008006"))  # a marker this node does depend on, written last
    eventually(changes_to(watch, before), "the marker seen")
    emu.delete_object(*VGPUS, "n1-000008006")
    eventually(lambda: watch.signature() == before, "back to the start")


def test_a_watch_of_a_compacted_version_lists_again(
    emu: ApiServerEmulator, follow: Callable[..., ClusterWatch], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(clusterwatch, "WATCH_TIMEOUT_S", 1)
    watch = follow()
    vgpus = next(f for f in watch.followers if f.spec.plural == "vgpudevices")
    assert vgpus.lists == 1
    # The watch ends (its timeout), a write and a compaction happen before it watches again
    # from its version: 410 Gone, so it lists again, and has the write.
    emu.bookmark_interval = 3600.0  # no bookmark moves its version past the compaction
    before = watch.signature()
    ended = vgpus.watches
    eventually(lambda: vgpus.watches > ended, "a second watch")
    emu.seed(vgpu("n1-000008007"))
    emu.compact()
    eventually(lambda: vgpus.lists >= 2, "listed again after 410")
    eventually(changes_to(watch, before), "the write seen")


def test_an_outage_is_reported_then_followed_again_with_backoff(
    emu: ApiServerEmulator, follow: Callable[..., ClusterWatch], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(clusterwatch, "BACKOFF_FIRST_S", 0.05)
    monkeypatch.setattr(clusterwatch, "BACKOFF_MAX_S", 0.2)
    watch = follow()
    before = watch.signature()
    emu.stop()

    def reported() -> bool:
        try:
            watch.signature()
        except ClusterError:
            return True
        return False

    eventually(reported, "the outage reported")
    emu.start()
    emu.seed(vgpu("n1-000008005"))
    eventually(changes_to(watch, before), "following again, the write seen")


def test_without_kubevirt_installed_the_collection_is_a_state(
    tmp_path: Path,
) -> None:
    with ApiServerEmulator() as server:
        # Our CRDs only: kubevirts.kubevirt.io is not served.
        from tests.cluster_node import install_crds

        install_crds(server)
        with connect(server.kubeconfig(tmp_path / "kubeconfig"), timeout=5.0) as client:
            watch = ClusterWatch(client, node=NODE, rng=lambda: 0.5)
            watch.start(wait=PATIENCE_S)
            try:
                first = watch.signature()
                assert first == watch.signature()
                kubevirt = next(f for f in watch.followers if f.spec.plural == "kubevirts")
                assert kubevirt.state() == ("kubevirts", "not served")
            finally:
                watch.stop()


def test_stop_ends_every_watch_promptly(
    follow: Callable[..., ClusterWatch],
) -> None:
    watch = follow()
    eventually(lambda: all(f.watches for f in watch.followers), "every collection watched")
    started = time.monotonic()
    watch.stop()
    assert not any(f.thread.is_alive() for f in watch.followers)
    assert time.monotonic() - started < PATIENCE_S


def test_the_objects_read_are_the_ones_of_this_node_and_the_summaries(
    emu: ApiServerEmulator, follow: Callable[..., ClusterWatch]
) -> None:
    """Selectors: this node's Harvester objects only; every summary (small, one per node)."""
    watch = follow()
    by_plural = {f.spec.plural: f for f in watch.followers}
    assert by_plural["vgpudevices"].state() == (
        "vgpudevices",
        "/n1-000008004@" + _rv(emu, "n1-000008004"),
    )
    assert by_plural["vgpunodestates"].state() == (
        "vgpunodestates",
        "/n2@profiles=NVIDIA A2-4Q;kinds=",
    )
    assert SRIOV and NODE_STATES  # the tuples the tests share


def _rv(emu: ApiServerEmulator, name: str) -> str:
    obj = emu.get_object(*VGPUS, name)
    assert obj is not None
    return f"rv={obj['metadata']['resourceVersion']}"
