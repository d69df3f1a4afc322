"""A test double of Harvester's pcidevices-controller (its GPU part) and its admission webhook,
for one simulated node, against the API-server emulator: what vgpuctl's delegate mode (issue 14)
leaves the host work to.

Modelled on harvester/pcidevices at bdd8025 (v1.8: the NVIDIA vendor-specific VFIO interface
only, docs/domain.md §3b), function by function; every method below names the Go it follows.

The controller (:class:`PciDevicesController`)
    acts on a simulated host (``reconciler.sim``) as the Go code acts on ``/sys``: it reads the
    sysfs tree under the host's root, runs the simulator's own ``DIR/bin/sriov-manage`` as a
    subprocess (the driver pod's ``/usr/lib/nvidia/sriov-manage``), and writes a VF's
    ``nvidia/current_vgpu_type`` through the simulator's kernel emulation. It writes the cluster
    through the unmodified ``kubernetes`` client over HTTP, one request per Go client call
    (``Create``, ``Update``, ``UpdateStatus``, ``Delete``), with the objects shaped as Go's JSON
    encoding of its types shapes them (spec fields always present, status fields ``omitempty``).
    Its informer caches are informers over HTTP (``tests/doubles/informer.py``: a list, then a
    watch from its resourceVersion, the cache kept from the events, as client-go's reflector
    keeps them), so it runs against any API server, the emulator or the real kube-apiserver;
    the object a handler is given is the one its informer last delivered (below), as lasso's
    ``syncHandler`` (rancher/lasso pkg/controller/controller.go) takes it from the informer's
    store by key when the key is processed. A step a test calls (:meth:`resync`,
    :meth:`reconcile_once`) first waits until the caches hold what the API server holds
    (:meth:`~PciDevicesController.sync`); the thread of :meth:`start` does not (its caches lag
    by the watch, as a real controller's do).

    It is driven step by step: :meth:`~PciDevicesController.resync` is the node controller's
    periodic reconcile (``reconcileNodeDevices``, every 30 s in the real one: PCIDevices, then
    SRIOVGPUDevices, then VGPUDevices, then the node label); :meth:`reconcile_once` is one pass
    of a wrangler worker (the informers' changes are queued, then one key is handled by
    ``OnGPUChange`` and ``reconcileMIGConfiguration``, or ``OnVGPUChange``);
    :meth:`run_until_idle` repeats it. A handler's error
    is kept in ``errors`` and its key waits for :meth:`retry` (wrangler's rate-limited requeue;
    :meth:`resync` retries too). :meth:`start`/:meth:`stop` run the same in a thread.

    Two behaviours a test switches on (docs/domain.md §6, "An admitted write is not a done
    step"):

    - ``refuse_enable`` (an errno): the host refuses the write of a VF's
      ``nvidia/current_vgpu_type`` that ``enableVGPU`` (vgpu_controller.go) makes after
      ``submitPCIDeviceClaim``: the webhook has admitted the spec, which stays ``enabled:
      true``; ``enableVGPU`` returns ``error writing to create file for vgpu <name>: ...``
      before its ``UpdateStatus``, so the status is not written (no ``vGPUStatus``, ``uuid``
      or ``configureVGPUTypeName``), and ``OnVGPUChange`` (registered by ``Register`` in
      gpu_controller.go with wrangler's ``OnChange``) returns it: wrangler logs it and
      requeues the key, and the handler tries again, forever, with no vGPU. The controller
      writes no Event and no condition (bdd8025 has no event recorder, and its types no
      conditions: pkg/apis/devices.harvesterhci.io/v1beta1/sriovgpudevice.go
      ``VGPUDeviceStatus``). Set it back to None and the next retry makes the vGPU (a fixed
      controller). The other failures after admission take the same path (the PCIDevice
      missing in ``submitPCIDeviceClaim``; after a reboot, ``reconcileVGPUSetup`` clears
      ``vGPUStatus`` and ``uuid`` but keeps ``configureVGPUTypeName``, and the re-enable may
      fail so).
    - ``informer_lag`` (seconds): a change reaches the handlers only that long after the API
      server stored it (client-go's reflector, DeltaFIFO and wrangler's work queue between
      the watch event and ``OnVGPUChange``/``OnGPUChange``), so a status is written a little
      after the spec it answers: in between, the spec says what the status does not. A key
      handled in between for another reason (``reconcileDisabledVGPUStatus``'s ``Enqueue``
      of a sibling, a retry) is handled on the object as last delivered: its ``UpdateStatus``
      carries that object's resourceVersion, the API server answers 409 Conflict, and the
      key is requeued (lasso ``processSingleItem``: ``AddRateLimited``, the error not logged
      for a conflict: :data:`CONFLICT`); the change, once delivered, queues it again.

    The NVIDIA driver pod (gpu_controller.go ``setupRemoteExecutor``, pkg/util/executor): the
    pod informer's changes reach :meth:`~PciDevicesController.setup_remote_executor`, which
    makes a ``harvester-system`` pod labelled ``app=nvidia-driver-daemonset`` on this node the
    executor (``executor_pod``), and a pod being deleted hands back to the local one.
    ``manageGPU`` runs the executor's readiness check first
    (:meth:`~PciDevicesController.check_ready`): with a driver pod whose first container does
    not run, it fails with ``error during readiness check: ...`` and the SRIOVGPUDevice key is
    requeued (as any handler error), until a retry finds the container running. Create one
    with :func:`driver_pod` and seed it (``tests/harvester_node.py``).

The webhook (:class:`PciDevicesWebhook`)
    is the validating webhook ``pcidevices.harvesterhci.io`` of the configuration
    ``pcidevices-validator`` (pkg/webhook/server.go, failurePolicy Ignore), for the two
    validators of vGPUs: ``vgpuValidator`` (pkg/webhook/vgpu.go) and ``sriovGPUValidator``
    (pkg/webhook/sriovgpudevices.go). On the emulator :func:`install` registers it in-process
    (the emulator runs judges under its lock: their caches are its store); on any API server
    :func:`serve_webhook` serves it over HTTPS as a real admission webhook (AdmissionReview v1,
    :class:`WebhookServer`, its VM and Node caches informers over HTTP) and registers the
    configuration pointing at it. Their errors are plain Go errors, which Harvester's
    ``AdmissionHandler.admit`` (harvester/harvester pkg/webhook/types/admission.go) turns into
    ``werror.NewInternalError``: the client sees 500, reason InternalError, and
    ``admission webhook "pcidevices.harvesterhci.io" denied the request: <error>``. A VM "uses"
    a device when its ``harvesterhci.io/deviceAllocationDetails`` annotation (JSON
    ``{"gpus": {resource: [names]}, "hostdevices": {resource: [names]}}``,
    pkg/apis/devices.harvesterhci.io/v1beta1/common.go ``AllocationDetails``) lists the device's
    name under ``hostdevices`` (pkg/util/common/common.go ``VMByHostDeviceName``: ``gpus`` is not
    looked at), on a KubeVirt ``VirtualMachine`` in any namespace.

MIG (:meth:`~PciDevicesController.reconcile_mig_configuration`)
    ``reconcileMIGConfiguration``, the second handler ``Register`` puts on SRIOVGPUDevices:
    when one is enabled, ``setupMigConfiguration`` asks the host's nvidia-smi whether the GPU
    has MIG (the simulator answers ``[N/A]`` for a model without MIG-backed profiles in the
    catalogue), turns MIG mode on (``-mig 1``: the simulated GPU's VFs then offer no type) and
    creates the MigConfiguration named as the GPU (its profiles from ``mig -lgip``); when one
    is disabled, that MigConfiguration is deleted. The commands run through ``/bin/sh -c`` as
    the driver pod's remote executor runs them.

Not modelled (see also tests/doubles/__init__.py): the mdev interface (Harvester before v1.8;
at bdd8025 a VF without ``nvidia/current_vgpu_type`` makes the vGPU setup fail, and so it does
here), the MigConfiguration's own handler (``OnMIGChange``, which makes GPU instances for a
MigConfiguration someone enabled: vgpuctl never writes one) and its validator, running
commands inside the driver pod (they run on the simulated host, whichever executor is chosen;
the pod's state decides only whether the exec fails), the PCIDeviceClaim controller (claims
are created and deleted, never acted on), device plugins, USB and SR-IOV NIC devices, the
management-NIC skip list, the ``nodes.devices.harvesterhci.io`` object, pci.ids names (a
PCIDevice's description and resource name take ghw's unknown-product forms), the other
validators of the webhook (PCIDeviceClaims, VMs, USB, MIG), and the Service and certificate
rotation of the real webhook (:func:`serve_webhook` registers a URL and a certificate made for
the run).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import ssl
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from reconciler.sim import SimHost
from tests.doubles.admission import Attributes
from tests.doubles.emulator import ApiServerEmulator, WebhookDenial
from tests.doubles.informer import Informers

JsonObject = dict[str, Any]
# The client is only partly typed: its entry points are used as Any.
_new_client_from_config: Any = config.new_client_from_config

GROUP, VERSION = "devices.harvesterhci.io", "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
SRIOVGPUS = (GROUP, VERSION, "sriovgpudevices")
VGPUS = (GROUP, VERSION, "vgpudevices")
PCIDEVICES = (GROUP, VERSION, "pcidevices")
PCIDEVICECLAIMS = (GROUP, VERSION, "pcideviceclaims")
MIGCONFIGURATIONS = (GROUP, VERSION, "migconfigurations")
VMS = ("kubevirt.io", "v1", "virtualmachines")
NODES = ("", "v1", "nodes")

#: pkg/apis/devices.harvesterhci.io/v1beta1: node.go ``NodeKeyName``, sriovgpudevice.go
#: ``ParentSRIOVGPUDeviceLabel``, ``VGPUEnabled``, ``NvidiaDriverNeededKey``, ``SysDevRoot``,
#: common.go ``DeviceAllocationKey``, pcideviceclaim.go and pcidevice.go annotations.
NODE_LABEL = "nodename"
PARENT_LABEL = "harvesterhci.io/parentSRIOVGPUDevice"
VGPU_CONFIGURED = "vGPUConfigured"
DRIVER_NEEDED_LABEL = "sriovgpu.harvesterhci.io/driver-needed"
ALLOCATION_ANNOTATION = "harvesterhci.io/deviceAllocationDetails"
SKIP_VFIO_BINDING = "pcidevices.harvesterhci.io/skip-vfio-binding"
OVERRIDE_RESOURCE_NAME = "pcidevice.harvesterhci.io/override-resource-name"
PCI_DEVICE_DRIVER = "harvesterhci.io/pcideviceDriver"
SYS_DEV_ROOT = "/sys/bus/pci/devices/"
#: pkg/controller/gpudevice/gpu_controller.go ``sriovManageCommand`` (in the driver pod).
SRIOV_MANAGE = "/usr/lib/nvidia/sriov-manage"
#: pkg/util/gpuhelper/mig.go ``NA`` and ``MigPrefix``.
MIG_NA = "[N/A]"
MIG_PREFIX = "MIG"
PODS = ("", "v1", "pods")
#: pkg/apis/devices.harvesterhci.io/v1beta1/sriovgpudevice.go ``DefaultNamespace`` and
#: ``NvidiaDriverLabel``: the driver pods ``setupRemoteExecutor`` follows.
DRIVER_NAMESPACE = "harvester-system"
DRIVER_LABEL = ("app", "nvidia-driver-daemonset")
#: pkg/controller/gpudevice/vgpu_controller.go ``defaultUser``.
CLAIM_USER = "admin"

#: pkg/webhook/server.go: the configuration and its one webhook.
WEBHOOK_CONFIGURATION = "pcidevices-validator"
WEBHOOK = "pcidevices.harvesterhci.io"
NAMESPACE = "harvester-system"

_REPO = Path(__file__).resolve().parents[2]
#: Harvester's CRDs the double needs beyond the two ``register_crds(harvester=True)`` installs.
_CRDS = (
    _REPO / "tests" / "fixtures" / "harvester-addon" / "pcidevices.devices.harvesterhci.io.yaml",
    _REPO
    / "tests"
    / "fixtures"
    / "harvester-pcidevices"
    / "pcideviceclaims.devices.harvesterhci.io.yaml",
    _REPO
    / "tests"
    / "fixtures"
    / "harvester-pcidevices"
    / "migconfigurations.devices.harvesterhci.io.yaml",
)
#: ghw's vendor names (pci.ids) for the vendors the simulator's hosts have.
_VENDORS = {"10de": "NVIDIA Corporation", "8086": "Intel Corporation"}


def device_name(address: str, node: str) -> str:
    """pcidevice.go ``PCIDeviceNameForHostname``: ``<node>-<address without ':' and '.'>``."""
    return f"{node}-{address.replace(':', '').replace('.', '')}"


def resource_name_of_type(type_name: str) -> str:
    """pkg/util/common/common.go ``GeneratevGPUDeviceName`` (its second regexp, written
    ``^a-zA-Z0-9_-.]+``, only matches that literal text, which no type name here holds)."""
    name = " ".join(type_name.split()).replace("/", "_").replace(".", "_")
    return "nvidia.com/" + name.replace(" ", "_")


# --- installing -----------------------------------------------------------------------------


#: The rules of ``pcidevices-validator`` for the two modelled validators: server.go
#: ``buildRules`` of each ``Resource()`` (vgpu.go, sriovgpudevices.go: UPDATE and DELETE of the
#: cluster-scoped kind in devices.harvesterhci.io/v1beta1).
RULES = [
    {
        "operations": ["UPDATE", "DELETE"],
        "apiGroups": [GROUP],
        "apiVersions": [VERSION],
        "resources": [plural],
        "scope": "Cluster",
    }
    for plural in ("vgpudevices", "sriovgpudevices")
]


def install(emu: ApiServerEmulator) -> PciDevicesWebhook:
    """Serve what the double writes beyond Harvester's two vGPU CRDs (PCIDevice, PCIDeviceClaim,
    KubeVirt's VirtualMachine), store the ``pcidevices-validator`` configuration as the
    controller applies it (rules of the two modelled validators only) and register the webhook
    behind it. Call after ``register_crds(emu, harvester=True)``."""
    for path in _CRDS:
        crd = yaml.safe_load(path.read_text())
        if not emu.serves(GROUP, VERSION, crd["spec"]["names"]["plural"]):
            emu.register_crd(crd)
    if not emu.serves(*VMS):
        emu.register(*VMS, "VirtualMachine", True, True)
    webhook = PciDevicesWebhook({res: _StoreCache(emu, res) for res in (VMS, NODES)})
    rules = RULES
    emu.seed(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": WEBHOOK_CONFIGURATION},
            "webhooks": [
                {
                    "name": WEBHOOK,
                    "clientConfig": {
                        "service": {
                            "namespace": NAMESPACE,
                            "name": "pcidevices-webhook",
                            "path": "/v1/webhook/validation",
                            "port": 8443,
                        }
                    },
                    "rules": rules,
                    "failurePolicy": "Ignore",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1", "v1beta1"],
                }
            ],
        }
    )
    emu.register_webhook(WEBHOOK, webhook, rules=rules, failure_policy="Ignore")
    return webhook


# --- the webhook ----------------------------------------------------------------------------


class _StoreCache:
    """The emulator's store of one resource as a webhook judge's cache: the emulator runs its
    judges under its lock, so they read the store, never over HTTP (emulator.py)."""

    def __init__(self, emu: ApiServerEmulator, res: tuple[str, str, str]) -> None:
        self._emu, self._res = emu, res

    def get(self, name: str, namespace: str = "") -> JsonObject | None:
        return self._emu.get_object(*self._res, name, namespace or None)

    def list(self) -> list[JsonObject]:
        return self._emu.objects(*self._res)


class PciDevicesWebhook:
    """``vgpuValidator`` and ``sriovGPUValidator`` (pkg/webhook/vgpu.go, sriovgpudevices.go)
    over their caches of VMs and core Nodes (pkg/webhook/validation.go ``Validation`` hands
    each the ``VirtualMachine`` and ``Node`` caches): the emulator's store when the emulator
    runs it in-process (:func:`install`), informers kept over HTTP when it is served as a real
    admission webhook (:class:`WebhookServer`, :func:`serve_webhook`)."""

    def __init__(self, caches: Mapping[tuple[str, str, str], Any]) -> None:
        self._caches = caches
        #: A test's hook, called with (operation, resource, name) before each review: what
        #: happens in the cluster between a writer's last read and its write (a VM taking a
        #: device), in time for the validators' caches to have it.
        self.before_review: Callable[[str, str, str], None] | None = None

    def __call__(self, a: Attributes) -> WebhookDenial | None:
        return self.review(a.resource, a.subresource, a.operation, a.object, a.old_object)

    def review(
        self,
        resource: str,
        subresource: str,
        operation: str,
        obj: JsonObject | None,
        old: JsonObject | None,
    ) -> WebhookDenial | None:
        """One admission request: None to admit, else the AdmissionResponse's Status."""
        if subresource:  # the rules name the main resources only
            return None
        if self.before_review is not None:
            name = _str(((obj or old or {}).get("metadata") or {}).get("name"))
            self.before_review(operation, resource, name)
        try:
            self._validate(resource, operation, obj, old)
        except _GoError as error:
            # admission.go: a plain error becomes werror.NewInternalError (500, InternalError).
            return WebhookDenial(str(error), code=500, reason="InternalError")
        return None

    def _validate(
        self, resource: str, operation: str, obj: JsonObject | None, old: JsonObject | None
    ) -> None:
        if resource == "vgpudevices" and operation == "UPDATE":
            self._vgpu_update(_need(old), _need(obj))
        elif resource == "vgpudevices" and operation == "DELETE":
            self._vgpu_delete(_need(old))
        elif resource == "sriovgpudevices" and operation == "UPDATE":
            self._gpu_update(_need(old), _need(obj))
        elif resource == "sriovgpudevices" and operation == "DELETE":
            self._gpu_delete(_need(old))

    def _vgpu_update(self, old: JsonObject, new: JsonObject) -> None:
        """vgpu.go ``vgpuValidator.Update``: nothing when the specs are equal (as Go structs);
        a disable (true → false) is ``checkVGPUUsage``; an enable (false → true) is
        ``validateVGPUProfiles`` against the OLD object's ``status.availableTypes``."""
        old_spec, new_spec = _vgpu_spec(old), _vgpu_spec(new)
        if old_spec == new_spec:
            return
        name = _name(new)
        if old_spec["enabled"] and not new_spec["enabled"]:
            self.check_vgpu_usage(name)
            return
        if not old_spec["enabled"] and new_spec["enabled"]:
            type_name = new_spec["vGPUTypeName"]
            if type_name == "":
                raise _GoError(f"VGPUTypeName cannot be empty for vGPU device {name}")
            available = _string_map(_status(old).get("availableTypes"))
            if type_name not in (available or {}):
                raise _GoError(
                    f"VGPUTypeName {type_name} is not a valid profile for vGPU device {name}"
                )

    def _vgpu_delete(self, old: JsonObject) -> None:
        """vgpu.go ``vgpuValidator.Delete``: allowed once the node is gone, else
        ``checkVGPUUsage``."""
        if self._node_deleted(_str(_spec(old).get("nodeName"))):
            return
        self.check_vgpu_usage(_name(old))

    def _gpu_update(self, old: JsonObject, new: JsonObject) -> None:
        """sriovgpudevices.go ``sriovGPUValidator.Update``: a disable (true → false) is
        ``checkGPUUsage``: ``checkVGPUUsage`` of each name in the NEW object's
        ``status.vGPUDevices`` (the stored status: a main-resource update carries it over)."""
        old_spec, new_spec = _gpu_spec(old), _gpu_spec(new)
        if old_spec == new_spec:
            return
        if old_spec["enabled"] and not new_spec["enabled"]:
            for vgpu in _string_list(_status(new).get("vGPUDevices")) or []:
                self.check_vgpu_usage(vgpu)

    def _gpu_delete(self, old: JsonObject) -> None:
        """sriovgpudevices.go ``sriovGPUValidator.Delete``: allowed once the node is gone;
        refused while ``spec.enabled``."""
        if self._node_deleted(_str(_spec(old).get("nodeName"))):
            return
        if _gpu_spec(old)["enabled"]:
            raise _GoError(f"please disable gpuDevice {_name(old)} before deletion")

    def check_vgpu_usage(self, device: str) -> None:
        """vgpu.go ``checkVGPUUsage``: the VMs the ``VMByPCIDeviceClaim`` index
        (common.go ``VMByHostDeviceName``) finds under ``device``; the first one is named.

        The index's order is a set's: the double names the first by namespace and name. An
        annotation that is not JSON makes the Go indexer fail (client-go panics on an indexer
        error; with failurePolicy Ignore the webhook's absence admits everything): the double
        refuses instead (fail closed) with the indexer's error text."""
        users: list[tuple[str, str]] = []
        for vm in self._caches[VMS].list():
            meta = vm.get("metadata") or {}
            details = (meta.get("annotations") or {}).get(ALLOCATION_ANNOTATION)
            if details is None:
                continue
            vm_name, vm_namespace = str(meta.get("name")), str(meta.get("namespace"))
            try:
                allocation = json.loads(details)
                hostdevices = allocation.get("hostdevices") or {}
                names = [n for group in hostdevices.values() for n in (group or [])]
            except (ValueError, AttributeError, TypeError) as error:
                raise _GoError(
                    f"error generating device allocation details {vm_name}/{vm_namespace}: {error}"
                ) from None
            if device in names:
                users.append((vm_namespace, vm_name))
        if users:
            namespace, user = sorted(users)[0]
            raise _GoError(f"device {device} is in use with VM {user} in namespace {namespace}")

    def _node_deleted(self, node: str) -> bool:
        """indexer.go ``isNodeDeleted``: no such Node, or one being deleted."""
        found = self._caches[NODES].get(node)
        return found is None or bool((found.get("metadata") or {}).get("deletionTimestamp"))


