"""The device plugins end to end, in process: simulated host → observer → PluginManager → real
gRPC on Unix sockets → the fake kubelet, which computes node allocatable as the kubelet does.

Expected values are the domain's facts (docs/domain.md §7), written out: resource and socket names,
the Allocate env variable, UUIDs as the simulator names them, IOMMU groups read from the sysfs
links themselves, not from the code under test.
"""

from __future__ import annotations

import logging
import os
import random
import uuid as uuidlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest

from reconciler.catalog import default_catalog
from reconciler.deviceplugin.manager import PluginManager
from reconciler.model import Inventory
from reconciler.observe import observe_host
from reconciler.sim import SimHost, build_host, reboot
from tests.doubles.fake_kubelet import (
    HEALTHY,
    UNHEALTHY,
    DeviceState,
    FakeKubelet,
    make_plugin_dir,
    remove_plugin_dir,
)

NODE = "harvester-kgd9c"
A2_4A = "nvidia.com/NVIDIA_A2-4A"
A2_4Q = "nvidia.com/NVIDIA_A2-4Q"
A2_4C = "nvidia.com/NVIDIA_A2-4C"
SOCKET_4A = "vgpuctl-nvidia.com_NVIDIA_A2-4A.sock"
SOCKET_4Q = "vgpuctl-nvidia.com_NVIDIA_A2-4Q.sock"
SOCKET_4C = "vgpuctl-nvidia.com_NVIDIA_A2-4C.sock"
ENV_4Q = "MDEV_PCI_RESOURCE_NVIDIA_COM_NVIDIA_A2-4Q"

# The seed's node: one A2, VFs .4/.6 NVIDIA A2-4A and .5/.7 NVIDIA A2-4Q.
SEED_SPEC = {
    "gpus": [
        {
            "model": "A2",
            "address": "0000:08:00.0",
            "vgpus": {
                "0000:08:00.4": "NVIDIA A2-4A",
                "0000:08:00.5": "NVIDIA A2-4Q",
                "0000:08:00.6": "NVIDIA A2-4A",
                "0000:08:00.7": "NVIDIA A2-4Q",
            },
        }
    ]
}
NVIDIA_A2_4A_TYPE = "nvidia-751"
NVIDIA_A2_4C_TYPE = "nvidia-754"


def sim_uuid(vf: str) -> str:
    """The UUID the simulator gives a vGPU built on ``vf`` (build_host's documented default)."""
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"sim/{vf}"))


U4 = sim_uuid("0000:08:00.4")
U5 = sim_uuid("0000:08:00.5")
U6 = sim_uuid("0000:08:00.6")
U7 = sim_uuid("0000:08:00.7")


def observe(host: SimHost) -> Inventory:
    return observe_host(
        host.sysfs_root, node=NODE, catalog=default_catalog(), hold_probe=host.hold_probe()
    )


def iommu_group(host: SimHost, uuid: str) -> str:
    """The vGPU's IOMMU group as the kernel links it: bus/mdev/devices/<uuid>/iommu_group."""
    return os.path.basename(
        os.readlink(host.sysfs_root / "bus/mdev/devices" / uuid / "iommu_group")
    )


def remove_vgpu(host: SimHost, uuid: str) -> None:
    host.writer().write(f"bus/mdev/devices/{uuid}/remove", "1")


def create_vgpu(host: SimHost, vf: str, type_id: str, uuid: str) -> None:
    host.writer().write(f"bus/pci/devices/{vf}/mdev_supported_types/{type_id}/create", uuid)


def healthy(*ids: str) -> set[DeviceState]:
    return {DeviceState(i, HEALTHY) for i in ids}


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    directory = make_plugin_dir()
    yield directory
    remove_plugin_dir(directory)


@pytest.fixture
def kubelet(plugin_dir: Path) -> Iterator[FakeKubelet]:
    with FakeKubelet(plugin_dir) as k:
        yield k


@pytest.fixture
def seed_host(tmp_path: Path) -> SimHost:
    return build_host(tmp_path / "host", SEED_SPEC)


