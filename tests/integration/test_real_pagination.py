"""vgpuctl's kube adapter reads a collection of thousands of objects in pages (``limit`` and
``continue``, reconciler/kube/api.py ``PAGE``) from the emulator and from the real kube-apiserver
alike (the ``api_server`` fixture; the real one is ``just test-real``): every object once, in
name order, at one resourceVersion, with or without a label selector."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import yaml

from reconciler.kube import connect
from reconciler.kube.api import PAGE
from tests.api_servers import Served
from tests.cluster_node import HARVESTER_CRDS

GROUP, VERSION, PLURAL = "devices.harvesterhci.io", "v1beta1", "vgpudevices"
#: More than two pages of the adapter's.
COUNT = 2 * PAGE + 500


def vgpu(i: int) -> dict[str, Any]:
    node = f"node-{i % 3}"
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VGPUDevice",
        "metadata": {"name": f"{node}-{i:05d}", "labels": {"nodename": node}},
        "spec": {"address": "0000:08:00.4", "enabled": False, "nodeName": node},
    }


def test_thousands_of_objects_are_read_in_pages_at_one_version(api_server: Served) -> None:
    api_server.install_crd(
        yaml.safe_load((HARVESTER_CRDS / "vgpudevices.devices.harvesterhci.io.yaml").read_text())
    )
    objects = [vgpu(i) for i in range(COUNT)]
    if api_server.emulator is not None:
        for obj in objects:
            api_server.emulator.seed(obj)
    else:
        create = api_server.custom.create_cluster_custom_object
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda obj: create(GROUP, VERSION, PLURAL, obj), objects))
    # The server pages a list of this size: a first page of PAGE objects and a token.
    first = api_server.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=PAGE)
    assert len(first["items"]) == PAGE and first["metadata"]["continue"]
    assert first["metadata"]["remainingItemCount"] == COUNT - PAGE

    api = connect(api_server.kubeconfig_path, timeout=60)
    listed = api.list_collection(group=GROUP, version=VERSION, plural=PLURAL)
    names = [o["metadata"]["name"] for o in listed.items]
    assert names == sorted(o["metadata"]["name"] for o in objects)
    assert listed.resource_version
    node_1 = api.list_collection(
        group=GROUP, version=VERSION, plural=PLURAL, label_selector="nodename=node-1"
    )
    assert [o["metadata"]["name"] for o in node_1.items] == [
        n for n in names if n.startswith("node-1-")
    ]
    if api_server.emulator is not None:  # each page is a list request, as RBAC sees it
        pages = [r for r in api_server.emulator.requests if r.verb == "list"]
        assert len(pages) == 1 + 3 + 1  # the test's own page, three, then one (1,500)