# --- the controller ---------------------------------------------------------------------------


#: What a 409 Conflict says (the API server's text). lasso, wrangler's controller core, requeues
#: the key of every failed handler but logs every error except this one
#: (rancher/lasso pkg/controller/controller.go, ``processNextWorkItem``): a write raced by
#: another writer is expected, and retried with the object read again.
CONFLICT = "please apply your changes to the latest version and try again"


class _Writer:
    """A client API whose every call marks the controller as having written (``_dirty``)."""

    def __init__(self, api: Any, controller: PciDevicesController) -> None:
        self._api, self._controller = api, controller

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._api, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self._controller._dirty = True
            return method(*args, **kwargs)

        return call


@dataclass
class HandlerError:
    """A handler's error, as wrangler logs it before requeueing the key (a conflict is requeued
    without a log: :data:`CONFLICT`)."""

    key: str
    message: str


@dataclass
class _Queue:
    """A wrangler work queue: keys in order, each once; failed keys wait for a retry."""

    keys: deque[str] = field(default_factory=deque)
    waiting: list[str] = field(default_factory=list)

    def add(self, key: str) -> None:
        if key not in self.keys:
            self.keys.append(key)


class PciDevicesController:
    """pcidevices-controller's GPU handlers for one node on a simulated host."""

    def __init__(
        self, emu: ApiServerEmulator | None, host: SimHost, node: str, kubeconfig: Path
    ) -> None:
        """``emu`` is not read (kept for the callers that pass it): every read is an
        informer's over HTTP (``informer.py``), on the API server ``kubeconfig`` names."""
        del emu
        self.node = node
        self.host = host
        self._api = _new_client_from_config(config_file=str(kubeconfig))
        #: The informers ``Register`` (gpu_controller.go, vgpu_controller.go) and the node
        #: controller's listers use: the two vGPU kinds, every Pod, PCIDevices, their claims,
        #: MigConfigurations, and core Nodes.
        self._informers = Informers(self._api)
        for res in (SRIOVGPUS, VGPUS, PODS, PCIDEVICES, PCIDEVICECLAIMS, MIGCONFIGURATIONS, NODES):
            self._informers.add(res)
        self._informers.start()
        #: Whether the double wrote since its caches were last synced (every call through
        #: ``_custom`` and ``_core`` is a write: the reads are the informers').
        self._dirty = False
        self._custom: Any = _Writer(client.CustomObjectsApi(self._api), self)
        self._core: Any = _Writer(client.CoreV1Api(self._api), self)
        self._queue = _Queue()
        #: The resourceVersion of every object the informers have delivered, by key.
        self._seen: dict[str, str] = {}
        self.errors: list[HandlerError] = []
        #: The keys whose handler met a conflict (requeued, not logged: :data:`CONFLICT`).
        self.conflicts: list[str] = []
        #: Every sriov-manage command line run, as the executor would run it.
        self.sriov_manage_calls: list[list[str]] = []
        #: Every nvidia-smi command the MIG handler ran, as the executor runs it (one string).
        self.nvidia_smi_calls: list[str] = []
        #: The driver pod the executor runs commands in (``setupRemoteExecutor``), as
        #: (namespace, name); None: the local executor.
        self.executor_pod: tuple[str, str] | None = None
        #: An errno the host refuses ``enableVGPU``'s ``current_vgpu_type`` write with (None:
        #: it does not): the enable fails after admission and is retried (module docstring).
        self.refuse_enable: int | None = None
        #: Seconds between a change in the store and its key reaching the work queue.
        self.informer_lag = 0.0
        #: When each changed key was first seen, while it waits out ``informer_lag``.
        self._arriving: dict[str, float] = {}
        #: Each key's object as its informer last delivered it (lasso's ``syncHandler`` gives
        #: a handler the informer store's object): what the handlers act on and write over.
        self._cache: dict[str, JsonObject] = {}
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def close(self) -> None:
        self.stop()
        self._informers.stop()
        self._api.close()

    def sync(self) -> None:
        """Wait until the informers hold what the API server holds now (``informer.py``): a
        test stepping the double has its writes, and the double's own, seen by the next step."""
        self._dirty = False
        self._informers.sync()

    def _stepped(self) -> None:
        """A step called by a test (not by the thread of :meth:`start`): the caches synced."""
        if threading.current_thread() is not self._thread:
            self.sync()

    def __enter__(self) -> PciDevicesController:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the step API --

    def resync(self) -> None:
        """The node controller's reconcile (pkg/controller/nodes/node_controller.go
        ``reconcileNodeDevices``): ``ReconcilePCIDevices``, ``SetupSRIOVGPUDevices``,
        ``SetupVGPUDevices``, ``checkAndUpdateNodeLabels``, stopping at the first error (kept
        in ``errors`` under ``node/<node>``). Keys waiting after an error are retried."""
        with self._lock:
            self._stepped()
            self.retry()
            for step, what in (
                (self._reconcile_pci_devices, "error reconciling pcidevices for node"),
                (self._setup_sriov_gpu_devices, "error setting up SRIOV GPU devices for node"),
                (self._setup_vgpu_devices, "error setting VGPU devices for node"),
                (self._check_and_update_node_labels, "error updating node labels for node"),
            ):
                try:
                    step()
                except _GoError as error:
                    message = f"{what} {self.node}: {error}"
                    self._failed(HandlerError(f"node/{self.node}", message))
                    return

    def reconcile_once(self) -> str | None:
        """Queue what the informers saw change, then handle one key (``sriovgpudevices/<name>``
        or ``vgpudevices/<name>``); the key handled, or None when there was nothing to do."""
        with self._lock:
            self._stepped()
            self._observe()
            if not self._queue.keys:
                return None
            key = self._queue.keys.popleft()
            kind = key.partition("/")[0]
            if kind == "sriovgpudevices":
                # gpu_controller.go ``Register``: two handlers on the kind, ``on-gpu-change``
                # then ``gpu-mig-reconcillation``; lasso's SharedHandler runs every handler of a
                # key in that order, the next one even after an error, and requeues the key
                # once if any failed (rancher/lasso pkg/controller/sharedhandler.go). Each gets
                # the object the informer last delivered (lasso passes a handler's returned
                # object on to the next; the double's handlers return none, so each gets that
                # one).
                handlers = (self.on_gpu_change, self.reconcile_mig_configuration)
                failed = False
                for handler in handlers:
                    try:
                        handler(copy.deepcopy(self._cache.get(key)))
                    except _GoError as error:
                        self._failed(HandlerError(key, str(error)))
                        failed = True
                if failed:
                    self._queue.waiting.append(key)
                return key
            try:
                if kind == "pods":
                    namespace, _, pod = key.partition("/")[2].partition("/")
                    self.setup_remote_executor(self._informers[PODS].get(pod, namespace))
                else:
                    self.on_vgpu_change(copy.deepcopy(self._cache.get(key)))
            except _GoError as error:
                self._failed(HandlerError(key, str(error)))
                self._queue.waiting.append(key)
            return key

    def _failed(self, error: HandlerError) -> None:
        """A handler's error, logged as lasso logs it: every one but a conflict."""
        if CONFLICT in error.message:
            self.conflicts.append(error.key)
        else:
            self.errors.append(error)

    def run_until_idle(self, max_steps: int = 200) -> list[str]:
        """:meth:`reconcile_once` until nothing is queued; the keys handled, in order.
        RuntimeError if still busy after ``max_steps``."""
        handled: list[str] = []
        for _ in range(max_steps):
            key = self.reconcile_once()
            if key is None:
                return handled
            handled.append(key)
        raise RuntimeError(f"not idle after {max_steps} steps: {handled[-10:]}")

    def retry(self) -> None:
        """Requeue the keys whose handler failed (wrangler's rate limiter, its delay elapsed)."""
        with self._lock:
            for key in self._queue.waiting:
                self._queue.add(key)
            self._queue.waiting.clear()

    # -- the thread mode --

    def start(self, *, resync_seconds: float = 30.0, poll_seconds: float = 0.05) -> None:
        """Run in a thread: :meth:`resync` now and every ``resync_seconds`` (retrying failed
        keys), :meth:`reconcile_once` whenever there is work."""
        if self._thread is not None:
            return
        self._stopping.clear()

        def loop() -> None:
            next_resync = 0.0
            clock = 0.0
            while not self._stopping.is_set():
                if clock >= next_resync:
                    if self._dirty:
                        # The node resync comes every 30 s in the real controller, long after
                        # its writes reach its caches; here every ``resync_seconds``: it waits
                        # for its own writes to be seen first, as the real one in effect does
                        # (else a loaded machine has it create what it made, 409).
                        with contextlib.suppress(Exception):  # an outage: resync fails anyway
                            self.sync()
                    self.resync()
                    next_resync = clock + resync_seconds
                if self.reconcile_once() is None:
                    self._stopping.wait(poll_seconds)
                    clock += poll_seconds

        self._thread = threading.Thread(target=loop, name=f"pcidevices-{self.node}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stopping.set()
            thread.join(timeout=10)

    # -- informers --

    def _observe(self) -> None:
        """The informers' events: every SRIOVGPUDevice and VGPUDevice (any node: the handlers
        filter) whose resourceVersion changed, or that vanished, is queued, once it has been
        so for ``informer_lag`` seconds."""
        current: dict[str, str] = {}
        stored: dict[str, JsonObject] = {}
        for plural, res in (("sriovgpudevices", SRIOVGPUS), ("vgpudevices", VGPUS)):
            for obj in self._informers[res].list():
                key = f"{plural}/{_name(obj)}"
                current[key] = str(obj["metadata"].get("resourceVersion"))
                stored[key] = obj
        for pod in self._informers[PODS].list():  # the pod informer (``Register``: every pod)
            key = f"pods/{pod['metadata'].get('namespace', '')}/{_name(pod)}"
            current[key] = str(pod["metadata"].get("resourceVersion"))
            stored[key] = pod
        # In the store's order, then the vanished in the order seen: keys that arrive together
        # are queued so (sorted() is stable), never in a set's hash order, which varies from
        # process to process (PYTHONHASHSEED) and made the handlers' order, and a test, flaky.
        changed = [k for k, rv in current.items() if self._seen.get(k) != rv]
        changed += [k for k in self._seen if k not in current]
        pending = set(changed)
        now = time.monotonic()
        self._arriving = {k: t for k, t in self._arriving.items() if k in pending}
        for key in sorted(changed, key=lambda k: self._arriving.setdefault(k, now)):
            if now - self._arriving[key] < self.informer_lag:
                continue
            del self._arriving[key]
            self._queue.add(key)
            if key in current:
                self._seen[key] = current[key]
                self._cache[key] = copy.deepcopy(stored[key])
            else:
                self._seen.pop(key, None)
                self._cache.pop(key, None)

    # -- OnGPUChange: pkg/controller/gpudevice/gpu_controller.go --

    def on_gpu_change(self, gpu: JsonObject | None) -> None:
        """``OnGPUChange``: for this node's GPU, ``manageGPU`` when ``spec.enabled`` differs
        from sysfs (VFs present), else one status write when the status differs."""
        if gpu is None or _deleting(gpu) or _str(_spec(gpu).get("nodeName")) != self.node:
            return
        spec = _gpu_spec(gpu)
        pf = spec["address"]
        try:
            enabled, status = self._gpu_status(pf)
        except _GoError as error:
            raise _GoError(
                f"error generating status for SRIOVGPUDevice {_name(gpu)}: {error}"
            ) from None
        if spec["enabled"] != enabled:
            self._manage_gpu(gpu, spec)
            return
        if _gpu_status(gpu) != status:
            self._update_status(SRIOVGPUS, gpu, _gpu_status_json(status))

    def _manage_gpu(self, gpu: JsonObject, spec: JsonObject) -> None:
        """``manageGPU``: the executor's readiness check (:meth:`check_ready`), then
        ``sriov-manage -e|-d <PF>``, then the status from sysfs in one write."""
        args = ["-e" if spec["enabled"] else "-d", spec["address"]]
        try:
            self.check_ready()
        except _GoError as error:
            raise _GoError(f"error during readiness check: {error}") from None
        argv = [str(self.host.sriov_manage), *args]
        self.sriov_manage_calls.append([SRIOV_MANAGE, *args])
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
        if done.returncode != 0:
            raise _GoError(f"error performing sriovmanage operation: exit status {done.returncode}")
        _, status = self._gpu_status(spec["address"])
        self._update_status(SRIOVGPUS, gpu, _gpu_status_json(status))

    def _gpu_status(self, pf: str) -> tuple[bool, JsonObject]:
        """pkg/util/gpuhelper/gpuhelper.go ``GenerateGPUStatus``: enabled when ``sriov_numvfs``
        > 0; the VFs from the ``virtfn*`` links in glob (text) order (common.go
        ``GetVFList``), and their object names. ``vfAddresses`` is an empty (not nil) list
        when there are none, ``vGPUDevices`` nil: Go's DeepEqual tells them from a stored
        status without the fields, so a GPU without VFs gets a status write on every change
        (the API server finds it a no-op)."""
        path = self._sys(pf)
        try:
            count = int((path / "sriov_numvfs").read_text().strip("\n"))
        except (OSError, ValueError) as error:
            raise _GoError(
                f"error reading sriov_numvfs for device {SYS_DEV_ROOT}{pf}: {_os_error(error)}"
            ) from None
        vfs = [
            os.path.basename(os.path.realpath(link))
            for link in sorted(path.glob("virtfn*"), key=lambda p: p.name)  # Go's Glob sorts
            if link.is_symlink()
        ]
        names = [device_name(vf, self.node) for vf in vfs] or None
        return count > 0, {"vfAddresses": vfs, "vGPUDevices": names}

    # -- reconcileMIGConfiguration: pkg/controller/gpudevice/gpu_controller.go --

    def reconcile_mig_configuration(self, gpu: JsonObject | None) -> None:
        """``reconcileMIGConfiguration`` (``gpu-mig-reconcillation``, on every SRIOVGPUDevice
        change, after ``OnGPUChange``): ``spec.enabled`` true → ``setupMigConfiguration``;
        false → the MigConfiguration named as the GPU deleted, if there is one.

        Unlike ``OnGPUChange`` it checks neither the node nor a deletion: every node's
        controller runs it for every GPU, asking its own host's nvidia-smi about that PCI
        address, and so does the double. A vanished object (nil) is skipped here: the Go
        dereferences it."""
        if gpu is None:
            return
        spec = _gpu_spec(gpu)
        if spec["enabled"]:
            self._setup_mig_configuration(gpu, spec)
            return
        if self._informers[MIGCONFIGURATIONS].get(_name(gpu)) is None:
            return  # IsNotFound: nothing to do
        self._delete(MIGCONFIGURATIONS, _name(gpu))

    def _setup_mig_configuration(self, gpu: JsonObject, spec: JsonObject) -> None:
        """``setupMigConfiguration``: ``IsMigConfigurationNeeded`` (mig.go: the answer of
        ``--query-gpu=mig.mode.current`` holds no ``[N/A]``), then ``EnableMIGMode`` (``-mig
        1``, every time: idempotent), then, when no MigConfiguration of the GPU's name exists,
        ``GenerateMIGConfiguration`` (``spec.enabled`` false, ``gpuAddress``, ``profileSpec``
        from ``-lgip`` with ``requested: 0``), ``GenerateMIGConfigurationStatus`` (``-lgi`` and
        ``-lgip``), ``spec.nodeName``, ``spec.enabled`` true only if an instance exists, an
        owner reference to the GPU (the cached object's apiVersion, kind, name and uid), one
        ``Create`` and one ``UpdateStatus``.

        The MigConfiguration's own handler (``OnMIGChange``, mig_controller.go) is not
        modelled: with ``spec.enabled`` false and no instance it only requeues itself (every 5
        minutes); it makes GPU instances only for a MigConfiguration someone enabled, and
        vgpuctl never writes one."""
        pf, name = spec["address"], _name(gpu)
        try:
            answer = self._nvidia_smi(
                f"nvidia-smi -i {pf} --query-gpu=mig.mode.current --format=csv,noheader"
            )
        except _GoError as error:
            raise _GoError(f"error checking if GPU supports MIG instances: {error}") from None
        if MIG_NA in answer:
            return  # isMigSupported: false
        try:
            self._nvidia_smi(f"nvidia-smi -i {pf} -mig 1")
        except _GoError as error:
            raise _GoError(f"error enable MIG Mode: {error}") from None
        if self._informers[MIGCONFIGURATIONS].get(name) is not None:
            return
        profile_command = f"nvidia-smi mig -i {pf} -lgip"
        try:
            profiles = _mig_profiles(self._nvidia_smi(profile_command))
        except _GoError as error:
            raise _GoError(f"error generating MIG Configuration: {error}") from None
        try:
            instances = self._nvidia_smi(f"nvidia-smi mig -i {pf} -lgi || exit 0")
            statuses = _mig_profiles(self._nvidia_smi(profile_command))
        except _GoError as error:
            raise _GoError(f"error generating MIG configuration status: {error}") from None
        by_profile = _mig_instances(instances)
        profile_status: list[JsonObject] = []
        for p in statuses:
            entry = {"name": p["name"], "id": p["id"], "available": p["free"], "total": p["total"]}
            if p["id"] in by_profile:
                entry["vGPUID"] = by_profile[p["id"]]
            profile_status.append(entry)
        count = sum(len(ids) for ids in by_profile.values())
        meta = gpu["metadata"]
        body: JsonObject = {
            "apiVersion": API_VERSION,
            "kind": "MigConfiguration",
            "metadata": {
                "name": name,
                "ownerReferences": [
                    {
                        "apiVersion": gpu.get("apiVersion", ""),
                        "kind": gpu.get("kind", ""),
                        "name": name,
                        "uid": meta.get("uid", ""),
                    }
                ],
            },
            "spec": {
                "enabled": count > 0,
                "gpuAddress": pf,
                "nodeName": spec["nodeName"],
                "profileSpec": [
                    {"name": p["name"], "id": p["id"], "requested": 0} for p in profiles
                ]
                or None,
            },
        }
        if body["spec"]["profileSpec"] is None:
            del body["spec"]["profileSpec"]  # omitempty
        created = self._create(MIGCONFIGURATIONS, body)
        # MigConfigurationStatus: profileStatus omitempty, status always, message omitempty.
        status: JsonObject = {"status": ""}
        if profile_status:
            status = {"profileStatus": profile_status, **status}
        self._update_status(MIGCONFIGURATIONS, created, status)

    def _nvidia_smi(self, command: str) -> str:
        """The driver pod's executor (pkg/util/executor/remote.go ``Run``): ``/bin/sh -c
        "<command> "`` there, its stdout; a non-zero exit is ``error during command execution:
        command terminated with exit code N`` (kubectl exec's words), which mig.go wraps as
        ``error executing <command>: …``. Here the shell runs on the simulated host, its
        ``DIR/bin/nvidia-smi`` first on the PATH."""
        self.nvidia_smi_calls.append(command)
        refused = self._exec_error()  # the driver pod's exec fails as in check_ready
        if refused is not None:
            raise _GoError(f"error executing {command}: error during command execution: {refused}")
        path = f"{self.host.nvidia_smi.parent}{os.pathsep}{os.environ.get('PATH', '')}"
        done = subprocess.run(
            ["/bin/sh", "-c", f"{command} "],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
            env={**os.environ, "PATH": path},
        )
        if done.returncode != 0:
            raise _GoError(
                f"error executing {command}: error during command execution: command "
                f"terminated with exit code {done.returncode}"
            )
        return done.stdout

    # -- the driver pod: gpu_controller.go setupRemoteExecutor, pkg/util/executor --

    def setup_remote_executor(self, pod: JsonObject | None) -> None:
        """``setupRemoteExecutor`` (registered by ``Register`` on every Pod change, as
        ``watch-driver-pods``): a pod of ``harvester-system`` labelled
        ``app=nvidia-driver-daemonset`` on this node becomes the executor
        (``NewRemoteCommandExecutor``) whatever its phase; one being deleted
        (``deletionTimestamp`` set) resets it to the local executor. A pod that is gone is
        handed over as nil and changes nothing (the Go returns early on a nil pod)."""
        if pod is None or pod["metadata"].get("namespace") != DRIVER_NAMESPACE:
            return
        labels = pod["metadata"].get("labels") or {}
        if labels.get(DRIVER_LABEL[0]) != DRIVER_LABEL[1]:  # ``isNotDriverPod``
            return
        if _str(_spec(pod).get("nodeName")) != self.node:
            return
        self.executor_pod = None if _deleting(pod) else (DRIVER_NAMESPACE, _name(pod))

    def check_ready(self) -> None:
        """The executor's ``CheckReady`` (pkg/util/executor): locally (no driver pod)
        ``/host/usr/bin/file /host/usr/lib/nvidia/sriov-manage``, which passes (file(1) exits 0
        even for a missing file); remotely ``/usr/bin/file /tmp/ready`` run by ``Run``
        (remote.go: a ``kubectl exec`` of ``/bin/sh -c`` into the pod's first container), which
        fails as the exec does, wrapped ``error during command execution: ...``: the pod gone
        (``pods "<name>" not found``), a completed pod (kubectl's ``ExecOptions.Run``: ``cannot
        exec into a container in a completed pod; current phase is <phase>``), or its first
        container not running (the kubelet's ``unable to upgrade connection: container not
        found ("<container>")``, as kubectl reports it). A running container passes, whether
        or not ``/tmp/ready`` exists."""
        error = self._exec_error()
        if error is not None:
            raise _GoError(f"error during command execution: {error}")

    def _exec_error(self) -> str | None:
        """Why an exec into the executor's pod fails now (``check_ready``), or None: the local
        executor, or a running first container."""
        if self.executor_pod is None:
            return None
        namespace, name = self.executor_pod
        pod = self._informers[PODS].get(name, namespace)
        if pod is None:
            return f'pods "{name}" not found'
        phase = _str(_status(pod).get("phase"))
        if phase in ("Succeeded", "Failed"):
            return f"cannot exec into a container in a completed pod; current phase is {phase}"
        containers = _spec(pod).get("containers") or [{}]
        container = _str(containers[0].get("name"))
        statuses = _status(pod).get("containerStatuses") or []
        state = next((c.get("state") or {} for c in statuses if c.get("name") == container), {})
        if "running" not in state:
            return f'unable to upgrade connection: container not found ("{container}")'
        return None

    # -- OnVGPUChange: pkg/controller/gpudevice/vgpu_controller.go --

    def on_vgpu_change(self, vgpu: JsonObject | None) -> None:
        """``OnVGPUChange``: ``enableVGPU`` when enabled and sysfs shows no type, ``disableVGPU``
        when disabled and sysfs shows one; otherwise ``uuid``, ``vGPUStatus`` and
        ``availableTypes`` from sysfs in one status write if they differ. A type change on an
        enabled device is therefore ignored."""
        if vgpu is None or _deleting(vgpu) or _str(_spec(vgpu).get("nodeName")) != self.node:
            return
        spec = _vgpu_spec(vgpu)
        try:
            discovered = self.fetch_vgpu_status(spec["address"])
        except _GoError as error:
            raise _GoError(f"error generating vgpu {_name(vgpu)} status: {error}") from None
        if spec["enabled"] and discovered["vGPUStatus"] == "":
            self._enable_vgpu(vgpu, spec)
            return
        if not spec["enabled"] and discovered["vGPUStatus"] == VGPU_CONFIGURED:
            self._disable_vgpu(vgpu, spec)
            return
        status = _vgpu_status(vgpu)
        wanted = {**status, **{k: discovered[k] for k in ("uuid", "vGPUStatus", "availableTypes")}}
        if wanted != status:
            self._update_status(VGPUS, vgpu, _vgpu_status_json(wanted))

    def _enable_vgpu(self, vgpu: JsonObject, spec: JsonObject) -> None:
        """``enableVGPU``: the type id from the object's (cached) ``status.availableTypes``,
        ``submitPCIDeviceClaim``, the id written to ``current_vgpu_type``, then ONE status write
        (``vGPUStatus: vGPUConfigured``, ``uuid`` = the type id, ``configureVGPUTypeName``;
        ``availableTypes`` left as it was), then ``reconcileDisabledVGPUStatus``."""
        status = _vgpu_status(vgpu)
        type_id = (status["availableTypes"] or {}).get(spec["vGPUTypeName"])
        if type_id is None:
            raise _GoError(
                f"VGPUType specified {spec['vGPUTypeName']} is not available for vGPU "
                f"{spec['address']}"
            )
        self._submit_pci_device_claim(vgpu, spec)
        self._write_current_type(vgpu, spec["address"], type_id)
        status.update(
            vGPUStatus=VGPU_CONFIGURED, uuid=type_id, configureVGPUTypeName=spec["vGPUTypeName"]
        )
        written = self._update_status(VGPUS, vgpu, _vgpu_status_json(status))
        self._reconcile_disabled_vgpu_status(written)

    def _disable_vgpu(self, vgpu: JsonObject, spec: JsonObject) -> None:
        """``disableVGPU``: ``cleanupRelatedPCIDeviceObjects`` (the claim deleted, the PCIDevice's
        override annotation and parent label removed), ``0`` written to ``current_vgpu_type``,
        then ONE status write clearing ``vGPUStatus``, ``uuid`` and ``configureVGPUTypeName``
        (``availableTypes`` left as it was: the next ``OnVGPUChange``, on this very write,
        refreshes it from sysfs in a second write), then ``reconcileDisabledVGPUStatus``."""
        name = _name(vgpu)
        try:
            self._custom.delete_cluster_custom_object(*PCIDEVICECLAIMS, name)
        except client.ApiException as error:
            if error.status != 404:
                raise _GoError(_api_message(error)) from None
        pd = self._informers[PCIDEVICES].get(name)
        if pd is None:
            raise _GoError(
                f"error looking up pcidevice {name} in cleanupPCIDeviceSpec: "
                f'pcidevice.devices.harvesterhci.io "{name}" not found'
            )
        changed = copy.deepcopy(pd)
        meta = changed["metadata"]
        (meta.get("annotations") or {}).pop(OVERRIDE_RESOURCE_NAME, None)
        (meta.get("labels") or {}).pop(PARENT_LABEL, None)
        if changed != pd:
            self._replace(PCIDEVICES, changed)
        self._write_current_type(vgpu, spec["address"], "0")
        status = _vgpu_status(vgpu)
        status.update(vGPUStatus="", uuid="", configureVGPUTypeName="")
        written = self._update_status(VGPUS, vgpu, _vgpu_status_json(status))
        self._reconcile_disabled_vgpu_status(written)

    def _write_current_type(self, vgpu: JsonObject, address: str, value: str) -> None:
        """``os.WriteFile(<SysDevRoot>/<VF>/nvidia/current_vgpu_type)`` through the simulator's
        kernel emulation; a type id (not ``0``) is refused with ``refuse_enable`` when set."""
        try:
            if value != "0" and self.refuse_enable is not None:
                raise OSError(self.refuse_enable, os.strerror(self.refuse_enable))
            self.host.writer().write(f"bus/pci/devices/{address}/nvidia/current_vgpu_type", value)
        except OSError as error:
            raise _GoError(
                f"error writing to create file for vgpu {_name(vgpu)}: write "
                f"{SYS_DEV_ROOT}{address}/nvidia/current_vgpu_type: {_os_error(error)}"
            ) from None

    def _reconcile_disabled_vgpu_status(self, vgpu: JsonObject) -> None:
        """``reconcileDisabledVGPUStatus``: every other disabled VGPUDevice of the same parent
        GPU (by the parent label) is queued, so their ``availableTypes`` narrow or widen."""
        parent = device_name(_vgpu_spec(vgpu)["parentGPUDeviceAddress"], self.node)
        for other in self._informers[VGPUS].list():
            labels = other["metadata"].get("labels") or {}
            if labels.get(PARENT_LABEL) != parent:
                continue
            if _vgpu_spec(other)["enabled"] or _name(other) == _name(vgpu):
                continue
            self._queue.add(f"vgpudevices/{_name(other)}")

    def _submit_pci_device_claim(self, vgpu: JsonObject, spec: JsonObject) -> None:
        """``submitPCIDeviceClaim``: the VF's PCIDevice gets ``status.resourceName`` (one status
        write, ``patchPCIDeviceStatus``) and the override annotation and parent label (one
        update, ``patchPCIDeviceSpec``), then the PCIDeviceClaim named after the VGPUDevice is
        created (AlreadyExists is fine)."""
        name = _name(vgpu)
        resource = resource_name_of_type(spec["vGPUTypeName"])
        pd = self._informers[PCIDEVICES].get(name)
        if pd is None:
            raise _GoError(
                "error creating pcideviceclaim for associated vgpu device: error looking up "
                "pcidevice when trying to setup vgpu passthrough: "
                f'pcidevice.devices.harvesterhci.io "{name}" not found'
            )
        if (pd.get("status") or {}).get("resourceName") != resource:
            body = copy.deepcopy(pd)
            body.setdefault("status", {})["resourceName"] = resource
            pd = self._update_status(PCIDEVICES, pd, body["status"])
        parent = device_name(spec["parentGPUDeviceAddress"], self.node)
        changed = copy.deepcopy(pd)
        changed["metadata"].setdefault("annotations", {})[OVERRIDE_RESOURCE_NAME] = resource
        changed["metadata"].setdefault("labels", {})[PARENT_LABEL] = parent
        if changed != pd:
            pd = self._replace(PCIDEVICES, changed)
        claim = {
            "apiVersion": API_VERSION,
            "kind": "PCIDeviceClaim",
            "metadata": {
                "name": name,
                "labels": {
                    PARENT_LABEL: device_name(spec["parentGPUDeviceAddress"], spec["nodeName"])
                },
                "annotations": {SKIP_VFIO_BINDING: "true", OVERRIDE_RESOURCE_NAME: resource},
                "ownerReferences": [
                    _owner(pd, "PCIDevice"),
                    _owner(vgpu, "VGPUDevice"),
                ],
            },
            "spec": {
                "address": spec["address"],
                "userName": CLAIM_USER,
                "nodeName": spec["nodeName"],
            },
        }
        try:
            self._custom.create_cluster_custom_object(*PCIDEVICECLAIMS, claim)
        except client.ApiException as error:
            if error.status != 409:
                raise _GoError(
                    "error creating pcideviceclaim for associated vgpu device: "
                    + _api_message(error)
                ) from None

    # -- the node's reconcile --

    def _reconcile_pci_devices(self) -> None:
        """pkg/controller/pcidevice/pcidevice_controller.go ``ReconcilePCIDevices``: a PCIDevice
        for every device but PCI bridges (class 0604), created when missing and its status
        written on every pass; PCIDevices of this node whose address is gone are deleted."""
        groups = self._iommu_groups()
        present: set[str] = set()
        for address in sorted(os.listdir(self._devices())):
            dev = self._pci_device(address)
            if dev["classId"] == "0604":
                continue
            present.add(address)
            name = device_name(address, self.node)
            pd = self._informers[PCIDEVICES].get(name)
            if pd is None:
                pd = self._create(
                    PCIDEVICES,
                    {
                        "apiVersion": API_VERSION,
                        "kind": "PCIDevice",
                        "metadata": {
                            "name": name,
                            "labels": {NODE_LABEL: self.node},
                            "annotations": {PCI_DEVICE_DRIVER: dev["driver"]},
                        },
                        "spec": {},
                        "status": _pci_status(dev, self.node, None, ""),
                    },
                )
            override = (pd["metadata"].get("annotations") or {}).get(OVERRIDE_RESOURCE_NAME, "")
            status = _pci_status(dev, self.node, groups.get(address), override)
            self._update_status(PCIDEVICES, pd, {**(pd.get("status") or {}), **status})
        for pd in self._informers[PCIDEVICES].list():
            if (pd["metadata"].get("labels") or {}).get(NODE_LABEL) != self.node:
                continue
            if (pd.get("status") or {}).get("address") not in present:
                self._delete(PCIDEVICES, _name(pd))

    def _setup_sriov_gpu_devices(self) -> None:
        """gpu_controller.go ``SetupSRIOVGPUDevices``/``reconcileSRIOVGPUSetup``: a
        SRIOVGPUDevice created for each SR-IOV GPU without one (none for a GPU a PCIDeviceClaim
        of the same name passes through whole; ``spec.enabled`` from ``sriov_numvfs``, the
        status dropped by the API server), this node's others deleted."""
        found = self._identify_sriov_gpus()
        for gpu in found:
            name = _name(gpu)
            if self._informers[PCIDEVICECLAIMS].get(name) is not None:
                continue
            if self._informers[SRIOVGPUS].get(name) is None:
                self._create(SRIOVGPUS, gpu)
        names = {_name(g) for g in found}
        for gpu in self._informers[SRIOVGPUS].list():
            labels = gpu["metadata"].get("labels") or {}
            if labels.get(NODE_LABEL) == self.node and _name(gpu) not in names:
                try:
                    self._delete(SRIOVGPUS, _name(gpu))
                except _GoError as error:
                    raise _GoError(
                        f"error deleting non existent GPU device {_name(gpu)}: {error}"
                    ) from None

    def _identify_sriov_gpus(self) -> list[JsonObject]:
        """gpuhelper.go ``IdentifySRIOVGPU``: NVIDIA GPUs (PFs) whose ``sriov_vf_device`` exists
        and is not 0 (common.go ``IsDeviceSRIOVCapable``), by address."""
        gpus = []
        for address in self._nvidia_devices():
            path = self._sys(address)
            if (path / "physfn").exists() or not self._is_gpu(address):
                continue
            try:
                vf_device = (path / "sriov_vf_device").read_text()
            except FileNotFoundError:
                continue
            if vf_device.removesuffix("\n") == "0":
                continue
            enabled, status = self._gpu_status(address)
            gpus.append(
                {
                    "apiVersion": API_VERSION,
                    "kind": "SRIOVGPUDevice",
                    "metadata": {
                        "name": device_name(address, self.node),
                        "labels": {NODE_LABEL: self.node},
                    },
                    "spec": {"address": address, "nodeName": self.node, "enabled": enabled},
                    "status": _gpu_status_json(status),
                }
            )
        return gpus

    def _setup_vgpu_devices(self) -> None:
        """vgpu_controller.go ``SetupVGPUDevices``/``reconcileVGPUSetup``: every VF of an NVIDIA
        GPU gets a VGPUDevice (created with ``spec.enabled`` false: ``FetchVGPUStatus`` never
        sets the configured type name ``generateVGPUDevice`` looks at), an existing one a status
        write when ``availableTypes``, ``vGPUStatus`` or ``uuid`` differ from sysfs; this
        node's VGPUDevices whose VF is gone are deleted unless their parent SRIOVGPUDevice is
        enabled; each VF's PCIDevice gets the parent label."""
        try:
            found = self._identify_vgpus()
        except _GoError as error:
            raise _GoError(f"error identifying vgpu devices: {error}") from None
        for vgpu in found:
            existing = self._informers[VGPUS].get(_name(vgpu))
            if existing is None:
                self._create(VGPUS, vgpu)
                continue
            status = _vgpu_status(existing)
            wanted = {
                **status,
                **{k: _vgpu_status(vgpu)[k] for k in ("availableTypes", "vGPUStatus", "uuid")},
            }
            if wanted != status:
                self._update_status(VGPUS, existing, _vgpu_status_json(wanted))
        names = {_name(v) for v in found}
        for vgpu in self._informers[VGPUS].list():
            if (vgpu["metadata"].get("labels") or {}).get(NODE_LABEL) != self.node:
                continue
            parent = self._informers[SRIOVGPUS].get(
                device_name(_vgpu_spec(vgpu)["parentGPUDeviceAddress"], self.node)
            )
            parent_enabled = parent is not None and _gpu_spec(parent)["enabled"]
            if not parent_enabled and _name(vgpu) not in names:
                self._delete(VGPUS, _name(vgpu))
        for vgpu in found:
            pd = self._informers[PCIDEVICES].get(_name(vgpu))
            if pd is None:
                continue
            changed = copy.deepcopy(pd)
            changed["metadata"].setdefault("labels", {})[PARENT_LABEL] = vgpu["metadata"]["labels"][
                PARENT_LABEL
            ]
            if changed != pd:
                self._replace(PCIDEVICES, changed)

    def _identify_vgpus(self) -> list[JsonObject]:
        """gpuhelper.go ``IdentifyVGPU``/``generateVGPUDevice``: each NVIDIA GPU-class VF
        (``physfn`` link), by address (go-nvlib sorts them)."""
        vgpus = []
        for address in self._nvidia_devices():
            path = self._sys(address)
            if not (path / "physfn").exists() or not self._is_gpu(address):
                continue
            physfn = os.path.basename(os.path.realpath(path / "physfn"))
            status = self.fetch_vgpu_status(address)
            vgpus.append(
                {
                    "apiVersion": API_VERSION,
                    "kind": "VGPUDevice",
                    "metadata": {
                        "name": device_name(address, self.node),
                        "labels": {
                            NODE_LABEL: self.node,
                            PARENT_LABEL: device_name(physfn, self.node),
                        },
                    },
                    "spec": {
                        "vGPUTypeName": "",
                        "address": address,
                        "enabled": False,
                        "nodeName": self.node,
                        "parentGPUDeviceAddress": physfn,
                    },
                    "status": _vgpu_status_json({**status, "configureVGPUTypeName": ""}),
                }
            )
        return vgpus

    def fetch_vgpu_status(self, address: str) -> JsonObject:
        """gpuhelper.go ``FetchVGPUStatus``: ``current_vgpu_type`` (not 0: ``uuid`` is that id,
        ``vGPUStatus`` vGPUConfigured) and ``availableTypes`` parsed from
        ``creatable_vgpu_types`` (``parseCurrentVGPUTypes``: name → id, the header dropped; an
        empty, non-nil map when nothing is creatable)."""
        nvidia = self._sys(address) / "nvidia"
        shown = f"{SYS_DEV_ROOT}{address}/nvidia"
        try:
            current = (nvidia / "current_vgpu_type").read_text().strip()
        except OSError as error:
            raise _GoError(
                "error during fetchVGPUstatus: error reading current_vgpu_type for device "
                f"{address}: open {shown}/current_vgpu_type: {_os_error(error)}"
            ) from None
        try:
            contents = (nvidia / "creatable_vgpu_types").read_text()
        except OSError as error:
            raise _GoError(
                "error during fetchAvailableTypes: could not get file creatable_vgpu_types for "
                f"vgpu device {address}: stat {shown}/creatable_vgpu_types: {_os_error(error)}"
            ) from None
        available: dict[str, str] = {}
        for line in contents.split("\n"):
            elements = line.split(":")
            if len(elements) != 2:
                continue
            available[elements[1].strip()] = elements[0].strip()
            available.pop("vGPU Name", None)
        configured = current not in ("0", "")
        return {
            "availableTypes": available,
            "vGPUStatus": VGPU_CONFIGURED if configured else "",
            "uuid": current if configured else "",
        }

    def _check_and_update_node_labels(self) -> None:
        """node_controller.go ``checkAndUpdateNodeLabels``: the core Node gets
        ``sriovgpu.harvesterhci.io/driver-needed: "true"`` while this node has SRIOVGPUDevices,
        loses it when it has none (an update of the Node)."""
        has_gpus = any(
            (g["metadata"].get("labels") or {}).get(NODE_LABEL) == self.node
            for g in self._informers[SRIOVGPUS].list()
        )
        node = self._informers[NODES].get(self.node)
        if node is None:
            raise _GoError(f'nodes "{self.node}" not found')
        labels = dict(node["metadata"].get("labels") or {})
        if DRIVER_NEEDED_LABEL in labels and not has_gpus:
            del labels[DRIVER_NEEDED_LABEL]
        elif DRIVER_NEEDED_LABEL not in labels and has_gpus:
            labels[DRIVER_NEEDED_LABEL] = "true"
        if labels != (node["metadata"].get("labels") or {}):
            body = copy.deepcopy(node)
            body["metadata"]["labels"] = labels
            try:
                self._core.replace_node(self.node, body)
            except client.ApiException as error:
                raise _GoError(_api_message(error)) from None

    # -- sysfs reads --

    def _devices(self) -> Path:
        return self.host.sysfs_root / "bus" / "pci" / "devices"

    def _sys(self, address: str) -> Path:
        return self._devices() / address

    def _nvidia_devices(self) -> list[str]:
        """go-nvlib ``GetAllDevices``: vendor 0x10de, sorted by address as a number."""
        found = []
        for address in os.listdir(self._devices()):
            with contextlib.suppress(OSError):
                if (self._sys(address) / "vendor").read_text().strip() == "0x10de":
                    found.append(address)
        return sorted(found, key=lambda a: int(a.replace(":", "").replace(".", ""), 16))

    def _is_gpu(self, address: str) -> bool:
        """go-nvlib ``IsGPU``: class 0x0300xx (VGA) or 0x0302xx (3D)."""
        text = (self._sys(address) / "class").read_text().strip()
        return int(text, 16) >> 8 in (0x0300, 0x0302)

    def _pci_device(self, address: str) -> dict[str, str]:
        """What ghw's ``pci.Device`` gives the PCIDevice code: ids without 0x, the driver."""
        path = self._sys(address)

        def read(name: str) -> str:
            return (path / name).read_text().strip().removeprefix("0x")

        klass = read("class")
        driver = (
            os.path.basename(os.path.realpath(path / "driver"))
            if (path / "driver").exists()
            else ""
        )
        return {
            "address": address,
            "vendorId": read("vendor"),
            "deviceId": read("device"),
            "classId": klass[:4],
            "driver": driver,
        }

    def _iommu_groups(self) -> dict[str, str]:
        """pkg/iommu ``GroupPaths``/``GroupMapForPCIDevices``: each device's group number."""
        groups: dict[str, str] = {}
        root = self.host.sysfs_root / "kernel" / "iommu_groups"
        with contextlib.suppress(OSError):
            for group in os.listdir(root):
                with contextlib.suppress(OSError):
                    for address in os.listdir(root / group / "devices"):
                        groups[address] = group
        return groups

    # -- API writes (the real client over HTTP) --

    def _create(self, res: tuple[str, str, str], body: JsonObject) -> JsonObject:
        try:
            created: JsonObject = self._custom.create_cluster_custom_object(*res, body)
        except client.ApiException as error:
            raise _GoError(_api_message(error)) from None
        return created

    def _replace(self, res: tuple[str, str, str], body: JsonObject) -> JsonObject:
        try:
            replaced: JsonObject = self._custom.replace_cluster_custom_object(
                *res, _name(body), body
            )
        except client.ApiException as error:
            raise _GoError(_api_message(error)) from None
        return replaced

    def _update_status(
        self, res: tuple[str, str, str], obj: JsonObject, status: JsonObject
    ) -> JsonObject:
        """``UpdateStatus``: PUT ``/status`` of the cached object (its resourceVersion) with
        ``status``."""
        body = copy.deepcopy(obj)
        body["status"] = status
        try:
            written: JsonObject = self._custom.replace_cluster_custom_object_status(
                *res, _name(obj), body
            )
        except client.ApiException as error:
            raise _GoError(_api_message(error)) from None
        return written

    def _delete(self, res: tuple[str, str, str], name: str) -> None:
        try:
            self._custom.delete_cluster_custom_object(*res, name)
        except client.ApiException as error:
            raise _GoError(_api_message(error)) from None


# --- Go's view of the objects -----------------------------------------------------------------


class _GoError(Exception):
    """An error a Go function returns (its text as Go formats it)."""


def _need(obj: JsonObject | None) -> JsonObject:
    if obj is None:
        raise _GoError("no object in the admission request")
    return obj


def _name(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def _deleting(obj: Mapping[str, Any]) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    status = obj.get("status")
    return status if isinstance(status, Mapping) else {}


def _str(value: Any) -> str:
    """A Go string field decoded from JSON: null or absent is ""."""
    return value if isinstance(value, str) else ""


def _string_list(value: Any) -> list[str] | None:
    """A Go ``[]string`` decoded from JSON: nil when absent or null."""
    return [str(v) for v in value] if isinstance(value, list) else None


def _string_map(value: Any) -> dict[str, str] | None:
    """A Go ``map[string]string`` decoded from JSON: nil when absent or null."""
    return {str(k): _str(v) for k, v in value.items()} if isinstance(value, Mapping) else None


def _vgpu_spec(obj: Mapping[str, Any]) -> JsonObject:
    """``VGPUDeviceSpec`` as Go decodes it (sriovgpudevice.go)."""
    spec = _spec(obj)
    return {
        "vGPUTypeName": _str(spec.get("vGPUTypeName")),
        "address": _str(spec.get("address")),
        "enabled": spec.get("enabled") is True,
        "nodeName": _str(spec.get("nodeName")),
        "parentGPUDeviceAddress": _str(spec.get("parentGPUDeviceAddress")),
    }


def _gpu_spec(obj: Mapping[str, Any]) -> JsonObject:
    """``SRIOVGPUDeviceSpec`` as Go decodes it."""
    spec = _spec(obj)
    return {
        "address": _str(spec.get("address")),
        "nodeName": _str(spec.get("nodeName")),
        "enabled": spec.get("enabled") is True,
    }


def _vgpu_status(obj: Mapping[str, Any]) -> JsonObject:
    """``VGPUDeviceStatus`` as Go decodes it (``availableTypes`` None for a nil map)."""
    status = _status(obj)
    return {
        "vGPUStatus": _str(status.get("vGPUStatus")),
        "uuid": _str(status.get("uuid")),
        "configureVGPUTypeName": _str(status.get("configureVGPUTypeName")),
        "availableTypes": _string_map(status.get("availableTypes")),
    }


def _vgpu_status_json(status: Mapping[str, Any]) -> JsonObject:
    """Go's JSON of a ``VGPUDeviceStatus``: every field ``omitempty``."""
    return {k: v for k, v in status.items() if v not in ("", None) and v != {}}


def _gpu_status(obj: Mapping[str, Any]) -> JsonObject:
    status = _status(obj)
    return {
        "vfAddresses": _string_list(status.get("vfAddresses")),
        "vGPUDevices": _string_list(status.get("vGPUDevices")),
    }


def _gpu_status_json(status: Mapping[str, Any]) -> JsonObject:
    """Go's JSON of a ``SRIOVGPUDeviceStatus``: both lists ``omitempty``."""
    return {k: v for k, v in status.items() if v}


def _pci_status(
    dev: Mapping[str, str], node: str, group: str | None, override: str
) -> dict[str, str]:
    """pcidevice.go ``PCIDeviceStatus.Update`` with ghw's unknown-product forms: the resource
    name ``<vendor>.com/<device id>``, the description ``Class <id>: <vendor> Device <id>``."""
    vendor = _VENDORS.get(dev["vendorId"], "unknown")
    vendor_base = "".join(c for c in vendor.split(" ")[0] if c.isalnum()).lower()
    status = {
        "address": dev["address"],
        "vendorId": dev["vendorId"],
        "deviceId": dev["deviceId"],
        "classId": dev["classId"],
        "resourceName": override or f"{vendor_base}.com/{dev['deviceId']}",
        "description": f"Class {dev['classId']}: {vendor} Device {dev['deviceId']}",
        "kernelDriverInUse": dev["driver"],
        "nodeName": node,
    }
    if group is not None:
        status["iommuGroup"] = group
    return status


def _mig_lines(text: str) -> list[list[str]]:
    """mig.go ``parseMigInfo`` and the cleaning its callers do: each line holding ``MIG``,
    its ``|`` removed, trimmed, split at runs of whitespace."""
    return [line.replace("|", "").split() for line in text.splitlines() if MIG_PREFIX in line]


def _mig_profiles(text: str) -> list[JsonObject]:
    """mig.go ``generateProfile`` over ``-lgip``'s rows: ``name`` is ``MIG <profile>`` (the
    second and third fields), ``id`` the fourth, Free/Total the fifth."""
    out = []
    for fields in _mig_lines(text):
        try:
            free, _, total = fields[4].partition("/")
            out.append(
                {
                    "name": f"{fields[1]} {fields[2]}",
                    "id": int(fields[3]),
                    "free": int(free),
                    "total": int(total),
                }
            )
        except (IndexError, ValueError) as error:
            raise _GoError(f"error converting profile id: {error}") from None
    return out


def _mig_instances(text: str) -> dict[int, list[str]]:
    """mig.go ``generateMIGInstanceInfo``: ``-lgi``'s rows, profile id (fourth field) → the
    instance ids (fifth)."""
    found: dict[int, list[str]] = {}
    for fields in _mig_lines(text):
        ids = found.setdefault(int(fields[3]), [])
        if fields[4] not in ids:
            ids.append(fields[4])
    return found


def _owner(obj: Mapping[str, Any], kind: str) -> JsonObject:
    meta = obj["metadata"]
    return {"apiVersion": API_VERSION, "kind": kind, "name": meta["name"], "uid": meta.get("uid")}


def _api_message(error: client.ApiException) -> str:
    """The message of an API error, as client-go's StatusError prints it."""
    try:
        return str(json.loads(error.body or "{}").get("message") or error.reason)
    except ValueError:
        return str(error.reason)


def _os_error(error: BaseException) -> str:
    """Go's text for an errno (``no such file or directory``, ``operation not permitted``)."""
    if isinstance(error, OSError) and error.errno is not None:
        return os.strerror(error.errno).lower()
    return str(error)


def vm(name: str, namespace: str, *, hostdevices: Mapping[str, list[str]]) -> JsonObject:
    """A KubeVirt VirtualMachine whose allocation annotation lists ``hostdevices`` (resource name
    → device names), as Harvester's VM webhook writes it (pkg/webhook/vm.go)."""
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {ALLOCATION_ANNOTATION: json.dumps({"hostdevices": dict(hostdevices)})},
        },
        "spec": {"running": True},
    }


