"""The device plugin's pure logic: device sets, tombstones, names, Allocate, preferred packing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.deviceplugin import (
    AllocationError,
    PluginDevice,
    UnknownDeviceError,
    allocate_env_name,
    allocation,
    carry_vanished,
    device_sets,
    preferred,
    socket_name,
)
from reconciler.model import VGPU, Gpu, Interface, Inventory, PciAddress, Vf

A2_1 = "0000:08:00.0"
A2_2 = "0000:09:00.0"
Q4 = "nvidia.com/NVIDIA_A2-4Q"
A4 = "nvidia.com/NVIDIA_A2-4A"

#: GPU address → VF index → (type name, uuid, IOMMU group)
Layout = Mapping[str, Mapping[int, tuple[str, str, str]]]


def uuid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


def vf_address(gpu: str, index: int) -> PciAddress:
    pf = PciAddress.parse(gpu)
    return PciAddress.from_routing_id(pf.domain, pf.routing_id + 4 + index)


def make_inventory(layout: Layout, *, vfs: int = 16) -> Inventory:
    gpus = []
    for gpu, vgpus in layout.items():
        gpus.append(
            Gpu(
                driver="nvidia",
                address=PciAddress.parse(gpu),
                vendor_id="10de",
                device_id="25b6",
                model="NVIDIA A2",
                interface=Interface.MDEV,
                total_vfs=vfs,
                num_vfs=vfs,
                vf_offset=4,
                vfs=tuple(
                    Vf(
                        address=vf_address(gpu, i),
                        index=i,
                        vgpu=None
                        if i not in vgpus
                        else VGPU(uuid=vgpus[i][1], type_name=vgpus[i][0], iommu_group=vgpus[i][2]),
                    )
                    for i in range(vfs)
                ),
            )
        )
    return Inventory(node="node-1", gpus=tuple(gpus))


def dev(n: int, gpu: str, index: int, *, healthy: bool = True, group: str = "") -> PluginDevice:
    return PluginDevice(
        id=uuid(n),
        healthy=healthy,
        vf=vf_address(gpu, index),
        gpu=PciAddress.parse(gpu),
        iommu_group=group or str(100 + n),
    )


# -- device sets ---------------------------------------------------------------------------------


def test_device_sets_group_vgpus_by_resource_in_pci_order() -> None:
    inventory = make_inventory(
        {
            # Listed out of order on purpose: the sets are sorted by GPU, then VF.
            A2_2: {0: ("NVIDIA A2-4Q", uuid(5), "60")},
            A2_1: {
                3: ("NVIDIA A2-4Q", uuid(1), "43"),
                0: ("NVIDIA A2-4Q", uuid(9), "40"),
                1: ("NVIDIA A2-4A", uuid(2), "41"),
            },
        }
    )

    sets = device_sets(inventory)

    assert list(sets) == [A4, Q4]
    assert [d.id for d in sets[Q4]] == [uuid(9), uuid(1), uuid(5)]
    assert all(d.healthy and d.health == "Healthy" for ds in sets.values() for d in ds)
    first = sets[Q4][0]
    assert (str(first.gpu), str(first.vf), first.iommu_group) == (A2_1, "0000:08:00.4", "40")
    assert sets[A4] == (dev(2, A2_1, 1, group="41"),)


def test_a_type_named_with_a_run_of_spaces_is_advertised_under_harvesters_name() -> None:
    """harvester/pcidevices ``GeneratevGPUDeviceName`` makes a run of whitespace one ``_``: a
    type the driver names ``NVIDIA  A2-4Q`` (two spaces) is ``nvidia.com/NVIDIA_A2-4Q`` there,
    the resource a VM on Harvester asks for; vgpuctl advertised ``nvidia.com/NVIDIA__A2-4Q``."""
    inventory = make_inventory({A2_1: {0: ("NVIDIA  A2-4Q", uuid(1), "40")}})

    ((resource, devices),) = device_sets(inventory).items()

    assert resource == Q4 == "nvidia.com/NVIDIA_A2-4Q"
    # Its socket and the variable virt-launcher reads follow from it.
    assert socket_name(resource) == "vgpuctl-nvidia.com_NVIDIA_A2-4Q.sock"
    assert allocation(resource, [uuid(1)], devices).envs == {
        "MDEV_PCI_RESOURCE_NVIDIA_COM_NVIDIA_A2-4Q": uuid(1)
    }


def test_a_host_without_vgpus_has_no_device_set() -> None:
    assert device_sets(make_inventory({A2_1: {}})) == {}
    assert device_sets(Inventory(node="n")) == {}


# -- health and tombstones ------------------------------------------------------------------------


def test_a_vgpu_that_vanished_out_of_band_stays_listed_unhealthy() -> None:
    before = {Q4: (dev(1, A2_1, 0), dev(2, A2_1, 1))}
    now = {Q4: (dev(1, A2_1, 0),)}

    merged = carry_vanished(before, now)

    assert merged == {Q4: (dev(1, A2_1, 0), dev(2, A2_1, 1, healthy=False))}
    assert merged[Q4][1].health == "Unhealthy"


def test_a_vgpu_removed_on_purpose_is_dropped() -> None:
    before = {Q4: (dev(1, A2_1, 0), dev(2, A2_1, 1))}
    now = {Q4: (dev(1, A2_1, 0),)}

    assert carry_vanished(before, now, removed_on_purpose=[uuid(2)]) == {Q4: (dev(1, A2_1, 0),)}


def test_a_tombstone_is_kept_until_its_removal_is_reported_and_keeps_the_profile() -> None:
    first = carry_vanished({Q4: (dev(1, A2_1, 0),)}, {})
    assert first == {Q4: (dev(1, A2_1, 0, healthy=False),)}

    assert carry_vanished(first, {}) == first  # still reported on the next scan
    assert carry_vanished(first, {}, removed_on_purpose={uuid(1)}) == {}


def test_a_vanished_vgpu_that_comes_back_is_healthy_again() -> None:
    tombstoned = {Q4: (dev(1, A2_1, 0, healthy=False),)}

    assert carry_vanished(tombstoned, {Q4: (dev(1, A2_1, 0),)}) == {Q4: (dev(1, A2_1, 0),)}


def test_a_removal_does_not_drop_a_device_that_is_present() -> None:
    # Removed on purpose and re-created with the same UUID by the same apply: present wins.
    sets = {Q4: (dev(1, A2_1, 0),)}

    assert carry_vanished(sets, sets, removed_on_purpose=[uuid(1)]) == sets


def test_a_vgpu_recreated_as_another_profile_tombstones_the_old_one() -> None:
    before = {Q4: (dev(1, A2_1, 0),)}
    now = {A4: (dev(1, A2_1, 0),)}

    merged = carry_vanished(before, now)

    assert merged == {A4: (dev(1, A2_1, 0),), Q4: (dev(1, A2_1, 0, healthy=False),)}


# -- names ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resource", "env"),
    [
        (Q4, "MDEV_PCI_RESOURCE_NVIDIA_COM_NVIDIA_A2-4Q"),
        ("nvidia.com/NVIDIA_L40S-12Q", "MDEV_PCI_RESOURCE_NVIDIA_COM_NVIDIA_L40S-12Q"),
        ("nvidia.com/GRID_T4-1B4", "MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-1B4"),
    ],
)
def test_allocate_env_name(resource: str, env: str) -> None:
    assert allocate_env_name(resource) == env


def test_socket_name() -> None:
    assert socket_name(Q4) == "vgpuctl-nvidia.com_NVIDIA_A2-4Q.sock"


# -- Allocate ------------------------------------------------------------------------------------


def test_allocation_names_the_uuids_and_each_iommu_group_once() -> None:
    devices = [dev(1, A2_1, 0, group="40"), dev(2, A2_1, 1, group="41"), dev(3, A2_1, 2)]
    shared = PluginDevice(uuid(4), True, vf_address(A2_1, 3), PciAddress.parse(A2_1), "40")

    got = allocation(Q4, [uuid(2), uuid(1), uuid(4)], [*devices, shared])

    assert got.envs == {
        "MDEV_PCI_RESOURCE_NVIDIA_COM_NVIDIA_A2-4Q": f"{uuid(2)},{uuid(1)},{uuid(4)}"
    }
    assert got.device_paths == ("/dev/vfio/vfio", "/dev/vfio/41", "/dev/vfio/40")


def test_allocation_refuses_unknown_ids_naming_them() -> None:
    with pytest.raises(UnknownDeviceError, match=f"unknown device ID {uuid(7)}, bogus"):
        allocation(Q4, [uuid(1), uuid(7), "bogus"], [dev(1, A2_1, 0)])
    with pytest.raises(UnknownDeviceError, match="names no device"):
        allocation(Q4, [], [dev(1, A2_1, 0)])


def test_allocation_refuses_unhealthy_and_groupless_devices() -> None:
    sick = dev(1, A2_1, 0, healthy=False)
    groupless = PluginDevice(uuid(2), True, vf_address(A2_1, 1), PciAddress.parse(A2_1), "")

    with pytest.raises(AllocationError, match="Unhealthy") as unhealthy:
        allocation(Q4, [uuid(1)], [sick])
    with pytest.raises(AllocationError, match="no IOMMU group") as no_group:
        allocation(Q4, [uuid(2)], [groupless])
    assert not unhealthy.value.unknown_device
    assert not no_group.value.unknown_device


def test_on_vfio_the_vfs_are_the_devices_and_are_allocated_as_pci_devices() -> None:
    """docs/domain.md §3b, §7: the VF is the vGPU, its address the device ID, and KubeVirt reads
    the addresses from PCI_RESOURCE_<NAME>; the VF's own IOMMU group is opened."""
    inventory = make_inventory({A2_1: {0: ("NVIDIA A2-4Q", str(vf_address(A2_1, 0)), "200")}})
    (gpu,) = inventory.gpus
    vfs = list(gpu.vfs)
    vfs[1] = Vf(vfs[1].address, 1, VGPU(str(vfs[1].address), "NVIDIA A2-4Q", iommu_group="201"))
    vfio = Inventory("node-1", (replace(gpu, interface=Interface.VFIO, vfs=tuple(vfs)),))
    (devices,) = device_sets(vfio).values()
    assert [(d.id, d.whole_vf) for d in devices] == [
        ("0000:08:00.4", True),
        ("0000:08:00.5", True),
    ]
    got = allocation(Q4, ["0000:08:00.5", "0000:08:00.4"], devices)
    assert got.envs == {"PCI_RESOURCE_NVIDIA_COM_NVIDIA_A2-4Q": "0000:08:00.5,0000:08:00.4"}
    assert got.device_paths == ("/dev/vfio/vfio", "/dev/vfio/201", "/dev/vfio/200")
    mdev = dev(1, A2_2, 0)
    with pytest.raises(AllocationError, match="mixes mdevs and whole VFs"):
        allocation(Q4, ["0000:08:00.4", uuid(1)], [*devices, mdev])


