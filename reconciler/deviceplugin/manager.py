"""The node's device plugins: one :class:`ProfilePlugin` per vGPU profile present, kept alive.

:class:`PluginManager` turns each observed inventory into device sets (``devices.py``), starts a
plugin for a profile that appears, pushes changed lists to running ones, and sends an empty list
then stops the plugin of a profile that is gone. A supervisor thread registers plugins with the
kubelet and retries with backoff while the kubelet is away or refuses; a watchdog observer on the
device-plugin directory notices a restarting kubelet (it deletes every socket there, then creates
``kubelet.sock`` again) so each plugin serves and registers again without losing a device.

:func:`run_standalone` is ``vgpuctl device-plugin``: it rescans sysfs on an interval and learns
which vanished vGPUs vgpuctl removed on purpose from the apply journal.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from reconciler.apply import Journal, JournalReader, JournalRecord, Phase
from reconciler.catalog import Catalog
from reconciler.deviceplugin.devices import (
    DeviceSets,
    PluginDevice,
    carry_vanished,
    device_sets,
)
from reconciler.deviceplugin.server import (
    KUBELET_SOCKET,
    PluginDirError,
    ProfilePlugin,
    RegistrationError,
    check_plugin_dir,
    remove_stale_staging,
)
from reconciler.model import (
    ActionKind,
    ApplyError,
    Inventory,
    ObserveError,
    PciAddress,
    ReconcilerError,
    TypeNames,
    unresolved_type_id,
)
from reconciler.model.record import field, record
from reconciler.observe import HoldProbe, SysfsTree, observe_host
from reconciler.observe.interfaces import vfio_cdev
from reconciler.observe.pci import PCI_DEVICES

log = logging.getLogger("vgpuctl.deviceplugin")

#: For this long after kubelet.sock appears, a failed registration is retried every
#: ``_KUBELET_STARTING_RETRY_S`` instead of backing off: the kubelet is starting.
_KUBELET_STARTING_S = 2.0
_KUBELET_STARTING_RETRY_S = 0.05


@record(frozen=True, slots=True)
class Backoff:
    """Delays between retries: ``initial``, doubling, at most ``cap`` seconds."""

    initial: float = 0.5
    cap: float = 5.0

    def delay(self, failures: int) -> float:
        return float(min(self.cap, self.initial * 2 ** max(failures - 1, 0)))


@record(slots=True)
class _PluginState:
    """What the supervisor still owes one plugin. Guarded by the manager's lock."""

    plugin: ProfilePlugin
    #: A socket of its name was deleted: serve again first if it was the one in use.
    serve: bool = False
    register: bool = False
    #: Bumped whenever work is asked for, so work that raced with a newer request (a socket
    #: deleted again during the restart, a kubelet restart during Register) is done again.
    request: int = 0
    serve_request: int = 0
    failures: int = 0
    next_try: float = 0.0
    #: Which kubelet.sock (inode, ctime) it registered with, or is registering with now.
    kubelet: tuple[int, int] | None = None

    def ask(self) -> None:
        """Register (again) as soon as possible."""
        self.register = True
        self.request += 1
        self.failures = 0
        self.next_try = 0.0
        self.kubelet = None

    def check_socket(self) -> None:
        """Serve again as soon as possible if the socket in use is gone; registering follows
        only if it was (see :meth:`ProfilePlugin.serve_again_if_gone`)."""
        self.serve = True
        self.serve_request += 1
        self.next_try = 0.0