@pytest.fixture
def manager(plugin_dir: Path) -> Iterator[PluginManager]:
    m = PluginManager(plugin_dir=plugin_dir, node=NODE)
    yield m
    m.close()


def wait_allocatable(
    kubelet: FakeKubelet, expected: Mapping[str, int], timeout: float = 2.0
) -> None:
    kubelet.wait_for(
        lambda: all(kubelet.allocatable(r) == n for r, n in expected.items()),
        timeout=timeout,
        what=f"allocatable {dict(expected)}",
    )


def seeded(kubelet: FakeKubelet, manager: PluginManager, host: SimHost) -> None:
    manager.update(observe(host))
    wait_allocatable(kubelet, {A2_4A: 2, A2_4Q: 2})


# --- what the node advertises ------------------------------------------------------------------


def test_seed_node_advertises_a2_4a_2_and_a2_4q_2_and_no_a2_4c(
    kubelet: FakeKubelet, manager: PluginManager, seed_host: SimHost, plugin_dir: Path
) -> None:
    manager.update(observe(seed_host))

    wait_allocatable(kubelet, {A2_4A: 2, A2_4Q: 2})
    assert kubelet.allocatable_all() == {A2_4A: 2, A2_4Q: 2}
    assert A2_4C not in kubelet.resources()
    assert set(kubelet.devices(A2_4A)) == healthy(U4, U6)
    assert set(kubelet.devices(A2_4Q)) == healthy(U5, U7)
    sockets = sorted(p.name for p in plugin_dir.iterdir())
    assert sockets == sorted(["kubelet.sock", SOCKET_4A, SOCKET_4Q])

    registrations = kubelet.registrations
    assert {(r.resource, r.endpoint) for r in registrations} == {
        (A2_4A, SOCKET_4A),
        (A2_4Q, SOCKET_4Q),
    }
    for r in registrations:
        assert r.accepted, r
        assert r.version == "v1beta1"
        assert (r.pre_start_required, r.get_preferred_allocation_available) == (False, True)
    options = kubelet.plugin_options(A2_4Q)
    assert (options.pre_start_required, options.get_preferred_allocation_available) == (
        False,
        True,
    )


def test_update_with_the_same_inventory_sends_nothing_new(
    kubelet: FakeKubelet, manager: PluginManager, seed_host: SimHost
) -> None:
    seeded(kubelet, manager, seed_host)
    before = kubelet.update_count()
    manager.update(observe(seed_host))
    # A changed list would arrive well within this; nothing must.
    with pytest.raises(AssertionError, match="timed out"):
        kubelet.wait_for(lambda: kubelet.update_count() != before, timeout=0.3)
    assert len(kubelet.registrations) == 2


def test_profile_change_moves_the_counts(
    kubelet: FakeKubelet, manager: PluginManager, seed_host: SimHost
) -> None:
    seeded(kubelet, manager, seed_host)

    # VF .7: A2-4Q → A2-4A, as apply does it (remove, then create).
    remove_vgpu(seed_host, U7)
    new = "7e57a2a4-0000-4000-8000-000000000007"
    create_vgpu(seed_host, "0000:08:00.7", NVIDIA_A2_4A_TYPE, new)
    manager.update(observe(seed_host), removed_on_purpose=[U7])

    wait_allocatable(kubelet, {A2_4A: 3, A2_4Q: 1})
    assert set(kubelet.devices(A2_4A)) == healthy(U4, U6, new)
    # Removed on purpose: dropped, not left Unhealthy.
    assert set(kubelet.devices(A2_4Q)) == healthy(U5)


