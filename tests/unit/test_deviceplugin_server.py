"""One profile's device plugin over real gRPC on a Unix socket: the DevicePlugin calls,
ListAndWatch streaming, serving and registering."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from reconciler.deviceplugin import (
    PluginDevice,
    PluginDirError,
    ProfilePlugin,
    RegistrationError,
)
from reconciler.deviceplugin.server import remove_stale_staging
from reconciler.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from reconciler.model import PciAddress
from tests.doubles.registry import kubelet, wait_until

RES = "nvidia.com/NVIDIA_A2-4Q"
GPU = PciAddress.parse("0000:08:00.0")
U1 = "dd6772a8-7db8-4e96-9a73-f94c389d9bc3"
U2 = "5b5b7326-6bb8-48cb-a321-8fa58ccbb38c"
U3 = "0b7e5c1e-3f7e-4c51-9d55-1e6f2f0a9a11"


def device(uuid: str, index: int, group: str, *, healthy: bool = True) -> PluginDevice:
    return PluginDevice(
        id=uuid,
        healthy=healthy,
        vf=PciAddress.from_routing_id(0, GPU.routing_id + 4 + index),
        gpu=GPU,
        iommu_group=group,
    )


DEVICES = (device(U1, 0, "45"), device(U2, 1, "46"))


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    # AF_UNIX paths hold 107 bytes: pytest's tmp_path is too deep.
    directory = Path(tempfile.mkdtemp(dir="/tmp", prefix="dp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def plugin(plugin_dir: Path) -> Iterator[ProfilePlugin]:
    p = ProfilePlugin(RES, plugin_dir=plugin_dir, stop_grace=0.2)
    p.update(DEVICES)
    p.start()
    yield p
    p.stop()


@contextmanager
def dial(path: Path) -> Iterator[Any]:
    with grpc.insecure_channel(f"unix://{path}") as channel:
        yield api_pb2_grpc.DevicePluginStub(channel)


@pytest.fixture
def stub(plugin: ProfilePlugin) -> Iterator[Any]:
    with dial(plugin.socket_path) as s:
        yield s


def listed(response: api_pb2.ListAndWatchResponse) -> list[tuple[str, str]]:
    return [(d.ID, d.health) for d in response.devices]


# -- the calls ------------------------------------------------------------------------------------


def test_serves_on_its_named_socket_in_the_plugin_dir(
    plugin: ProfilePlugin, plugin_dir: Path
) -> None:
    assert plugin.socket_path == plugin_dir / "vgpuctl-nvidia.com_NVIDIA_A2-4Q.sock"
    assert plugin.socket_path.is_socket()
    assert plugin.serving


def test_options_ask_for_no_prestart_and_offer_preferred_allocation(stub: Any) -> None:
    options = stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=2)

    assert options.pre_start_required is False
    assert options.get_preferred_allocation_available is True


def test_allocate_returns_the_uuids_and_the_vfio_devices(stub: Any) -> None:
    request = api_pb2.AllocateRequest(
        container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=[U2, U1]),
            api_pb2.ContainerAllocateRequest(devices_ids=[U1]),
        ]
    )

    response = stub.Allocate(request, timeout=2)

    first, second = response.container_responses
    assert dict(first.envs) == {"MDEV_PCI_RESOURCE_NVIDIA_COM_NVIDIA_A2-4Q": f"{U2},{U1}"}
    assert [(d.container_path, d.host_path, d.permissions) for d in first.devices] == [
        ("/dev/vfio/vfio", "/dev/vfio/vfio", "mrw"),
        ("/dev/vfio/46", "/dev/vfio/46", "mrw"),
        ("/dev/vfio/45", "/dev/vfio/45", "mrw"),
    ]
    assert dict(second.envs) == {"MDEV_PCI_RESOURCE_NVIDIA_COM_NVIDIA_A2-4Q": U1}
    assert [d.host_path for d in second.devices] == ["/dev/vfio/vfio", "/dev/vfio/45"]


def test_allocate_of_an_unknown_id_is_invalid_argument_and_the_server_goes_on(
    stub: Any,
) -> None:
    bad = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[U1, U3])]
    )

    with pytest.raises(grpc.RpcError) as err:
        stub.Allocate(bad, timeout=2)

    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"unknown device ID {U3}" in err.value.details()
    good = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[U1])]
    )
    assert stub.Allocate(good, timeout=2).container_responses[0].envs


def test_allocate_of_an_unhealthy_device_is_failed_precondition(
    plugin: ProfilePlugin, stub: Any
) -> None:
    plugin.update((DEVICES[0], device(U2, 1, "46", healthy=False)))
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[U2])]
    )

    with pytest.raises(grpc.RpcError) as err:
        stub.Allocate(request, timeout=2)

    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "Unhealthy" in err.value.details()


def test_preferred_allocation_answers_each_container(plugin: ProfilePlugin, stub: Any) -> None:
    plugin.update((*DEVICES, device(U3, 2, "47")))
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=[U3, U2, U1], allocation_size=2
            ),
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=[U3, U2, U1], must_include_deviceIDs=[U3], allocation_size=2
            ),
        ]
    )

    response = stub.GetPreferredAllocation(request, timeout=2)

    assert [list(r.deviceIDs) for r in response.container_responses] == [[U1, U2], [U3, U1]]


def test_prestart_container_is_accepted(stub: Any) -> None:
    request = api_pb2.PreStartContainerRequest(devices_ids=[U1])

    assert stub.PreStartContainer(request, timeout=2) == api_pb2.PreStartContainerResponse()


# -- ListAndWatch ---------------------------------------------------------------------------------


def test_list_and_watch_sends_the_list_at_once_and_each_change(
    plugin: ProfilePlugin, stub: Any
) -> None:
    # How fast a change reaches the stream is the bench's refresh_to_list_and_watch.
    stream = stub.ListAndWatch(api_pb2.Empty(), timeout=5)
    try:
        assert listed(next(stream)) == [(U1, "Healthy"), (U2, "Healthy")]

        plugin.update((DEVICES[0], device(U2, 1, "46", healthy=False)))

        assert listed(next(stream)) == [(U1, "Healthy"), (U2, "Unhealthy")]
        assert not plugin.update((DEVICES[0], device(U2, 1, "46", healthy=False)))  # same
        plugin.update(DEVICES[:1])
        assert listed(next(stream)) == [(U1, "Healthy")]
    finally:
        stream.cancel()


def test_a_stream_the_client_drops_ends_and_the_next_gets_the_current_list(
    plugin: ProfilePlugin, stub: Any
) -> None:
    stream = stub.ListAndWatch(api_pb2.Empty(), timeout=5)
    next(stream)
    assert plugin.open_streams == 1

    stream.cancel()

    assert wait_until(lambda: plugin.open_streams == 0)
    plugin.update(DEVICES[1:])
    again = stub.ListAndWatch(api_pb2.Empty(), timeout=5)
    try:
        assert listed(next(again)) == [(U2, "Healthy")]
    finally:
        again.cancel()


def test_stop_sends_a_pending_empty_list_then_ends_the_stream_and_removes_the_socket(
    plugin: ProfilePlugin, stub: Any
) -> None:
    stream = stub.ListAndWatch(api_pb2.Empty(), timeout=5)
    next(stream)

    plugin.update(())
    plugin.stop()

    assert listed(next(stream)) == []
    with pytest.raises(StopIteration):
        next(stream)
    assert not plugin.socket_path.exists()
    assert not plugin.serving
    assert not plugin.serve_again_if_gone()  # a stopped plugin is not resurrected by a late retry


def test_a_plugin_whose_socket_is_in_place_is_not_restarted(plugin: ProfilePlugin) -> None:
    inode = plugin.socket_path.lstat().st_ino
    assert not plugin.serve_again_if_gone()
    assert plugin.socket_path.lstat().st_ino == inode


def test_another_socket_under_its_name_is_not_taken_for_its_own(plugin: ProfilePlugin) -> None:
    plugin.socket_path.unlink()
    other = socket.socket(socket.AF_UNIX)
    other.bind(str(plugin.socket_path))  # nobody serves on it
    other.close()
    theirs = plugin.socket_path.lstat().st_ino

    assert plugin.serve_again_if_gone()

    assert plugin.socket_path.lstat().st_ino != theirs
    with dial(plugin.socket_path) as stub:
        assert stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=2)


def test_a_file_under_its_name_that_is_no_socket_is_left_alone_and_said(
    plugin: ProfilePlugin,
) -> None:
    plugin.socket_path.unlink()
    plugin.socket_path.write_text("")

    with pytest.raises(PluginDirError, match="is not a socket"):
        plugin.serve_again_if_gone()
    assert plugin.socket_path.read_text() == ""


def test_it_serves_again_after_the_socket_was_deleted(plugin: ProfilePlugin) -> None:
    plugin.socket_path.unlink()

    assert plugin.serve_again_if_gone()

    with dial(plugin.socket_path) as stub:
        stream = stub.ListAndWatch(api_pb2.Empty(), timeout=5)
        try:
            assert listed(next(stream)) == [(U1, "Healthy"), (U2, "Healthy")]
        finally:
            stream.cancel()


# -- serving problems -----------------------------------------------------------------------------


def test_a_stale_socket_from_a_dead_process_is_replaced(plugin_dir: Path) -> None:
    p = ProfilePlugin(RES, plugin_dir=plugin_dir)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(p.socket_path))
    stale.close()  # the file stays, nobody listens

    p.start()
    try:
        with dial(p.socket_path) as stub:
            assert stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=2)
    finally:
        p.stop()


def test_the_socket_appears_only_once_serving_under_its_own_name(
    plugin: ProfilePlugin, plugin_dir: Path
) -> None:
    # Bound under a one-off name, renamed into place once serving: nothing else is left.
    assert [p.name for p in plugin_dir.iterdir()] == [plugin.socket_path.name]


def test_with_umask_0_the_socket_is_never_reachable_more_open_than_0600(
    plugin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the socket and its directory are at the moment it takes its name: bound with
    umask 0 it is 0777, so it must be 0600 by then, and until then out of reach."""
    seen: list[tuple[int, int, int]] = []
    real_replace = os.replace

    def replace(src: Any, dst: Any, **kw: Any) -> None:
        if Path(dst) == p.socket_path:
            parent = Path(src).parent
            assert parent.parent == plugin_dir
            seen.append(
                (
                    stat.S_IMODE(Path(src).lstat().st_mode),
                    stat.S_IMODE(parent.lstat().st_mode),
                    parent.lstat().st_uid,
                )
            )
        real_replace(src, dst, **kw)

    monkeypatch.setattr(os, "replace", replace)
    p = ProfilePlugin(RES, plugin_dir=plugin_dir)
    previous = os.umask(0)
    try:
        p.start()
        p.socket_path.unlink()
        assert p.serve_again_if_gone()
    finally:
        os.umask(previous)
    try:
        assert seen == [(0o600, 0o700, os.getuid())] * 2
        assert stat.S_IMODE(p.socket_path.lstat().st_mode) == 0o600
        assert [f.name for f in plugin_dir.iterdir()] == [p.socket_path.name]
        with dial(p.socket_path) as stub:
            assert stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=2)
    finally:
        p.stop()


