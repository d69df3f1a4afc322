"""What the device plugins advertise, as pure functions of the host inventory.

The observed :class:`~reconciler.model.Inventory` becomes one device set per kubelet resource
(:func:`device_sets`); :func:`carry_vanished` merges it with what was advertised before, so a
vGPU that vanished without vgpuctl removing it stays listed as Unhealthy (a tombstone) while one
vgpuctl removed on purpose is dropped. :func:`allocation` and :func:`preferred` answer the
kubelet's ``Allocate`` and ``GetPreferredAllocation`` (docs/domain.md §7). No I/O, no gRPC: the
servers in ``server.py`` translate these values to and from protobuf messages.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from reconciler.model import (
    Interface,
    Inventory,
    PciAddress,
    ReconcilerError,
    unresolved_type_id,
)
from reconciler.model.cluster import resource_name
from reconciler.model.record import record, replace

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

#: The container-side VFIO control device every vGPU user opens besides its group.
VFIO_CONTROL = "/dev/vfio/vfio"
#: Where a device's iommufd cdev ``vfioN`` is (drivers/vfio/device_cdev.c: ``"vfio/devices/%s"``).
VFIO_CDEV_DIR = "/dev/vfio/devices/"
_CDEV_NAME = re.compile(r"vfio[0-9]{1,10}")
#: cgroup device permissions handed out: mknod, read, write.
PERMISSIONS = "mrw"


@record(frozen=True, slots=True)
class PluginDevice:
    """One advertised device: a vGPU (ID = mdev UUID; on NVIDIA's vendor-specific VFIO
    interface the VF's address, the VF being the vGPU) with where it lives."""

    id: str
    healthy: bool
    vf: PciAddress
    gpu: PciAddress
    #: The vGPU's IOMMU group number as a string ("" when unknown): ``/dev/vfio/<group>``.
    iommu_group: str
    #: The VF itself is the device, handed to the VM as a PCI device (docs/domain.md §3b).
    whole_vf: bool = False

    @property
    def health(self) -> str:
        return HEALTHY if self.healthy else UNHEALTHY


DeviceSets = dict[str, tuple[PluginDevice, ...]]


def _order(device: PluginDevice) -> tuple[PciAddress, PciAddress, str]:
    return (device.gpu, device.vf, device.id)


def device_sets(inventory: Inventory) -> DeviceSets:
    """Resource name → the vGPUs of that type on the host, every one Healthy, in PCI order.

    A vGPU in the inventory exists and sits on a present VF: that is what Healthy means. A
    profile with no vGPU has no entry (so no plugin). A vfio vGPU whose type id nothing names
    (``type 1147``) is not advertised: its resource is unknown, and a name made up from the id
    would be a resource no VM asks for.
    """
    sets: dict[str, list[PluginDevice]] = {}
    for gpu in inventory.gpus:
        for vf in gpu.vfs:
            if vf.vgpu is None or vf.vgpu.removing:
                continue  # a vGPU being removed is no device to hand out any more
            if unresolved_type_id(vf.vgpu.type_name) is not None:
                continue
            sets.setdefault(resource_name(vf.vgpu.type_name), []).append(
                PluginDevice(
                    id=vf.vgpu.uuid,
                    healthy=True,
                    vf=vf.address,
                    gpu=gpu.address,
                    iommu_group=vf.vgpu.iommu_group,
                    whole_vf=gpu.interface is Interface.VFIO,
                )
            )
    return {resource: tuple(sorted(devs, key=_order)) for resource, devs in sorted(sets.items())}


def carry_vanished(
    previous: Mapping[str, Sequence[PluginDevice]],
    current: Mapping[str, Sequence[PluginDevice]],
    *,
    removed_on_purpose: Iterable[str] = (),
) -> DeviceSets:
    """What to advertise now: ``current``, plus every device of ``previous`` that is no longer
    there, marked Unhealthy — unless its UUID is in ``removed_on_purpose``.

    The rule, per resource: a device present now is listed as it is now (so a vanished vGPU
    that comes back, e.g. re-created with the same UUID after a reboot, is Healthy again). A
    device listed before and absent now vanished: if vgpuctl removed it (``removed_on_purpose``,
    from a refresh or the apply journal) it is dropped, otherwise it stays as an Unhealthy
    tombstone, because a VM that was handed it is now broken and the kubelet must not count it
    as allocatable. A tombstone is dropped later when its removal is reported, and with the
    process (tombstones are not persisted). A resource whose list ends up empty has no entry.
    """
    removed = frozenset(removed_on_purpose)
    out: DeviceSets = {}
    for resource in sorted(set(previous) | set(current)):
        now = {d.id: d for d in current.get(resource, ())}
        merged = list(now.values())
        for old in previous.get(resource, ()):
            if old.id not in now and old.id not in removed:
                merged.append(replace(old, healthy=False))
        if merged:
            out[resource] = tuple(sorted(merged, key=_order))
    return out


def socket_name(resource: str) -> str:
    """The plugin's socket file in the device-plugin directory:
    ``nvidia.com/NVIDIA_A2-4Q`` → ``vgpuctl-nvidia.com_NVIDIA_A2-4Q.sock``."""
    return "vgpuctl-" + resource.replace("/", "_") + ".sock"


def allocate_env_name(resource: str, *, whole_vf: bool = False) -> str:
    """``nvidia.com/NVIDIA_A2-4Q`` → ``MDEV_PCI_RESOURCE_NVIDIA_COM_NVIDIA_A2-4Q``: the variable
    KubeVirt's virt-launcher reads the allocated mdev UUIDs from; for VFs handed over whole
    (the vfio interface), ``PCI_RESOURCE_NVIDIA_COM_NVIDIA_A2-4Q`` with their PCI addresses
    (docs/domain.md §7)."""
    prefix = "PCI_RESOURCE_" if whole_vf else "MDEV_PCI_RESOURCE_"
    return prefix + resource.upper().replace("/", "_").replace(".", "_")


class AllocationError(ReconcilerError):
    """An ``Allocate`` the plugin cannot honour; the server answers it with a gRPC status."""

    #: True when an ID is not one of the plugin's devices (INVALID_ARGUMENT), False when it is
    #: known but cannot be handed out now (FAILED_PRECONDITION).
    unknown_device: bool = False


class UnknownDeviceError(AllocationError):
    """An ID that is not one of this resource's devices."""

    unknown_device = True


@record(frozen=True, slots=True)
class Allocation:
    """What one container gets: the env variable with the UUIDs and the VFIO device nodes."""

    envs: Mapping[str, str]
    #: Host paths, mapped to the same path in the container, with :data:`PERMISSIONS`.
    device_paths: tuple[str, ...]


def allocation(
    resource: str,
    ids: Sequence[str],
    devices: Sequence[PluginDevice],
    cdevs: Mapping[str, str] | None = None,
) -> Allocation:
    """The answer to one container's ``Allocate`` request for ``ids``.

    ``cdevs``: device ID → the iommufd cdev (``vfio7``) of a VF handed over whole, where the
    host has one: ``/dev/vfio/devices/vfio7`` is handed out too, after the groups, for a VM
    that opens the VF through iommufd (KubeVirt's ``IOMMUFD`` feature gate; docs/domain.md §9).
    An mdev's cdev is not handed out: the mdev path goes through its group.

    Raises :class:`UnknownDeviceError` for IDs that are not in ``devices`` and
    :class:`AllocationError` for Unhealthy ones or ones with no known IOMMU group (a VM could
    not open them), naming every offending ID.
    """
    if not ids:
        raise UnknownDeviceError(f"{resource}: the request names no device")
    by_id = {d.id: d for d in devices}
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        raise UnknownDeviceError(
            f"{resource}: unknown device ID {', '.join(unknown)} "
            f"(this plugin advertises {len(by_id)} devices)"
        )
    unhealthy = [i for i in ids if not by_id[i].healthy]
    if unhealthy:
        raise AllocationError(
            f"{resource}: device {', '.join(unhealthy)} is Unhealthy "
            "(its vGPU vanished from the host)"
        )
    no_group = [i for i in ids if not by_id[i].iommu_group]
    if no_group:
        raise AllocationError(f"{resource}: no IOMMU group known for {', '.join(no_group)}")
    kinds = {by_id[i].whole_vf for i in ids}
    if len(kinds) > 1:
        raise AllocationError(
            f"{resource}: the request mixes mdevs and whole VFs, which no VM can take together"
        )
    whole_vf = kinds.pop()
    groups = dict.fromkeys(by_id[i].iommu_group for i in ids)
    nodes = [f"/dev/vfio/{g}" for g in groups]
    if whole_vf:
        for i in ids:
            cdev = (cdevs or {}).get(i)
            if cdev is None:
                continue
            if _CDEV_NAME.fullmatch(cdev) is None:
                raise AllocationError(f"{resource}: {i}: {cdev!r} is not a vfio cdev name")
            nodes.append(f"{VFIO_CDEV_DIR}{cdev}")
    return Allocation(
        envs={allocate_env_name(resource, whole_vf=whole_vf): ",".join(ids)},
        device_paths=(VFIO_CONTROL, *dict.fromkeys(nodes)),
    )


def preferred(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    devices: Sequence[PluginDevice],
) -> list[str]:
    """The ``size`` devices to hand one container, packing them onto one GPU.

    ``must_include`` comes first, in the order given. The rest are taken GPU by GPU: first
    the GPUs of the ``must_include`` devices (most of them first, then by PCI address), then
    the others with the most available devices first, ties by PCI address; within a GPU by VF
    address. IDs the plugin does not know come last, by ID. The result does not depend on the
    order of ``available``. Asked for more than there is, it returns all it has.
    """
    by_id = {d.id: d for d in devices}
    chosen = list(dict.fromkeys(must_include))
    if len(chosen) >= size:
        return chosen
    taken = set(chosen)
    candidates = sorted(
        (by_id[i] for i in set(available) - taken if i in by_id), key=lambda d: (d.vf, d.id)
    )
    strangers = sorted(i for i in set(available) - taken if i not in by_id)

    must_gpus: dict[PciAddress, int] = {}
    for i in chosen:
        if i in by_id:
            must_gpus[by_id[i].gpu] = must_gpus.get(by_id[i].gpu, 0) + 1
    per_gpu: dict[PciAddress, list[str]] = {}
    for d in candidates:
        per_gpu.setdefault(d.gpu, []).append(d.id)

    def rank(gpu: PciAddress) -> tuple[int, int, PciAddress]:
        # Must-include GPUs lead (most must-include devices first); then the fullest GPU, so
        # one VM's vGPUs share a card when any card can hold them all.
        return (-must_gpus.get(gpu, 0), -len(per_gpu[gpu]), gpu)

    for gpu in sorted(per_gpu, key=rank):
        for i in per_gpu[gpu]:
            if len(chosen) >= size:
                return chosen
            chosen.append(i)
    for i in strangers:
        if len(chosen) >= size:
            break
        chosen.append(i)
    return chosen