def test_a_whole_vf_gets_its_iommufd_cdev_and_an_mdev_never_does() -> None:
    """docs/domain.md §9: KubeVirt opens a VF through /dev/vfio/devices/vfioN with its IOMMUFD
    feature gate; an mdev is opened through its group, so its cdev is not handed out."""
    vf4 = PluginDevice("0000:08:00.4", True, vf_address(A2_1, 0), PciAddress.parse(A2_1), "200",
                       whole_vf=True)  # fmt: skip
    vf5 = replace(vf4, id="0000:08:00.5", vf=vf_address(A2_1, 1), iommu_group="201")
    got = allocation(Q4, [vf4.id, vf5.id], [vf4, vf5], {vf5.id: "vfio12", vf4.id: "vfio3"})
    assert got.device_paths == (
        "/dev/vfio/vfio",
        "/dev/vfio/200",
        "/dev/vfio/201",
        "/dev/vfio/devices/vfio3",
        "/dev/vfio/devices/vfio12",
    )
    mdev = dev(1, A2_1, 2, group="40")
    assert allocation(Q4, [mdev.id], [mdev], {mdev.id: "vfio3"}).device_paths == (
        "/dev/vfio/vfio",
        "/dev/vfio/40",
    )
    for bad in ("../../sda", "vfio3/../../sda", "vfio\u0663", "vfio"):
        with pytest.raises(AllocationError, match="is not a vfio cdev name"):
            allocation(Q4, [vf4.id], [vf4], {vf4.id: bad})