def test_new_profile_gets_a_plugin_and_a_gone_profile_sends_empty_then_stops(
    kubelet: FakeKubelet, manager: PluginManager, seed_host: SimHost, plugin_dir: Path
) -> None:
    seeded(kubelet, manager, seed_host)

    # Both A2-4Q become A2-4C: A2-4C appears, A2-4Q is gone.
    remove_vgpu(seed_host, U5)
    remove_vgpu(seed_host, U7)
    c5, c7 = (f"7e57a2c4-0000-4000-8000-00000000000{i}" for i in (5, 7))
    create_vgpu(seed_host, "0000:08:00.5", NVIDIA_A2_4C_TYPE, c5)
    create_vgpu(seed_host, "0000:08:00.7", NVIDIA_A2_4C_TYPE, c7)
    manager.update(observe(seed_host), removed_on_purpose=[U5, U7])

    wait_allocatable(kubelet, {A2_4A: 2, A2_4C: 2, A2_4Q: 0})
    assert set(kubelet.devices(A2_4C)) == healthy(c5, c7)
    assert kubelet.accepted(A2_4C)[0].endpoint == SOCKET_4C
    # The gone profile's last message is the empty list; then its server stops.
    assert kubelet.updates(A2_4Q)[-1].devices == ()
    kubelet.wait_for(
        lambda: not kubelet.streaming(A2_4Q) and not (plugin_dir / SOCKET_4Q).exists(),
        what="the A2-4Q plugin to stop and remove its socket",
    )
    assert (plugin_dir / SOCKET_4C).exists()
    assert (plugin_dir / SOCKET_4A).exists()

    # The profile comes back: a new server, a new registration.
    remove_vgpu(seed_host, c7)
    create_vgpu(seed_host, "0000:08:00.7", "nvidia-746", U7)  # NVIDIA A2-4Q
    manager.update(observe(seed_host), removed_on_purpose=[c7])
    wait_allocatable(kubelet, {A2_4A: 2, A2_4C: 1, A2_4Q: 1})
    assert len(kubelet.accepted(A2_4Q)) == 2


# --- kubelet restarts, refusals, dropped streams ---------------------------------------------


def test_kubelet_restart_reregisters_losing_no_device(
    kubelet: FakeKubelet, manager: PluginManager, seed_host: SimHost, plugin_dir: Path
) -> None:
    seeded(kubelet, manager, seed_host)
    before = {r: set(kubelet.devices(r)) for r in (A2_4A, A2_4Q)}

    for epoch in (2, 3):  # and again: the watch survives a restart
        # Let the plugins settle first (the crash-loop test below does not).
        kubelet.wait_for(
            lambda: manager.registered(A2_4A) and manager.registered(A2_4Q),
            what="the manager to have nothing left to do",
        )
        kubelet.restart()  # deletes every socket, the plugins' too
        assert kubelet.epoch == epoch
        # How fast is the bench's (kubelet_restart_to_allocatable); this bound only says it
        # does not hang, generous for a loaded CI machine.
        kubelet.wait_for(
            lambda: all(kubelet.allocatable(r) == 2 for r in (A2_4A, A2_4Q)),
            timeout=15.0,
            what=f"re-registration after kubelet restart {epoch - 1}",
        )
        assert {r.resource for r in kubelet.accepted(epoch=epoch)} == {A2_4A, A2_4Q}
        assert {r: set(kubelet.devices(r)) for r in (A2_4A, A2_4Q)} == before
        kubelet.wait_for(
            lambda: (plugin_dir / SOCKET_4A).exists() and (plugin_dir / SOCKET_4Q).exists(),
            what="both plugin sockets",
        )

    # The plugins still follow changes after the restarts.
    remove_vgpu(seed_host, U5)
    manager.update(observe(seed_host), removed_on_purpose=[U5])
    wait_allocatable(kubelet, {A2_4Q: 1})


