"""KubeVirt's virt-handler as a neighbour of the simulated host: its mdev sweep.

What it models (docs/domain.md §10, read in KubeVirt's source, Dec 2026): on every node, at each
heartbeat (about every 1–2 minutes) and on every change of the KubeVirt CR,
``refreshMediatedDeviceTypes`` (pkg/virt-handler/device-manager/device_controller.go) calls
``updateMDEVTypesConfiguration``, whose ``removeUndesiredMDEVs``
(pkg/virt-handler/device-manager/mediated_devices_types.go) removes every mdev under
``/sys/bus/mdev/devices`` whose type name, and then whose type id (the ``mdev_type`` link's
target, ``nvidia-745``), each with spaces turned into ``_`` and trimmed (``shouldRemoveMDEV``),
is neither

- a type ``spec.configuration.mediatedDevicesConfiguration`` wants on that node
  (pkg/virt-config/virt-config.go ``GetDesiredMDEVTypes``: the ``nodeMediatedDeviceTypes``
  entries whose ``nodeSelector`` the node's labels match, when they name any, else the global
  list; ``mediatedDeviceTypes``, or the deprecated ``mediatedDevicesTypes`` when it is empty;
  taken as written), nor
- the ``mdevNameSelector`` (spaces turned into ``_``, trimmed: ``removeSelectorSpaces``) of a
  ``spec.configuration.permittedHostDevices.mediatedDevices`` entry with
  ``externalResourceProvider: true``.

An mdev whose ``mdev_type`` link cannot be read is left alone.
There is no in-use check: a VM's vGPU is removed too, the removal blocking in the kernel until
QEMU lets go (``vfio_unregister_group_dev``, docs/domain.md §9; the simulated kernel,
:mod:`reconciler.sim.kernel`, blocks the same way). Nothing is swept when
``mediatedDevicesConfiguration.enabled`` is ``false`` or the feature gate that turns it off is
listed (pkg/virt-config/virt-config.go ``MediatedDevicesHandlingDisabled``). That gate is spelt
``DisableMDEVConfiguration`` in the CR: ``DisableMediatedDevicesHandling`` is only the Go
constant's name (pkg/virt-config/featuregate: ``DisableMediatedDevicesHandling =
"DisableMDEVConfiguration"``), and listing it turns nothing off. This model is written apart from
vgpuctl's own reading of the CR (``observe/kubevirt.py``, doctor's check), so the suites do not
grade vgpuctl by its own understanding. Only mdevs are swept: a VF on NVIDIA's vendor-specific
VFIO interface is not under ``/sys/bus/mdev/devices``.

:func:`heartbeat` is one such sweep, reading the KubeVirt CR through the cluster port;
``vgpuctl sim virt-handler`` runs it in a loop, and the reliability suite calls it between the
steps of a run. A removal goes through the simulated kernel's ``remove`` file as virt-handler's
write does; ``wait=False`` leaves a held vGPU's removal unstarted (counted in
:attr:`Sweep.held`, a VM that would lose its GPU) so a test does not block on it, and
``dry_run=True`` removes nothing (what it would remove is in :attr:`Sweep.removed`): a test that
holds the simulator's host lock to see the host at one instant decides so (the removals take the
lock themselves), and carries them out once it has let go.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from reconciler.model.clusterapi import ClusterApi
from reconciler.model.errors import ClusterError
from reconciler.model.record import field, record
from reconciler.sim.kernel import SimSysfsWriter
from reconciler.sim.state import load_state

#: KubeVirt's CR (kubevirt.io/v1 kubevirts), as docs/domain.md §8 names it.
_GROUP, _VERSION, _PLURAL = "kubevirt.io", "v1", "kubevirts"
#: The feature gate that turns the sweep off, as the CR lists it (pkg/virt-config/featuregate:
#: the constant ``DisableMediatedDevicesHandling`` holds this string).
DISABLE_GATE = "DisableMDEVConfiguration"
MDEV_DEVICES = Path("bus/mdev/devices")


@record(frozen=True, slots=True)
class Sweep:
    """One heartbeat's sweep of one host."""

    #: The sweep did not run (mediated devices handling off, or no KubeVirt CR): why.
    skipped: str = ""
    #: Type names (spaces → ``_``) the sweep keeps.
    allowed: frozenset[str] = frozenset()
    #: mdev UUID → type name of each vGPU removed (held ones included when ``wait``).
    removed: Mapping[str, str] = field(default_factory=dict)
    #: mdev UUID → type name of each vGPU a VM holds that the sweep removes (``wait``) or
    #: would have removed (not ``wait``): a VM losing its GPU.
    held: Mapping[str, str] = field(default_factory=dict)

    @property
    def lost(self) -> int:
        """vGPUs this sweep took (or, held, would have taken) from the host."""
        return len(self.removed.keys() | self.held.keys())