def driver_pod(name: str, node: str, *, running: bool) -> JsonObject:
    """A pod of Harvester's NVIDIA driver DaemonSet (harvester/charts nvidia-driver-runtime:
    label ``app: nvidia-driver-daemonset``, one container ``nvidia-driver-ctr``, no readiness
    probe) on ``node``, as the kubelet reports it: its container ``running`` (phase Running,
    Ready True), or crash-looping (phase Running, Ready False: ContainersNotReady, the
    container waiting in CrashLoopBackOff)."""
    container = "nvidia-driver-ctr"
    if running:
        ready = {"type": "Ready", "status": "True"}
        state: JsonObject = {"running": {"startedAt": "2026-12-07T00:00:00Z"}}
    else:
        ready = {
            "type": "Ready",
            "status": "False",
            "reason": "ContainersNotReady",
            "message": f"containers with unready status: [{container}]",
        }
        state = {"waiting": {"reason": "CrashLoopBackOff"}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": DRIVER_NAMESPACE,
            "labels": {
                DRIVER_LABEL[0]: DRIVER_LABEL[1],
                "app.kubernetes.io/name": "nvidia-driver-runtime",
            },
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": container, "image": "rancher/harvester-nvidia-driver-toolkit"}],
        },
        "status": {
            "phase": "Running",
            "conditions": [ready],
            "containerStatuses": [
                {"name": container, "ready": running, "restartCount": 0, "state": state}
            ],
        },
    }


