"""The fake kubelet itself, against a minimal plugin written here with the generated stubs.

The integration tests trust the fake kubelet to behave like the kubelet; these tests pin the
parts they rely on: registration checks, dial-back, allocatable = healthy count, restarts that
wipe the directory, ended streams (devices unhealthy, as the kubelet marks them),
pass-through calls.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from reconciler.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from tests.doubles.fake_kubelet import (
    CHECKPOINT,
    KUBELET_SOCKET,
    DeviceState,
    FakeKubelet,
    make_plugin_dir,
    remove_plugin_dir,
)

RESOURCE = "example.com/widget"


class TinyPlugin(api_pb2_grpc.DevicePluginServicer):
    """Streams a settable device list; answers Allocate with the IDs in an env var."""

    def __init__(self, plugin_dir: Path, endpoint: str = "tiny.sock") -> None:
        self.plugin_dir = plugin_dir
        self.endpoint = endpoint
        self._cond = threading.Condition()
        self._devices: list[tuple[str, str]] = []
        self._version = 0
        self._server: Any = None
        self._stopping = False

    def serve(self) -> None:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_DevicePluginServicer_to_server(self, self._server)  # type: ignore[no-untyped-call]
        self._server.add_insecure_port(f"unix://{self.plugin_dir / self.endpoint}")
        self._server.start()

    def register(self, *, version: str = "v1beta1", resource: str = RESOURCE) -> None:
        with grpc.insecure_channel(f"unix://{self.plugin_dir / KUBELET_SOCKET}") as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            stub.Register(
                api_pb2.RegisterRequest(
                    version=version,
                    endpoint=self.endpoint,
                    resource_name=resource,
                    options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
                ),
                timeout=5,
            )

    def set_devices(self, devices: Sequence[tuple[str, str]]) -> None:
        with self._cond:
            self._devices = list(devices)
            self._version += 1
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._server is not None:
            self._server.stop(grace=None).wait(5)

    def GetDevicePluginOptions(self, request: Any, context: Any) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[api_pb2.ListAndWatchResponse]:
        sent = -1
        while context.is_active():
            with self._cond:
                self._cond.wait_for(
                    lambda sent=sent: (  # type: ignore[misc]
                        self._version != sent or self._stopping or not context.is_active()
                    ),
                    timeout=0.1,
                )
                if self._stopping:
                    return
                if self._version == sent:
                    continue
                sent = self._version
                devices = [api_pb2.Device(ID=i, health=h) for i, h in self._devices]
            yield api_pb2.ListAndWatchResponse(devices=devices)

    def Allocate(self, request: Any, context: Any) -> api_pb2.AllocateResponse:
        return api_pb2.AllocateResponse(
            container_responses=[
                api_pb2.ContainerAllocateResponse(envs={"IDS": ",".join(r.devices_ids)})
                for r in request.container_requests
            ]
        )

    def GetPreferredAllocation(
        self, request: Any, context: Any
    ) -> api_pb2.PreferredAllocationResponse:
        return api_pb2.PreferredAllocationResponse(
            container_responses=[
                api_pb2.ContainerPreferredAllocationResponse(
                    deviceIDs=sorted(r.available_deviceIDs)[: r.allocation_size]
                )
                for r in request.container_requests
            ]
        )


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    directory = make_plugin_dir()
    yield directory
    remove_plugin_dir(directory)


@pytest.fixture
def kubelet(plugin_dir: Path) -> Iterator[FakeKubelet]:
    with FakeKubelet(plugin_dir, dial_timeout=0.5) as k:
        yield k


@pytest.fixture
def plugin(plugin_dir: Path) -> Iterator[TinyPlugin]:
    p = TinyPlugin(plugin_dir)
    yield p
    p.stop()


def test_allocatable_is_the_healthy_count_of_the_last_list(
    kubelet: FakeKubelet, plugin: TinyPlugin
) -> None:
    plugin.set_devices([("a", "Healthy"), ("b", "Unhealthy"), ("c", "Healthy")])
    plugin.serve()
    plugin.register()
    kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 2, what="2 healthy")
    assert kubelet.devices(RESOURCE) == (
        DeviceState("a", "Healthy"),
        DeviceState("b", "Unhealthy"),
        DeviceState("c", "Healthy"),
    )
    assert kubelet.plugin_options(RESOURCE).get_preferred_allocation_available
    [reg] = kubelet.registrations
    assert (reg.resource, reg.endpoint, reg.version, reg.accepted, reg.epoch) == (
        RESOURCE,
        "tiny.sock",
        "v1beta1",
        True,
        1,
    )

    plugin.set_devices([("a", "Unhealthy")])
    kubelet.wait_for(lambda: kubelet.devices(RESOURCE) == (DeviceState("a", "Unhealthy"),))
    assert kubelet.allocatable(RESOURCE) == 0
    assert kubelet.allocatable_all() == {RESOURCE: 0}
    assert [len(u.devices) for u in kubelet.updates(RESOURCE)] == [3, 1]


@pytest.mark.parametrize(
    ("version", "resource", "code"),
    [
        ("v1alpha", RESOURCE, grpc.StatusCode.INVALID_ARGUMENT),
        ("v1beta1", "widget", grpc.StatusCode.INVALID_ARGUMENT),
        ("v1beta1", "kubernetes.io/widget", grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_bad_registrations_are_refused(
    kubelet: FakeKubelet, plugin: TinyPlugin, version: str, resource: str, code: Any
) -> None:
    plugin.serve()
    with pytest.raises(grpc.RpcError) as info:
        plugin.register(version=version, resource=resource)
    assert info.value.code() == code
    assert [r.accepted for r in kubelet.registrations] == [False]
    assert kubelet.resources() == set()


def test_refuse_hook_and_registering_before_serving(
    kubelet: FakeKubelet, plugin: TinyPlugin
) -> None:
    kubelet.refuse = True
    plugin.serve()
    with pytest.raises(grpc.RpcError) as info:
        plugin.register()
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    kubelet.refuse = False
    other = TinyPlugin(kubelet.plugin_dir, "other.sock")  # registers without serving
    with pytest.raises(grpc.RpcError) as info:
        other.register(resource="example.com/other")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "cannot connect to device plugin" in (info.value.details() or "")
    assert [r.accepted for r in kubelet.registrations] == [False, False]

    plugin.register()
    assert kubelet.accepted(RESOURCE)


def test_restart_wipes_every_socket_and_forgets_devices(
    kubelet: FakeKubelet, plugin: TinyPlugin, plugin_dir: Path
) -> None:
    plugin.set_devices([("a", "Healthy")])
    plugin.serve()
    plugin.register()
    kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 1)
    (plugin_dir / CHECKPOINT).write_text("{}")
    (plugin_dir / "stray-file").write_text("")
    (plugin_dir / "subdir").mkdir()
    assert (plugin_dir / "tiny.sock").exists()

    kubelet.restart()

    assert kubelet.epoch == 2
    assert sorted(p.name for p in plugin_dir.iterdir()) == sorted(
        [CHECKPOINT, KUBELET_SOCKET, "subdir"]
    )
    assert kubelet.allocatable(RESOURCE) == 0
    assert kubelet.resources() == set()

    # The plugin's server still runs but its socket is gone: a plugin must serve again.
    plugin.stop()
    plugin = TinyPlugin(plugin_dir)
    plugin.set_devices([("a", "Healthy")])
    plugin.serve()
    plugin.register()
    kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 1)
    assert [r.epoch for r in kubelet.accepted(RESOURCE)] == [1, 2]
    plugin.stop()


def test_stream_ended_by_the_plugin_makes_its_devices_unhealthy(
    plugin_dir: Path, plugin: TinyPlugin
) -> None:
    # The kubelet's PluginDisconnected → markResourceUnhealthy: allocatable 0, capacity kept,
    # the devices listed Unhealthy until the grace period (endpointStopGracePeriod) ends.
    with FakeKubelet(plugin_dir, dial_timeout=0.5, grace_period=0.5) as kubelet:
        plugin.set_devices([("a", "Healthy"), ("b", "Unhealthy")])
        plugin.serve()
        plugin.register()
        kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 1)
        plugin.stop()
        kubelet.wait_for(lambda: kubelet.stopped(RESOURCE), what="stream end")
        assert not kubelet.streaming(RESOURCE)
        assert kubelet.devices(RESOURCE) == (
            DeviceState("a", "Unhealthy"),
            DeviceState("b", "Unhealthy"),
        )
        assert (kubelet.allocatable(RESOURCE), kubelet.capacity(RESOURCE)) == (0, 2)
        with pytest.raises(KeyError):  # the connection is gone: nothing reaches the plugin
            kubelet.allocate(RESOURCE, ["a"])
        kubelet.wait_for(
            lambda: RESOURCE not in kubelet.resources(), what="the grace period to end"
        )
        assert kubelet.capacity(RESOURCE) == 0


def test_a_broken_stream_is_a_stream_end_and_registering_again_restores(
    kubelet: FakeKubelet, plugin: TinyPlugin
) -> None:
    plugin.set_devices([("a", "Healthy")])
    plugin.serve()
    plugin.register()
    kubelet.wait_for(lambda: kubelet.update_count(RESOURCE) == 1)

    kubelet.drop_stream(RESOURCE)
    kubelet.wait_for(lambda: kubelet.stopped(RESOURCE), what="the endpoint to stop")
    assert kubelet.devices(RESOURCE) == (DeviceState("a", "Unhealthy"),)
    assert kubelet.allocatable(RESOURCE) == 0
    assert RESOURCE in kubelet.resources()  # within the grace period (5 minutes by default)

    # Only a new registration brings it back, with a new stream and the current list.
    plugin.set_devices([("a", "Healthy"), ("b", "Healthy")])
    plugin.register()
    kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 2)
    assert kubelet.streaming(RESOURCE) and not kubelet.stopped(RESOURCE)


def test_calls_reach_the_plugin(kubelet: FakeKubelet, plugin: TinyPlugin) -> None:
    plugin.serve()
    plugin.register()
    assert kubelet.allocate(RESOURCE, ["x", "y"]).envs["IDS"] == "x,y"
    many = kubelet.allocate_containers(RESOURCE, [["x"], ["y", "z"]])
    assert [r.envs["IDS"] for r in many.container_responses] == ["x", "y,z"]
    assert kubelet.preferred(RESOURCE, ["c", "a", "b"], size=2) == ["a", "b"]
    with pytest.raises(KeyError):
        kubelet.allocate("example.com/unknown", ["x"])


def test_wait_for_fails_with_the_state(kubelet: FakeKubelet) -> None:
    with pytest.raises(AssertionError, match=r"waiting for nothing; epoch=1"):
        kubelet.wait_for(lambda: False, timeout=0.05, what="nothing")


def test_plugin_dir_must_be_short() -> None:
    with pytest.raises(ValueError, match="too long"):
        FakeKubelet(Path("/tmp") / ("x" * 80))
