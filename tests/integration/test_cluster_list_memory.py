"""A fleet's objects read in bounded memory (issue 33, item 6): the adapter converts each list
page's items as the page is read (``KubernetesApi.list_each``), the cluster observer keeps a
record of each object and never the collection as JSON, and the records share what the objects
repeat. Over HTTP, through the unmodified ``kubernetes`` client, against the API-server
emulator (tests/doubles/emulator.py).

Structural checks, not timed ones: how many decoded list items are alive at once is counted
(a probe object hung on each item once converted, counted while alive), so the test says the
same on a busy machine; the memory a fleet saves is the benchmark's (tests/bench/cluster_fleet.py,
``docs/performance.md``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from reconciler.kube import KubernetesApi, connect
from reconciler.model import ClusterError
from reconciler.model.cluster import (
    GROUP,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NODE_LABEL,
    VERSION,
    VGPU_KIND,
    KubeObject,
)
from reconciler.model.clusterapi import list_each
from reconciler.observe.cluster import FleetReader, observe_cluster
from tests.doubles.cluster import FakeCluster
from tests.doubles.emulator import ApiServerEmulator

REPO = Path(__file__).resolve().parents[2]
VGPUS = {"group": GROUP, "version": VERSION, "plural": "vgpudevices"}
#: Items a list page in these tests (monkeypatched over the adapter's 2,000).
PAGE = 4
PARENT_LABEL = "harvesterhci.io/parentSRIOVGPUDevice"


@pytest.fixture
def emu() -> Iterator[ApiServerEmulator]:
    with ApiServerEmulator() as server:
        for path in sorted((REPO / "schemas" / "crds").glob("*.yaml")):
            server.register_crd(yaml.safe_load(path.read_text()))
        yield server


@pytest.fixture
def api(
    emu: ApiServerEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[KubernetesApi]:
    import reconciler.kube.api as kube_api

    monkeypatch.setattr(kube_api, "PAGE", PAGE)
    with connect(emu.kubeconfig(tmp_path), timeout=5) as adapter:
        yield adapter


def vgpu_device(node: str, gpu: str, vf: str, **labels: Any) -> dict[str, Any]:
    """A VGPUDevice as Harvester's schema has it (pcidevices ``pkg/apis/devices.harvesterhci.io
    /v1beta1/vgpudevice.go``: spec address, enabled, nodeName, parentGPUDeviceAddress,
    vGPUTypeName), labelled with its node and parent as pcidevices labels it."""
    slot = gpu.split(":")[1]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": VGPU_KIND,
        "metadata": {
            "name": f"{node}-0000{slot}00{vf[-1]}",
            "labels": {
                NODE_LABEL: node,
                PARENT_LABEL: f"{node}-0000{slot}000",
                MANAGED_BY_LABEL: MANAGED_BY,
                **labels,
            },
        },
        "spec": {
            "address": vf,
            "enabled": True,
            "nodeName": node,
            "parentGPUDeviceAddress": gpu,
            "vGPUTypeName": "NVIDIA L40S-8Q",
        },
        "status": {"vGPUStatus": "vGPUConfigured", "configureVGPUTypeName": "NVIDIA L40S-8Q"},
    }


#: Two GPUs of four VFs each.
LAYOUT = {
    "0000:08:00.0": ["0000:08:00.4", "0000:08:00.5", "0000:08:00.6", "0000:08:00.7"],
    "0000:18:00.0": ["0000:18:00.4", "0000:18:00.5", "0000:18:00.6", "0000:18:00.7"],
}
NODES = [f"node-{i}" for i in range(5)]


def seed_fleet(emu: ApiServerEmulator) -> None:
    """Five nodes' VGPUDevices: 40 objects, ten list pages of four."""
    for node in NODES:
        for gpu, vfs in LAYOUT.items():
            for vf in vfs:
                emu.seed(vgpu_device(node, gpu, vf))


class Probe:
    """Hung on a decoded list item once it is converted: alive as long as the item is."""

    alive: ClassVar[int] = 0
    most: ClassVar[int] = 0

    def __init__(self) -> None:
        Probe.alive += 1
        Probe.most = max(Probe.most, Probe.alive)

    def __del__(self) -> None:
        Probe.alive -= 1


@pytest.fixture
def probed(monkeypatch: pytest.MonkeyPatch) -> type[Probe]:
    """Every item the observer makes a record of gets a :class:`Probe` (after the record is
    made, so the record is as it would be); :attr:`Probe.most`: the most alive at once."""
    Probe.alive = Probe.most = 0
    made = KubeObject.from_json.__func__  # type: ignore[attr-defined]

    def from_json(cls: type[KubeObject], raw: Any, *, take: bool = False) -> KubeObject:
        obj: KubeObject = made(cls, raw, take=take)
        if take and isinstance(raw, dict):
            raw["probe"] = Probe()
        return obj

    monkeypatch.setattr(KubeObject, "from_json", classmethod(from_json))
    return Probe