def node_object(name: str) -> JsonObject:
    """A core Node: the webhook admits deletes once it is gone; the controller labels it."""
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {}}}


# --- the webhook served over HTTPS, for any API server --------------------------------------

#: server.go ``validationPath``.
VALIDATION_PATH = "/v1/webhook/validation"


class WebhookServer:
    """:class:`PciDevicesWebhook` as a real validating admission webhook: an HTTPS server on
    127.0.0.1 (a certificate made for the run with openssl, its own authority) answering
    AdmissionReview v1 at ``/v1/webhook/validation`` (server.go ``validationPath``), its VM and
    Node caches informers over HTTP (``informer.py``). The API server calls it as it calls
    Harvester's (harvester/harvester pkg/webhook/types/admission.go ``AdmissionHandler``
    answers a denial with ``allowed: false`` and the error's Status in ``result``)."""

    def __init__(self, kubeconfig: Path, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._cert, key = directory / "webhook.crt", directory / "webhook.key"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
             "-keyout", str(key), "-out", str(self._cert)],
            check=True, capture_output=True,
        )  # fmt: skip
        self._api = _new_client_from_config(config_file=str(kubeconfig))
        self._informers = Informers(self._api)
        for res in (VMS, NODES):
            self._informers.add(res)
        self._informers.start()
        self.webhook = PciDevicesWebhook({VMS: self._informers[VMS], NODES: self._informers[NODES]})
        #: Every AdmissionRequest answered: (operation, resource, name, allowed).
        self.reviews: list[tuple[str, str, str, bool]] = []
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2  # server.go: MinVersion TLS 1.2
        context.load_cert_chain(self._cert, key)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _review_handler(self))
        self._httpd.daemon_threads = True
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="pcidevices-webhook", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self._httpd.server_address[1]}{VALIDATION_PATH}"

    @property
    def ca_bundle(self) -> str:
        """The certificate, base64 PEM, as a configuration's ``caBundle``."""
        return base64.b64encode(self._cert.read_bytes()).decode()

    def sync(self) -> None:
        """Wait until the VM and Node caches hold what the API server holds now."""
        self._informers.sync()

    def answer(self, review: JsonObject) -> JsonObject:
        """The AdmissionReview v1 answering ``review``."""
        request = review.get("request") or {}
        resource = (request.get("resource") or {}).get("resource", "")
        denial = self.webhook.review(
            str(resource),
            str(request.get("subResource") or ""),
            str(request.get("operation") or ""),
            request.get("object"),
            request.get("oldObject"),
        )
        self.reviews.append(
            (str(request.get("operation")), str(resource), str(request.get("name")), not denial)
        )
        response: JsonObject = {"uid": request.get("uid", ""), "allowed": denial is None}
        if denial is not None:
            response["status"] = {
                "status": "Failure",
                "message": denial.message,
                "reason": denial.reason,
                "code": denial.code,
            }
        return {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": response,
        }

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._informers.stop()
        self._api.close()


