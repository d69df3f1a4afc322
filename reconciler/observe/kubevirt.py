"""KubeVirt as a neighbour on this host: whether its virt-handler runs here, and whether its
mediated-device handling would remove the mdevs vgpuctl makes (docs/domain.md §10).

virt-handler runs on every KubeVirt (and Harvester) node, and at each heartbeat and on every
change of the KubeVirt CR removes every mdev under ``/sys/bus/mdev/devices`` whose type name
(spaces → ``_``) the CR does not allow-list, with no in-use check
(pkg/virt-handler/device-manager/device_controller.go ``refreshMediatedDeviceTypes`` →
mediated_devices_types.go ``removeUndesiredMDEVs``). NVIDIA's vendor-specific VFIO vGPUs are VFs,
not mdevs: they are not swept.

- :func:`sight_kubevirt` (raw reads) says whether and why KubeVirt runs on the host: the kubelet's
  device-plugin directory holds KubeVirt's sockets, ``kubevirt-<device>.sock``
  (device_manager/common.go ``SocketPath``), or a process named ``virt-handler`` runs. Both
  reads are bounded. The directory entry is judged by its name alone: a stale socket left by a
  stopped virt-handler is a socket file too, so its type would tell nothing more, and a false
  alarm has a documented way out where a missed KubeVirt costs VMs their GPUs. A directory or
  process table it cannot read fully makes it say so (:attr:`KubevirtSighting.certain` False):
  detection fails closed.
- :func:`mdev_handling` and :func:`not_allow_listed` (pure) read a KubeVirt CR as virt-handler
  does: whether it removes mdevs at all, and which of some mdev types it would remove.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from reconciler.model.cluster import kubevirt_selector
from reconciler.model.errors import excerpt
from reconciler.model.record import record

#: The kubelet's device-plugin directory, under its directory (``--kubelet-dir``).
DEVICE_PLUGINS = "device-plugins"
#: KubeVirt's device-plugin sockets: ``kubevirt-<device>.sock`` (device_manager/common.go
#: ``SocketPath``: ``kubevirt-kvm.sock``, ``kubevirt-tun.sock``, ``kubevirt-nvidia.com-….sock``).
SOCKET_PREFIX, SOCKET_SUFFIX = "kubevirt-", ".sock"
#: virt-handler's process name (``/proc/<pid>/comm``: the executable's name, at most 15 bytes).
VIRT_HANDLER = "virt-handler"
#: At most this many entries of the device-plugin directory are looked at: a kubelet has one
#: socket per resource and its checkpoint; more is no kubelet's directory.
LISTING_LIMIT = 4096
#: At most this many processes are looked at: ``PID_MAX_LIMIT`` on 64-bit Linux
#: (include/linux/threads.h, 4 × 1024 × 1024); a proc tree with more is not Linux's.
PROCESS_LIMIT = 4 * 1024 * 1024
#: At most this much of a ``comm`` file is read (the kernel's is at most 16 bytes, TASK_COMM_LEN).
COMM_LIMIT = 64
#: The feature gate that turns virt-handler's mediated-device handling off: its name in
#: ``developerConfiguration.featureGates`` (pkg/virt-config/featuregate:
#: ``DisableMediatedDevicesHandling = "DisableMDEVConfiguration"``).
DISABLE_MDEV_GATE = "DisableMDEVConfiguration"
#: Sockets named in a signal before "and N more".
_SHOWN = 3
#: Errnos of a process that exited while the proc tree was read: it is not virt-handler any more.
_GONE = frozenset({errno.ENOENT, errno.ESRCH})


@record(frozen=True, slots=True)
class KubevirtSighting:
    """Why vgpuctl takes KubeVirt to run on this host: ``signal`` says what it found, or, when
    not ``certain``, what it could not read (KubeVirt may run there: it fails closed)."""

    signal: str
    certain: bool = True

    @property
    def reason(self) -> str:
        """Why vGPU creates on mdev GPUs wait, as a blocked step's reason (it reads after
        "which" in a deferred removal's)."""
        return f"waits for a cluster connection: {self.sweep}; {WAY_OUT}"

    @property
    def sweep(self) -> str:
        """What KubeVirt does here."""
        seen = (
            f"KubeVirt runs on this host ({self.signal})"
            if self.certain
            else f"vgpuctl cannot tell whether KubeVirt runs on this host ({self.signal})"
        )
        return (
            f"{seen}, and its virt-handler removes every mdev whose type the KubeVirt CR does "
            "not allow-list, in use by a VM or not"
        )

    @property
    def unsafe_note(self) -> str:
        """The plan's note when ``--unsafe-kubevirt-allow-listed`` lets creates run."""
        seen = (
            f"KubeVirt runs on this host ({self.signal})"
            if self.certain
            else f"KubeVirt may run on this host ({self.signal})"
        )
        return (
            f"--unsafe-kubevirt-allow-listed: {seen}; mdev vGPUs are created on the operator's "
            "word that every type vgpuctl creates here is allow-listed by hand in the KubeVirt CR "
            "with externalResourceProvider: true (otherwise virt-handler removes them, in use "
            "or not)"
        )


#: The two ways out, for a blocked create and for ``doctor``.
WAY_OUT = (
    "pass --kubeconfig (vgpuctl then keeps the allow-list), or allow-list each type by hand "
    "(permittedHostDevices.mediatedDevices, externalResourceProvider: true) and pass "
    "--unsafe-kubevirt-allow-listed"
)