class PluginManager:
    """The device plugins of one node. Thread-safe; :meth:`close` when done.

    Raises :class:`PluginDirError` when ``plugin_dir`` is missing, not a directory or not
    writable. Kubelet trouble (no ``kubelet.sock``, a refused registration) is logged and
    retried with ``backoff``, never raised.
    """

    def __init__(
        self,
        *,
        plugin_dir: Path,
        node: str,
        kubelet_socket: Path | None = None,
        backoff: Backoff = Backoff(),
        register_timeout: float = 2.0,
    ) -> None:
        self.plugin_dir = Path(os.path.abspath(plugin_dir))
        self.node = node
        self.kubelet_socket = (
            Path(os.path.abspath(kubelet_socket))
            if kubelet_socket is not None
            else self.plugin_dir / KUBELET_SOCKET
        )
        self._backoff = backoff
        self._register_timeout = register_timeout
        check_plugin_dir(self.plugin_dir)
        remove_stale_staging(self.plugin_dir)

        self._lock = threading.Condition()  # state below; the supervisor waits on it
        self._plugins: dict[str, _PluginState] = {}
        self._advertised: DeviceSets = {}
        self._closed = False
        #: Where the last inventory was read: a VF's iommufd cdev is looked up there.
        self._sysfs_root: Path | None = None
        self._kubelet_seen_at = float("-inf")  # when kubelet.sock last appeared
        # Serialises update()/refresh()/close(): servers start and stop in there.
        self._updating = threading.RLock()

        self._observer = Observer()
        handler = _DirectoryEvents(self)
        watched = {self.plugin_dir, self.kubelet_socket.parent}
        for directory in sorted(watched):
            try:
                self._observer.schedule(handler, str(directory), recursive=False)
            except OSError as exc:
                raise PluginDirError(f"cannot watch {directory}: {exc.strerror or exc}") from None
        self._observer.start()
        self._supervisor = threading.Thread(
            target=self._supervise, name="deviceplugin-supervisor", daemon=True
        )
        self._supervisor.start()

    def __enter__(self) -> PluginManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what is advertised ---------------------------------------------------------------------

    def advertised(self) -> DeviceSets:
        """Resource → the devices its plugin lists now (tombstones included)."""
        with self._lock:
            return dict(self._advertised)

    def plugin(self, resource: str) -> ProfilePlugin | None:
        with self._lock:
            state = self._plugins.get(resource)
            return state.plugin if state is not None else None

    def registered(self, resource: str) -> bool:
        """Whether the plugin of ``resource`` is registered with the current kubelet."""
        with self._lock:
            state = self._plugins.get(resource)
            return state is not None and not state.register and not state.serve

    def update(self, inventory: Inventory, *, removed_on_purpose: Iterable[str] = ()) -> None:
        """Advertise what ``inventory`` holds.

        A profile with vGPUs (or tombstones) gets a plugin; a running plugin gets its new list
        (streams send it at once); a profile with nothing left sends an empty list and stops.
        A vGPU that vanished is reported Unhealthy unless its UUID is in
        ``removed_on_purpose`` (see :func:`~reconciler.deviceplugin.devices.carry_vanished`).
        Raises :class:`PluginDirError` if a new profile's socket cannot be created (the other
        profiles are still updated).
        """
        removed = frozenset(removed_on_purpose)
        with self._updating:
            if self._closed:
                return
            if inventory.sysfs_root:
                self._sysfs_root = Path(inventory.sysfs_root)
            with self._lock:
                previous = self._advertised
            now = carry_vanished(previous, device_sets(inventory), removed_on_purpose=removed)
            _log_changes(previous, now)
            failed: PluginDirError | None = None
            for resource, devices in now.items():
                try:
                    self._advertise(resource, devices)
                except PluginDirError as exc:
                    log.error("cannot serve %s: %s", resource, exc.message)
                    failed = failed or exc
            with self._lock:
                gone = [r for r in self._plugins if r not in now]
                stopping = [self._plugins.pop(r) for r in gone]
                # A profile whose plugin could not start is tried afresh by the next update.
                self._advertised = {r: d for r, d in now.items() if r in self._plugins}
            for resource, state in zip(gone, stopping, strict=True):
                state.plugin.update(())
                state.plugin.stop()
                log.info("profile %s is gone: sent an empty list and stopped its plugin", resource)
            if failed is not None:
                raise failed

    def refresh(self, inventory: Inventory, *, resource: str, devices: Iterable[str]) -> None:
        """Carry out a ``device-plugin-refresh`` action: ``devices`` are the UUIDs ``resource``
        has after the plan; any other device it listed was removed on purpose and is dropped
        (not reported Unhealthy). ``inventory`` is the host observed after the host actions."""
        keep = frozenset(devices)
        with self._updating:
            with self._lock:
                before = self._advertised.get(resource, ())
            self.update(inventory, removed_on_purpose=[d.id for d in before if d.id not in keep])

    def close(self) -> None:
        """Stop the supervisor, the directory watch and every plugin (their sockets go)."""
        with self._updating:
            with self._lock:
                if self._closed:
                    return
                self._closed = True
                states = list(self._plugins.values())
                self._plugins.clear()
                self._lock.notify_all()
            self._observer.stop()
            self._observer.join(timeout=5)
            self._supervisor.join(timeout=5)
            for state in states:
                state.plugin.stop()

    def _advertise(self, resource: str, devices: Sequence[PluginDevice]) -> None:
        with self._lock:
            state = self._plugins.get(resource)
        if state is not None:
            state.plugin.update(devices)
            return
        plugin = ProfilePlugin(
            resource,
            plugin_dir=self.plugin_dir,
            kubelet_socket=self.kubelet_socket,
            register_timeout=self._register_timeout,
            vfio_cdev=self._vfio_cdev,
        )
        plugin.update(devices)
        plugin.start()  # serve before registering: the kubelet dials back at once
        state = _PluginState(plugin)
        with self._lock:
            self._plugins[resource] = state
            state.ask()
            self._lock.notify_all()

    def _vfio_cdev(self, vf: PciAddress) -> str | None:
        """The iommufd cdev of ``vf`` now (``vfio7``), from its ``vfio-dev/`` in sysfs; None
        where the host has none, or it cannot be read (then the VM gets the group only)."""
        root = self._sysfs_root
        if root is None:
            return None
        tree = SysfsTree(root)
        try:
            return vfio_cdev(tree, tree.resolve(f"{PCI_DEVICES}/{vf}"))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, ReconcilerError) as exc:
            why = exc.message if isinstance(exc, ReconcilerError) else exc.strerror or str(exc)
            log.warning("cannot read the vfio cdev of %s: %s", vf, why)
            return None

    # -- kubelet events (watchdog thread) -------------------------------------------------------

    def _socket_deleted(self, path: Path) -> None:
        if path == self.kubelet_socket:
            log.info("%s was removed (kubelet restarting?)", path)
            return
        with self._lock:
            state = next((s for s in self._plugins.values() if s.plugin.socket_path == path), None)
            if state is None:
                return
            # Whether it was the socket in use (not one the plugin replaced itself, not one
            # already served again) is for the supervisor to find out: the plugin decides it
            # once any restart under way is done. Judged here, on a flag that a restart flips,
            # a deletion arriving mid-restart was lost and the plugin left without a socket.
            state.check_socket()
            self._lock.notify_all()

    def _kubelet_appeared(self) -> None:
        current = _identity(self.kubelet_socket)
        with self._lock:
            self._kubelet_seen_at = time.monotonic()
            # A plugin that registered (or is registering) with this very socket is known to
            # this kubelet already: the event merely arrived late.
            stale = [
                s
                for s in self._plugins.values()
                if (current is None or s.kubelet != current) and not _owed_first_try(s)
            ]
            if not stale:
                return
            log.info(
                "kubelet socket appeared at %s: registering %d plugins",
                self.kubelet_socket,
                len(stale),
            )
            for state in stale:
                state.ask()
            self._lock.notify_all()

    # -- the supervisor thread ------------------------------------------------------------------

    def _supervise(self) -> None:
        while True:
            with self._lock:
                due = self._wait_for_work()
                if due is None:
                    return
            for state, request in due:
                if self._closed:
                    return
                try:
                    self._serve_and_register(state, request)
                except Exception:
                    # Whatever goes wrong with one plugin, the others are still looked after.
                    log.exception("unexpected error serving %s", state.plugin.resource)
                    self._failed(state, f"{state.plugin.resource} not registered")

    def _wait_for_work(self) -> list[tuple[_PluginState, int]] | None:
        """Called with the lock held: the plugins owed work now, or None once closed."""
        while not self._closed:
            now = time.monotonic()
            owed = [s for s in self._plugins.values() if s.serve or s.register]
            due = [(s, s.request) for s in owed if s.next_try <= now]
            if due:
                return due
            self._lock.wait(min((s.next_try - now for s in owed), default=None))
        return None

    def _serve_and_register(self, state: _PluginState, request: int) -> None:
        plugin = state.plugin
        with self._lock:
            serve, serve_request = state.serve, state.serve_request
        if serve:
            try:
                restarted = plugin.serve_again_if_gone()
            except PluginDirError as exc:
                self._failed(state, f"cannot serve {plugin.resource}: {exc.message}")
                return
            with self._lock:
                if state.serve_request == serve_request:
                    state.serve = False
                if restarted:
                    log.warning(
                        "socket %s was deleted (kubelet restart?): serving %s again",
                        plugin.socket_path,
                        plugin.resource,
                    )
                    state.ask()
                    request = state.request
                elif not state.register:
                    return  # its socket is in place and it is registered
        if not plugin.serving:
            return  # stopped meanwhile (its profile is gone)
        with self._lock:
            state.kubelet = _identity(self.kubelet_socket)
        try:
            plugin.register()
        except RegistrationError as exc:
            with self._lock:
                state.kubelet = None
            if exc.kubelet_missing:
                self._failed(state, f"kubelet not ready at {self.kubelet_socket}")
            else:
                self._failed(state, exc.message)
            return
        with self._lock:
            if state.request == request:
                state.register = False
                state.failures = 0

    def _failed(self, state: _PluginState, message: str) -> None:
        with self._lock:
            state.failures += 1
            delay = self._backoff.delay(state.failures)
            if time.monotonic() - self._kubelet_seen_at < _KUBELET_STARTING_S:
                # Its socket exists a moment before it answers: try again soon.
                delay = min(delay, _KUBELET_STARTING_RETRY_S)
            state.next_try = time.monotonic() + delay
        log.warning("%s, retrying in %g s", message, delay)


