"""What one run may touch: the executors' own check of the plan they are given.

The planner never plans an action on a GPU the desired state does not name, on a device that
is not an NVIDIA vGPU GPU, on a vGPU in use, on a cluster object that is not vgpuctl's own on
this node, or on a KubeVirt allow-list entry (mediated or PCI host device) vgpuctl did not
add (nor marks one retiring: ``model.retiring``; a kubevirt-allow may name an entry that is
there already only to make sure of it before a create, which adds nothing while it is there),
nor publishes intent anywhere but in this node's own VGPUNodeState, vgpuctl's.
The objects of a GPU the desired state does not name are written only as the host has
that GPU (their spec its layout), and deleted only once the GPU or VF is gone from the host.
The executors do not take that on trust: a plan may come from a file someone edited
(``plan --out``), or from a bug.
So the host executor (``executor.py``) and the cluster executor (``cluster.py``) check every
action against a mandate built from the desired state and the observation the plan was made
from (under the node lock) before anything runs, and the host executor asks again right before
it removes a vGPU whether anything uses it *now*. A violation is :class:`MandateError`: the run
stops there and nothing after it runs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from reconciler.apply.errors import MandateError
from reconciler.model import (
    Action,
    CrCreate,
    CrDelete,
    CrUpdate,
    Intent,
    Inventory,
    KubevirtAllow,
    KubevirtUpdate,
    PciAddress,
)
from reconciler.model.cluster import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NODE_LABEL,
    NODE_STATE_KIND,
    NVIDIA_PCI_VENDOR,
    SRIOV_GPU_KIND,
    ClusterState,
    KubeObject,
    KubeVirtConfig,
    is_type_name,
    object_name,
    resource_name,
)
from reconciler.model.errors import excerpt
from reconciler.model.record import field, record
from reconciler.plan.render import as_found

#: The pciVendorSelector vgpuctl writes: NVIDIA's vendor id and a VF device id, upper case.
_PCI_SELECTOR = re.compile(rf"{NVIDIA_PCI_VENDOR}:[0-9A-F]{{4}}")
#: The resource name a profile's allow-list entries carry: ``nvidia.com/`` and its name.
_RESOURCE = re.compile(r"nvidia\.com/(.+)")
#: ``in_use(vf, uuid, type_name)``: who uses that vGPU at this moment; None: nobody.
InUse = Callable[[PciAddress, str, str], str | None]


def refused(
    action: Action, why: str, rule: str, *, cause: str = "a bug or an edited plan"
) -> MandateError:
    """The violation of ``rule`` by ``action``, and what probably caused it."""
    return MandateError(
        f"refused action {action.seq} ({action.kind.value} {excerpt(action.target)}): {why} "
        f"(rule: {rule}); {cause}: the run stops here"
    )


@record(frozen=True, slots=True)
class HostMandate:
    """What the host executor may act on in one run."""

    #: The GPUs the desired state names: no host action targets any other.
    managed: frozenset[PciAddress]
    #: The NVIDIA vGPU GPUs the host showed when the run was planned (vendor ``10de``, with
    #: SR-IOV): a NIC, an audio function or any other device is never a target.
    nvidia: frozenset[PciAddress]
    #: Asked right before each removal (a fresh look, not the plan's).
    in_use: InUse

    def check_target(self, action: Action, gpu: PciAddress) -> None:
        """Before anything runs: ``action`` acts on ``gpu`` (its PF)."""
        if gpu not in self.nvidia:
            raise refused(
                action,
                f"{gpu} is not an NVIDIA vGPU GPU of this host",
                "host actions act only on NVIDIA GPUs",
            )
        if gpu not in self.managed:
            raise refused(
                action,
                f"GPU {gpu} is not in the desired state",
                "only the GPUs the desired state names are touched",
            )

    def check_unused(self, action: Action, *, vf: PciAddress, uuid: str, type_name: str) -> None:
        """At the moment of acting: nothing uses the vGPU ``action`` would remove."""
        holder = self.in_use(vf, uuid, type_name)
        if holder is not None:
            raise refused(
                action,
                f"vGPU {uuid} on {vf} is in use by {excerpt(holder)}",
                "a vGPU in use is never removed",
                cause="it was taken since the plan was made, or the plan was edited",
            )


@record(frozen=True, slots=True)
class ClusterMandate:
    """What the cluster executor may write in one run."""

    node: str
    #: The GPUs the desired state names: the only ones objects are written for.
    managed: frozenset[PciAddress]
    #: This node's SRIOVGPUDevices and VGPUDevices as observed, by name.
    objects: Mapping[str, KubeObject] = field(default_factory=lambda: MappingProxyType({}))
    #: This node's VGPUNodeState as observed (None: none yet).
    node_state: KubeObject | None = None
    #: The KubeVirt CR's allow-list as observed (None: none was found).
    kubevirt: KubeVirtConfig | None = None
    #: ``--adopt``: objects another controller manages may be taken over (never deleted).
    adopt: bool = False
    #: The objects of the GPUs on the host the desired state does not name and of their VFs,
    #: by name: the spec fields the host's layout gives them (``enabled``, ``vGPUTypeName``).
    #: Written only so; never deleted (their GPU or VF is on the host).
    unmanaged: Mapping[str, Mapping[str, object]] = field(
        default_factory=lambda: MappingProxyType({})
    )

    @classmethod
    def observed(
        cls,
        cluster: ClusterState,
        *,
        managed: frozenset[PciAddress],
        adopt: bool,
        inventory: Inventory | None = None,
    ) -> ClusterMandate:
        """The mandate of a run planned from ``cluster`` and the host ``inventory`` (None:
        not known, so no object of a GPU the desired state does not name is written)."""
        return cls(
            node=cluster.node,
            managed=managed,
            objects={**cluster.sriov_gpu_devices, **cluster.vgpu_devices},
            node_state=cluster.node_state,
            kubevirt=cluster.kubevirt,
            adopt=adopt,
            unmanaged=_host_specs(cluster.node, inventory, managed),
        )

    def check(self, actions: Sequence[Action]) -> None:
        """Before anything is written: every cluster action among ``actions`` (their fields
        already checked to fit together) is one vgpuctl may carry out here."""
        for action in actions:
            if isinstance(action, CrCreate | CrUpdate | CrDelete):
                self._check_object(action)
            elif isinstance(action, KubevirtUpdate):
                self._check_kubevirt(action)

    def check_rewrite(self, rewrite: CrCreate | CrUpdate | CrDelete) -> None:
        """After a conflict: ``rewrite``, re-planned from the object as the server has it now,
        writes a body that is this node's and vgpuctl's, for a managed GPU. (The cluster
        executor has checked that it is the same object, and its owner on re-reading; its
        version is the fresh one, so it is not compared.)"""
        if isinstance(rewrite, CrCreate | CrUpdate):
            self._check_body(rewrite, rewrite.object)

    def _check_object(self, action: CrCreate | CrUpdate | CrDelete) -> None:
        if isinstance(action, CrCreate):
            self._check_body(action, action.object)
            return
        kind = action.object_kind if isinstance(action, CrDelete) else action.object.kind
        stored = self.node_state if kind == NODE_STATE_KIND else self.objects.get(action.target)
        if stored is None or stored.kind != kind:
            raise refused(
                action,
                f"no {kind} of that name was observed for node {self.node}",
                "cluster actions touch only this node's objects",
            )
        if stored.labels.get(NODE_LABEL) != self.node:
            raise refused(
                action,
                f"{kind} {stored.name} is not labelled {NODE_LABEL}={self.node}",
                "cluster actions touch only this node's objects",
            )
        if action.resource_version != stored.resource_version:
            raise refused(
                action,
                f"it was planned from resourceVersion {excerpt(action.resource_version)}, "
                f"the object observed is at {stored.resource_version}",
                "a write carries the version of the object it was planned from",
            )
        who = stored.labels.get(MANAGED_BY_LABEL) or "another controller"
        if isinstance(action, CrDelete):
            if not stored.managed_by_us:
                raise refused(
                    action,
                    f"{kind} {stored.name} is managed by {excerpt(who)}",
                    "vgpuctl deletes only objects it manages",
                )
            if action.target in self.unmanaged:
                raise refused(
                    action,
                    f"{kind} {stored.name} is of a GPU or VF on the host that the desired state "
                    "does not name",
                    "an unmanaged GPU's objects are deleted only once it or the VF is gone from "
                    "the host",
                )
            return
        if not stored.managed_by_us and not (self.adopt and action.adopt):
            raise refused(
                action,
                f"{kind} {stored.name} is managed by {excerpt(who)}",
                "another controller's object is written only when adopted with --adopt",
            )
        self._check_body(action, action.object)

    def _check_body(self, action: Action, obj: KubeObject) -> None:
        """The object written is this node's, labelled as vgpuctl's, for a managed GPU (the
        node's VGPUNodeState: named after the node)."""
        kind, labels, spec = obj.kind, obj.labels, obj.spec
        if labels.get(NODE_LABEL) != self.node or spec.get("nodeName") != self.node:
            raise refused(
                action,
                f"the {kind} written is not for node {self.node} (label {NODE_LABEL} "
                f"{_shown(labels.get(NODE_LABEL))}, spec.nodeName {_shown(spec.get('nodeName'))})",
                "cluster actions write only this node's objects",
            )
        if labels.get(MANAGED_BY_LABEL) != MANAGED_BY:
            raise refused(
                action,
                f"the {kind} written is not labelled {MANAGED_BY_LABEL}={MANAGED_BY}",
                "objects vgpuctl writes are marked as its own",
            )
        if kind == NODE_STATE_KIND:
            if action.target != self.node:
                raise refused(
                    action,
                    f"a {kind} named {excerpt(action.target)} is not node {self.node}'s",
                    "a node's VGPUNodeState is named after the node",
                )
            return
        address = _address(spec.get("address"))
        if address is None or object_name(self.node, str(address)) != action.target:
            raise refused(
                action,
                f"the name does not belong to spec.address {_shown(spec.get('address'))} on "
                f"node {self.node}",
                "an object is named <node>-<its PCI address>",
            )
        gpu = address if kind == SRIOV_GPU_KIND else _address(spec.get("parentGPUDeviceAddress"))
        host = self.unmanaged.get(action.target)
        if gpu is not None and gpu not in self.managed and host is not None:
            if any(spec.get(key) != value for key, value in host.items()):
                raise refused(
                    action,
                    f"the {kind} written for GPU {gpu}, which the desired state does not name, "
                    f"asks for {_shown({k: spec.get(k) for k in host})}, the host has "
                    f"{_shown(dict(host))}",
                    "an unmanaged GPU's objects describe what the host has",
                )
            return
        if gpu is None or gpu not in self.managed:
            raise refused(
                action,
                f"the {kind} written is for GPU {gpu or _shown(spec.get('parentGPUDeviceAddress'))}"
                ", which the desired state does not name",
                "objects are written only for the GPUs the desired state names",
            )

    def _check_kubevirt(self, action: KubevirtUpdate) -> None:
        kv = self.kubevirt
        if kv is None:
            raise refused(action, "no KubeVirt CR was observed", "only the KubeVirt CR observed")
        if (action.namespace, action.name) != (kv.namespace, kv.name) or action.target != kv.target:
            raise refused(
                action,
                f"the KubeVirt CR observed is {kv.target}",
                "only the KubeVirt CR observed is written",
            )
        present = {str(e.get("mdevNameSelector")) for e in kv.mediated_devices}
        added: set[str] = set()
        for entry in action.add:
            selector = entry.selector
            if entry.resource_name != resource_name(selector):
                raise refused(
                    action,
                    f"it adds {excerpt(_json(entry.to_json()))}",
                    "vgpuctl adds only {mdevNameSelector: <profile>, resourceName: "
                    "nvidia.com/<profile>, externalResourceProvider: true}",
                )
            if selector in present:
                if isinstance(action, KubevirtAllow) and selector in action.unmark:
                    continue  # made sure of before a create: added only if gone at apply
                raise refused(
                    action,
                    f"the allow-list already has an entry for {excerpt(selector)}",
                    "entries vgpuctl did not add are never touched",
                )
            added.add(selector)
        for selector in action.retire:
            if selector not in kv.owned:
                raise refused(
                    action,
                    f"it marks {excerpt(str(selector))} retiring, an entry vgpuctl did not add",
                    "only the entries vgpuctl added are retired",
                )
        for selector in action.remove:
            if selector not in kv.owned:
                raise refused(
                    action,
                    f"it removes {excerpt(str(selector))}, an entry vgpuctl did not add",
                    "only the entries vgpuctl added are removed",
                )
        for selector in action.owned:
            if selector not in kv.owned and selector not in added:
                raise refused(
                    action,
                    f"it claims {excerpt(str(selector))} as vgpuctl's, an entry it did not add",
                    "vgpuctl owns only the entries it added",
                )
        self._check_pci(action, kv)
        if isinstance(action, KubevirtAllow) and action.intent is not None:
            self._check_intent(action, action.intent)

    def _check_intent(self, action: KubevirtAllow, intent: Intent) -> None:
        """The intent is published in this node's own VGPUNodeState (vgpuctl's, or none yet),
        for vGPU types, each wanted at least once. (A type the run does not create is
        harmless there: it only keeps an entry listed until the node's next summary.)"""
        if intent.node != self.node:
            raise refused(
                action,
                f"it publishes intent in the {NODE_STATE_KIND} of {excerpt(intent.node)}",
                "a run writes only its own node's VGPUNodeState",
            )
        stored = self.node_state
        if stored is not None and not stored.managed_by_us:
            who = stored.labels.get(MANAGED_BY_LABEL) or "another controller"
            raise refused(
                action,
                f"{NODE_STATE_KIND} {stored.name} is managed by {excerpt(who)}",
                "vgpuctl writes only the VGPUNodeState it manages",
            )
        for profile in intent.profiles:
            if not is_type_name(profile.name) or profile.wanted < 1:
                raise refused(
                    action,
                    f"it publishes intent for {excerpt(profile.name)} (wanted {profile.wanted})",
                    "intent names vGPU types, each wanted on at least one VF",
                )

    def _check_pci(self, action: KubevirtUpdate, kv: KubeVirtConfig) -> None:
        """The pciHostDevices side, by resourceName: only entries vgpuctl writes are added
        ({pciVendorSelector: 10DE:<device id>, resourceName: nvidia.com/<profile>,
        externalResourceProvider: true}), only its own removed or claimed."""
        present = {str(e.get("resourceName")) for e in kv.pci_host_devices}
        added: set[str] = set()
        for entry in action.add_pci:
            profile = _RESOURCE.fullmatch(entry.resource_name)
            if (
                profile is None
                or resource_name(profile[1]) != entry.resource_name
                or _PCI_SELECTOR.fullmatch(entry.selector) is None
            ):
                raise refused(
                    action,
                    f"it adds {excerpt(_json(entry.to_json()))}",
                    "vgpuctl adds only {pciVendorSelector: 10DE:<VF device id>, resourceName: "
                    "nvidia.com/<profile>, externalResourceProvider: true}",
                )
            if entry.resource_name in present or entry.resource_name in added:
                raise refused(
                    action,
                    f"the allow-list already has a PCI host device entry for "
                    f"{excerpt(entry.resource_name)}",
                    "entries vgpuctl did not add are never touched",
                )
            added.add(entry.resource_name)
        for gone in action.remove_pci:
            if gone not in kv.owned_pci:
                raise refused(
                    action,
                    f"it removes PCI host device {excerpt(str(gone))}, an entry vgpuctl did "
                    "not add",
                    "only the entries vgpuctl added are removed",
                )
        for claimed in action.owned_pci:
            if claimed not in kv.owned_pci and claimed not in added:
                raise refused(
                    action,
                    f"it claims PCI host device {excerpt(str(claimed))} as vgpuctl's, an entry "
                    "it did not add",
                    "vgpuctl owns only the entries it added",
                )


def _host_specs(
    node: str, inventory: Inventory | None, managed: frozenset[PciAddress]
) -> Mapping[str, Mapping[str, object]]:
    """:attr:`ClusterMandate.unmanaged` for the host ``inventory`` as observed."""
    out: dict[str, Mapping[str, object]] = {}
    for gpu in inventory.gpus if inventory is not None else ():
        if gpu.address in managed:
            continue
        entry, layout = as_found(gpu)
        out[object_name(node, str(gpu.address))] = MappingProxyType({"enabled": entry.sriov})
        for vf in gpu.vfs:
            profile = layout.get(vf.index)
            out[object_name(node, str(vf.address))] = MappingProxyType(
                {"enabled": profile is not None, "vGPUTypeName": profile or ""}
            )
    return MappingProxyType(out)


def _address(value: object) -> PciAddress | None:
    if not isinstance(value, str) or not PciAddress.is_valid(value):
        return None
    return PciAddress.parse(value)


def _shown(value: object) -> str:
    return "absent" if value is None else excerpt(_json(value))


def _json(value: object) -> str:
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return repr(value)
