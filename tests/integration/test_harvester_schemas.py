"""What Harvester's own CRDs (tests/fixtures/harvester-crds: pcidevices-controller installs them
at every start) do to vgpuctl's writes, through the strict emulator and the real client: only
Harvester's fields survive, which is why vgpuctl writes only those (its other facts are in its
own VGPUNodeState) and why its CRDs for the two kinds are Harvester's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.cluster_node import HARVESTER_CRDS, OUR_CRDS, install_crds
from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import REPO

GROUP, VERSION, PLURAL = "devices.harvesterhci.io", "v1beta1", "vgpudevices"


def api_with(crds: Path) -> Iterator[Any]:
    with ApiServerEmulator() as emulator:
        install_crds(emulator, crds)
        config = client.Configuration()
        config.host = emulator.url
        with client.ApiClient(config) as api:
            yield client.CustomObjectsApi(api)


@pytest.fixture
def harvester() -> Iterator[Any]:
    yield from api_with(HARVESTER_CRDS)


@pytest.fixture
def ours() -> Iterator[Any]:
    yield from api_with(OUR_CRDS)


def seed_object() -> dict[str, Any]:
    """The seed's VGPUDevice as Harvester shows it, without what the server sets."""
    obj: dict[str, Any] = yaml.safe_load(
        (REPO / "tests/fixtures/crds/seed-vgpudevice.yaml").read_text()
    )
    obj["metadata"] = {k: obj["metadata"][k] for k in ("name", "labels")}
    return obj


def write(api: Any, obj: dict[str, Any]) -> dict[str, Any]:
    """Create, then write the status through its subresource, as vgpuctl does."""
    created = api.create_cluster_custom_object(GROUP, VERSION, PLURAL, obj)
    created["status"] = obj["status"]
    return dict(
        api.replace_cluster_custom_object_status(
            GROUP, VERSION, PLURAL, obj["metadata"]["name"], created
        )
    )


def test_harvesters_schema_keeps_harvesters_fields_and_drops_vgpuctls(harvester: Any) -> None:
    obj = seed_object()
    obj["status"].update(vfIndex=0, inUse=False, holder="", availableTypes={})

    stored = write(harvester, obj)

    assert stored["spec"] == seed_object()["spec"]
    assert stored["status"] == {
        "configureVGPUTypeName": "NVIDIA A2-4A",
        "uuid": "dd6772a8-7db8-4e96-9a73-f94c389d9bc3",
        "vGPUStatus": "vGPUConfigured",
        "availableTypes": {},
    }


def test_harvesters_ui_disable_without_a_type_name_is_accepted(harvester: Any) -> None:
    obj = seed_object()
    del obj["spec"]["vGPUTypeName"]  # what the UI's "Disable" saves
    obj["spec"]["enabled"] = False
    created = harvester.create_cluster_custom_object(GROUP, VERSION, PLURAL, obj)
    assert "vGPUTypeName" not in created["spec"]


def test_our_crd_accepts_the_harvester_ui_disable_too(ours: Any) -> None:
    """Ours is Harvester's: it requires nothing either (before issue 12 it required every spec
    field, so with ours installed the UI's Disable was refused with a 422)."""
    obj = seed_object()
    del obj["spec"]["vGPUTypeName"]
    obj["spec"]["enabled"] = False
    ours.create_cluster_custom_object(GROUP, VERSION, PLURAL, obj)