def _owed_first_try(state: _PluginState) -> bool:
    """A registration asked for (its socket was deleted: the kubelet's restart) and not tried
    yet, or being tried with whatever kubelet.sock is there now: it reaches the new kubelet as
    it is. Asking again would make it register twice."""
    return state.register and state.failures == 0 and state.kubelet is None


def _identity(path: Path) -> tuple[int, int] | None:
    """Which file ``path`` is now: a re-created kubelet.sock differs in inode or ctime."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns)


class _DirectoryEvents(FileSystemEventHandler):
    """Watchdog callbacks on the device-plugin directory, handed to the manager."""

    def __init__(self, manager: PluginManager) -> None:
        self._manager = manager

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory:
            return
        if event.event_type == "deleted":
            self._manager._socket_deleted(Path(os.fsdecode(event.src_path)))
        elif event.event_type in ("created", "moved"):
            path = event.dest_path if event.event_type == "moved" else event.src_path
            if Path(os.fsdecode(path)) == self._manager.kubelet_socket:
                self._manager._kubelet_appeared()


def _log_changes(previous: Mapping[str, Sequence[PluginDevice]], now: DeviceSets) -> None:
    for resource in sorted(set(previous) | set(now)):
        before = {d.id: d for d in previous.get(resource, ())}
        after = {d.id: d for d in now.get(resource, ())}
        if before == after:
            continue
        for uuid, dev in after.items():
            old = before.get(uuid)
            if old is not None and old.healthy and not dev.healthy:
                log.warning(
                    "vGPU %s of %s vanished without vgpuctl removing it: reported Unhealthy",
                    uuid,
                    resource,
                )
            elif old is not None and not old.healthy and dev.healthy:
                log.info("vGPU %s of %s is back: Healthy", uuid, resource)
        for uuid in before.keys() - after.keys():
            log.info("vGPU %s of %s was removed by vgpuctl: no longer advertised", uuid, resource)
        if after:
            healthy = sum(d.healthy for d in after.values())
            log.info("%s: %d listed, %d healthy", resource, len(after), healthy)


# -- standalone: vgpuctl device-plugin ------------------------------------------------------------


def removals(records: Iterable[JournalRecord]) -> list[str]:
    """UUIDs of the vGPUs the journal says vgpuctl removed: the structured ``removed`` field of
    records of kind ``vgpu-remove`` in phase ``done`` (checked when the record was read).

    The message is for people and never read: a record without the field (a journal written
    before it existed, or a message that merely says "removed") is not a removal. ``noop``
    ("already gone") does not count either: that vGPU vanished by other means.
    """
    return [
        record.removed.uuid
        for record in records
        if record.removed is not None
        and record.kind == ActionKind.VGPU_REMOVE
        and record.phase is Phase.DONE
    ]


@record(slots=True)
class _JournalTail:
    """The removals in the journal records appended since the last read (read incrementally:
    see :class:`JournalReader`), kept until a scan has used them."""

    reader: JournalReader
    pending: set[str] = field(default_factory=set)

    def skip_to_end(self) -> None:
        try:
            self.reader.skip_to_end()
        except ApplyError as exc:
            log.warning("%s: vGPUs removed meanwhile will show as Unhealthy", exc.message)

    def new_removals(self) -> set[str]:
        try:
            read = self.reader.read_new()
        except ApplyError as exc:
            log.warning("%s: vGPUs removed meanwhile will show as Unhealthy", exc.message)
        else:
            for skipped in read.skipped:
                log.warning("skipped a journal line, %s: not a record vgpuctl wrote", skipped)
            self.pending.update(removals(read.records))
        return set(self.pending)

    def applied(self) -> None:
        self.pending.clear()


def run_standalone(
    *,
    sysfs_root: Path,
    plugin_dir: Path,
    node: str,
    state_dir: Path,
    catalog: Catalog,
    hold_probe: HoldProbe | None = None,
    rescan_interval: float = 2.0,
    stop_event: threading.Event,
    kubelet_socket: Path | None = None,
    backoff: Backoff = Backoff(),
    known_types: Callable[[], TypeNames] | None = None,
    name_unknown: Callable[[Inventory], bool] | None = None,
) -> None:
    """Run the node's device plugins until ``stop_event`` is set.

    ``known_types`` reads the record of the vfio types vgpuctl configured (asked at every
    rescan: an apply may add to it), which names a type in use that no VF lists any more.
    ``name_unknown`` is asked when a scan still shows a vfio type by its id only (a vGPU
    vgpuctl did not make): it asks the driver (``nvidia-smi vgpu -s -v``) and says whether it
    learnt names, and the scan is then made again with them, so such vGPUs are advertised too.

    Every ``rescan_interval`` seconds: read the apply journal's records appended since (their
    structured removals: removed on purpose), observe the host, update the plugins. Raises
    :class:`PluginDirError` for a bad plugin directory and :class:`ObserveError` when the
    first scan fails; later scan failures are logged and the lists kept. The journal is read
    before the scan: a removal is journalled only once the vGPU is gone, so a scan never sees
    a vGPU that the journal already called removed.
    """
    tail = _JournalTail(JournalReader(Journal(state_dir, node)))
    tail.skip_to_end()  # removals before we started concern nothing we advertised
    with PluginManager(
        plugin_dir=plugin_dir, node=node, kubelet_socket=kubelet_socket, backoff=backoff
    ) as manager:
        log.info(
            "device plugins for node %s: scanning %s every %g s, sockets in %s",
            node,
            sysfs_root,
            rescan_interval,
            manager.plugin_dir,
        )
        scanned = False
        while not stop_event.is_set():
            removed = tail.new_removals()

            def scan() -> Inventory:
                return observe_host(
                    sysfs_root,
                    node=node,
                    catalog=catalog,
                    hold_probe=hold_probe,
                    known_types=known_types() if known_types is not None else None,
                    # The plugins advertise vGPUs: which types a free VF could still make is
                    # not theirs to say, and is most of a scan's reads.
                    availability=False,
                )

            try:
                inventory = scan()
                if name_unknown is not None and _shown_by_id(inventory) and name_unknown(inventory):
                    inventory = scan()
            except ObserveError as exc:
                if not scanned:
                    raise
                log.warning("cannot observe the host: %s; keeping the advertised lists", exc)
            else:
                manager.update(inventory, removed_on_purpose=removed)
                tail.applied()
                scanned = True
            stop_event.wait(rescan_interval)
        log.info("device plugins for node %s stopping", node)


def _shown_by_id(inventory: Inventory) -> bool:
    """Whether a vGPU's type is shown by its id only (vfio: nothing named it)."""
    return any(
        vf.vgpu is not None and unresolved_type_id(vf.vgpu.type_name) is not None
        for gpu in inventory.gpus
        for vf in gpu.vfs
    )