def test_kubelet_crash_loop_ends_with_every_plugin_registered_again(
    kubelet: FakeKubelet, manager: PluginManager, seed_host: SimHost, plugin_dir: Path
) -> None:
    # Restarts back to back: sockets vanish while plugins are still serving again and
    # registering after the previous one. Whatever state that leaves, every plugin must end up
    # serving and registered with the last kubelet, with all its devices. How fast is the
    # bench's (tests/bench/deviceplugin.py, kubelet_restart_to_allocatable); the bound here only
    # says it does not hang, generous for a loaded CI machine (a 1 s bound failed there).
    seeded(kubelet, manager, seed_host)
    before = {r: set(kubelet.devices(r)) for r in (A2_4A, A2_4Q)}
    for _ in range(5):
        kubelet.restart()
    kubelet.wait_for(
        lambda: (
            {r: set(kubelet.devices(r)) for r in (A2_4A, A2_4Q)} == before
            and (plugin_dir / SOCKET_4A).exists()
            and (plugin_dir / SOCKET_4Q).exists()
        ),
        timeout=15.0,
        what="every plugin registered after a kubelet crash loop",
    )
    assert {r.resource for r in kubelet.accepted(epoch=kubelet.epoch)} == {A2_4A, A2_4Q}


def test_kubelet_restart_keeps_unhealthy_devices_listed(
    kubelet: FakeKubelet, manager: PluginManager, seed_host: SimHost
) -> None:
    seeded(kubelet, manager, seed_host)
    remove_vgpu(seed_host, U7)  # out of band
    manager.update(observe(seed_host))
    wait_allocatable(kubelet, {A2_4Q: 1})

    kubelet.restart()
    kubelet.wait_for(lambda: kubelet.accepted(A2_4Q, epoch=2) != [], what="re-registration")
    kubelet.wait_for(lambda: len(kubelet.devices(A2_4Q)) == 2, what="the A2-4Q list")
    assert set(kubelet.devices(A2_4Q)) == {DeviceState(U5, HEALTHY), DeviceState(U7, UNHEALTHY)}


def test_plugins_wait_for_a_missing_kubelet_and_register_when_it_comes(
    plugin_dir: Path, manager: PluginManager, seed_host: SimHost, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="vgpuctl.deviceplugin")
    kubelet = FakeKubelet(plugin_dir)  # not started: no kubelet.sock
    manager.update(observe(seed_host))
    kubelet.wait_for(
        lambda: (
            "kubelet not ready at" in caplog.text
            and (plugin_dir / SOCKET_4A).exists()
            and (plugin_dir / SOCKET_4Q).exists()
        ),
        what="the plugins to serve and say the kubelet is not ready",
    )
    assert str(plugin_dir / "kubelet.sock") in caplog.text

    with kubelet:  # starting wipes the plugins' sockets, as a real kubelet does
        wait_allocatable(kubelet, {A2_4A: 2, A2_4Q: 2}, timeout=7.0)  # backoff is capped ~5 s


def test_refused_registration_is_logged_and_retried(
    kubelet: FakeKubelet,
    manager: PluginManager,
    seed_host: SimHost,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="vgpuctl.deviceplugin")
    kubelet.refuse = True
    manager.update(observe(seed_host))
    kubelet.wait_for(
        lambda: sum(1 for r in kubelet.registrations if r.resource == A2_4Q) >= 2,
        timeout=5.0,
        what="two refused A2-4Q registrations",
    )
    assert not any(r.accepted for r in kubelet.registrations)
    assert "refused" in caplog.text
    assert A2_4Q in caplog.text

    kubelet.refuse = False
    wait_allocatable(kubelet, {A2_4A: 2, A2_4Q: 2}, timeout=7.0)


def test_dropped_stream_leaves_the_plugin_serving_and_the_next_stream_is_current(
    kubelet: FakeKubelet, manager: PluginManager, seed_host: SimHost
) -> None:
    seeded(kubelet, manager, seed_host)

    kubelet.drop_stream(A2_4Q)  # the kubelet marks its devices unhealthy and drops the plugin
    remove_vgpu(seed_host, U7)
    manager.update(observe(seed_host), removed_on_purpose=[U7])
    wait_allocatable(kubelet, {A2_4A: 2})  # the other plugin's stream is unaffected
    assert kubelet.allocatable(A2_4Q) == 0
    assert kubelet.capacity(A2_4Q) == 2  # no stream: the kubelet has not heard of the removal

    # The plugin still serves: once registered again (a kubelet restart makes every plugin
    # do so), the new ListAndWatch gets the current list at once.
    kubelet.restart()
    wait_allocatable(kubelet, {A2_4A: 2, A2_4Q: 1})
    assert set(kubelet.devices(A2_4Q)) == healthy(U5)
    assert kubelet.allocate(A2_4Q, [U5]).envs[ENV_4Q] == U5


