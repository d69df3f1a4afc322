"""Composition: turn global options into the engine's parts for one host.

A simulated host (``vgpuctl sim init``) is recognised from the sysfs tree itself; its kernel
emulation then stands behind the same sysfs-writer port the real adapter code writes through.
"""

from __future__ import annotations

import os
import shlex
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.catalog import Catalog, default_catalog
from reconciler.cli.options import (
    DEFAULT_KUBELET_DIR,
    DEFAULT_SRIOV_MANAGE,
    DEFAULT_STATE_DIR,
    GlobalOptions,
)
from reconciler.model import Inventory, PciAddress, TypeNames, UsageError, unresolved_type_id
from reconciler.model.cluster import ClusterState, DeviceUse
from reconciler.model.record import field, record, replace

if TYPE_CHECKING:
    from reconciler.apply import BoundedWriter, PerVfDriver
    from reconciler.apply.typerecord import TypeRecord
    from reconciler.engine import NodePorts
    from reconciler.kube import KubernetesApi
    from reconciler.observe.holds import HoldProbe
    from reconciler.observe.kubevirt import KubevirtSighting
    from reconciler.observe.vgpumode import ModeReading
    from reconciler.sim import SimHost

#: How long one sysfs write may take before it is left to finish on its own (``--write-timeout``).
DEFAULT_WRITE_TIMEOUT = 10.0

#: Set in every pod: the in-cluster service account is the connection then.
SERVICE_HOST_ENV = "KUBERNETES_SERVICE_HOST"


