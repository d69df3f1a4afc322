"""The simulator's KubeVirt virt-handler (reconciler/sim/virt_handler.py): the sweep rule of
docs/domain.md §10 (``removeUndesiredMDEVs``, KubeVirt's
pkg/virt-handler/device-manager/mediated_devices_types.go), values by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reconciler.sim import build_host, hold
from reconciler.sim.state import load_state
from reconciler.sim.virt_handler import handling_disabled, kept_types, sweep


def _cr(configuration: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"configuration": configuration}}


def test_only_external_entries_and_the_wanted_types_of_this_node_are_kept() -> None:
    cr = _cr(
        {
            "permittedHostDevices": {
                "mediatedDevices": [
                    {"mdevNameSelector": "NVIDIA A2-4Q", "externalResourceProvider": True},
                    # Not external: KubeVirt's own plugin would serve it, the sweep removes it.
                    {"mdevNameSelector": "NVIDIA A2-4A", "resourceName": "nvidia.com/x"},
                    {"mdevNameSelector": "NVIDIA A2-2Q", "externalResourceProvider": False},
                ],
                "pciHostDevices": [{"pciVendorSelector": "10DE:2236", "resourceName": "a"}],
            },
            "mediatedDevicesConfiguration": {
                "mediatedDeviceTypes": ["nvidia-745"],
                "nodeMediatedDeviceTypes": [
                    {"nodeSelector": {"gpu": "a2"}, "mediatedDeviceTypes": ["GRID T4-2Q"]},
                    {"nodeSelector": {"gpu": "l4"}, "mediatedDeviceTypes": ["NVIDIA L4-6Q"]},
                ],
            },
        }
    )
    # A node some nodeMediatedDeviceTypes entry selects gets that entry's types instead of the
    # global list, taken as written (virt-config.go GetDesiredMDEVTypes): "GRID T4-2Q" keeps
    # its space, so it keeps no mdev (shouldRemoveMDEV compares "GRID_T4-2Q").
    assert kept_types(cr, {"gpu": "a2"}) == {"NVIDIA_A2-4Q", "GRID T4-2Q"}
    assert kept_types(cr, {}) == {"NVIDIA_A2-4Q", "nvidia-745"}
    assert kept_types({}, {}) == frozenset()
    # The deprecated spelling counts only when the current one is empty.
    both = _cr(
        {
            "mediatedDevicesConfiguration": {
                "mediatedDeviceTypes": ["nvidia-745"],
                "mediatedDevicesTypes": ["nvidia-746"],
            }
        }
    )
    assert kept_types(both, {}) == {"nvidia-745"}
    old = _cr({"mediatedDevicesConfiguration": {"mediatedDevicesTypes": ["nvidia-746"]}})
    assert kept_types(old, {}) == {"nvidia-746"}
    # A selector has its spaces turned into "_", then is trimmed (removeSelectorSpaces): a
    # space at an end becomes "_" first, a newline is trimmed.
    padded = [
        {"mdevNameSelector": " NVIDIA A2-4Q", "externalResourceProvider": True},
        {"mdevNameSelector": "NVIDIA A2-8Q\n", "externalResourceProvider": True},
    ]
    assert kept_types(_cr({"permittedHostDevices": {"mediatedDevices": padded}}), {}) == {
        "_NVIDIA_A2-4Q",
        "NVIDIA_A2-8Q",
    }


def test_handling_is_off_only_by_the_enabled_flag_or_the_feature_gate() -> None:
    assert handling_disabled(_cr({})) == ""
    assert handling_disabled(_cr({"mediatedDevicesConfiguration": {"enabled": True}})) == ""
    assert (
        handling_disabled(_cr({"mediatedDevicesConfiguration": {"enabled": False}}))
        == "mediatedDevicesConfiguration.enabled is false"
    )
    gates = {"developerConfiguration": {"featureGates": ["DisableMDEVConfiguration"]}}
    assert handling_disabled(_cr(gates)) == "feature gate DisableMDEVConfiguration is on"
    # The Go constant's name is not the gate's: listed in the CR, it turns nothing off.
    named = {"developerConfiguration": {"featureGates": ["DisableMediatedDevicesHandling"]}}
    assert handling_disabled(_cr(named)) == ""


def _host(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    directory = tmp_path / "host"
    build_host(
        directory,
        {
            "gpus": [
                {
                    "model": "A2",
                    "address": "0000:08:00.0",
                    "sriov": True,
                    "vgpus": {0: "A2-4Q", 1: "A2-4A", 2: "A2-4A"},
                },
                {
                    "model": "A2",
                    "address": "0000:09:00.0",
                    "interface": "vfio",
                    "sriov": True,
                    "vgpus": {0: "A2-4A"},
                },
            ]
        },
    )
    state = load_state(directory / "sys")
    return directory, {uuid: rec.type for uuid, rec in state.vgpus.items()}


def test_a_sweep_removes_every_mdev_not_kept_held_or_not_and_no_vfio_vgpu(tmp_path: Path) -> None:
    directory, before = _host(tmp_path)
    mdev_4a = sorted(u for u, t in before.items() if t == "NVIDIA A2-4A" and "-" in u)
    held = mdev_4a[0]
    hold(directory, held)
    only_4q = _cr(
        {
            "permittedHostDevices": {
                "mediatedDevices": [
                    {"mdevNameSelector": "NVIDIA A2-4Q", "externalResourceProvider": True}
                ]
            }
        }
    )
    # Without waiting: the held vGPU is counted, its removal not started.
    found = sweep(directory, only_4q, wait=False)
    assert dict(found.removed) == {mdev_4a[1]: "NVIDIA A2-4A"}
    assert dict(found.held) == {held: "NVIDIA A2-4A"}
    assert found.lost == 2
    after = load_state(directory / "sys").vgpus
    # The A2-4Q mdev stays; so does the vfio GPU's A2-4A (a VF, not an mdev).
    assert {u: r.type for u, r in after.items()} == {
        u: t for u, t in before.items() if u != mdev_4a[1]
    }
    # Allow-listed (spaces → _ on both sides), nothing is touched.
    both = _cr(
        {
            "permittedHostDevices": {
                "mediatedDevices": [
                    {"mdevNameSelector": "NVIDIA A2-4Q", "externalResourceProvider": True},
                    {"mdevNameSelector": "NVIDIA_A2-4A", "externalResourceProvider": True},
                ]
            }
        }
    )
    assert sweep(directory, both, wait=False).lost == 0
    off = _cr({"mediatedDevicesConfiguration": {"enabled": False}})
    assert sweep(directory, off).skipped == "mediatedDevicesConfiguration.enabled is false"
    assert sweep(directory, None).skipped == "no KubeVirt CR"
    assert len(load_state(directory / "sys").vgpus) == len(before) - 1


def test_a_type_wanted_by_id_keeps_its_mdevs_and_a_selector_by_name_keeps_none_of_them(
    tmp_path: Path,
) -> None:
    # shouldRemoveMDEV keeps an mdev whose type name, else whose type id (the mdev_type link's
    # target), is kept: mediatedDevicesConfiguration names types by id (nvidia-751 is the
    # simulated A2's A2-4A).
    directory, before = _host(tmp_path)
    by_id = _cr({"mediatedDevicesConfiguration": {"mediatedDeviceTypes": ["nvidia-751"]}})
    found = sweep(directory, by_id)
    assert sorted(found.removed.values()) == ["NVIDIA A2-4Q"]
    assert found.held == {}
    left = {u: r.type for u, r in load_state(directory / "sys").vgpus.items()}
    assert sorted(left.values()) == ["NVIDIA A2-4A", "NVIDIA A2-4A", "NVIDIA A2-4A"]
    assert len(before) == 4
