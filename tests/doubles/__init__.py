"""Test doubles, in one place: models of the real systems vgpuctl talks to, and their tests.

- ``cluster.FakeCluster``: the in-memory ``ClusterApi`` (the port, no HTTP) for unit tests.
- ``emulator.ApiServerEmulator``: a Kubernetes API server over HTTP for the real ``kubernetes``
  client (with ``admission`` evaluating deploy/'s ValidatingAdmissionPolicy and ``jsonpatch``;
  ``register_webhook`` installs a Python judge as a validating admission webhook).
- ``fake_kubelet.FakeKubelet``: the kubelet's device manager speaking real gRPC;
  ``registry``: only its Registration service, for unit tests of the plugin server.
- ``pcidevices``: Harvester's pcidevices-controller for one simulated node and its vGPU
  admission webhook (issue 14's delegate mode), modelled on harvester/pcidevices at bdd8025.

The simulated NVIDIA host is not here: it is product code (``reconciler.sim``, ``vgpuctl sim``).

pcidevices-controller double: what it models
--------------------------------------------
``PciDevicesController`` (step API: ``resync``, ``reconcile_once``, ``run_until_idle``,
``retry``; ``start``/``stop`` run it in a thread) follows, in harvester/pcidevices:

- ``pkg/controller/nodes/node_controller.go`` ``reconcileNodeDevices`` (``resync``):
  ``pkg/controller/pcidevice/pcidevice_controller.go`` ``ReconcilePCIDevices`` (PCIDevice objects,
  bridges skipped), ``gpu_controller.go`` ``SetupSRIOVGPUDevices``/``reconcileSRIOVGPUSetup``,
  ``vgpu_controller.go`` ``SetupVGPUDevices``/``reconcileVGPUSetup`` (VGPUDevices made only here,
  for the VFs that exist), ``checkAndUpdateNodeLabels``;
- ``pkg/controller/gpudevice/gpu_controller.go`` ``OnGPUChange``, ``manageGPU`` (the simulator's
  ``DIR/bin/sriov-manage -e|-d <PF>`` as a subprocess), ``pkg/util/gpuhelper/gpuhelper.go``
  ``GenerateGPUStatus`` (VFs in ``virtfn*`` glob order), ``IdentifySRIOVGPU``;
- ``vgpu_controller.go`` ``OnVGPUChange``, ``enableVGPU``, ``disableVGPU`` (the type id or ``0``
  written to ``<VF>/nvidia/current_vgpu_type`` through the simulator's kernel emulation; one status
  write each), ``reconcileDisabledVGPUStatus``, ``submitPCIDeviceClaim``,
  ``cleanupRelatedPCIDeviceObjects``, and gpuhelper.go ``FetchVGPUStatus``/``IdentifyVGPU``/
  ``parseCurrentVGPUTypes``.
- ``gpu_controller.go`` ``reconcileMIGConfiguration``/``setupMigConfiguration`` and its delete
  branch, with mig.go's commands (``nvidia-smi`` through ``/bin/sh -c`` on the simulated host,
  as the driver pod's executor runs them) and parsing; the MigConfiguration it creates.

Its informers list and watch over HTTP (``informer.py``), so it runs against the emulator or
the real kube-apiserver. ``PciDevicesWebhook`` (registered in-process by ``pcidevices.install``
on the emulator, served over HTTPS as a real admission webhook by ``pcidevices.serve_webhook``)
follows ``pkg/webhook/vgpu.go`` and
``pkg/webhook/sriovgpudevices.go`` (Update and Delete), ``indexer.go`` ``isNodeDeleted`` and
``pkg/util/common/common.go`` ``VMByHostDeviceName``, with harvester/harvester's
``AdmissionHandler`` turning their errors into 500 InternalError denials.

Not modelled: the mdev interface (pre-v1.8 Harvester; at bdd8025 an mdev host fails the vGPU
setup, and the double fails it the same way), MIG's own handler (``OnMIGChange``: GPU
instances for an enabled MigConfiguration, which vgpuctl never writes), the NVIDIA driver pod
and its readiness check, the PCIDeviceClaim controller and device plugins (claims are
written, never acted on), USB and SR-IOV NIC devices and the management-NIC skip list, pci.ids
names, the devices.harvesterhci.io Node object, the other validators of the same webhook
(PCIDeviceClaim, VM, USB, MIG), and the mutating webhook.
"""