def test_staging_directories_a_killed_process_left_are_removed(plugin_dir: Path) -> None:
    stale = plugin_dir / ".vgpuctl-staging-0a1b2c3d"
    stale.mkdir(mode=0o700)
    bound = socket.socket(socket.AF_UNIX)
    bound.bind(str(stale / "p.sock"))
    bound.close()
    empty = plugin_dir / ".vgpuctl-staging-4e5f6a7b"
    empty.mkdir(mode=0o700)
    odd = plugin_dir / ".vgpuctl-staging-8c9d0e1f"  # not what a plugin leaves: kept
    odd.mkdir()
    (odd / "notes.txt").write_text("someone's file")
    elsewhere = plugin_dir / "elsewhere"
    elsewhere.mkdir()
    (plugin_dir / ".vgpuctl-staging-link").symlink_to(elsewhere)  # never followed
    (elsewhere / "p.sock").write_text("")

    remove_stale_staging(plugin_dir)

    assert sorted(f.name for f in plugin_dir.iterdir()) == [
        ".vgpuctl-staging-8c9d0e1f",
        ".vgpuctl-staging-link",
        "elsewhere",
    ]
    assert (odd / "notes.txt").read_text() == "someone's file"
    assert (elsewhere / "p.sock").exists()


def test_stop_leaves_a_socket_that_is_not_its_own(plugin: ProfilePlugin) -> None:
    plugin.socket_path.unlink()
    foreign = socket.socket(socket.AF_UNIX)
    foreign.bind(str(plugin.socket_path))
    try:
        plugin.stop()

        assert plugin.socket_path.is_socket()
    finally:
        foreign.close()