def test_a_vfio_vgpu_whose_type_nothing_names_is_not_advertised() -> None:
    """``type 1147``: a type id no list and no record names. Its resource is unknown, so no
    plugin offers it (a resource made from the id would be one no VM asks for)."""
    inventory = make_inventory(
        {
            A2_1: {
                0: ("NVIDIA A2-4Q", str(vf_address(A2_1, 0)), "200"),
                1: ("type 1147", str(vf_address(A2_1, 1)), "201"),
            }
        }
    )
    (gpu,) = inventory.gpus
    vfio = Inventory("node-1", (replace(gpu, interface=Interface.VFIO),))
    sets = device_sets(vfio)
    assert list(sets) == [Q4]
    assert [d.id for d in sets[Q4]] == ["0000:08:00.4"]


# -- preferred allocation ------------------------------------------------------------------------

#: GPU 1 has 2 free devices, GPU 2 has 3, GPU 3 has 3 (ties with GPU 2, higher address).
A2_3 = "0000:0a:00.0"
POOL = [
    dev(1, A2_1, 0),
    dev(2, A2_1, 5),
    dev(3, A2_2, 2),
    dev(4, A2_2, 0),
    dev(5, A2_2, 1),
    dev(6, A2_3, 0),
    dev(7, A2_3, 1),
    dev(8, A2_3, 2),
]
ALL = [d.id for d in POOL]


