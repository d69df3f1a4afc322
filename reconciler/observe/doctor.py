"""``vgpuctl doctor``: every precondition of a vGPU node, checked and explained, one line each.

Reads only: the sysfs tree (IOMMU groups, the NVIDIA driver's version, each GPU's vGPU side and
bound driver, through the same observer ``plan`` uses), the ``sriov-manage`` command's program
(found and executable, never run), the hold probe's view of the host's processes, and the
kubelet's device-plugin directory, and KubeVirt as a neighbour: whether its virt-handler runs on
the host and, with a cluster, whether its KubeVirt CR lets it remove the host's mdev vGPUs
(``observe/kubevirt.py``). Each check says what it found and, when it fails, what to
do. A check is ``ok``, ``fail`` (the node cannot be managed as it is: ``doctor`` exits 1) or
``info`` (worth knowing, not a fault: a GPU passed through whole, no kubelet on a plain KVM host).
"""

from __future__ import annotations

import enum
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from reconciler.catalog import Catalog
from reconciler.model import Gpu, Interface, ObserveError, ReconcilerError
from reconciler.model.clusterapi import ClusterApi
from reconciler.model.errors import ResourceMissingError, excerpt
from reconciler.model.inventory import Inventory
from reconciler.model.record import record
from reconciler.observe.holds import HoldProbe
from reconciler.observe.host import observe_host
from reconciler.observe.kubevirt import (
    SOCKET_PREFIX,
    SOCKET_SUFFIX,
    VIRT_HANDLER,
    WAY_OUT,
    KubevirtSighting,
    mdev_handling,
    not_allow_listed,
)
from reconciler.observe.sysfs import SysfsTree

IOMMU_GROUPS = "kernel/iommu_groups"
NVIDIA_VERSION = "module/nvidia/version"
DEVICE_PLUGINS = "device-plugins"


class CheckStatus(enum.StrEnum):
    OK = "ok"
    FAIL = "fail"
    INFO = "info"


@record(frozen=True, slots=True)
class Check:
    """One precondition: what was found, and what to do when it does not hold."""

    name: str  # "iommu", "nvidia-driver", "gpu 0000:08:00.0", …
    status: CheckStatus
    found: str
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.name,
            "status": self.status.value,
            "found": self.found,
            "fix": self.fix,
        }


@record(frozen=True, slots=True)
class DoctorReport:
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.status is not CheckStatus.FAIL for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [c.to_json() for c in self.checks]}


def examine_node(
    *,
    sysfs_root: Path,
    node: str,
    catalog: Catalog,
    sriov_manage: Sequence[str],
    hold_probe: HoldProbe,
    kubelet_dir: Path,
    kubelet_expected: bool,
    kubevirt_sighting: Callable[[], KubevirtSighting | None] | None = None,
    cluster_api: Callable[[], ClusterApi] | None = None,
    kubevirt_namespace: str | None = None,
    unsafe_kubevirt_allow_listed: bool = False,
) -> DoctorReport:
    """Run every check; none raises (a check that cannot look fails, saying why).

    ``cluster_api``: how to reach the cluster (None: no cluster configured); the KubeVirt check
    then reads the KubeVirt CR, else it asks ``kubevirt_sighting`` whether KubeVirt runs here."""
    checks = [_iommu(sysfs_root), _nvidia_driver(sysfs_root)]
    try:
        inventory: Inventory | None = observe_host(sysfs_root, node=node, catalog=catalog)
    except ReconcilerError as exc:
        inventory = None
        checks.append(
            Check(
                "gpus",
                CheckStatus.FAIL,
                f"cannot read the GPUs: {exc.message}",
                "check --sysfs-root (the host's /sys; in a pod, mount it)",
            )
        )
    if inventory is not None:
        checks.extend(gpu_checks(inventory))
    checks.append(_sriov_manage(sriov_manage))
    checks.append(_holders(hold_probe))
    checks.append(_kubelet(kubelet_dir, expected=kubelet_expected))
    if cluster_api is not None:
        checks.append(_kubevirt_cr(cluster_api, kubevirt_namespace, inventory))
    elif kubevirt_sighting is not None:
        checks.append(
            _kubevirt_host(
                kubevirt_sighting(),
                inventory,
                plugins=kubelet_dir / DEVICE_PLUGINS,
                unsafe=unsafe_kubevirt_allow_listed,
            )
        )
    return DoctorReport(tuple(checks))