def test_a_file_in_the_way_of_the_socket_is_a_clear_error(plugin_dir: Path) -> None:
    p = ProfilePlugin(RES, plugin_dir=plugin_dir)
    p.socket_path.write_text("not a socket")

    with pytest.raises(PluginDirError, match="is not a socket"):
        p.start()

    assert p.socket_path.read_text() == "not a socket"
    assert [f.name for f in plugin_dir.iterdir()] == [p.socket_path.name]


def test_serving_in_a_missing_directory_is_a_clear_error(plugin_dir: Path) -> None:
    p = ProfilePlugin(RES, plugin_dir=plugin_dir / "gone")

    with pytest.raises(PluginDirError, match=r"gone does not exist"):
        p.start()


def test_a_staging_path_too_long_for_af_unix_is_a_clear_error(plugin_dir: Path) -> None:
    # "vgpuctl-a.b_c.sock" fits; ".vgpuctl-staging-XXXXXXXX/p.sock" (32 bytes) does not.
    deep = plugin_dir / ("d" * (107 - 20 - len(str(plugin_dir))))
    deep.mkdir()
    p = ProfilePlugin("a.b/c", plugin_dir=deep)
    assert len(str(p.socket_path)) <= 107

    with pytest.raises(PluginDirError, match="staging path"):
        p.start()
    assert list(deep.iterdir()) == []