def test_a_fleet_readers_vgpudevices_are_never_all_held_as_json(
    api: KubernetesApi, emu: ApiServerEmulator, probed: type[Probe]
) -> None:
    """The decoded items of at most one page are alive at once: each item is made a record
    as its page is read, and let go then (before: every item of the list was kept until the
    last page was read, all 40 here; 256,000 at 1,000 nodes)."""
    seed_fleet(emu)
    observed = FleetReader(api).observe(NODES)
    assert probed.most <= PAGE, f"{probed.most} decoded items alive at once"
    # Every node was read all the same (each without a VGPUNodeState maps to its error: only
    # the VGPUDevices are looked at here).
    assert sorted(observed) == NODES
    listed = list_each(api, lambda item: item["metadata"]["name"], **VGPUS)
    assert len(listed) == len(NODES) * 8


def test_list_each_converts_each_page_as_it_is_read(
    api: KubernetesApi, emu: ApiServerEmulator
) -> None:
    seed_fleet(emu)
    emu.requests.clear()
    served: list[int] = []  # list requests the server had answered at each conversion

    def convert(item: dict[str, Any]) -> str:
        served.append(sum(1 for r in emu.requests if r.verb == "list"))
        return str(item["metadata"]["name"])

    names = api.list_each(convert, **VGPUS)
    # The list's order, every item once.
    assert names == sorted(o["metadata"]["name"] for o in emu.objects(*VGPUS.values()))
    assert len(names) == 40
    # The first page's items are converted before the rest are read: by then the server has
    # answered the first page and at most the one asked for ahead, never all ten.
    assert served[0] <= 2
    assert sum(1 for r in emu.requests if r.verb == "list") == 10


def test_list_each_keeps_the_bound_and_its_errors(
    api: KubernetesApi, emu: ApiServerEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    import reconciler.kube.api as kube_api

    seed_fleet(emu)
    monkeypatch.setattr(kube_api, "MAX_ITEMS", 10)
    converted: list[str] = []
    with pytest.raises(ClusterError) as err:
        api.list_each(lambda item: converted.append(item["metadata"]["name"]), **VGPUS)
    assert err.value.message == (
        "list vgpudevices.devices.harvesterhci.io: more than 10 items; refusing to read on"
    )
    # Refused before the page past the bound is converted: 8 items of two pages, not 12.
    assert len(converted) == 8


def test_list_each_over_a_port_without_it_converts_the_listed_items() -> None:
    """A port that lists in memory (the fakes) gives the same items, converted after."""
    fake = FakeCluster()
    for gpu, vfs in LAYOUT.items():
        for vf in vfs:
            fake.put("vgpudevices", vgpu_device("node-0", gpu, vf))
    names = list_each(fake, lambda item: item["metadata"]["name"], **VGPUS)
    assert sorted(names) == sorted(o["metadata"]["name"] for o in fake.list_objects(**VGPUS))
    assert len(names) == 8


def test_a_fleet_readers_records_share_their_label_sets(
    api: KubernetesApi, emu: ApiServerEmulator
) -> None:
    """Equal label sets are one read-only mapping: one per GPU, not one per VF. Values read
    are as stored."""
    seed_fleet(emu)
    # A label set no API server keeps (a value that is no text): kept as read, not shared.
    odd = vgpu_device("node-4", "0000:28:00.0", "0000:28:00.4")
    odd["metadata"]["labels"]["odd"] = ["a", "list"]
    emu.seed(odd)
    mine = observe_cluster(api, node="node-0").vgpu_devices
    theirs = observe_cluster(api, node="node-4").vgpu_devices
    a, b = mine["node-0-000008004"], mine["node-0-000008005"]
    other_gpu = mine["node-0-000018004"]
    # One GPU's VFs: one label set.
    assert a.labels is b.labels
    assert dict(a.labels) == {
        NODE_LABEL: "node-0",
        PARENT_LABEL: "node-0-000008000",
        MANAGED_BY_LABEL: MANAGED_BY,
    }
    assert a.labels is not other_gpu.labels
    assert other_gpu.labels[PARENT_LABEL] == "node-0-000018000"
    assert a.spec["address"] == "0000:08:00.4"
    assert a.spec["enabled"] is True
    odd_record = theirs["node-4-000028004"]
    assert odd_record.labels["odd"] == ["a", "list"]
    assert odd_record.labels[NODE_LABEL] == "node-4"
    # Every record as the API server has it.
    for record in [*mine.values(), *theirs.values()]:
        stored = emu.get_object(*VGPUS.values(), record.name)
        assert stored is not None
        assert record.kind == VGPU_KIND
        assert dict(record.labels) == stored["metadata"]["labels"]
        assert dict(record.spec) == stored["spec"]
        assert dict(record.status) == stored["status"]
        assert record.resource_version == stored["metadata"]["resourceVersion"]