def kubevirt_sockets(names: Iterable[str]) -> list[str]:
    """KubeVirt's device-plugin sockets among directory entry names, sorted (pure)."""
    return sorted(
        n
        for n in names
        if n.startswith(SOCKET_PREFIX)
        and n.endswith(SOCKET_SUFFIX)
        and len(n) > len(SOCKET_PREFIX) + len(SOCKET_SUFFIX)
    )


def is_virt_handler(comm: bytes) -> bool:
    """Whether a ``/proc/<pid>/comm`` file's content names virt-handler (pure)."""
    return comm.removesuffix(b"\n") == VIRT_HANDLER.encode()


def sight_kubevirt(*, kubelet_dir: Path, proc_root: Path) -> KubevirtSighting | None:
    """Whether KubeVirt runs on the host whose kubelet directory and proc tree these are, and
    why; None when neither shows it. The sockets are looked for first (one listing): the proc
    tree is read only when none is there."""
    sockets = _socket_sighting(kubelet_dir / DEVICE_PLUGINS)
    if sockets is not None:
        return sockets
    return _process_sighting(proc_root)


def _socket_sighting(plugins: Path) -> KubevirtSighting | None:
    names: list[str] = []
    try:
        with os.scandir(plugins) as entries:
            for entry in entries:
                if len(names) == LISTING_LIMIT:
                    found = kubevirt_sockets(names)
                    if found:
                        break
                    return KubevirtSighting(
                        f"{plugins} has more than {LISTING_LIMIT} entries, none of the first "
                        "KubeVirt's: not read further",
                        certain=False,
                    )
                names.append(entry.name)
    except FileNotFoundError:
        return None  # no kubelet here (a plain KVM host)
    except NotADirectoryError:
        return None
    except OSError as exc:
        return KubevirtSighting(f"cannot list {plugins}: {exc.strerror or exc}", certain=False)
    found = kubevirt_sockets(names)
    if not found:
        return None
    shown = ", ".join(excerpt(n) for n in found[:_SHOWN])
    more = f" and {len(found) - _SHOWN} more" if len(found) > _SHOWN else ""
    return KubevirtSighting(
        f"{plugins} holds KubeVirt's device-plugin socket{'s' * (len(found) != 1)} {shown}{more}"
    )


def _process_sighting(proc_root: Path) -> KubevirtSighting | None:
    proc = os.fspath(proc_root)
    seen = 0
    try:
        with os.scandir(proc) as entries:
            for entry in entries:
                if not entry.name.isdecimal():
                    continue
                seen += 1
                if seen > PROCESS_LIMIT:
                    return KubevirtSighting(
                        f"{proc} lists more than {PROCESS_LIMIT} processes: not read further",
                        certain=False,
                    )
                try:
                    comm = _read_comm(f"{proc}/{entry.name}/comm")
                except OSError as exc:
                    if exc.errno in _GONE:
                        continue  # exited since the listing
                    return KubevirtSighting(
                        f"cannot read {proc}/{entry.name}/comm: {exc.strerror or exc}",
                        certain=False,
                    )
                if comm is not None and is_virt_handler(comm):
                    return KubevirtSighting(f"process {int(entry.name)} is {VIRT_HANDLER}")
    except FileNotFoundError:
        return None  # no proc tree (a simulated host without processes)
    except OSError as exc:
        return KubevirtSighting(f"cannot list {proc}: {exc.strerror or exc}", certain=False)
    return None


def _read_comm(path: str) -> bytes | None:
    """At most :data:`COMM_LIMIT` bytes of a regular file; None when it is not one. Opened
    ``O_NONBLOCK | O_NOFOLLOW``: a FIFO or a link planted in a (simulated) tree cannot hang
    the scan nor lead it elsewhere."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, COMM_LIMIT)
    finally:
        os.close(fd)


# -- the KubeVirt CR, as virt-handler reads it (pure) -------------------------------------------


def mdev_handling(kubevirt: Mapping[str, Any]) -> str | None:
    """Why virt-handler leaves mdevs alone under this KubeVirt CR; None when it removes those
    not allow-listed (its mediated-device handling is on, the default)."""
    configuration = _mapping(_mapping(kubevirt.get("spec")).get("configuration"))
    mdevs = _mapping(configuration.get("mediatedDevicesConfiguration"))
    if mdevs.get("enabled") is False:
        return "spec.configuration.mediatedDevicesConfiguration.enabled is false"
    gates = _mapping(configuration.get("developerConfiguration")).get("featureGates")
    if isinstance(gates, list) and DISABLE_MDEV_GATE in gates:
        return f"the feature gate {DISABLE_MDEV_GATE} is on"
    return None


def not_allow_listed(kubevirt: Mapping[str, Any], types: Iterable[str]) -> list[str]:
    """The mdev ``types`` (names as the host shows them) virt-handler would remove under this
    KubeVirt CR: those no ``permittedHostDevices.mediatedDevices`` entry with
    ``externalResourceProvider: true`` selects, compared as KubeVirt compares them (spaces →
    ``_``, trimmed: :func:`kubevirt_selector`), sorted (pure)."""
    configuration = _mapping(_mapping(kubevirt.get("spec")).get("configuration"))
    entries = _mapping(configuration.get("permittedHostDevices")).get("mediatedDevices")
    external = {
        kubevirt_selector(e["mdevNameSelector"])
        for e in (entries if isinstance(entries, list) else [])
        if isinstance(e, dict)
        and e.get("externalResourceProvider") is True
        and isinstance(e.get("mdevNameSelector"), str)
    }
    return sorted({t for t in types if kubevirt_selector(t) not in external})


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}