@record
class Host:
    options: GlobalOptions
    #: The bounded sysfs writers made so far, by write timeout (see :meth:`driver`).
    _writers: dict[float, BoundedWriter] = field(default_factory=dict, repr=False)
    #: vfio type names the driver gave (``nvidia-smi vgpu -s -v``) for ids nothing else named,
    #: kept for this process's life (a watch asks once, not at every rescan).
    _driver_names: dict[tuple[PciAddress, str], str] = field(default_factory=dict, repr=False)
    #: The NVIDIA driver version ``_driver_names`` are of.
    _names_driver: str = field(default="", repr=False)

    @cached_property
    def catalog(self) -> Catalog:
        return default_catalog()

    @cached_property
    def sim(self) -> SimHost | None:
        from reconciler.sim import SimHost

        return SimHost.open(self.options.sysfs_root)

    @cached_property
    def simulated(self) -> bool:
        """Whether the sysfs root is a simulated host's (without loading the simulator)."""
        from reconciler.sim.holds import is_simulated

        return is_simulated(self.options.sysfs_root)

    @property
    def sim_dir(self) -> Path | None:
        return self.options.sysfs_root.resolve().parent if self.simulated else None

    @property
    def state_dir(self) -> Path:
        if self.options.state_dir is not None:
            return self.options.state_dir
        sim_dir = self.sim_dir
        return sim_dir / "state" if sim_dir else Path(DEFAULT_STATE_DIR)

    @property
    def kubelet_dir(self) -> Path:
        """``--kubelet-dir``; by default the node's, or a simulated host's own ``DIR/kubelet``
        (a simulated host never reads the machine's kubelet checkpoint)."""
        if self.options.kubelet_dir is not None:
            return self.options.kubelet_dir
        sim_dir = self.sim_dir
        return sim_dir / "kubelet" if sim_dir else Path(DEFAULT_KUBELET_DIR)

    @property
    def sriov_manage_argv(self) -> list[str]:
        return self._command("--sriov-manage", self.options.sriov_manage, DEFAULT_SRIOV_MANAGE)

    @property
    def nvidia_smi_argv(self) -> list[str]:
        from reconciler.apply.sriov import DEFAULT_NVIDIA_SMI

        return self._command("--nvidia-smi", self.options.nvidia_smi, DEFAULT_NVIDIA_SMI)

    def _command(self, option: str, given: str | None, default: str) -> list[str]:
        """``option``'s argv: as given (split, never run by a shell), else a simulated host's
        own program (``DIR/bin/<name>``), else ``default``."""
        cmd = given
        if cmd is None:
            sim_dir = self.sim_dir
            cmd = str(sim_dir / "bin" / option.removeprefix("--")) if sim_dir else default
        try:
            argv = shlex.split(cmd)
        except ValueError as exc:
            raise UsageError(f"{option} {cmd!r}: {exc}") from None
        if not argv:
            raise UsageError(f"{option} is empty")
        return argv

    def vgpu_modes(self) -> ModeReading:
        """Every GPU's vGPU mode as ``nvidia-smi -q`` tells it (``observe/vgpumode.py``)."""
        from reconciler.apply.runner import SubprocessRunner
        from reconciler.apply.sriov import read_vgpu_modes

        return read_vgpu_modes(SubprocessRunner(), self.nvidia_smi_argv)

    @cached_property
    def type_record(self) -> TypeRecord:
        """The vfio types vgpuctl configured on this node (``apply.typerecord``)."""
        from reconciler.apply.typerecord import TypeRecord, driver_version

        return TypeRecord(
            self.state_dir, self.options.node, driver=driver_version(self.options.sysfs_root)
        )

    def observe(self, *, availability: bool = True) -> Inventory:
        """This node's host. Without ``availability``, each mdev VF's creatable set is not
        read (``Inventory.vf_availability``): what a plan with no cluster asks for."""
        from reconciler.observe import observe_host

        def scan(known: TypeNames) -> Inventory:
            return observe_host(
                self.options.sysfs_root,
                node=self.options.node,
                catalog=self.catalog,
                hold_probe=self.hold_probe(),
                assume_no_hidden_holders=self.options.assume_no_hidden_holders,
                known_types=known,
                availability=availability,
            )

        record = self.type_record.read()
        version = self._driver_version()
        if version != self._names_driver:
            # Type ids are a driver branch's: what another driver named names nothing now.
            self._driver_names.clear()
            self._names_driver = version
        inventory = scan(self._known_types(record.names))
        notes: list[str] = []
        unnamed = _unnamed_types(inventory)
        if unnamed:
            # An id no list and no record names (a vGPU vgpuctl did not make, or a record
            # lost): ask the driver, once per GPU, and look again with its names.
            learnt, notes = self._ask_driver(inventory, unnamed)
            if learnt:
                self._driver_names.update(learnt)
                inventory = scan(self._known_types(record.names))
        api = self.cluster_api if _unnamed_types(inventory) else None
        if api is not None:
            # Rare (the driver could not say either): the node's summary may still name them.
            # One read, only then: an idle node's rescans make no API call for it.
            from reconciler.observe.cluster import summary_type_names

            inventory = scan(
                {**summary_type_names(api, self.options.node), **self._known_types(record.names)}
            )
        still = _unnamed_types(inventory)
        notes = [n for gpu, n in zip(unnamed, notes, strict=True) if gpu in still and n]
        if record.note is not None:
            notes.append(record.note)
        if notes:
            inventory = replace(inventory, notes=(*inventory.notes, *notes))
        return inventory

    def _driver_version(self) -> str:
        from reconciler.apply.typerecord import driver_version

        return driver_version(self.options.sysfs_root)

    def vfio_known_types(self) -> TypeNames:
        """The vfio type names known now: the record's, and what the driver named so far."""
        return self._known_types(self.type_record.read().names)

    def learn_vfio_types(self, inventory: Inventory) -> bool:
        """Ask the driver about every GPU of ``inventory`` with a type shown by its id only
        (``_ask_driver``); whether it named anything new (then scan again)."""
        unnamed = _unnamed_types(inventory)
        if not unnamed:
            return False
        learnt, _ = self._ask_driver(inventory, unnamed)
        new = any(self._driver_names.get(k) != v for k, v in learnt.items())
        self._driver_names.update(learnt)
        return new

    def _known_types(self, recorded: TypeNames) -> TypeNames:
        """The vfio type names known without reading the host: the driver's, then the record's."""
        return {**self._driver_names, **recorded}

    def _ask_driver(
        self, inventory: Inventory, gpus: tuple[PciAddress, ...]
    ) -> tuple[dict[tuple[PciAddress, str], str], list[str]]:
        """The names the driver gives each of ``gpus``' supported types, each answer checked
        against what the GPU's VFs list (``observe/vgputypes.py``); and per GPU, in order, why
        its answer could not be used ("" when it could)."""
        from reconciler.apply.runner import SubprocessRunner
        from reconciler.apply.sriov import read_supported_types
        from reconciler.observe.vgputypes import SupportedTypes, check_against_lists

        runner, argv = SubprocessRunner(), self.nvidia_smi_argv
        learnt: dict[tuple[PciAddress, str], str] = {}
        notes: list[str] = []
        failed: SupportedTypes | None = None  # a command that could not run: not run again
        for address in gpus:
            gpu = inventory.gpu(address)
            listed = {t.type_id: t.name for t in gpu.types if t.type_id} if gpu else {}
            asked = failed or read_supported_types(runner, argv, address)
            if not asked.ran:
                failed = asked
            answer = check_against_lists(asked, listed)
            if answer.problem is not None:
                notes.append(f"GPU {address}: its vGPU types could not be named: {answer.problem}")
                continue
            notes.append("")
            learnt.update({(address, t): n for t, n in answer.names.items()})
        return learnt, notes

    def observe_all(self) -> Inventory:
        """:meth:`observe`, with the vGPU mode of every GPU whose SR-IOV is on (one
        ``nvidia-smi -q``): what ``status`` and ``export`` show. A plan reads it only where it
        makes vGPUs (``engine/observe.py``)."""
        from reconciler.observe.vgpumode import with_vgpu_modes

        inventory = self.observe()
        enabled = [g.address for g in inventory.gpus if g.sriov_enabled]
        if not enabled:
            return inventory
        return with_vgpu_modes(inventory, enabled, self.vgpu_modes())

    def hold_probe(self) -> HoldProbe:
        """Who holds a vGPU: the simulator's VMs on a simulated host, ``/proc`` on a real one."""
        if self.simulated:
            from reconciler.sim.holds import SimHoldProbe

            return SimHoldProbe(self.options.sysfs_root)
        from reconciler.observe.holds import ProcfsHoldProbe

        return ProcfsHoldProbe()

    def kubevirt_sighting(self) -> KubevirtSighting | None:
        """Whether (and why) KubeVirt's virt-handler runs on this host: its sockets in the
        kubelet's device-plugin directory, or its process. A simulated host's processes are its
        own proc tree (``sim/procfs.py``): the machine's ``/proc`` is never read for it."""
        from reconciler.observe.kubevirt import sight_kubevirt

        if self.simulated:
            from reconciler.sim.procfs import proc_root

            processes = proc_root(self.options.sysfs_root)
        else:
            processes = Path("/proc")
        return sight_kubevirt(kubelet_dir=self.kubelet_dir, proc_root=processes)

    @property
    def has_cluster(self) -> bool:
        """A cluster is configured: ``--kubeconfig``, or running in a pod."""
        return self.options.kubeconfig is not None or bool(os.environ.get(SERVICE_HOST_ENV))

    @cached_property
    def cluster_api(self) -> KubernetesApi | None:
        if not self.has_cluster:
            return None
        from reconciler.kube import connect

        return connect(self.options.kubeconfig)

    def observe_cluster(self) -> ClusterState | None:
        """The cluster's view of this node, or None without a cluster."""
        api = self.cluster_api
        if api is None:
            return None
        from reconciler.observe import observe_cluster

        return observe_cluster(
            api,
            node=self.options.node,
            kubevirt_namespace=self.options.kubevirt_namespace,
            kubelet_dir=self.kubelet_dir,
        )

    def kubelet_uses(self) -> ClusterState | None:
        """Without a cluster, the kubelet's checkpoint alone still says which vGPUs are handed
        to pods: those count as in use (None when there is no checkpoint)."""
        from reconciler.observe import read_checkpoint

        entries = read_checkpoint(self.kubelet_dir)
        if not entries:
            return None
        uses = {
            device: DeviceUse(device, e.resource_name, f"pod {e.pod_uid}")
            for e in entries
            if e.resource_name.startswith("nvidia.com/")
            for device in e.device_ids
        }
        return ClusterState(node=self.options.node, device_uses=uses)

    def process_holder(self, vf: PciAddress, uuid: str) -> str | None:
        """Which process of the host holds the vGPU ``uuid`` on ``vf`` now (the executor asks
        right before removing it); blindness counts as holding, as in :meth:`observe`."""
        from reconciler.observe.host import vgpu_holder

        return vgpu_holder(
            self.options.sysfs_root,
            vf=vf,
            uuid=uuid,
            hold_probe=self.hold_probe(),
            assume_no_hidden_holders=self.options.assume_no_hidden_holders,
        )

    def allocations(self) -> dict[str, frozenset[str]]:
        """The kubelet checkpoint's vGPU allocations now: device ID → the pods (UIDs) it is
        given to; empty when there is no checkpoint."""
        from reconciler.observe import read_checkpoint

        pods: dict[str, set[str]] = {}
        for entry in read_checkpoint(self.kubelet_dir) or ():
            if entry.resource_name.startswith("nvidia.com/"):
                for device in entry.device_ids:
                    pods.setdefault(device, set()).add(entry.pod_uid)
        return {device: frozenset(uids) for device, uids in pods.items()}

    def driver(
        self, *, command_timeout: float = 300.0, write_timeout: float = DEFAULT_WRITE_TIMEOUT
    ) -> PerVfDriver:
        from reconciler.apply import (
            BoundedWriter,
            MdevDriver,
            PerVfDriver,
            SubprocessRunner,
            VfioDriver,
        )
        from reconciler.apply.runner import own_module_argv
        from reconciler.apply.sysfs import SysfsReader

        root = self.options.sysfs_root
        # Every write in a writer process of its own: a kernel call that never returns
        # (removing a vGPU a VM vgpuctl could not see still holds) strands that process only.
        # One per timeout for this Host's life: watch reuses it from reconcile to reconcile.
        writer = self._writers.get(write_timeout)
        if writer is None:
            # Isolated, importing vgpuctl from where this process did: never from the
            # current directory (``python -m`` would put it first on ``sys.path``).
            command = own_module_argv(
                "reconciler.cli.sysfs_writer", "--root", os.path.abspath(root)
            )
            if self.sim is not None:
                command += ["--simulated", "--owner", str(os.getpid())]
            writer = BoundedWriter(command, timeout=write_timeout, root=root)
            self._writers[write_timeout] = writer
        runner, argv, smi = SubprocessRunner(), self.sriov_manage_argv, self.nvidia_smi_argv
        return PerVfDriver(
            mdev=MdevDriver(
                sysfs_root=root,
                writer=writer,
                runner=runner,
                sriov_manage=argv,
                command_timeout=command_timeout,
                nvidia_smi=smi,
            ),
            vfio=VfioDriver(
                sysfs_root=root,
                writer=writer,
                runner=runner,
                sriov_manage=argv,
                command_timeout=command_timeout,
                nvidia_smi=smi,
                known_types=self._known_types(self.type_record.read().names),
                on_configured=self.type_record.add,
                on_seen=self.type_record.remember,
            ),
            reader=SysfsReader(root),
        )

    def ports(
        self, *, command_timeout: float = 300.0, write_timeout: float = DEFAULT_WRITE_TIMEOUT
    ) -> NodePorts:
        """This node's parts, for the engine (``reconciler.engine``)."""
        from reconciler.engine import NodePorts

        api = self.cluster_api
        events = None
        if api is not None:
            from reconciler.kube import EventRecorder

            events = EventRecorder(api, node=self.options.node)
        return NodePorts(
            node=self.options.node,
            catalog=self.catalog,
            state_dir=self.state_dir,
            observe_host=self.observe,
            observe_cluster=self.observe_cluster,
            kubelet_uses=self.kubelet_uses,
            driver=lambda: self.driver(
                command_timeout=command_timeout, write_timeout=write_timeout
            ),
            process_holder=self.process_holder,
            allocations=self.allocations,
            cluster_api=api,
            events=events,
            vgpu_modes=self.vgpu_modes,
            kubevirt_host=self.kubevirt_sighting,
            unsafe_kubevirt_allow_listed=self.options.kubevirt_allow_listed,
            allow_list_grace=self.options.allow_list_grace,
        )


def _unnamed_types(inventory: Inventory) -> tuple[PciAddress, ...]:
    """The GPUs with a vGPU whose type is shown by its id only (vfio: no list, no record and
    not the driver names it)."""
    return tuple(
        gpu.address
        for gpu in inventory.gpus
        if any(
            vf.vgpu is not None and unresolved_type_id(vf.vgpu.type_name) is not None
            for vf in gpu.vfs
        )
    )