def _review_handler(server: WebhookServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if self.path.split("?", 1)[0] != VALIDATION_PATH or length > 3 * 1024 * 1024:
                self.send_error(404 if length <= 3 * 1024 * 1024 else 413)
                return
            try:
                review = json.loads(self.rfile.read(length))
                body = json.dumps(server.answer(review)).encode()
            except (ValueError, AttributeError, TypeError) as error:
                self.send_error(400, str(error))
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


def serve_webhook(api: Any, kubeconfig: Path, directory: Path) -> WebhookServer:
    """Serve the webhook (:class:`WebhookServer`) and register it on the API server ``api``
    (a ``kubernetes`` ApiClient, an admin's) as server.go registers it: the
    ValidatingWebhookConfiguration ``pcidevices-validator``, one webhook
    ``pcidevices.harvesterhci.io``, failurePolicy Ignore, sideEffects None, review versions v1
    and v1beta1, :data:`RULES`; created, or replaced when there (``apply.ApplyObjects``). Its
    ``clientConfig`` is the server's URL where Harvester's names its Service (nothing here
    routes a Service). Close the server with :func:`stop_webhook`."""
    server = WebhookServer(kubeconfig, directory)
    admission: Any = client.AdmissionregistrationV1Api(api)
    body: JsonObject = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIGURATION},
        "webhooks": [
            {
                "name": WEBHOOK,
                "clientConfig": {"url": server.url, "caBundle": server.ca_bundle},
                "rules": RULES,
                "failurePolicy": "Ignore",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1", "v1beta1"],
            }
        ],
    }
    try:
        admission.create_validating_webhook_configuration(body)
    except client.ApiException as error:
        if error.status != 409:
            raise
        current = admission.read_validating_webhook_configuration(WEBHOOK_CONFIGURATION)
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        admission.replace_validating_webhook_configuration(WEBHOOK_CONFIGURATION, body)
    return server


def stop_webhook(api: Any, server: WebhookServer) -> None:
    """Unregister ``pcidevices-validator`` (its absence admits everything, as failurePolicy
    Ignore would) and close the server."""
    admission: Any = client.AdmissionregistrationV1Api(api)
    try:
        admission.delete_validating_webhook_configuration(WEBHOOK_CONFIGURATION)
    except client.ApiException as error:
        if error.status != 404:
            raise
    server.close()


def install_crds(install_crd: Any) -> None:
    """Harvester's CRDs the double writes beyond the two vGPU kinds (:data:`_CRDS`), through
    ``install_crd`` (``Served.install_crd``: any server)."""
    for path in _CRDS:
        install_crd(yaml.safe_load(path.read_text()))


__all__ = [
    "MIGCONFIGURATIONS",
    "PciDevicesController",
    "PciDevicesWebhook",
    "WebhookServer",
    "device_name",
    "driver_pod",
    "install",
    "node_object",
    "resource_name_of_type",
    "serve_webhook",
    "stop_webhook",
    "vm",
]