def underscored(name: str) -> str:
    """A type name as the sweep compares it: every space turned into ``_``, then surrounding
    whitespace trimmed (device_controller.go ``removeSelectorSpaces``; mediated_devices_types.go
    ``shouldRemoveMDEV`` does the same to the mdev's type name and type id)."""
    return name.replace(" ", "_").strip()


def desired_types(kubevirt: Mapping[str, Any], node_labels: Mapping[str, str]) -> frozenset[str]:
    """The types ``mediatedDevicesConfiguration`` wants on a node with ``node_labels``, as
    pkg/virt-config/virt-config.go ``GetDesiredMDEVTypes`` reads them: the union of the
    ``nodeMediatedDeviceTypes`` entries whose ``nodeSelector`` the node matches (``canSelectNode``),
    when that is not empty; else the global list. Each list is ``mediatedDeviceTypes``, or the
    deprecated ``mediatedDevicesTypes`` when the first is empty. Taken as written: no spaces
    turned into ``_`` (``updateMDEVTypesConfiguration`` keys them as they are)."""
    config = _mapping(_mapping(kubevirt.get("spec")).get("configuration"))
    mdev_config = _mapping(config.get("mediatedDevicesConfiguration"))
    per_node: set[str] = set()
    for raw in _listed(mdev_config.get("nodeMediatedDeviceTypes")):
        entry = _mapping(raw)
        selector = _mapping(entry.get("nodeSelector"))
        if all(node_labels.get(str(k)) == str(v) for k, v in selector.items()):
            per_node.update(_types_of(entry))
    return frozenset(per_node) if per_node else frozenset(_types_of(mdev_config))


def _types_of(entry: Mapping[str, Any]) -> list[str]:
    types = _listed(entry.get("mediatedDeviceTypes"))
    return [str(t) for t in (types or _listed(entry.get("mediatedDevicesTypes")))]


def kept_types(kubevirt: Mapping[str, Any], node_labels: Mapping[str, str]) -> frozenset[str]:
    """What the sweep leaves alone on a node with ``node_labels``, under the KubeVirt CR
    ``kubevirt`` (pure): :func:`desired_types`, and the ``mdevNameSelector`` (:func:`underscored`)
    of each ``permittedHostDevices.mediatedDevices`` entry with ``externalResourceProvider:
    true`` (device_controller.go ``getExternallyProvidedMdevs``)."""
    config = _mapping(_mapping(kubevirt.get("spec")).get("configuration"))
    out = set(desired_types(kubevirt, node_labels))
    permitted = _mapping(config.get("permittedHostDevices"))
    for raw in _listed(permitted.get("mediatedDevices")):
        entry = _mapping(raw)
        if entry.get("externalResourceProvider") is True and entry.get("mdevNameSelector"):
            out.add(underscored(str(entry["mdevNameSelector"])))
    return frozenset(out)