# --- Allocate ----------------------------------------------------------------------------------


def test_allocate_returns_the_uuids_and_their_vfio_groups(
    kubelet: FakeKubelet, manager: PluginManager, seed_host: SimHost
) -> None:
    seeded(kubelet, manager, seed_host)

    response = kubelet.allocate(A2_4Q, [U5, U7])

    assert dict(response.envs) == {ENV_4Q: f"{U5},{U7}"}
    specs = [(d.container_path, d.host_path, d.permissions) for d in response.devices]
    groups = [f"/dev/vfio/{iommu_group(seed_host, u)}" for u in (U5, U7)]
    assert groups[0] != groups[1]
    assert sorted(specs) == sorted((path, path, "mrw") for path in ["/dev/vfio/vfio", *groups])
    assert not response.mounts
    assert not response.cdi_devices

    one = kubelet.allocate(A2_4Q, [U7])
    assert dict(one.envs) == {ENV_4Q: U7}
    assert {d.host_path for d in one.devices} == {"/dev/vfio/vfio", groups[1]}


def test_allocate_answers_each_container(
    kubelet: FakeKubelet, manager: PluginManager, seed_host: SimHost
) -> None:
    seeded(kubelet, manager, seed_host)
    response = kubelet.allocate_containers(A2_4A, [[U4], [U6]])
    assert [dict(c.envs) for c in response.container_responses] == [
        {"MDEV_PCI_RESOURCE_NVIDIA_COM_NVIDIA_A2-4A": U4},
        {"MDEV_PCI_RESOURCE_NVIDIA_COM_NVIDIA_A2-4A": U6},
    ]


@pytest.mark.parametrize(
    "ids",
    [
        pytest.param(["00000000-0000-0000-0000-000000000000"], id="unknown-uuid"),
        pytest.param([U4], id="a-device-of-another-profile"),
        pytest.param([U5, "not-a-uuid"], id="one-of-two-unknown"),
    ],
)
def test_allocate_of_an_unknown_device_is_a_grpc_error_not_a_crash(
    kubelet: FakeKubelet, manager: PluginManager, seed_host: SimHost, ids: list[str]
) -> None:
    seeded(kubelet, manager, seed_host)
    with pytest.raises(grpc.RpcError) as info:
        kubelet.allocate(A2_4Q, ids)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert ids[-1] in (info.value.details() or "")
    # Still serving, still streaming.
    assert kubelet.allocate(A2_4Q, [U5]).envs[ENV_4Q] == U5
    assert kubelet.streaming(A2_4Q)


# --- health ------------------------------------------------------------------------------------


def test_vgpu_removed_out_of_band_turns_unhealthy(
    kubelet: FakeKubelet, manager: PluginManager, seed_host: SimHost
) -> None:
    seeded(kubelet, manager, seed_host)

    remove_vgpu(seed_host, U7)  # not by vgpuctl: nobody says it was on purpose
    manager.update(observe(seed_host))

    wait_allocatable(kubelet, {A2_4Q: 1})
    assert set(kubelet.devices(A2_4Q)) == {DeviceState(U5, HEALTHY), DeviceState(U7, UNHEALTHY)}
    assert kubelet.allocatable(A2_4A) == 2
    with pytest.raises(grpc.RpcError) as info:
        kubelet.allocate(A2_4Q, [U7])
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert U7 in (info.value.details() or "")

    # Still Unhealthy on later refreshes; dropped once its removal is reported.
    manager.update(observe(seed_host))
    assert DeviceState(U7, UNHEALTHY) in kubelet.devices(A2_4Q)
    manager.update(observe(seed_host), removed_on_purpose=[U7])
    kubelet.wait_for(lambda: len(kubelet.devices(A2_4Q)) == 1, what="the tombstone to go")
    assert set(kubelet.devices(A2_4Q)) == healthy(U5)


