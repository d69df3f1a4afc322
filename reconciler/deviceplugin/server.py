"""One kubelet device plugin: the gRPC ``DevicePlugin`` server for one vGPU profile.

A :class:`ProfilePlugin` serves ``v1beta1.DevicePlugin`` on its own Unix socket in the
device-plugin directory, registers that socket with the kubelet (``kubelet.sock``), streams the
device list (``ListAndWatch``: the full list at once, then again on every :meth:`update`), and
answers ``Allocate``/``GetPreferredAllocation`` from the pure functions of ``devices.py``. It
knows nothing about sysfs or other profiles: ``manager.py`` decides which plugins run, when to
serve again and when to retry a registration.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any, NoReturn

import grpc

from reconciler.deviceplugin.devices import (
    PERMISSIONS,
    AllocationError,
    PluginDevice,
    allocation,
    preferred,
    socket_name,
)
from reconciler.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from reconciler.model import PciAddress, TransientError, UsageError

log = logging.getLogger("vgpuctl.deviceplugin")

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")

#: The plugin sockets' mode: only root (the kubelet) may connect, whatever the umask.
SOCKET_MODE = 0o600
#: The private directories sockets are bound in before they move into place.
STAGING_PREFIX = ".vgpuctl-staging-"
#: ``sun_path`` holds 108 bytes including the terminating NUL.
_MAX_SOCKET_PATH = 107
#: A blocked ListAndWatch re-checks its client this often even if no wake-up reaches it (the
#: done callback normally wakes it at once; this only bounds a lost wake-up).
_STREAM_RECHECK_S = 1.0

_OPTIONS = api_pb2.DevicePluginOptions(
    pre_start_required=False, get_preferred_allocation_available=True
)


class PluginDirError(UsageError):
    """The device-plugin directory is missing, not a directory, or not writable."""


class RegistrationError(TransientError):
    """The kubelet did not accept a registration; trying again later may succeed."""

    def __init__(self, message: str, *, kubelet_missing: bool = False) -> None:
        super().__init__(message)
        #: True when no kubelet answers at all (no socket, or nobody listening on it).
        self.kubelet_missing = kubelet_missing


def check_plugin_dir(plugin_dir: Path) -> None:
    """Raise :class:`PluginDirError` unless ``plugin_dir`` is a directory we can create
    sockets in."""
    if not plugin_dir.exists():
        raise PluginDirError(
            f"device-plugin directory {plugin_dir} does not exist "
            "(is the kubelet installed on this node? pass --plugin-dir)"
        )
    if not plugin_dir.is_dir():
        raise PluginDirError(f"device-plugin directory {plugin_dir} is not a directory")
    if not os.access(plugin_dir, os.W_OK | os.X_OK):
        raise PluginDirError(f"device-plugin directory {plugin_dir} is not writable (run as root?)")


class ProfilePlugin:
    """The device plugin of one resource (one vGPU profile). Thread-safe.

    :meth:`start` serves, :meth:`register` announces the socket to the kubelet, :meth:`update`
    replaces the device list (every open ``ListAndWatch`` stream sends it at once),
    :meth:`restart` serves again after the socket was deleted, :meth:`stop` ends the streams,
    stops the server and removes the socket.
    """

    def __init__(
        self,
        resource: str,
        *,
        plugin_dir: Path,
        kubelet_socket: Path | None = None,
        register_timeout: float = 2.0,
        stop_grace: float = 0.5,
        workers: int = 8,
        vfio_cdev: Callable[[PciAddress], str | None] | None = None,
    ) -> None:
        self.resource = resource
        #: A VF's iommufd cdev (``vfio7``) now, or None: asked at each ``Allocate`` of a VF
        #: handed over whole (``manager.py`` reads it from sysfs).
        self.vfio_cdev = vfio_cdev
        self.plugin_dir = Path(os.path.abspath(plugin_dir))
        self.socket_path = self.plugin_dir / socket_name(resource)
        self.kubelet_socket = (
            Path(os.path.abspath(kubelet_socket))
            if kubelet_socket is not None
            else self.plugin_dir / KUBELET_SOCKET
        )
        self._register_timeout = register_timeout
        self._stop_grace = stop_grace
        self._workers = workers
        # Guards the device list and the stream bookkeeping; streams wait on it for changes.
        self._changed = threading.Condition()
        self._devices: tuple[PluginDevice, ...] = ()
        self._generation = 0  # bumped on every change of the list
        self._epoch = 0  # bumped whenever a server starts or stops: older streams end
        self._serving = False
        self._streams: set[object] = set()
        # Serialises start/stop/restart: one server at a time owns the socket name.
        self._lifecycle = threading.Lock()
        self._stopped = False
        self._server: Any = None
        self._executor: futures.ThreadPoolExecutor | None = None
        self._inode: int | None = None  # of the socket file this plugin put in place

    # -- state ----------------------------------------------------------------------------------

    @property
    def devices(self) -> tuple[PluginDevice, ...]:
        with self._changed:
            return self._devices

    @property
    def serving(self) -> bool:
        with self._changed:
            return self._serving

    @property
    def open_streams(self) -> int:
        """How many ``ListAndWatch`` streams are open now."""
        with self._changed:
            return len(self._streams)

    def update(self, devices: Sequence[PluginDevice]) -> bool:
        """Replace the device list; True if it changed (and the streams were woken)."""
        new = tuple(devices)
        with self._changed:
            if new == self._devices:
                return False
            self._devices = new
            self._generation += 1
            self._changed.notify_all()
        return True

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Serve on :attr:`socket_path` (no-op when serving). Raises :class:`PluginDirError`
        when the socket cannot be created."""
        with self._lifecycle:
            self._stopped = False
            if self._server is None:
                self._start_locked()

    def stop(self) -> None:
        """End every stream (each sends a pending change first), stop serving, remove the
        socket. No-op when not serving; :meth:`serve_again_if_gone` does nothing afterwards."""
        with self._lifecycle:
            self._stopped = True
            self._stop_locked()

    def serve_again_if_gone(self) -> bool:
        """Serve afresh unless :attr:`socket_path` is still this plugin's socket: True when it
        restarted. A deletion seen in the directory may be of any socket that had the name (one
        this plugin replaced itself, or one already served again), and may arrive while a
        restart is under way: decided here, under the lifecycle lock, it is decided on what is
        there once any restart is done. False, doing nothing, once :meth:`stop` was called."""
        with self._lifecycle:
            if self._stopped or (self._server is not None and self._socket_intact()):
                return False
            self._stop_locked()
            self._start_locked()
            return True

    def _socket_intact(self) -> bool:
        try:
            st = self.socket_path.lstat()
        except OSError:
            return False
        return stat.S_ISSOCK(st.st_mode) and st.st_ino == self._inode

    def _start_locked(self) -> None:
        path = str(self.socket_path)
        staging_dir = self.plugin_dir / f"{STAGING_PREFIX}{secrets.token_hex(4)}"
        staging = staging_dir / "p.sock"
        longest = max(len(path.encode()), len(str(staging).encode()))
        if longest > _MAX_SOCKET_PATH:
            raise PluginDirError(
                f"socket path {path} (or its staging path) is longer than {_MAX_SOCKET_PATH} "
                "bytes: choose a shorter --plugin-dir"
            )
        _remove_socket(self.socket_path)  # a stale one from a process that died
        if self.socket_path.exists() or self.socket_path.is_symlink():
            raise PluginDirError(f"cannot serve {self.resource}: {path} is not a socket")
        # The socket is bound in a directory of its own (0700) and moved into place once it is
        # 0600 and serving. bind() gives a socket the mode 0777 & ~umask: bound in the open it
        # would be connectable by anyone until a chmod, and the umask cannot be set for one
        # bind (it is the process's: other threads create files meanwhile). A rename keeps a
        # Unix socket working; the name only ever points at a server that accepts calls, and
        # grpc's unlink of its bound path at shutdown (which may come late) hits the private
        # directory, never a newer server's socket.
        try:
            staging_dir.mkdir(mode=0o700)  # the umask can only narrow it
        except OSError as exc:
            check_plugin_dir(self.plugin_dir)
            raise PluginDirError(
                f"cannot serve {self.resource}: cannot create {staging_dir}: {exc.strerror}"
            ) from None
        executor = futures.ThreadPoolExecutor(
            max_workers=self._workers, thread_name_prefix="deviceplugin"
        )
        server = grpc.server(executor)
        # The generated module is unannotated (grpcio-tools emits no types for services).
        api_pb2_grpc.add_DevicePluginServicer_to_server(  # type: ignore[no-untyped-call]
            _DevicePluginServicer(self), server
        )
        try:
            server.add_insecure_port("unix://" + str(staging))
            server.start()
            os.chmod(staging, SOCKET_MODE)
            # Serving before the name appears: a client that dials the moment it does (the
            # kubelet after a registration, a test) gets the list, never an empty stream.
            with self._changed:
                self._serving = True
                self._epoch += 1
            os.replace(staging, self.socket_path)
            inode = self.socket_path.lstat().st_ino
        except (RuntimeError, OSError) as exc:
            with self._changed:
                if self._serving:
                    self._serving = False
                    self._epoch += 1
                    self._changed.notify_all()
            server.stop(None)
            executor.shutdown(wait=False)
            check_plugin_dir(self.plugin_dir)  # the likely reason, said clearly
            reason = exc.strerror if isinstance(exc, OSError) else "cannot bind"
            raise PluginDirError(f"cannot serve {self.resource} on {path}: {reason}") from None
        finally:
            _remove_staging(staging_dir)
        self._server, self._executor, self._inode = server, executor, inode
        log.info("serving %s on %s", self.resource, path)

    def _stop_locked(self) -> None:
        server, executor = self._server, self._executor
        if server is None:
            return
        self._server = self._executor = None
        with self._changed:
            self._serving = False
            self._epoch += 1
            self._changed.notify_all()
        server.stop(self._stop_grace).wait()
        if executor is not None:
            executor.shutdown(wait=False)
        _remove_socket(self.socket_path, inode=self._inode)
        log.info("stopped serving %s", self.resource)

    # -- registration ---------------------------------------------------------------------------

    def register(self) -> None:
        """Announce this plugin to the kubelet. Raises :class:`RegistrationError`."""
        if not self.kubelet_socket.exists():
            raise RegistrationError(
                f"kubelet not ready at {self.kubelet_socket}", kubelet_missing=True
            )
        request = api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket_path.name,
            resource_name=self.resource,
            options=_OPTIONS,
        )
        with grpc.insecure_channel("unix://" + str(self.kubelet_socket)) as channel:
            try:
                stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
                stub.Register(request, timeout=self._register_timeout)
            except grpc.RpcError as exc:
                code, details = exc.code(), exc.details()
                if code == grpc.StatusCode.UNAVAILABLE:
                    raise RegistrationError(
                        f"kubelet not ready at {self.kubelet_socket} ({details})",
                        kubelet_missing=True,
                    ) from None
                raise RegistrationError(
                    f"kubelet refused registration of {self.resource}: {code.name}: {details}"
                ) from None
        log.info("registered %s with the kubelet at %s", self.resource, self.kubelet_socket)

    # -- the stream -----------------------------------------------------------------------------

    def _list_and_watch(self, context: Any) -> Iterator[api_pb2.ListAndWatchResponse]:
        token = object()
        with self._changed:
            epoch, generation, devices = self._epoch, self._generation, self._devices
            if not self._serving:
                return
            self._streams.add(token)

        def gone() -> None:
            with self._changed:
                self._streams.discard(token)
                self._changed.notify_all()

        # Wakes the waiting loop below as soon as the client goes away.
        context.add_callback(gone)
        log.debug("ListAndWatch opened for %s: %d devices", self.resource, len(devices))
        try:
            yield _list_response(devices)
            while True:
                with self._changed:
                    while (
                        self._generation == generation
                        and self._epoch == epoch
                        and context.is_active()
                    ):
                        self._changed.wait(_STREAM_RECHECK_S)
                    if not context.is_active():
                        log.debug("ListAndWatch for %s: the client went away", self.resource)
                        return
                    changed = self._generation != generation
                    ending = self._epoch != epoch
                    generation, devices = self._generation, self._devices
                # A change made just before stop() (a profile gone: the empty list) is sent
                # before the stream ends.
                if changed:
                    yield _list_response(devices)
                if ending:
                    log.debug("ListAndWatch for %s: the plugin stopped", self.resource)
                    return
        finally:
            with self._changed:
                self._streams.discard(token)
                self._changed.notify_all()