def _uses_mdev(inventory: Inventory | None) -> bool:
    """Whether this host's vGPUs are (or, SR-IOV off, likely will be) mdevs; unknown: yes."""
    if inventory is None:
        return True
    return any(
        g.interface is Interface.MDEV or (g.interface is Interface.NONE and inventory.mdev_bus)
        for g in inventory.gpus
    )


def _kubevirt_host(
    sighting: KubevirtSighting | None,
    inventory: Inventory | None,
    *,
    plugins: Path,
    unsafe: bool,
) -> Check:
    """No cluster: does KubeVirt run here, which would remove the mdevs vgpuctl makes?"""
    if sighting is None:
        return Check(
            "kubevirt",
            CheckStatus.OK,
            f"KubeVirt does not run on this host (no {SOCKET_PREFIX}*{SOCKET_SUFFIX} in "
            f"{plugins}, no {VIRT_HANDLER} process): nothing removes the vGPUs vgpuctl makes",
        )
    if not _uses_mdev(inventory):
        return Check(
            "kubevirt",
            CheckStatus.OK,
            f"{sighting.sweep}; this host's vGPUs are NVIDIA's vendor-specific VFIO VFs, "
            "which it does not remove",
        )
    if unsafe:
        return Check(
            "kubevirt",
            CheckStatus.INFO,
            f"{sighting.sweep}; --unsafe-kubevirt-allow-listed: the operator says every type "
            "vgpuctl creates here is allow-listed by hand",
        )
    return Check(
        "kubevirt",
        CheckStatus.FAIL,
        f"{sighting.sweep}; with no cluster connection vgpuctl cannot allow-list the types it "
        "creates, so plan and apply block every mdev vGPU create",
        WAY_OUT,
    )


def _kubevirt_cr(
    connect: Callable[[], ClusterApi], namespace: str | None, inventory: Inventory | None
) -> Check:
    """With a cluster: would virt-handler, under the KubeVirt CR, remove this host's mdevs?"""
    from reconciler.observe.cluster import kubevirt_cr

    where = f"in namespace {namespace}" if namespace else "in any namespace"
    try:
        cr = kubevirt_cr(connect(), namespace)
    except ResourceMissingError:
        return Check(
            "kubevirt",
            CheckStatus.OK,
            "KubeVirt is not installed (kubevirts.kubevirt.io is not served): nothing removes "
            "the vGPUs vgpuctl makes",
        )
    except ObserveError as exc:  # several CRs: which one rules this node is not known
        return Check("kubevirt", CheckStatus.FAIL, exc.message)
    except ReconcilerError as exc:
        return Check(
            "kubevirt",
            CheckStatus.FAIL,
            f"cannot read the KubeVirt CR: {exc.message}",
            "check --kubeconfig, and that vgpuctl's role may list kubevirts.kubevirt.io",
        )
    if cr is None:
        return Check(
            "kubevirt",
            CheckStatus.OK,
            f"no KubeVirt CR {where}: no virt-handler removes the vGPUs vgpuctl makes",
        )
    raw_meta = cr.get("metadata")
    meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
    name = excerpt(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
    off = mdev_handling(cr)
    if off is not None:
        return Check(
            "kubevirt",
            CheckStatus.OK,
            f"KubeVirt's mediated-device handling is off in {name} ({off}): virt-handler "
            "removes no mdev",
        )
    types = sorted(
        {
            vf.vgpu.type_name
            for g in (inventory.gpus if inventory is not None else ())
            if g.interface is Interface.MDEV
            for vf in g.vfs
            if vf.vgpu is not None
        }
    )
    missing = not_allow_listed(cr, types)
    if missing:
        return Check(
            "kubevirt",
            CheckStatus.FAIL,
            f"KubeVirt's mediated-device handling is on, and {name} does not allow-list "
            f"{', '.join(excerpt(t) for t in missing)} with externalResourceProvider: true: "
            "virt-handler removes those vGPUs at its next heartbeat, in use by a VM or not",
            "run vgpuctl apply with this cluster connection (it allow-lists the types it "
            "configures), or add a permittedHostDevices.mediatedDevices entry for each "
            "(mdevNameSelector: the type's name, externalResourceProvider: true), or turn the "
            "handling off (mediatedDevicesConfiguration.enabled: false)",
        )
    if not types:
        return Check(
            "kubevirt",
            CheckStatus.OK,
            f"KubeVirt's mediated-device handling is on ({name}); this host has no mdev vGPU "
            "for it to remove (vgpuctl allow-lists each type it creates)",
        )
    return Check(
        "kubevirt",
        CheckStatus.OK,
        f"KubeVirt's mediated-device handling is on, and {name} allow-lists every mdev vGPU "
        f"type on this host ({', '.join(excerpt(t) for t in types)}) with "
        "externalResourceProvider: true",
    )


def _iommu(root: Path) -> Check:
    tree = SysfsTree(root)
    try:
        groups = [g for g in tree.list_dir(IOMMU_GROUPS) if g.isdigit()]
    except (OSError, ReconcilerError) as exc:
        groups = []
        why = exc.message if isinstance(exc, ReconcilerError) else exc.strerror or str(exc)
        detail = f"{tree.describe(IOMMU_GROUPS)}: {why}"
    else:
        detail = f"{tree.describe(IOMMU_GROUPS)} is empty"
    if groups:
        return Check("iommu", CheckStatus.OK, f"IOMMU on: {len(groups)} IOMMU groups")
    return Check(
        "iommu",
        CheckStatus.FAIL,
        f"no IOMMU groups ({detail}): the IOMMU is off, and no VM can be given a vGPU",
        "enable VT-d (Intel) or AMD-Vi in the firmware and boot with intel_iommu=on "
        "(or amd_iommu=on) iommu=pt",
    )


def _nvidia_driver(root: Path) -> Check:
    tree = SysfsTree(root)
    try:
        version = tree.read_text(NVIDIA_VERSION).strip()
    except (OSError, ReconcilerError) as exc:
        why = exc.message if isinstance(exc, ReconcilerError) else exc.strerror or str(exc)
        return Check(
            "nvidia-driver",
            CheckStatus.FAIL,
            f"the NVIDIA host driver is not loaded ({tree.describe(NVIDIA_VERSION)}: {why})",
            "install NVIDIA's vGPU host driver (the -vgpu-kvm package) and load it "
            "(modprobe nvidia); with the GPU operator, wait for its driver pod",
        )
    shown = excerpt(version) if version else "?"
    return Check("nvidia-driver", CheckStatus.OK, f"NVIDIA host driver {shown} loaded")


def gpu_checks(inventory: Inventory) -> list[Check]:
    """One line per NVIDIA SR-IOV GPU: can vgpuctl make vGPUs on it, and if not, why."""
    if not inventory.gpus:
        return [
            Check(
                "gpus",
                CheckStatus.FAIL,
                f"no NVIDIA SR-IOV GPU under {inventory.sysfs_root}",
                "check that the GPUs are SR-IOV vGPU parts (A2, A10, A16, A40, L4, L40, L40S, "
                "A100, H100, …) and bound to the nvidia driver",
            )
        ]
    return [_gpu(g) for g in inventory.gpus]


def _gpu(gpu: Gpu) -> Check:
    name = f"gpu {gpu.address}"
    label = gpu.model or f"{gpu.vendor_id}:{gpu.device_id}"
    if gpu.driver != "nvidia":
        bound = f"bound to {gpu.driver}" if gpu.driver else "bound to no driver"
        return Check(
            name,
            CheckStatus.INFO,
            f"{label} is {bound}: passed through whole to a VM, or reserved for one; vgpuctl "
            "leaves it alone",
            "to make vGPUs on it, stop what uses it and bind it to nvidia",
        )
    if not gpu.vgpu_vfs:
        return Check(
            name,
            CheckStatus.INFO,
            f"{label} has SR-IOV but no vGPU VFs (sriov_vf_device 0): it cannot host vGPUs",
        )
    if not gpu.sriov_enabled:
        return Check(
            name,
            CheckStatus.INFO,
            f"{label}: SR-IOV off ({gpu.total_vfs} VFs possible); its vGPU side shows once SR-IOV "
            "is enabled (vgpuctl apply does it)",
        )
    offered = f"{len(gpu.types)} vGPU types" if gpu.types else "no vGPU type creatable now"
    if gpu.interface is Interface.MDEV:
        return Check(
            name,
            CheckStatus.OK,
            f"{label}: {gpu.num_vfs} VFs, mdev interface, {offered}",
        )
    if gpu.interface is Interface.VFIO:
        return Check(
            name,
            CheckStatus.OK,
            f"{label}: {gpu.num_vfs} VFs, NVIDIA's vendor-specific VFIO interface "
            f"(nvidia/creatable_vgpu_types), {offered}",
        )
    return Check(
        name,
        CheckStatus.FAIL,
        f"{label}: {gpu.num_vfs} VFs, but they expose no vGPU interface (no "
        "mdev_supported_types, no nvidia/creatable_vgpu_types)",
        "start the NVIDIA vGPU manager (systemctl start nvidia-vgpu-mgr) and check the "
        "kernel log (dmesg); VFs just enabled take a few seconds",
    )


def _sriov_manage(argv: Sequence[str]) -> Check:
    shown = " ".join(argv)
    program = _program(argv)
    if program is None:
        return Check(
            "sriov-manage",
            CheckStatus.FAIL,
            f"{shown}: {argv[0]} not found" if argv else "no sriov-manage command",
            "install NVIDIA's vGPU host driver, or point --sriov-manage at its script (a "
            "wrapper works: 'chroot /run/nvidia/driver /usr/lib/nvidia/sriov-manage')",
        )
    if not os.access(program, os.X_OK) or os.path.isdir(program):
        return Check(
            "sriov-manage",
            CheckStatus.FAIL,
            f"{shown}: {program} is not executable",
            f"chmod +x {program}, or point --sriov-manage at NVIDIA's script",
        )
    target = _chroot_target(argv)
    if target is not None and not os.access(target, os.X_OK):
        return Check(
            "sriov-manage",
            CheckStatus.FAIL,
            f"{shown}: {target} is not there or not executable",
            "mount the driver root where the chroot expects it, or fix --sriov-manage",
        )
    return Check("sriov-manage", CheckStatus.OK, f"{shown} is runnable")


def _program(argv: Sequence[str]) -> str | None:
    if not argv:
        return None
    first = argv[0]
    if os.sep in first:
        return first if os.path.exists(first) else None
    return shutil.which(first)


def _chroot_target(argv: Sequence[str]) -> str | None:
    """``chroot ROOT PROGRAM …``: where PROGRAM is seen from outside the chroot."""
    if len(argv) >= 3 and os.path.basename(argv[0]) == "chroot" and not argv[1].startswith("-"):
        return os.path.join(argv[1], argv[2].lstrip("/"))
    return None


def _holders(probe: HoldProbe) -> Check:
    blind = probe.blindness()
    if blind is None:
        return Check(
            "holders",
            CheckStatus.OK,
            "vgpuctl sees every process of the host: a VM that holds a vGPU is seen, and its "
            "vGPU kept",
        )
    return Check(
        "holders",
        CheckStatus.FAIL,
        f"vgpuctl cannot tell every holder of a vGPU ({blind}): every vGPU counts as in use, "
        "so none is removed or changed",
        "run vgpuctl as root in the host's PID namespace, able to read every process's open "
        "files: in the DaemonSet, hostPID: true and a privileged container (CAP_SYS_PTRACE); "
        "a VFIO device fd the kernel does not name (before Linux 6.18) blocks removals until "
        "its process closes it",
    )


def _kubelet(kubelet_dir: Path, *, expected: bool) -> Check:
    plugins = kubelet_dir / DEVICE_PLUGINS
    if not plugins.is_dir():
        if not expected:
            return Check(
                "kubelet",
                CheckStatus.INFO,
                f"no kubelet device-plugin directory at {plugins}: fine on a plain KVM host; "
                "on a Kubernetes node the device plugins need it",
                "in a pod, mount the host's /var/lib/kubelet/device-plugins (--kubelet-dir)",
            )
        return Check(
            "kubelet",
            CheckStatus.FAIL,
            f"no kubelet device-plugin directory at {plugins}",
            "mount the host's /var/lib/kubelet/device-plugins into the pod (--kubelet-dir)",
        )
    if not os.access(plugins, os.W_OK | os.X_OK):
        return Check(
            "kubelet",
            CheckStatus.FAIL,
            f"{plugins} is not writable: the device plugins cannot put their sockets there",
            "run as root, and mount the directory read-write",
        )
    return Check("kubelet", CheckStatus.OK, f"{plugins} is writable")