def test_vgpu_that_comes_back_is_healthy_again(
    kubelet: FakeKubelet, manager: PluginManager, seed_host: SimHost
) -> None:
    seeded(kubelet, manager, seed_host)
    remove_vgpu(seed_host, U7)
    manager.update(observe(seed_host))
    wait_allocatable(kubelet, {A2_4Q: 1})

    create_vgpu(seed_host, "0000:08:00.7", "nvidia-746", U7)  # same UUID, NVIDIA A2-4Q
    manager.update(observe(seed_host))
    wait_allocatable(kubelet, {A2_4Q: 2})
    assert set(kubelet.devices(A2_4Q)) == healthy(U5, U7)


def test_reboot_leaves_every_device_listed_unhealthy(
    kubelet: FakeKubelet, manager: PluginManager, seed_host: SimHost, plugin_dir: Path
) -> None:
    seeded(kubelet, manager, seed_host)

    reboot(seed_host.directory)  # SR-IOV off, every vGPU and VF gone
    manager.update(observe(seed_host))

    wait_allocatable(kubelet, {A2_4A: 0, A2_4Q: 0})
    assert set(kubelet.devices(A2_4A)) == {DeviceState(u, UNHEALTHY) for u in (U4, U6)}
    assert set(kubelet.devices(A2_4Q)) == {DeviceState(u, UNHEALTHY) for u in (U5, U7)}
    # The plugins keep running to report them.
    assert (plugin_dir / SOCKET_4A).exists()
    assert kubelet.streaming(A2_4A)


# --- GetPreferredAllocation --------------------------------------------------------------------


def two_gpu_spec() -> tuple[dict[str, Any], list[str], list[str]]:
    """Two A2s with A2-4Q vGPUs: two on the first GPU, three on the second."""
    first = [f"aaaaaaaa-0000-4000-8000-00000000000{i}" for i in range(2)]
    second = [f"bbbbbbbb-0000-4000-8000-00000000000{i}" for i in range(3)]
    spec = {
        "gpus": [
            {
                "model": "A2",
                "address": "0000:08:00.0",
                "vgpus": {i: {"type": "NVIDIA A2-4Q", "uuid": u} for i, u in enumerate(first)},
            },
            {
                "model": "A2",
                "address": "0000:18:00.0",
                "vgpus": {i: {"type": "NVIDIA A2-4Q", "uuid": u} for i, u in enumerate(second)},
            },
        ]
    }
    return spec, first, second


def test_preferred_allocation_packs_onto_one_gpu(
    kubelet: FakeKubelet, manager: PluginManager, tmp_path: Path
) -> None:
    spec, first, second = two_gpu_spec()
    host = build_host(tmp_path / "host", spec)
    manager.update(observe(host))
    wait_allocatable(kubelet, {A2_4Q: 5})
    everything = first + second

    def ask(available: list[str], must: list[str], size: int) -> list[str]:
        answers = set()
        for seed in range(5):  # the same answer whatever order the kubelet lists them in
            shuffled = list(available)
            random.Random(seed).shuffle(shuffled)  # noqa: S311 (test data)
            answers.add(tuple(kubelet.preferred(A2_4Q, shuffled, must, size)))
        assert len(answers) == 1, answers
        return list(answers.pop())

    # The GPU with the most available devices, in VF order.
    assert ask(everything, [], 2) == second[:2]
    assert ask(everything, [], 3) == second
    # A must-include device pulls the rest onto its GPU.
    assert ask(everything, [first[1]], 2) == [first[1], first[0]]
    # Only the second GPU's two remain besides the first's two: tie → lower PCI address.
    assert ask([*first, *second[:2]], [], 2) == first
    # More than one GPU holds: fill the fullest, then the next.
    assert ask(everything, [], 4) == [*second, first[0]]
    # must_include alone when it already has the size.
    assert ask(everything, [second[2], first[0]], 2) == [second[2], first[0]]