def _list_response(devices: Sequence[PluginDevice]) -> api_pb2.ListAndWatchResponse:
    return api_pb2.ListAndWatchResponse(
        devices=[api_pb2.Device(ID=d.id, health=d.health) for d in devices]
    )


def _abort(context: Any, code: Any, message: str) -> NoReturn:
    context.abort(code, message)
    raise AssertionError("context.abort returned")  # pragma: no cover - grpc always raises


class _DevicePluginServicer(api_pb2_grpc.DevicePluginServicer):
    """Translates the gRPC calls of one plugin to its state and the pure device logic."""

    def __init__(self, plugin: ProfilePlugin) -> None:
        self._plugin = plugin

    def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: Any
    ) -> api_pb2.DevicePluginOptions:
        return _OPTIONS

    def ListAndWatch(
        self, request: api_pb2.Empty, context: Any
    ) -> Iterator[api_pb2.ListAndWatchResponse]:
        return self._plugin._list_and_watch(context)

    def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: Any
    ) -> api_pb2.PreferredAllocationResponse:
        devices = self._plugin.devices
        return api_pb2.PreferredAllocationResponse(
            container_responses=[
                api_pb2.ContainerPreferredAllocationResponse(
                    deviceIDs=preferred(
                        list(r.available_deviceIDs),
                        list(r.must_include_deviceIDs),
                        r.allocation_size,
                        devices,
                    )
                )
                for r in request.container_requests
            ]
        )

    def Allocate(self, request: api_pb2.AllocateRequest, context: Any) -> api_pb2.AllocateResponse:
        resource = self._plugin.resource
        devices = self._plugin.devices
        responses = []
        for container in request.container_requests:
            ids = list(container.devices_ids)
            try:
                granted = allocation(resource, ids, devices, self._cdevs(ids, devices))
            except AllocationError as exc:
                log.warning("Allocate refused: %s", exc.message)
                code = (
                    grpc.StatusCode.INVALID_ARGUMENT
                    if exc.unknown_device
                    else grpc.StatusCode.FAILED_PRECONDITION
                )
                _abort(context, code, exc.message)
            responses.append(
                api_pb2.ContainerAllocateResponse(
                    envs=dict(granted.envs),
                    devices=[
                        api_pb2.DeviceSpec(container_path=p, host_path=p, permissions=PERMISSIONS)
                        for p in granted.device_paths
                    ],
                )
            )
            log.info(
                "Allocate %s: %s (%s)",
                resource,
                ",".join(ids),
                ", ".join(granted.device_paths[1:]),
            )
        return api_pb2.AllocateResponse(container_responses=responses)

    def _cdevs(self, ids: Sequence[str], devices: Sequence[PluginDevice]) -> dict[str, str]:
        """The iommufd cdevs of the whole VFs among ``ids``, where the host has one."""
        lookup = self._plugin.vfio_cdev
        if lookup is None:
            return {}
        out: dict[str, str] = {}
        for device in devices:
            if device.whole_vf and device.id in ids:
                cdev = lookup(device.vf)
                if cdev is not None:
                    out[device.id] = cdev
        return out

    def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: Any
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


def remove_stale_staging(plugin_dir: Path) -> None:
    """Remove the staging directories a process killed while starting a plugin left behind
    (the kubelet's clean-up leaves directories alone). Call before any plugin serves."""
    with os.scandir(plugin_dir) as entries:
        stale = [
            Path(entry.path)
            for entry in entries
            if entry.name.startswith(STAGING_PREFIX) and entry.is_dir(follow_symlinks=False)
        ]
    for directory in stale:
        _remove_staging(directory)


def _remove_staging(directory: Path) -> None:
    """Remove a staging directory and the socket in it; anything else makes it stay."""
    _remove_socket(directory / "p.sock")
    try:
        directory.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("cannot remove %s: %s", directory, exc.strerror or exc)


def _remove_socket(path: Path, *, inode: int | None = None) -> None:
    """Remove ``path`` if it is a socket (and, given ``inode``, that very one); leave anything
    else alone: it is not ours."""
    try:
        st = path.lstat()
        if stat.S_ISSOCK(st.st_mode) and inode in (None, st.st_ino):
            path.unlink()
    except FileNotFoundError:
        pass