def test_preferred_packs_onto_the_gpu_with_most_available_ties_by_address() -> None:
    # GPU 2 and 3 both have 3: GPU 2 (lower address) wins; within it, VF order.
    assert preferred(ALL, [], 3, POOL) == [uuid(4), uuid(5), uuid(3)]


def test_preferred_starts_from_the_gpu_of_must_include() -> None:
    got = preferred(ALL, [uuid(2)], 2, POOL)

    assert got == [uuid(2), uuid(1)]


def test_preferred_spills_over_to_the_next_best_gpu() -> None:
    got = preferred(ALL, [uuid(1)], 4, POOL)

    # must-include first, then the rest of its GPU, then the fullest other GPU.
    assert got == [uuid(1), uuid(2), uuid(4), uuid(5)]


def test_preferred_returns_must_include_when_it_fills_the_request() -> None:
    assert preferred(ALL, [uuid(8), uuid(1)], 2, POOL) == [uuid(8), uuid(1)]


def test_preferred_with_too_few_available_returns_all_and_unknown_ids_last() -> None:
    got = preferred([uuid(1), "zz-unknown", "aa-unknown"], [], 5, POOL)

    assert got == [uuid(1), "aa-unknown", "zz-unknown"]


@given(
    order=st.permutations(ALL),
    size=st.integers(min_value=1, max_value=len(ALL)),
    must=st.lists(st.sampled_from(ALL), max_size=2, unique=True),
)
def test_preferred_is_deterministic_and_well_formed(
    order: Sequence[str], size: int, must: list[str]
) -> None:
    size = max(size, len(must))
    got = preferred(list(order), must, size, list(reversed(POOL)))

    assert got == preferred(ALL, must, size, POOL)
    assert got[: len(must)] == must
    assert len(got) == size == len(set(got))
    assert set(got) <= set(ALL)
    # Packing: a request that fits on one GPU of the must-include device stays on it.
    gpus = {d.id: d.gpu for d in POOL}
    if must and len({gpus[m] for m in must}) == 1:
        room = sum(1 for d in POOL if d.gpu == gpus[must[0]])
        if size <= room:
            assert {gpus[i] for i in got} == {gpus[must[0]]}