def test_a_socket_path_too_long_for_af_unix_is_a_clear_error(plugin_dir: Path) -> None:
    deep = plugin_dir / ("d" * 90)
    deep.mkdir()
    p = ProfilePlugin(RES, plugin_dir=deep)

    with pytest.raises(PluginDirError, match="longer than 107 bytes"):
        p.start()


# -- registration ---------------------------------------------------------------------------------


def test_register_announces_the_socket_to_the_kubelet(plugin: ProfilePlugin) -> None:
    with kubelet(plugin.kubelet_socket) as registry:
        plugin.register()

    (request,) = registry.requests
    assert request.version == "v1beta1"
    assert request.endpoint == "vgpuctl-nvidia.com_NVIDIA_A2-4Q.sock"
    assert request.resource_name == RES
    assert request.options.get_preferred_allocation_available
    assert not request.options.pre_start_required


def test_register_without_a_kubelet_says_it_is_not_ready(plugin: ProfilePlugin) -> None:
    with pytest.raises(RegistrationError, match="kubelet not ready at") as err:
        plugin.register()

    assert err.value.kubelet_missing
    assert err.value.transient


def test_register_on_a_dead_kubelet_socket_says_it_is_not_ready(plugin: ProfilePlugin) -> None:
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(plugin.kubelet_socket))
    dead.close()

    with pytest.raises(RegistrationError, match="kubelet not ready at") as err:
        plugin.register()

    assert err.value.kubelet_missing


def test_a_refused_registration_names_the_kubelets_answer(plugin: ProfilePlugin) -> None:
    with kubelet(plugin.kubelet_socket, refuse=1), pytest.raises(RegistrationError) as err:
        plugin.register()

    assert not err.value.kubelet_missing
    assert "kubelet refused registration of nvidia.com/NVIDIA_A2-4Q" in err.value.message
    assert "INVALID_ARGUMENT: version not supported" in err.value.message


def test_a_client_dialling_the_moment_the_socket_appears_gets_the_list(
    plugin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The socket is moved into place once the server accepts calls; a ListAndWatch opened
    right then (before ``start`` has returned) gets the devices, not a stream that ends
    empty (a race a loaded machine once showed in tests/unit/test_deviceplugin_standalone.py)."""
    from reconciler.deviceplugin import server as server_module

    first: list[list[tuple[str, str]]] = []
    real_replace = os.replace

    def replace_then_dial(src: Any, dst: Any) -> None:
        real_replace(src, dst)
        if str(dst).endswith(".sock"):
            with dial(Path(dst)) as s:
                stream = s.ListAndWatch(api_pb2.Empty(), timeout=5)
                first.append(listed(next(iter(stream), api_pb2.ListAndWatchResponse())))
                stream.cancel()

    monkeypatch.setattr(server_module.os, "replace", replace_then_dial)
    p = ProfilePlugin(RES, plugin_dir=plugin_dir, stop_grace=0.2)
    p.update(DEVICES)
    try:
        p.start()
    finally:
        p.stop()
    assert first == [[(d.id, "Healthy") for d in DEVICES]]
