"""A fake kubelet for device-plugin tests: the kubelet's side of the v1beta1 API over real gRPC.

It does what the kubelet's device manager does with plugins (docs/domain.md §7), and only that:

- On ``start()`` it deletes every file in the plugin directory except its checkpoint (the
  kubelet's ``CleanupPluginDirectory``: plugin sockets included: this is the signal plugins
  watch for), then serves ``v1beta1.Registration`` on ``<plugin_dir>/kubelet.sock``.
- ``Register`` is handled synchronously, as the kubelet does: validate the version
  (``v1beta1``), the resource name (an extended resource: domain-qualified, not
  ``kubernetes.io``) and the endpoint (a file name in the directory); dial the plugin back on
  ``unix://<plugin_dir>/<endpoint>``, call ``GetDevicePluginOptions``, and only then answer, so a
  plugin that registers before it serves gets an error. A new registration for a resource
  replaces the previous connection (its stream is cancelled).
- ``ListAndWatch`` is consumed in a thread per plugin; each message is the full list and
  replaces the resource's devices. ``allocatable(resource)`` is the count of ``Healthy`` ones:
  what the kubelet reports as node allocatable; ``capacity(resource)`` counts them all.
- A stream that ends (the plugin stopped, its server went away, the stream broke) ends the
  plugin's connection, as in the kubelet: ``runClient`` → ``disconnectClient`` → the client's
  ``Disconnect`` closes the gRPC connection and calls ``ManagerImpl.PluginDisconnected``, which
  calls ``markResourceUnhealthy`` (every healthy device of the resource becomes unhealthy:
  allocatable drops to 0, capacity stays) and stops the endpoint (``setStopTime``). The devices
  stay listed, ``Unhealthy``, for ``endpointStopGracePeriod`` (5 minutes; ``grace_period``
  here), after which the kubelet's ``GetCapacity`` drops the resource. Only a new registration
  brings it back (kubernetes ``pkg/kubelet/cm/devicemanager``: ``plugin/v1beta1/handler.go``
  ``runClient``, ``plugin/v1beta1/client.go`` ``Run``/``Disconnect``, ``manager.go``
  ``PluginDisconnected``/``markResourceUnhealthy``/``GetCapacity``, ``types.go``
  ``endpointStopGracePeriod``; the 2018 ``manager.go`` ``addEndpoint`` did the same after
  ``e.run()`` returned). The kubelet never opens a second stream on a connection.
- ``restart()`` is a kubelet restart: connections drop, the state is forgotten (allocatable is
  zero until the plugin re-registers and streams again), every socket is deleted and a new
  ``kubelet.sock`` is served.

Test hooks: ``refuse`` (registrations fail with a gRPC error), ``drop_stream`` (the
resource's ``ListAndWatch`` stream breaks: handled as any stream end, above), the
``registrations`` log and the ``updates`` log (arrival time of every list, for latency
measurement), ``wait_for``. ``allocate``/``preferred``/``pre_start`` call the plugin directly,
without the kubelet's own checks, so tests see what the plugin answers to anything.

Socket paths must fit AF_UNIX's 107 bytes: make directories with :func:`make_plugin_dir`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from reconciler.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT = "kubelet_internal_checkpoint"
SUPPORTED_VERSIONS = ("v1beta1",)
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# sizeof(sockaddr_un.sun_path) - 1 on Linux.
UNIX_PATH_MAX = 107
# The kubelet's extended-resource rule: a DNS-subdomain prefix that is not kubernetes.io,
# a qualified name after the slash.
_EXTENDED_RESOURCE = re.compile(
    r"^(?!(?:[^/]*\.)?kubernetes\.io/)[a-z0-9]([-a-z0-9.]*[a-z0-9])?/"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)

log = logging.getLogger("tests.fake_kubelet")


def make_plugin_dir(prefix: str = "dp") -> Path:
    """A fresh, short directory for sockets (pytest's tmp_path is too deep for AF_UNIX)."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path("/tmp")
    return Path(tempfile.mkdtemp(dir=base, prefix=prefix))


def remove_plugin_dir(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class DeviceState:
    """One device as the last ListAndWatch message of its plugin listed it."""

    id: str
    health: str

    @property
    def healthy(self) -> bool:
        return self.health == HEALTHY


@dataclass(frozen=True, slots=True)
class Registration:
    """One Register call as the kubelet saw it, accepted or not."""

    resource: str
    endpoint: str
    version: str
    pre_start_required: bool
    get_preferred_allocation_available: bool
    accepted: bool
    error: str  # "" when accepted
    epoch: int  # how many times the kubelet had been (re)started when it came: 1 = first run
    at: float  # time.monotonic()


@dataclass(frozen=True, slots=True)
class Update:
    """One ListAndWatch message: when it arrived (time.perf_counter()) and what it listed."""

    resource: str
    at: float
    devices: tuple[DeviceState, ...]


@dataclass(eq=False)
class _Connection:
    """The kubelet's client for one registered plugin."""

    resource: str
    endpoint: str
    channel: Any  # grpc.Channel
    stub: api_pb2_grpc.DevicePluginStub
    options: api_pb2.DevicePluginOptions
    call: Any = None  # the ListAndWatch call (iterator and grpc.Call)
    thread: threading.Thread | None = None
    streaming: bool = False
    closed: bool = False
    stream_errors: list[str] = field(default_factory=list)


class _RegistrationServicer(api_pb2_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self._kubelet = kubelet

    def Register(self, request: api_pb2.RegisterRequest, context: Any) -> api_pb2.Empty:
        error = self._kubelet._register(request)
        if error is not None:
            code, message = error
            context.abort(code, message)
        return api_pb2.Empty()


class FakeKubelet:
    """The kubelet's device manager, serving ``Registration`` in ``plugin_dir``.

    Use as a context manager or call ``start()``/``stop()``. Thread-safe; every query returns
    a snapshot.
    """

    def __init__(
        self,
        plugin_dir: Path,
        *,
        refuse: bool = False,
        dial_timeout: float = 2.0,
        call_timeout: float = 5.0,
        grace_period: float = 300.0,
    ) -> None:
        self.plugin_dir = Path(plugin_dir)
        self.socket = self.plugin_dir / KUBELET_SOCKET
        if len(str(self.socket)) > UNIX_PATH_MAX - 40:
            # Leave room for the plugins' longer socket names next to kubelet.sock.
            raise ValueError(f"plugin dir {self.plugin_dir} is too long for AF_UNIX sockets")
        self.refuse = refuse
        self.dial_timeout = dial_timeout
        self.call_timeout = call_timeout
        #: The kubelet's ``endpointStopGracePeriod``: how long a resource whose stream ended
        #: keeps its (unhealthy) devices before it is dropped.
        self.grace_period = grace_period
        self._cond = threading.Condition(threading.RLock())
        # Registrations of one resource are handled one at a time (the newer replaces the
        # older); different resources in parallel, as the kubelet does.
        self._resource_locks: dict[str, threading.Lock] = {}
        self._server: Any = None
        self._epoch = 0
        self._connections: dict[str, _Connection] = {}
        self._devices: dict[str, tuple[DeviceState, ...]] = {}
        #: Resources whose stream ended: when (time.monotonic()), until they re-register.
        self._stopped: dict[str, float] = {}
        self._registrations: list[Registration] = []
        self._updates: list[Update] = []
        self._events = 0  # bumped on every change, under _cond
        self._closers: list[threading.Thread] = []

    def _notify(self) -> None:
        self._events += 1
        self._cond.notify_all()

    # --- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> FakeKubelet:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop, and wait until every connection to a plugin is closed."""
        self.stop()
        with self._cond:
            closers, self._closers = self._closers, []
        for closer in closers:
            closer.join(5)

    def start(self) -> None:
        """Start as the kubelet does: wipe the directory's sockets, then serve kubelet.sock."""
        with self._cond:
            if self._server is not None:
                raise RuntimeError("fake kubelet already running")
            self.plugin_dir.mkdir(parents=True, exist_ok=True)
            self._clean_directory()
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
            api_pb2_grpc.add_RegistrationServicer_to_server(  # type: ignore[no-untyped-call]
                _RegistrationServicer(self), server
            )
            server.add_insecure_port(f"unix://{self.socket}")
            server.start()
            self._server = server
            self._epoch += 1
            self._notify()
            log.info("fake kubelet %d serving %s", self._epoch, self.socket)

    def stop(self) -> None:
        """Stop serving and drop every plugin connection (the kubelet process is gone)."""
        with self._cond:
            server, self._server = self._server, None
            connections = list(self._connections.values())
            self._connections.clear()
            self._devices.clear()
            self._stopped.clear()
            self._notify()
        if server is not None:
            server.stop(grace=None).wait(5)
        for conn in connections:
            self._disconnect(conn)

    def restart(self) -> None:
        """A kubelet restart: stop, delete every socket in the directory, serve again."""
        self.stop()
        self.start()

    @property
    def running(self) -> bool:
        with self._cond:
            return self._server is not None

    @property
    def epoch(self) -> int:
        """1 after the first start, +1 per restart."""
        with self._cond:
            return self._epoch

    def _clean_directory(self) -> None:
        for entry in self.plugin_dir.iterdir():
            if entry.name == CHECKPOINT or entry.is_dir():
                continue
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()

    # --- registration ----------------------------------------------------------------------

    def _register(self, request: api_pb2.RegisterRequest) -> tuple[Any, str] | None:
        """Handle one Register call; the (status code, message) to fail it with, or None."""
        with self._cond:
            lock = self._resource_locks.setdefault(request.resource_name, threading.Lock())
        with lock:
            with self._cond:
                epoch = self._epoch
            error = self._validate(request)
            conn: _Connection | None = None
            if error is None:
                conn, message = self._connect(request)
                if conn is None:
                    error = (grpc.StatusCode.UNAVAILABLE, message)
            with self._cond:
                if error is None and (self._server is None or self._epoch != epoch):
                    # The kubelet stopped (or restarted) while this call was in flight.
                    error = (grpc.StatusCode.UNAVAILABLE, "kubelet is shutting down")
                registration = Registration(
                    resource=request.resource_name,
                    endpoint=request.endpoint,
                    version=request.version,
                    pre_start_required=request.options.pre_start_required,
                    get_preferred_allocation_available=(
                        request.options.get_preferred_allocation_available
                    ),
                    accepted=error is None,
                    error="" if error is None else error[1],
                    epoch=epoch,
                    at=time.monotonic(),
                )
                self._registrations.append(registration)
                previous = None
                if error is None and conn is not None:
                    previous = self._connections.get(request.resource_name)
                    self._connections[request.resource_name] = conn
                    self._devices.setdefault(request.resource_name, ())
                    self._stopped.pop(request.resource_name, None)
                self._notify()
            if previous is not None:
                self._disconnect(previous)
            if error is not None:
                if conn is not None:
                    self._disconnect(conn)
                log.info("registration of %s refused: %s", request.resource_name, error[1])
                return error
            assert conn is not None
            self._open_stream(conn)
            log.info("registered %s at %s", request.resource_name, request.endpoint)
            return None

    def _validate(self, request: api_pb2.RegisterRequest) -> tuple[Any, str] | None:
        if self.refuse:
            return (grpc.StatusCode.FAILED_PRECONDITION, "registration refused (test hook)")
        if request.version not in SUPPORTED_VERSIONS:
            return (
                grpc.StatusCode.INVALID_ARGUMENT,
                f"requested device plugin API version {request.version!r} is not supported; "
                f"supported versions: {list(SUPPORTED_VERSIONS)}",
            )
        if not _EXTENDED_RESOURCE.match(request.resource_name):
            return (
                grpc.StatusCode.INVALID_ARGUMENT,
                f"invalid extended resource name {request.resource_name!r}",
            )
        endpoint = request.endpoint
        if not endpoint or "/" in endpoint or endpoint in {".", "..", KUBELET_SOCKET}:
            return (grpc.StatusCode.INVALID_ARGUMENT, f"invalid endpoint {endpoint!r}")
        return None

    def _connect(self, request: api_pb2.RegisterRequest) -> tuple[_Connection | None, str]:
        """Dial the plugin back and ask its options, as the kubelet does inside Register."""
        target = f"unix://{self.plugin_dir / request.endpoint}"
        channel = grpc.insecure_channel(target)
        try:
            grpc.channel_ready_future(channel).result(timeout=self.dial_timeout)
            stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
            options = stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=self.call_timeout)
        except (grpc.FutureTimeoutError, grpc.RpcError) as exc:
            channel.close()
            return None, f"cannot connect to device plugin at {target}: {_describe(exc)}"
        return _Connection(request.resource_name, request.endpoint, channel, stub, options), ""

    def _open_stream(self, conn: _Connection) -> None:
        with self._cond:
            if conn.closed:
                return
            conn.call = conn.stub.ListAndWatch(api_pb2.Empty())
            conn.streaming = True
            thread = threading.Thread(
                target=self._watch,
                args=(conn, conn.call),
                name=f"fake-kubelet-watch {conn.resource}",
                daemon=True,
            )
            conn.thread = thread
            thread.start()  # under the lock: a concurrent _disconnect joins a started thread

    def _watch(self, conn: _Connection, call: Any) -> None:
        """Consume one ListAndWatch stream: each message replaces the resource's devices."""
        try:
            for message in call:
                at = time.perf_counter()
                devices = tuple(DeviceState(d.ID, d.health) for d in message.devices)
                with self._cond:
                    if conn.closed or conn.call is not call:
                        break
                    self._devices[conn.resource] = devices
                    self._updates.append(Update(conn.resource, at, devices))
                    self._notify()
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                conn.stream_errors.append(_describe(exc))
                log.info("ListAndWatch of %s ended: %s", conn.resource, _describe(exc))
        finally:
            with self._cond:
                ended = conn.call is call and not conn.closed
                if conn.call is call:
                    conn.streaming = False
                self._notify()
            if ended:
                self._plugin_disconnected(conn)

    def _plugin_disconnected(self, conn: _Connection) -> None:
        """The stream of the resource's current connection ended: the kubelet's
        ``disconnectClient`` (close the connection, forget the client) and
        ``PluginDisconnected`` (``markResourceUnhealthy``, stop the endpoint)."""
        with self._cond:
            if self._connections.get(conn.resource) is not conn:
                return  # replaced by a new registration, or the kubelet stopped
            del self._connections[conn.resource]
            self._devices[conn.resource] = tuple(
                DeviceState(d.id, UNHEALTHY) for d in self._devices.get(conn.resource, ())
            )
            self._stopped[conn.resource] = time.monotonic()
            self._notify()
        log.info("ListAndWatch of %s ended: its devices are unhealthy", conn.resource)
        self._disconnect(conn)

    def _expire(self) -> None:
        """The kubelet's ``GetCapacity``: drop resources stopped longer than the grace period.
        Call with ``_cond`` held."""
        now = time.monotonic()
        for resource, since in list(self._stopped.items()):
            if now - since > self.grace_period:
                del self._stopped[resource]
                self._devices.pop(resource, None)
                self._notify()

    def _disconnect(self, conn: _Connection) -> None:
        with self._cond:
            conn.closed = True
            call, thread = conn.call, conn.thread
        if call is not None:
            call.cancel()
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)
        # Closing a grpc channel can take ~0.2 s; the calls are already cancelled, so the
        # plugin sees the kubelet go at once, as when a kubelet process dies.
        closer = threading.Thread(target=conn.channel.close, name="fake-kubelet-close")
        closer.start()
        with self._cond:
            self._closers = [t for t in self._closers if t.is_alive()]
            self._closers.append(closer)

    # --- test hooks ------------------------------------------------------------------------

    def drop_stream(self, resource: str) -> None:
        """The resource's ListAndWatch stream breaks (cancelled here): the kubelet handles it
        as any stream end (its devices unhealthy, the connection closed) and waits for the
        plugin to register again."""
        with self._cond:
            conn = self._require(resource)
            call, thread = conn.call, conn.thread
        if call is not None:
            call.cancel()
        if thread is not None:
            thread.join(5)

    # --- queries ---------------------------------------------------------------------------

    def resources(self) -> set[str]:
        """Resources registered with this kubelet run (since the last restart), those whose
        stream ended less than the grace period ago included."""
        with self._cond:
            self._expire()
            return set(self._devices)

    def devices(self, resource: str) -> tuple[DeviceState, ...]:
        """The resource's devices from its last ListAndWatch message (empty if none yet), all
        ``Unhealthy`` once its stream ended."""
        with self._cond:
            self._expire()
            return self._devices.get(resource, ())

    def stopped(self, resource: str) -> bool:
        """Whether the resource's stream ended and it has not registered again since."""
        with self._cond:
            self._expire()
            return resource in self._stopped

    def capacity(self, resource: str) -> int:
        """Node capacity for the resource: its devices, healthy or not (0 once dropped)."""
        return len(self.devices(resource))

    def device_ids(self, resource: str) -> set[str]:
        return {d.id for d in self.devices(resource)}

    def healthy_ids(self, resource: str) -> set[str]:
        return {d.id for d in self.devices(resource) if d.healthy}

    def allocatable(self, resource: str) -> int:
        """Node allocatable for the resource, as the kubelet computes it: healthy devices."""
        return sum(1 for d in self.devices(resource) if d.healthy)

    def allocatable_all(self) -> dict[str, int]:
        with self._cond:
            self._expire()
            return {r: self.allocatable(r) for r in sorted(self._devices)}

    def streaming(self, resource: str) -> bool:
        """Whether the resource's ListAndWatch stream is open."""
        with self._cond:
            conn = self._connections.get(resource)
            return conn is not None and conn.streaming

    def stream_errors(self, resource: str) -> list[str]:
        """How streams of the current connection ended, other than cancelled by the kubelet."""
        with self._cond:
            conn = self._connections.get(resource)
            return list(conn.stream_errors) if conn is not None else []

    def plugin_options(self, resource: str) -> api_pb2.DevicePluginOptions:
        """What GetDevicePluginOptions answered when the resource registered."""
        with self._cond:
            return self._require(resource).options

    @property
    def registrations(self) -> list[Registration]:
        """Every Register call, in order, accepted or not, across restarts."""
        with self._cond:
            return list(self._registrations)

    def accepted(
        self, resource: str | None = None, *, epoch: int | None = None
    ) -> list[Registration]:
        """Accepted registrations, optionally of one resource and one kubelet run."""
        return [
            r
            for r in self.registrations
            if r.accepted
            and (resource is None or r.resource == resource)
            and (epoch is None or r.epoch == epoch)
        ]

    def updates(self, resource: str | None = None) -> list[Update]:
        """Every ListAndWatch message received, in arrival order, across restarts."""
        with self._cond:
            return [u for u in self._updates if resource is None or u.resource == resource]

    def update_count(self, resource: str | None = None) -> int:
        with self._cond:
            if resource is None:
                return len(self._updates)
            return sum(1 for u in self._updates if u.resource == resource)

    def describe(self) -> str:
        """The state in one line, for assertion messages."""
        with self._cond:
            state = {
                r: [f"{d.id[:8]}:{d.health}" for d in devs] for r, devs in self._devices.items()
            }
            streams = {r: c.streaming for r, c in self._connections.items()}
            registrations = [
                f"{r.resource}@{r.epoch}:{'ok' if r.accepted else r.error}"
                for r in self._registrations[-6:]
            ]
            epoch, running = self._epoch, self._server is not None
        try:
            files = sorted(p.name for p in self.plugin_dir.iterdir())
        except OSError as exc:
            files = [str(exc)]
        return (
            f"epoch={epoch} running={running} devices={state} "
            f"streaming={streams} files={files} last registrations={registrations}"
        )

    def wait_for(
        self, predicate: Callable[[], bool], timeout: float = 2.0, what: str = "condition"
    ) -> None:
        """Wait until ``predicate()`` holds, or fail the test after ``timeout`` seconds.

        Woken by every kubelet event (registration, stream message, stream end); also
        re-checked every 20 ms so predicates on other things (files) work too.
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                seen = self._events
            # Evaluated without the lock: a predicate may ask the plugin, whose threads may be
            # in a call to this kubelet.
            if predicate():
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"timed out after {timeout} s waiting for {what}; {self.describe()}"
                )
            with self._cond:
                if self._events == seen:
                    self._cond.wait(min(remaining, 0.02))

    # --- calls to the plugin ---------------------------------------------------------------

    def allocate_containers(
        self, resource: str, requests: Sequence[Iterable[str]]
    ) -> api_pb2.AllocateResponse:
        """Allocate, one container request per ID list. Raises grpc.RpcError on refusal."""
        stub = self._stub(resource)
        request = api_pb2.AllocateRequest(
            container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=list(ids)) for ids in requests
            ]
        )
        response: api_pb2.AllocateResponse = stub.Allocate(request, timeout=self.call_timeout)
        return response

    def allocate(self, resource: str, ids: Iterable[str]) -> api_pb2.ContainerAllocateResponse:
        """Allocate ``ids`` for one container; its ContainerAllocateResponse."""
        response = self.allocate_containers(resource, [ids])
        if len(response.container_responses) != 1:
            raise AssertionError(
                f"Allocate for one container answered {len(response.container_responses)}"
            )
        return response.container_responses[0]

    def preferred(
        self,
        resource: str,
        available: Iterable[str],
        must_include: Iterable[str] = (),
        size: int = 1,
    ) -> list[str]:
        """GetPreferredAllocation for one container; the IDs the plugin prefers, in order."""
        stub = self._stub(resource)
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        response: api_pb2.PreferredAllocationResponse = stub.GetPreferredAllocation(
            request, timeout=self.call_timeout
        )
        if len(response.container_responses) != 1:
            raise AssertionError(
                f"GetPreferredAllocation for one container answered "
                f"{len(response.container_responses)}"
            )
        return list(response.container_responses[0].deviceIDs)

    def pre_start(self, resource: str, ids: Iterable[str]) -> None:
        stub = self._stub(resource)
        stub.PreStartContainer(
            api_pb2.PreStartContainerRequest(devices_ids=list(ids)), timeout=self.call_timeout
        )

    def _stub(self, resource: str) -> api_pb2_grpc.DevicePluginStub:
        with self._cond:
            return self._require(resource).stub

    def _require(self, resource: str) -> _Connection:
        conn = self._connections.get(resource)
        if conn is None:
            raise KeyError(f"{resource} is not registered with the fake kubelet")
        return conn


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.RpcError):
        return f"{exc.code().name}: {exc.details()}"
    if isinstance(exc, grpc.FutureTimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}"
