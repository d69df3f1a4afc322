"""A node as Harvester's own objects show it: what delegate mode plans from (docs/delegate.md).

In delegate mode vgpuctl does not read the host: Harvester's pcidevices-controller does, and
publishes it as one ``SRIOVGPUDevice`` per GPU and one ``VGPUDevice`` per VF (docs/domain.md
§5–6). These values are those objects' fields as pcidevices' Go types declare them
(``pkg/apis/devices.harvesterhci.io/v1beta1/sriovgpudevice.go``), checked when read
(``observe/harvester_devices.py``), plus who uses each VF.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from reconciler.model.address import PciAddress
from reconciler.model.record import field, record

#: ``status.vGPUStatus`` of a VF that hosts a vGPU (pcidevices ``VGPUEnabled``); empty otherwise.
VGPU_CONFIGURED = "vGPUConfigured"
#: Where pcidevices-controller looks for the NVIDIA driver pod of its node, and by which label
#: (pkg/apis/devices.harvesterhci.io/v1beta1/sriovgpudevice.go ``DefaultNamespace``,
#: ``NvidiaDriverLabel``; Harvester's nvidia-driver-runtime chart labels its DaemonSet's pods so).
DRIVER_NAMESPACE = "harvester-system"
DRIVER_LABEL = "app=nvidia-driver-daemonset"


@record(frozen=True, slots=True)
class HarvesterGpu:
    """One ``SRIOVGPUDevice``: a GPU, and whether pcidevices-controller is to keep its SR-IOV
    on (``spec.enabled``)."""

    name: str
    resource_version: str
    address: PciAddress
    enabled: bool
    #: ``status.vfAddresses``: its VFs, once SR-IOV is on.
    vf_addresses: tuple[PciAddress, ...] = ()
    #: ``status.vGPUDevices``: the names of its VFs' ``VGPUDevice`` objects.
    vgpu_devices: tuple[str, ...] = ()


@record(frozen=True, slots=True)
class HarvesterVf:
    """One ``VGPUDevice``: a VF, the profile asked of it (``spec``) and what the controller
    reports (``status``)."""

    name: str
    resource_version: str
    address: PciAddress
    parent: PciAddress
    enabled: bool
    #: ``spec.vGPUTypeName``; empty when absent (Harvester's UI leaves it out).
    type_name: str = ""
    #: ``status.vGPUStatus`` is ``vGPUConfigured``: the VF hosts a vGPU now.
    configured: bool = False
    #: ``status.configureVGPUTypeName``: the profile of that vGPU.
    configured_type: str = ""
    #: ``status.uuid``: the mdev UUID, or on the vfio interface the type id (pcidevices writes it
    #: so; docs/domain.md §3b).
    uuid: str = ""
    #: ``status.availableTypes``: the profiles the VF can take now, name → type key.
    available: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "available", MappingProxyType(dict(self.available)))

    @property
    def hosts(self) -> str:
        """The profile the VF hosts as its status says (the truth: docs/domain.md §6, "An
        admitted write is not a done step"): ``vGPUStatus`` configured, a ``uuid`` and
        ``configureVGPUTypeName``; "" otherwise. pcidevices' ``enableVGPU`` writes the three in
        one status write, only once the vGPU is made; a spec it could not carry out leaves them
        as they were (and a node resync after a reboot clears ``vGPUStatus`` and ``uuid``)."""
        if self.configured and self.uuid and self.configured_type:
            return self.configured_type
        return ""

    @property
    def pending(self) -> bool:
        """The spec asks what the status does not show: a write pcidevices-controller has not
        carried out (yet, or ever: it retries a failed enable forever, writing no status)."""
        if self.enabled:
            return bool(self.type_name) and self.hosts != self.type_name
        return self.configured


@record(frozen=True, slots=True)
class DriverPod:
    """A node's NVIDIA driver pod that is not ready, and why (docs/delegate.md, "The NVIDIA
    driver pod").

    pcidevices-controller (bdd8025, pkg/controller/gpudevice/gpu_controller.go) follows the
    pods of :data:`DRIVER_NAMESPACE` labelled :data:`DRIVER_LABEL` on its node
    (``setupRemoteExecutor``): from the moment one exists, every host command runs in its first
    container (pkg/util/executor/remote.go, a ``kubectl exec``), and ``manageGPU`` runs the
    readiness check (``CheckReady``: ``/usr/bin/file /tmp/ready`` in the pod) before
    ``sriov-manage``; when it fails the ``SRIOVGPUDevice`` is requeued, and so on while it
    fails. file(1) exits 0 for a missing file, so what fails in practice is the exec itself: a
    container that is not running. A pod being deleted turns the controller back to its local
    executor, the host's own ``/usr/lib/nvidia/sriov-manage`` (which a driver the pod installed
    does not provide): counted as not ready too. The vGPUs themselves
    (``enableVGPU``/``disableVGPU``, vgpu_controller.go) are sysfs writes that use neither the
    executor nor the check, but the NVIDIA host driver the pod installs carries them out."""

    name: str
    #: What its status says: being deleted, its phase, its ``Ready`` condition, its first
    #: container's state (each read from the object, bounded).
    why: str

    def blocks(self, node: str, *, sriov: bool) -> str:
        """Why a step of ``node`` that needs the controller's host work waits (``sriov``: an
        ``SRIOVGPUDevice`` step, which the readiness check gates; else a ``VGPUDevice`` one)."""
        pod = f"the NVIDIA driver pod {DRIVER_NAMESPACE}/{self.name} on node {node}"
        if sriov:
            return (
                f"{pod} is not ready ({self.why}): pcidevices-controller waits for it before "
                "any host work (gpu_controller.go manageGPU → executor CheckReady)"
            )
        return (
            f"{pod} is not ready ({self.why}): the vGPUs are made by the NVIDIA host driver it "
            "installs, and pcidevices-controller does no SR-IOV work until it is ready "
            "(gpu_controller.go manageGPU → executor CheckReady)"
        )


@record(frozen=True, slots=True)
class HarvesterNode:
    """One node's GPUs and VFs as pcidevices-controller publishes them, and who uses which."""

    node: str
    gpus: tuple[HarvesterGpu, ...] = ()
    vfs: tuple[HarvesterVf, ...] = ()
    #: ``VGPUDevice`` name → who uses it (``VM <ns>/<name>``): a VM whose device-allocation
    #: annotation lists it, or a running VMI that may hold it.
    used_by: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: Objects that could not be read, and why (each names the object and the field): the
    #: planner writes nothing for the node while there are any (half a picture).
    notes: tuple[str, ...] = ()
    #: VMs whose device-allocation annotation could not be read, and why (each names the VM
    #: and the annotation): each is counted in :attr:`used_by` as holding every VF here it
    #: could hold, which blocks only those VFs' changes; the rest of the node is planned.
    unread_holders: tuple[str, ...] = ()
    #: A device's PCI ids (vendor, device; lower-case hex) by address, from Harvester's
    #: ``PCIDevice`` objects, where they exist (they carry no subsystem ids).
    pci_ids: Mapping[PciAddress, tuple[str, str]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    #: The names of this node's ``SRIOVGPUDevice``s that have a ``MigConfiguration`` of the same
    #: name: pcidevices-controller found the GPU MIG-capable and turned MIG mode on
    #: (gpu_controller.go ``setupMigConfiguration``; ``plan/mig.py``).
    mig_configured: frozenset[str] = frozenset()
    #: The node's NVIDIA driver pod when it is not ready (:class:`DriverPod`): the steps that
    #: need pcidevices-controller's host work wait for it. None when it is ready, when there is
    #: none (the controller then runs the host's own driver tools) or when it was not read.
    driver: DriverPod | None = None
    #: What could not be read of the driver pods, and why (the list refused, a pod's fields):
    #: said in the plan; it blocks nothing (the steps are planned as without a pod).
    driver_notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "used_by", MappingProxyType(dict(self.used_by)))
        object.__setattr__(self, "pci_ids", MappingProxyType(dict(self.pci_ids)))

    def gpu(self, address: PciAddress) -> HarvesterGpu | None:
        return next((g for g in self.gpus if g.address == address), None)

    def vfs_of(self, gpu: PciAddress) -> tuple[HarvesterVf, ...]:
        """The VFs of ``gpu``, in address order."""
        return tuple(sorted((v for v in self.vfs if v.parent == gpu), key=lambda v: v.address))