# --- Allocate of a VF handed over whole: its iommufd cdev too ------------------------------------

L40S_8Q = "nvidia.com/NVIDIA_L40S-8Q"
ENV_L40S_8Q = "PCI_RESOURCE_NVIDIA_COM_NVIDIA_L40S-8Q"
VFIO_VF0, VFIO_VF1 = "0000:08:00.4", "0000:08:00.5"


@pytest.fixture
def vfio_host(tmp_path: Path) -> SimHost:
    """An L40S on NVIDIA's vendor-specific VFIO interface with two 8Q vGPUs: the VFs are the
    vGPUs, handed to VMs as PCI devices (docs/domain.md §3b)."""
    spec = {
        "interface": "vfio",
        "gpus": [
            {
                "model": "L40S",
                "address": "0000:08:00.0",
                "vgpus": {VFIO_VF0: "NVIDIA L40S-8Q", VFIO_VF1: "NVIDIA L40S-8Q"},
            }
        ],
    }
    return build_host(tmp_path / "vfio-host", spec)


def give_cdev(host: SimHost, vf: str, name: str) -> None:
    """``<VF>/vfio-dev/<name>/dev`` as the kernel lists a VFIO device's cdev
    (vfio_main.c ``__vfio_register_dev``: ``"vfio%d"``, a child of the device)."""
    d = Path(os.path.realpath(host.sysfs_root / "bus/pci/devices" / vf)) / "vfio-dev" / name
    d.mkdir(parents=True)
    (d / "dev").write_text("511:7\n")


def vf_group(host: SimHost, vf: str) -> str:
    link = os.readlink(host.sysfs_root / "bus/pci/devices" / vf / "iommu_group")
    return os.path.basename(link)


def test_allocate_of_a_whole_vf_hands_out_its_iommufd_cdev_where_the_host_has_one(
    kubelet: FakeKubelet, manager: PluginManager, vfio_host: SimHost
) -> None:
    give_cdev(vfio_host, VFIO_VF0, "vfio7")
    manager.update(observe(vfio_host))
    wait_allocatable(kubelet, {L40S_8Q: 2})

    response = kubelet.allocate(L40S_8Q, [VFIO_VF0, VFIO_VF1])

    assert dict(response.envs) == {ENV_L40S_8Q: f"{VFIO_VF0},{VFIO_VF1}"}
    specs = [(d.container_path, d.host_path, d.permissions) for d in response.devices]
    paths = [
        "/dev/vfio/vfio",
        f"/dev/vfio/{vf_group(vfio_host, VFIO_VF0)}",
        f"/dev/vfio/{vf_group(vfio_host, VFIO_VF1)}",
        "/dev/vfio/devices/vfio7",  # VF1 has no cdev: its group only
    ]
    assert specs == [(p, p, "mrw") for p in paths]
    # Looked up at Allocate, not when advertised: a cdev that appears later is handed out.
    give_cdev(vfio_host, VFIO_VF1, "vfio8")
    again = kubelet.allocate(L40S_8Q, [VFIO_VF1])
    assert [d.host_path for d in again.devices][-1] == "/dev/vfio/devices/vfio8"


@pytest.mark.parametrize("name", ["vfio", "vfio7x", "vfio\u0663", "VFIO7", "vfio-7"])
def test_an_entry_that_is_no_cdev_name_is_never_handed_out(
    kubelet: FakeKubelet, manager: PluginManager, vfio_host: SimHost, name: str
) -> None:
    """``vfio`` and ASCII digits only (an Arabic-Indic ``٣`` is a digit to str.isdigit)."""
    give_cdev(vfio_host, VFIO_VF0, name)
    manager.update(observe(vfio_host))
    wait_allocatable(kubelet, {L40S_8Q: 2})
    response = kubelet.allocate(L40S_8Q, [VFIO_VF0])
    assert [d.host_path for d in response.devices] == [
        "/dev/vfio/vfio",
        f"/dev/vfio/{vf_group(vfio_host, VFIO_VF0)}",
    ]