def handling_disabled(kubevirt: Mapping[str, Any]) -> str:
    """Why virt-handler does not touch mdevs under ``kubevirt`` ("" when it does)."""
    config = _mapping(_mapping(kubevirt.get("spec")).get("configuration"))
    if _mapping(config.get("mediatedDevicesConfiguration")).get("enabled") is False:
        return "mediatedDevicesConfiguration.enabled is false"
    gates = _listed(_mapping(config.get("developerConfiguration")).get("featureGates"))
    if DISABLE_GATE in gates:
        return f"feature gate {DISABLE_GATE} is on"
    return ""


def sweep(
    directory: Path,
    kubevirt: Mapping[str, Any] | None,
    *,
    node_labels: Mapping[str, str] | None = None,
    wait: bool = True,
    dry_run: bool = False,
) -> Sweep:
    """One ``removeUndesiredMDEVs`` over the simulated host in ``directory`` (its ``sys`` tree),
    under the KubeVirt CR ``kubevirt`` (None: KubeVirt is not there, nothing is swept).
    ``dry_run``: nothing is written; :attr:`Sweep.removed` is what the sweep would remove
    (held vGPUs too when ``wait``)."""
    if kubevirt is None:
        return Sweep(skipped="no KubeVirt CR")
    why = handling_disabled(kubevirt)
    if why:
        return Sweep(skipped=why)
    allowed = kept_types(kubevirt, node_labels or {})
    root = Path(directory) / "sys"
    state = load_state(root)
    removed: dict[str, str] = {}
    held: dict[str, str] = {}
    writer = SimSysfsWriter(root)
    for uuid, raw_name, type_id in _mdevs(root):
        # shouldRemoveMDEV: kept by its type's name as read, else by its type's id (the
        # mdev_type link's target); an mdev whose link cannot be read is left alone.
        if type_id is None or underscored(raw_name) in allowed or underscored(type_id) in allowed:
            continue
        type_name = raw_name.strip()
        if uuid in state.held:
            held[uuid] = type_name
            if not wait:
                continue
        if dry_run:
            removed[uuid] = type_name
            continue
        try:
            writer.write(str(MDEV_DEVICES / uuid / "remove"), "1")
        except FileNotFoundError:
            continue  # gone meanwhile (or already being removed: its links are gone)
        removed[uuid] = type_name
    return Sweep(allowed=allowed, removed=removed, held=held)


def heartbeat(
    directory: Path, api: ClusterApi, *, node: str, namespace: str | None = None, wait: bool = True
) -> Sweep:
    """One virt-handler heartbeat on ``node``: the KubeVirt CR read through ``api`` (the one
    in ``namespace``, else the only one anywhere), then :func:`sweep`."""
    items = api.list_objects(group=_GROUP, version=_VERSION, plural=_PLURAL, namespace=namespace)
    if not items:
        return Sweep(skipped="no KubeVirt CR")
    labels: Mapping[str, str] = {}
    try:
        raw = api.get_object(group="", version="v1", plural="nodes", name=node)
    except ClusterError:  # no Node object to read: no labels to match
        raw = None
    if raw is not None:
        labels = {
            str(k): str(v) for k, v in _mapping(_mapping(raw.get("metadata")).get("labels")).items()
        }
    return sweep(directory, items[0], node_labels=labels, wait=wait)


def _mdevs(root: Path) -> Iterable[tuple[str, str, str | None]]:
    """(UUID, type name, type id) of each mdev under the simulated ``/sys/bus/mdev/devices``;
    the type name "" when its ``mdev_type/name`` cannot be read, the type id (the
    ``mdev_type`` link's last component) None when the link cannot be read."""
    devices = root / MDEV_DEVICES
    if not devices.is_dir():
        return []
    out: list[tuple[str, str, str | None]] = []
    for link in sorted(devices.iterdir()):
        try:
            name = (link / "mdev_type" / "name").read_text()
        except OSError:
            name = ""
        try:
            type_id: str | None = os.path.basename(os.readlink(link / "mdev_type"))
        except OSError:
            type_id = None  # vanishing (a removal under way)
        out.append((link.name, name, type_id))
    return out


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _listed(value: object) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []
