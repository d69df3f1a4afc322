"""What one reconcile of one node needs from the outside world, as ports.

:class:`NodePorts` holds how to observe the host and the cluster, the host driver, the
cluster API and the Event sink; :class:`DevicePlugins` is how an in-process run tells the
node's kubelet device plugins what the host now has. The engine composes them and decides
nothing about where they come from: the CLI builds the real ones (``cli/host.py``), the
tests build simulated ones. Nothing here imports the kube adapter or grpc.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from reconciler.catalog import Catalog
from reconciler.model import Inventory, PciAddress
from reconciler.model.cluster import ClusterState
from reconciler.model.record import record
from reconciler.model.retiring import DEFAULT_ALLOW_LIST_GRACE

if TYPE_CHECKING:
    from reconciler.apply.cluster import EventSink
    from reconciler.apply.ports import HostDriver
    from reconciler.model.clusterapi import ClusterApi
    from reconciler.observe.kubevirt import KubevirtSighting
    from reconciler.observe.vgpumode import ModeReading


class HostObserver(Protocol):
    """Scans the node's host. ``availability``: read each VF's available types (every
    ``available_instances``, most of a scan's reads), which only the cluster's objects and the
    node summary show: the engine asks for them when it plans against a cluster."""

    def __call__(self, *, availability: bool = True) -> Inventory: ...


@record(frozen=True, slots=True)
class NodePorts:
    """Everything a reconcile of one node needs from the outside world."""

    node: str
    catalog: Catalog
    state_dir: Path
    observe_host: HostObserver
    #: None: no cluster configured (node-local).
    observe_cluster: Callable[[], ClusterState | None]
    #: Without a cluster: the kubelet checkpoint's allocations (None when there is none).
    kubelet_uses: Callable[[], ClusterState | None]
    driver: Callable[[], HostDriver]
    #: Which process of the host holds the mdev ``uuid`` on ``vf`` now; None: none does.
    process_holder: Callable[[PciAddress, str], str | None]
    #: The kubelet checkpoint's vGPU allocations now: device ID → the pods it is given to.
    allocations: Callable[[], Mapping[str, frozenset[str]]]
    cluster_api: ClusterApi | None = None
    events: EventSink | None = None
    #: Every GPU's vGPU mode as the host tells it (``nvidia-smi -q``); None: it cannot be read,
    #: and the driver's default decides (``observe/vgpumode.py``). Asked only when a plan
    #: creates vGPUs on a GPU wanted in mixed-size mode whose SR-IOV is on.
    vgpu_modes: Callable[[], ModeReading] | None = None
    #: Whether (and why) KubeVirt's virt-handler runs on this host, which removes every mdev
    #: its CR does not allow-list (``observe/kubevirt.py``); None: it does not. Asked only
    #: without a cluster (with one, vgpuctl keeps the allow-list) and only when a plan makes
    #: vGPUs: its creates on mdev GPUs are then blocked.
    kubevirt_host: Callable[[], KubevirtSighting | None] | None = None
    #: ``--unsafe-kubevirt-allow-listed``: the operator says every type vgpuctl creates here is
    #: allow-listed by hand; creates then run, and the plan says on whose word.
    unsafe_kubevirt_allow_listed: bool = False
    #: ``--allow-list-grace``: seconds an owned KubeVirt allow-list entry no node keeps stays
    #: marked retiring before a run removes it (``model.retiring``; 0: at once, unsafe).
    allow_list_grace: float = DEFAULT_ALLOW_LIST_GRACE


class RolloutSlot(Protocol):
    """A rollout slot this node holds while it changes its host (``apply/slots.py``)."""

    #: The node waited for it: what it planned before may be stale.
    waited: bool

    def guard(self) -> None:
        """Raise a ``ReconcilerError`` when the slot may no longer be counted on (asked before
        each host action)."""
        ...

    def release(self) -> None: ...


class RolloutBudget(Protocol):
    """The node agents' fleet budget (``spec.rollout.maxParallel``): a slot to hold while this
    node's host changes. ``acquire`` raises a transient ``ReconcilerError`` when none is free
    (after waiting, for ``apply``)."""

    def acquire(self, max_parallel: int) -> RolloutSlot: ...


class DevicePlugins(Protocol):
    """The node's kubelet device plugins (``reconciler.deviceplugin.PluginManager``) as the
    engine tells them what changed: the host as observed after the run, and the vGPUs the run
    removed on purpose (dropped from the lists; any other vGPU that vanished is advertised
    unhealthy). Only an in-process run has them (``watch``); ``vgpuctl apply`` passes none, and a
    standalone ``vgpuctl device-plugin`` learns from the host and the journal."""

    def update(self, inventory: Inventory, *, removed_on_purpose: Iterable[str] = ()) -> None: ...
