"""Harvester's ``SRIOVGPUDevice``/``VGPUDevice`` objects and KubeVirt's VMs → one node as
delegate mode plans it (``model/harvester.py``; docs/delegate.md). Pure.

Every object is untrusted input: each field is checked for its type and form (PCI addresses
parsed, names bounded), and an object that fails is left out with a note naming it and the
field; its GPU is then listed in :attr:`HarvesterNode.notes` so the planner can leave that GPU
alone rather than act on half a picture.

Who uses a VF: a ``VirtualMachine`` whose ``harvesterhci.io/deviceAllocationDetails`` annotation
lists the VF's ``VGPUDevice`` name under ``gpus`` or ``hostdevices`` (pcidevices'
``AllocationDetails``; its own webhook reads only ``hostdevices``, vgpuctl both: fail closed),
and a running ``VirtualMachineInstance`` on the node that requests the profile's resource (which
of the profile's VFs it holds is not said there, so every configured VF of that profile counts).

A VM whose allocation annotation cannot be read (not text, longer than 256 KiB, nested deeper
than ``model.clustertext.MAX_DEPTH``, not JSON, not the shape above) fails closed for that VM
only: it counts as holding every configured VF it could hold (:func:`could_hold`), which blocks
those VFs' changes and nothing else, and the plans of the nodes where it holds one say so in
one line naming the VM and the annotation (:attr:`HarvesterNode.unread_holders`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from reconciler.model import PciAddress
from reconciler.model.cluster import resource_name
from reconciler.model.clustertext import ClusterTextError, parse_json
from reconciler.model.errors import excerpt
from reconciler.model.harvester import VGPU_CONFIGURED, HarvesterGpu, HarvesterNode, HarvesterVf

#: The annotation KubeVirt VMs carry on Harvester with the devices allocated to them.
ALLOCATION_ANNOTATION = "harvesterhci.io/deviceAllocationDetails"
#: At most this many entries in a list or map field of one object (a GPU has at most a few
#: hundred VFs and a VF a few dozen profiles).
MAX_ENTRIES = 4096
_MAX_NAME = 253
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")


class ObjectError(ValueError):
    """One object's field is not what Harvester's type says."""


def parse_gpu(raw: Mapping[str, Any]) -> HarvesterGpu:
    """An ``SRIOVGPUDevice`` as the API server returns it."""
    r = _Reader(raw)
    return HarvesterGpu(
        name=r.name,
        resource_version=r.resource_version,
        address=r.address("spec", "address"),
        enabled=r.flag("spec", "enabled"),
        vf_addresses=tuple(
            _address(text, f"{r.name}: status.vfAddresses")
            for text in r.strings("status", "vfAddresses")
        ),
        vgpu_devices=r.strings("status", "vGPUDevices"),
    )


def parse_vf(raw: Mapping[str, Any]) -> HarvesterVf:
    """A ``VGPUDevice`` as the API server returns it."""
    r = _Reader(raw)
    available = r.mapping("status", "availableTypes")
    status = r.text("status", "vGPUStatus")
    if status not in ("", VGPU_CONFIGURED):
        raise ObjectError(
            f"{r.name}: status.vGPUStatus is {excerpt(status)!r}, not {VGPU_CONFIGURED} or empty"
        )
    return HarvesterVf(
        name=r.name,
        resource_version=r.resource_version,
        address=r.address("spec", "address"),
        parent=r.address("spec", "parentGPUDeviceAddress"),
        enabled=r.flag("spec", "enabled"),
        type_name=r.text("spec", "vGPUTypeName"),
        configured=status == VGPU_CONFIGURED,
        configured_type=r.text("status", "configureVGPUTypeName"),
        uuid=r.text("status", "uuid"),
        available=available,
    )


def allocated_devices(vm: Mapping[str, Any]) -> frozenset[str]:
    """The device names a VM's allocation annotation lists, under ``gpus`` or ``hostdevices``;
    raises :class:`ObjectError` when the annotation cannot be read (it then says nothing the
    caller could trust)."""
    metadata = vm.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    text = annotations.get(ALLOCATION_ANNOTATION) if isinstance(annotations, Mapping) else None
    if text is None:
        return frozenset()
    where = f"VM {_vm_name(vm)}: annotation {ALLOCATION_ANNOTATION}"
    try:
        details = parse_json(text)
    except ClusterTextError as e:
        raise ObjectError(f"{where} {e}") from None
    if not isinstance(details, Mapping):
        raise ObjectError(f"{where} is not a JSON object")
    names: set[str] = set()
    for key in ("gpus", "hostdevices"):
        by_resource = details.get(key)
        if by_resource is None:
            continue
        if not isinstance(by_resource, Mapping):
            raise ObjectError(f"{where}: {key} is not a map of resource → device names")
        for devices in by_resource.values():
            if not isinstance(devices, list):
                raise ObjectError(f"{where}: {key} lists something other than device names")
            for device in devices:
                if not isinstance(device, str):
                    raise ObjectError(f"{where}: {key} lists something other than device names")
                names.add(device)
    return frozenset(names)


def pci_ids(raw: Mapping[str, Any]) -> tuple[PciAddress, tuple[str, str]] | None:
    """A ``PCIDevice``'s address and ids (``status.address``, ``vendorId``, ``deviceId``:
    pcidevice.go ``PCIDeviceStatus``); None when they are not four-digit hex ids."""
    status = raw.get("status")
    if not isinstance(status, Mapping):
        return None
    vendor, device = status.get("vendorId"), status.get("deviceId")
    if not all(isinstance(v, str) and _HEX4.fullmatch(v) for v in (vendor, device)):
        return None
    try:
        address = PciAddress.parse(str(status.get("address", "")))
    except ValueError:
        return None
    return address, (str(vendor).lower(), str(device).lower())


def harvester_node(
    node: str,
    gpu_objects: Iterable[Mapping[str, Any]],
    vf_objects: Iterable[Mapping[str, Any]],
    *,
    vms: Iterable[Mapping[str, Any]] = (),
    vmis: Iterable[Mapping[str, Any]] = (),
    pci_devices: Iterable[Mapping[str, Any]] = (),
    mig_configurations: Iterable[Mapping[str, Any]] = (),
) -> HarvesterNode:
    """Node ``node`` from its objects (already selected by the ``nodename`` label), the
    cluster's VMs, this node's VMIs, its ``PCIDevice`` objects and the cluster's
    ``MigConfiguration`` objects (those named as one of its GPUs' objects count)."""
    notes: list[str] = []
    gpus: list[HarvesterGpu] = []
    for raw in gpu_objects:
        try:
            gpus.append(parse_gpu(raw))
        except ObjectError as e:
            notes.append(f"SRIOVGPUDevice {e}")
    vfs: list[HarvesterVf] = []
    for raw in vf_objects:
        try:
            vfs.append(parse_vf(raw))
        except ObjectError as e:
            notes.append(f"VGPUDevice {e}")
    names = {v.name for v in vfs}
    used: dict[str, str] = {}
    unread: list[str] = []
    vmis = list(vmis)
    for vm in vms:
        try:
            listed = allocated_devices(vm)
        except ObjectError as e:
            # Which VFs it holds is unknown: every one it could hold counts as held.
            held = could_hold(vm, node, vfs, vmis)
            if held:
                unread.append(
                    f"{e}: counted as holding the {len(held)} configured VGPUDevice"
                    f"{'s' * (len(held) != 1)} of this node it could hold"
                )
            for name in sorted(held):
                used.setdefault(name, f"VM {_vm_name(vm)} (allocation annotation unreadable)")
            continue
        for name in sorted(listed & names):
            used.setdefault(name, f"VM {_vm_name(vm)}")
    for vmi in vmis:
        if not _running_here(vmi, node):
            continue
        wanted = _resources(vmi) or frozenset()
        for vf in vfs:
            if vf.configured and resource_name(vf.configured_type) in wanted:
                used.setdefault(vf.name, f"VM {_vm_name(vmi)} (running; allocation unknown)")
    ids = dict(found for raw in pci_devices if (found := pci_ids(raw)) is not None)
    migs = {mig for raw in mig_configurations if (mig := object_name(raw)) is not None}
    return HarvesterNode(
        node=node,
        gpus=tuple(sorted(gpus, key=lambda g: g.address)),
        vfs=tuple(sorted(vfs, key=lambda v: v.address)),
        used_by=used,
        notes=tuple(notes),
        unread_holders=tuple(unread),
        pci_ids=ids,
        mig_configured=frozenset(g.name for g in gpus if g.name in migs),
    )


def object_name(raw: Mapping[str, Any]) -> str | None:
    """An object's ``metadata.name``; None when it is not a name (what a ``MigConfiguration``
    is read for: pcidevices names it as the GPU's ``SRIOVGPUDevice``, gpu_controller.go
    ``setupMigConfiguration``, and its existence is what says the GPU is MIG-capable)."""
    metadata = raw.get("metadata") if isinstance(raw, Mapping) else None
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return name if isinstance(name, str) and 0 < len(name) <= _MAX_NAME else None


def could_hold(
    vm: Mapping[str, Any],
    node: str,
    vfs: Iterable[HarvesterVf],
    vmis: Iterable[Mapping[str, Any]],
) -> frozenset[str]:
    """The configured VFs of ``node`` (``vfs``) that ``vm`` could hold when its allocation
    annotation says nothing that can be trusted: none when its VMI runs on another node (a VM
    with host devices runs where they are), else those of the vGPU resources its template
    requests (``spec.template.spec.domain.devices`` ``gpus``/``hostDevices`` ``deviceName``),
    or every configured VF here when its template cannot be read. A VM that requests no
    resource of a configured VF holds none: KubeVirt attaches only what the spec asks for."""
    key = _vm_key(vm)
    for vmi in vmis:
        status = vmi.get("status")
        if (
            isinstance(key[1], str)
            and _vm_key(vmi) == key
            and isinstance(status, Mapping)
            and status.get("phase") not in ("Succeeded", "Failed")
            and isinstance(status.get("nodeName"), str)
            and status["nodeName"]
            and status["nodeName"] != node
        ):
            return frozenset()
    configured = [v for v in vfs if v.configured]
    spec = vm.get("spec")
    template = spec.get("template") if isinstance(spec, Mapping) else None
    wanted = _resources(template) if isinstance(template, Mapping) else None
    if wanted is None:
        return frozenset(v.name for v in configured)
    return frozenset(v.name for v in configured if resource_name(v.configured_type) in wanted)


def _running_here(vmi: Mapping[str, Any], node: str) -> bool:
    status = vmi.get("status")
    if not isinstance(status, Mapping):
        return False
    return status.get("nodeName") == node and status.get("phase") not in ("Succeeded", "Failed")


def _resources(vmi: Mapping[str, Any]) -> frozenset[str] | None:
    """The device names a VMI (or a VM's template) requests; None when its
    ``spec.domain.devices`` cannot be read (absent: none requested)."""
    spec = vmi.get("spec")
    domain = spec.get("domain") if isinstance(spec, Mapping) else None
    devices = domain.get("devices") if isinstance(domain, Mapping) else None
    if devices is None:
        return frozenset()
    if not isinstance(devices, Mapping):
        return None
    gpus, host = devices.get("gpus") or [], devices.get("hostDevices") or []
    if not isinstance(gpus, list) or not isinstance(host, list):
        return None
    out = set()
    for entry in [*gpus, *host][:MAX_ENTRIES]:
        if isinstance(entry, Mapping) and isinstance(entry.get("deviceName"), str):
            out.add(entry["deviceName"])
    return frozenset(out)


def _vm_key(vm: Mapping[str, Any]) -> tuple[object, object]:
    metadata = vm.get("metadata")
    if not isinstance(metadata, Mapping):
        return None, None
    return metadata.get("namespace"), metadata.get("name")


def _vm_name(vm: Mapping[str, Any]) -> str:
    metadata = vm.get("metadata")
    if not isinstance(metadata, Mapping):
        return "?"
    namespace = excerpt(str(metadata.get("namespace", "")), 63)
    return f"{namespace}/{excerpt(str(metadata.get('name', '')), 63)}"


def _address(text: object, where: str) -> PciAddress:
    if not isinstance(text, str):
        raise ObjectError(f"{where} is not a PCI address")
    try:
        return PciAddress.parse(text)
    except ValueError:
        raise ObjectError(f"{where} is {excerpt(text)!r}, not a PCI address") from None


class _Reader:
    """Typed reads of one object's fields, each failure naming the object and the field."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        if not isinstance(raw, Mapping):
            raise ObjectError("?: not an object")
        metadata = raw.get("metadata")
        if not isinstance(metadata, Mapping):
            raise ObjectError("?: no metadata")
        name = metadata.get("name")
        if not isinstance(name, str) or not 0 < len(name) <= _MAX_NAME:
            raise ObjectError("?: metadata.name is not a name")
        self.name = name
        version = metadata.get("resourceVersion")
        if not isinstance(version, str) or not version:
            raise ObjectError(f"{name}: metadata.resourceVersion is missing")
        self.resource_version = version
        self._raw = raw

    def _part(self, part: str) -> Mapping[str, Any]:
        value = self._raw.get(part)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ObjectError(f"{self.name}: {part} is not an object")
        return value

    def address(self, part: str, key: str) -> PciAddress:
        return _address(self._part(part).get(key), f"{self.name}: {part}.{key}")

    def flag(self, part: str, key: str) -> bool:
        value = self._part(part).get(key, False)  # Go's zero value when left out
        if not isinstance(value, bool):
            raise ObjectError(f"{self.name}: {part}.{key} is not true or false")
        return value

    def text(self, part: str, key: str) -> str:
        value = self._part(part).get(key, "")
        if not isinstance(value, str) or len(value) > _MAX_NAME:
            raise ObjectError(f"{self.name}: {part}.{key} is not a name")
        return value

    def strings(self, part: str, key: str) -> tuple[str, ...]:
        value = self._part(part).get(key) or []
        if (
            not isinstance(value, list)
            or len(value) > MAX_ENTRIES
            or not all(isinstance(v, str) and len(v) <= _MAX_NAME for v in value)
        ):
            raise ObjectError(f"{self.name}: {part}.{key} is not a list of names")
        return tuple(value)

    def mapping(self, part: str, key: str) -> dict[str, str]:
        value = self._part(part).get(key) or {}
        if (
            not isinstance(value, Mapping)
            or len(value) > MAX_ENTRIES
            or not all(
                isinstance(k, str) and isinstance(v, str) and len(k) <= _MAX_NAME
                for k, v in value.items()
            )
        ):
            raise ObjectError(f"{self.name}: {part}.{key} is not a map of names")
        return dict(value)
