"""The cluster half of a node plan: CR writes and the KubeVirt allow-list. Pure.

The CRs as they should be (``render``) are compared with what the API server holds, read
through Harvester's schema (``harvester_view``: the fields it declares, absent ones as Go reads
them), so a field the server prunes or a status field left out when empty is no difference:
- missing → ``cr-create``;
- ours (label ``app.kubernetes.io/managed-by: vgpuctl``), or adopted, and different →
  ``cr-update`` with the field-level changes; a stored spec that differs from the spec vgpuctl
  last wrote (annotation) was edited by hand: reported as drift, and the update resets it; an
  annotation that cannot be read (longer than 256 KiB, nested deeper than 32 levels, not a JSON
  object: ``model.clustertext``) fails closed for that object only: no drift can be told, the
  update rewrites it, and the plan says so in one line naming the object and the annotation;
- another controller's → left alone, with the reason (``--adopt`` takes it over);
- ours for this node but no longer rendered (GPU gone from the host, VFs gone with SR-IOV) →
  ``cr-delete``. A GPU the desired state does not name keeps the objects vgpuctl wrote for it,
  rendered from the host (``render.kept_unmanaged``): they are never deleted while it is there.
Every write carries the resourceVersion it was planned from; on a conflict the executor re-reads
the object and calls :func:`replan_object`, never overwriting blindly.

The KubeVirt CR's allow-list: KubeVirt's virt-handler removes, on every node and at every
heartbeat, each mdev whose type is not allow-listed, in use or not (docs/domain.md §10). So:
- an entry is **added before** the first vGPU of its type is created: a ``kubevirt-allow``, run
  in the allow-list phase before any host action, adds every profile that this host has a vGPU
  of now or will have once the host phase is done, that this node's desired state names, or
  that another node's VGPUNodeState shows (a vGPU it has, or a profile it wants);
- every mdev type the host phase **creates** vGPUs of is named by that ``kubevirt-allow`` even
  when listed at plan time: at apply it is added again if gone and its retiring mark cleared;
- those of them the node's stored VGPUNodeState does not show configured are its **intent**
  (:func:`intent_for`), which the ``kubevirt-allow`` publishes in that VGPUNodeState (their
  ``wanted`` counts) before it reads the CR: another node reading the summaries after that
  keeps them listed, and one that read them before had read the CR before too, so the check
  finds its mark (docs/architecture.md, "The KubeVirt allow-list");
- an entry is **retired after** the host phase, by the cluster phase's ``kubevirt-update``, and
  only when no node has a vGPU of it any more: not this host as the host phase leaves it, not
  another node per its VGPUNodeState (what it has or wants), and no desired state of this node
  names it. Retired in two runs (``model.retiring``): marked first, removed by a run that finds
  the mark at least the grace period older than its read of the other nodes' summaries
  (``ClusterState.observed_at``); a mark on a type kept again is cleared. A vGPU this run
  cannot remove (a VM holds it) keeps its entry, whatever the files say. The host phase
  failing, or the host not as predicted, stops the run before the cluster phase: no removal is
  ever decided from a host that was not reached.
Entries someone else added are never touched. A profile on an mdev GPU is a
``mediatedDevices`` entry (by mdevNameSelector, the profile's name); one on NVIDIA's
vendor-specific VFIO interface, where the VF itself is the vGPU, a ``pciHostDevices`` entry
selecting the VFs' PCI device id (owned by resourceName: the selector is every profile's of
that GPU model). Only mdevs are swept; vfio profiles' entries follow the same rule, harmlessly,
and are removed without a mark.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache

from reconciler.model import (
    UNKNOWN_TYPE,
    ClusterAction,
    CrCreate,
    CrDelete,
    CrUpdate,
    DesiredGpu,
    Intent,
    Interface,
    Inventory,
    KubevirtAllow,
    KubevirtUpdate,
    MediatedDevice,
    Noop,
    PciAddress,
    PciHostDevice,
    WantedProfile,
    unresolved_type_id,
)
from reconciler.model.cluster import (
    MANAGED_BY_LABEL,
    NODE_LABEL,
    NODE_STATE_KIND,
    PARENT_LABEL,
    SRIOV_GPU_KIND,
    VGPU_KIND,
    ClusterState,
    ConfiguredProfile,
    KubeObject,
    KubeVirtConfig,
    harvester_view,
    is_type_name,
    kubevirt_selector,
    resource_name,
)
from reconciler.model.clustertext import ClusterTextError, parse_json
from reconciler.model.errors import excerpt
from reconciler.model.nodestate import configured_profiles
from reconciler.model.plan import Drift, FieldChange
from reconciler.model.record import field, record
from reconciler.model.retiring import DEFAULT_ALLOW_LIST_GRACE, expired, seconds
from reconciler.plan.changes import section_changes
from reconciler.plan.predict import likely_interface
from reconciler.plan.render import LAST_APPLIED_ANNOTATION, AsStored

#: The labels and annotations vgpuctl sets; any other key on a stored object is kept as is.
OUR_LABELS = frozenset({NODE_LABEL, PARENT_LABEL, MANAGED_BY_LABEL})
OUR_ANNOTATIONS = frozenset({LAST_APPLIED_ANNOTATION})
#: Plan note when the KubeVirt CR could not be found.
KUBEVIRT_MISSING = "KubeVirt CR not found: allow-list not updated"
_KIND_RANK = {SRIOV_GPU_KIND: 0, VGPU_KIND: 1}


@record(frozen=True, slots=True)
class ClusterPlan:
    """Cluster steps in run order (kind, then GPU, PF object before its VFs'), and the rest."""

    actions: list[ClusterAction] = field(default_factory=list)
    #: The allow-list's additions, run before any host action (none, or one).
    before_host: list[KubevirtAllow] = field(default_factory=list)
    noops: list[Noop] = field(default_factory=list)
    drift: list[Drift] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@record(frozen=True, slots=True)
class Retiring:
    """What the allow-list's two-phase retirement needs besides the CR (``model.retiring``)."""

    #: Seconds a retiring mark must be old before its entry is removed (0: removed unmarked).
    grace: float = DEFAULT_ALLOW_LIST_GRACE
    #: When the other nodes' VGPUNodeStates were read (``ClusterState.observed_at``).
    observed_at: str = ""
    #: The mdev types the host phase creates vGPUs of: made sure of before it, marks cleared.
    created: frozenset[str] = frozenset()


def plan_cluster(
    rendered: Sequence[KubeObject | AsStored],
    cluster: ClusterState,
    *,
    desired: Mapping[PciAddress, DesiredGpu],
    inventory: Inventory,
    configured: Iterable[str],
    adopt: bool = False,
    unmanaged: frozenset[PciAddress] = frozenset(),
    observed: Inventory | None = None,
    grace: float = DEFAULT_ALLOW_LIST_GRACE,
    created: frozenset[str] = frozenset(),
    wanted_counts: Mapping[str, int] | None = None,
) -> ClusterPlan:
    """Steps that take ``cluster`` to ``rendered`` (the node's CRs as they should be, from the
    predicted ``inventory``; those already stored so, :class:`AsStored`, are up to date), and
    the allow-list to the profiles this host has vGPUs of (``observed``, the host before the
    run, and ``inventory``, after it), the ``configured`` profiles of this node (on the kind of
    GPU ``desired``, the GPUs whose objects are rendered, puts each on: the managed GPUs, and
    the unmanaged ones that keep their objects, as the host has them) and those of the others:
    additions in :attr:`ClusterPlan.before_host`, removals among the cluster actions (see the
    module docstring). ``desired`` also words the reasons of deletes; ``unmanaged`` are those of
    its GPUs it holds as the host has them (their spec follows the host, and an update says
    so). ``created``: the mdev types the host phase creates vGPUs of (each made sure of by the
    kubevirt-allow); ``grace``: how old a retiring mark must be, at ``cluster.observed_at``,
    for its entry to be removed; ``wanted_counts``: VFs the desired state gives each profile (the
    summary's ``wanted``), the counts of the intent the kubevirt-allow publishes first for
    the ``created`` types the stored VGPUNodeState does not show (:func:`intent_for`)."""
    plan = ClusterPlan()
    # Read through Harvester's view when compared (an AsStored object needs no comparing).
    stored = {**cluster.sriov_gpu_devices, **cluster.vgpu_devices}
    untouched: dict[str, list[str]] = {}
    as_found = {str(a) for a in unmanaged}
    for intended in rendered:
        if isinstance(intended, AsStored):
            plan.noops.append(Noop(intended.name, _up_to_date(intended.kind)))
            continue
        found = stored.get(intended.name)
        current = None if found is None else harvester_view(found)
        if current is not None and not (current.managed_by_us or adopt):
            who = _manager(current)
            untouched.setdefault(who, []).append(current.name)
            plan.noops.append(Noop(current.name, f"managed by {who}: not touched (use --adopt)"))
            continue
        source = "the host" if as_found and _gpu_of(intended) in as_found else "the desired state"
        step, drift, unread = _object_step(intended, current, source)
        if drift is not None:
            plan.drift.append(drift)
        if unread is not None:
            plan.notes.append(unread)
        if step is None:
            plan.noops.append(Noop(intended.name, _up_to_date(intended.kind)))
        else:
            plan.actions.append(step)
    for who, names in untouched.items():
        plan.notes.append(_untouched_note(who, names))

    wanted = {o.name for o in rendered}
    leftovers = [harvester_view(o) for name, o in stored.items() if name not in wanted]
    for current in sorted(leftovers, key=_delete_order):
        reason = _gone_reason(current, desired, inventory)
        if not current.managed_by_us:
            plan.noops.append(
                Noop(current.name, f"managed by {_manager(current)}; {reason}: not touched")
            )
            continue
        plan.actions.append(
            CrDelete(
                target=current.name,
                reason=reason,
                object_kind=current.kind,
                resource_version=current.resource_version,
            )
        )

    # What stays listed once the host phase is done; what must be listed before it starts.
    keep = (
        configured_here(configured, desired, inventory)
        | hosted_profiles(inventory)
        | cluster.profiles_elsewhere
    )
    needed = keep | (hosted_profiles(observed) if observed is not None else frozenset())
    if cluster.kubevirt is None:
        plan.notes.append(KUBEVIRT_MISSING)
    else:
        plan.notes.extend(_unselectable_notes(cluster.kubevirt, needed))
        plan.notes.extend(_served_by_kubevirt_notes(cluster.kubevirt, needed))
        retiring = Retiring(grace=grace, observed_at=cluster.observed_at, created=created)
        before, after, waiting = _kubevirt_steps(
            cluster.kubevirt,
            needed=needed,
            keep=keep,
            retiring=retiring,
            intent=intent_for(cluster.node, cluster.node_state, created, wanted_counts or {}),
        )
        plan.notes.extend(waiting)
        if before is None and after is None:
            listed = ", ".join(sorted({p.name for p in needed})) or "none"
            plan.noops.append(
                Noop(
                    cluster.kubevirt.target,
                    f"allow-list has every profile a node has or wants ({listed})",
                )
            )
        if before is not None:
            plan.before_host.append(before)
        if after is not None:
            plan.actions.append(after)
    plan.actions.sort(key=lambda s: s.kind.order)  # stable: the order above within a kind
    return plan


def intent_for(
    node: str, stored: KubeObject | None, created: frozenset[str], wanted: Mapping[str, int]
) -> Intent | None:
    """The intent a run that creates vGPUs of the mdev types ``created`` publishes in its
    VGPUNodeState (``stored``, as observed) before its allow-list check: each type the stored
    status does not show configured (``wanted`` or ``vgpus`` above 0), with its ``wanted``
    count (at least 1). None when there is none, or when the stored object is another
    controller's (vgpuctl writes no summary there, and no node reads one from it)."""
    if stored is not None and not stored.managed_by_us:
        return None
    shown = configured_profiles(stored.status) if stored is not None else frozenset()
    names = sorted(created - shown)
    if not names:
        return None
    return Intent(node, tuple(WantedProfile(n, max(wanted.get(n, 0), 1)) for n in names))


def plan_node_state(intended: KubeObject, current: KubeObject | None) -> CrCreate | CrUpdate | Noop:
    """The write that takes the node's VGPUNodeState to ``intended``, or a no-op. Another
    controller's object of that name is left alone (vgpuctl never adopts it)."""
    if current is not None and not current.managed_by_us:
        return Noop(current.name, f"{NODE_STATE_KIND} managed by {_manager(current)}: not touched")
    step, _, _ = _object_step(intended, current)
    if step is None:
        return Noop(intended.name, f"{NODE_STATE_KIND} up to date")
    return step


def replan_object(
    intended: KubeObject, current: KubeObject | None, *, adopt: bool = False, seq: int = 0
) -> CrCreate | CrUpdate | None:
    """The write that takes ``current`` (as just re-read, after a 409) to ``intended``, or None
    when there is nothing to write or the object is another controller's (and not adopted).

    ``intended`` may be a plan's ``object``: its resourceVersion and any labels or annotations
    that are not vgpuctl's are ignored. ``seq`` numbers the result (pass the original action's).
    Pass ``adopt=action.adopt`` (False for a create).
    """
    ours = KubeObject(
        kind=intended.kind,
        name=intended.name,
        labels={k: v for k, v in intended.labels.items() if k in OUR_LABELS},
        annotations={k: v for k, v in intended.annotations.items() if k in OUR_ANNOTATIONS},
        spec=intended.spec,
        status=intended.status,
    )
    if current is not None and not (current.managed_by_us or adopt):
        return None
    step, _, _ = _object_step(ours, None if current is None else harvester_view(current))
    if step is None:
        return None
    return step.numbered(seq)


def _object_step(
    intended: KubeObject, current: KubeObject | None, source: str = "the desired state"
) -> tuple[CrCreate | CrUpdate | None, Drift | None, str | None]:
    """The write that takes ``current`` to ``intended`` (None: none), the hand edits found on
    ``current``, and the line saying its last-applied annotation cannot be read (None: it
    can, or it was not read). ``source`` is where the intended spec comes from."""
    if current is None:
        return (
            CrCreate(
                target=intended.name,
                reason=f"{intended.kind} for {_what(intended)} does not exist",
                object=_body(intended, None),
            ),
            None,
            None,
        )
    metadata_changed = not (
        intended.labels.items() <= current.labels.items()
        and intended.annotations.items() <= current.annotations.items()
    )
    spec_changed = current.spec != intended.spec
    status_changed = current.status != intended.status
    if not (metadata_changed or spec_changed or status_changed):
        # The stored spec is the one last applied (the annotation is its canonical text).
        return None, None, None
    drift: Drift | None = None
    unread: str | None = None
    # Our spec, stored and annotated as last applied, cannot have drifted: skip parsing it.
    annotated = current.annotations.get(LAST_APPLIED_ANNOTATION)
    if current.managed_by_us and (
        spec_changed or annotated != intended.annotations.get(LAST_APPLIED_ANNOTATION)
    ):
        try:
            drift = _drift(current)
        except ClusterTextError as e:
            unread = (
                f"{current.kind} {excerpt(current.name, 253)}: annotation "
                f"{LAST_APPLIED_ANNOTATION} {e}: hand edits of its spec cannot be told; "
                "the update rewrites it"
            )
    adopting = not current.managed_by_us
    changes = _changes(intended, current)
    why: list[str] = []
    if adopting:
        why.append(f"taken over from {_manager(current)} (--adopt)")
    if unread is not None:
        why.append(f"its {LAST_APPLIED_ANNOTATION} annotation cannot be read: rewritten")
    if drift is not None:
        why.append("spec changed outside vgpuctl: reset")
    elif spec_changed:
        why.append(f"spec differs from {source}")
    if status_changed:
        why.append("status differs from the host")
    if not why:
        why.append("labels or annotations differ")
    reason = f"{intended.kind} for {_what(intended)}: " + "; ".join(why)
    update = CrUpdate(
        target=intended.name,
        reason=reason,
        resource_version=current.resource_version,
        object=_body(intended, current),
        spec_changed=metadata_changed or spec_changed,
        status_changed=status_changed,
        changes=tuple(changes),
        drift=drift is not None,
        adopt=adopting,
    )
    return update, drift, unread


def _body(intended: KubeObject, current: KubeObject | None) -> KubeObject:
    """``intended`` as the object to write (over ``current``): keeping the labels and
    annotations of ``current`` that are not vgpuctl's and its finalizers and owner references,
    with the resourceVersion the write is planned from. Rendered spec and status values are
    plain JSON already: copying them deeply again for each of a node's 256 VFs is what made
    plans slow (``KubeObject.to_json`` copies them when a plan is written)."""
    if current is None:
        return intended
    return KubeObject(
        kind=intended.kind,
        name=intended.name,
        labels={**current.labels, **intended.labels},
        annotations={**current.annotations, **intended.annotations},
        spec=intended.spec,
        status=intended.status,
        resource_version=current.resource_version,
        # Another controller's finalizers and owner references: a PUT without them drops them.
        retained={k: json.loads(json.dumps(v)) for k, v in current.retained.items()},
    )


def _changes(intended: KubeObject, current: KubeObject) -> list[FieldChange]:
    # The last-applied annotation is the spec again, in one string: its change says nothing new.
    shown = {k: v for k, v in intended.annotations.items() if k != LAST_APPLIED_ANNOTATION}
    return [
        *section_changes(
            {k: current.labels[k] for k in intended.labels if k in current.labels},
            intended.labels,
            prefix=("metadata", "labels"),
        ),
        *section_changes(
            {k: current.annotations[k] for k in shown if k in current.annotations},
            shown,
            prefix=("metadata", "annotations"),
        ),
        *section_changes(current.spec, intended.spec, prefix=("spec",)),
        *section_changes(current.status, intended.status, prefix=("status",)),
    ]


def _drift(current: KubeObject) -> Drift | None:
    """The hand edits on ``current``: its spec against the spec vgpuctl last wrote (its
    last-applied annotation). Raises :class:`ClusterTextError` when that annotation cannot be
    read within bounds or is not a JSON object: the caller plans the update that rewrites it."""
    text = current.annotations.get(LAST_APPLIED_ANNOTATION)
    if text is None:
        return None  # never written by vgpuctl (adopted): nothing to compare with
    applied = parse_json(text)
    if not isinstance(applied, dict):
        raise ClusterTextError("is not a JSON object")
    if applied == dict(current.spec):
        return None
    changes = section_changes(applied, current.spec, prefix=("spec",))
    return Drift(target=current.name, kind=current.kind, changes=tuple(changes))


@lru_cache(maxsize=16)
def _up_to_date(kind: str) -> str:
    """One message text per kind, shared by every no-op (a fleet's plan holds 265,000)."""
    return f"{kind} up to date"


def _what(obj: KubeObject) -> str:
    if obj.kind == NODE_STATE_KIND:
        return f"node {obj.name}"
    address = obj.spec.get("address", "")
    return f"GPU {address}" if obj.kind == SRIOV_GPU_KIND else f"VF {address}"


def _manager(obj: KubeObject) -> str:
    return obj.labels.get(MANAGED_BY_LABEL) or "another controller"


def _untouched_note(who: str, names: list[str]) -> str:
    shown = ", ".join(names[:3])
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    count = f"{len(names)} object{'s' * (len(names) != 1)}"
    return f"{count} managed by {who} not touched (use --adopt to manage them): {shown}{more}"


def _gpu_of(obj: KubeObject) -> str:
    key = "address" if obj.kind == SRIOV_GPU_KIND else "parentGPUDeviceAddress"
    return str(obj.spec.get(key, ""))


def _delete_order(obj: KubeObject) -> tuple[str, int, str]:
    # Per GPU, its VFs' objects before the GPU's own: nothing is left pointing at a deleted parent.
    return (_gpu_of(obj), -_KIND_RANK.get(obj.kind, 0), obj.name)


def _gone_reason(
    obj: KubeObject, desired: Mapping[PciAddress, DesiredGpu], inventory: Inventory
) -> str:
    gpu_text = _gpu_of(obj)
    try:
        address = PciAddress.parse(gpu_text)
    except ValueError:
        return f"{obj.kind} of no GPU the desired state manages"
    gpu = inventory.gpu(address)
    if gpu is None:
        return f"GPU {address} is not on this host"
    if address not in desired:
        return f"GPU {address} is not in the desired state"
    if obj.kind == SRIOV_GPU_KIND:
        return f"GPU {address} is rendered under another name"
    vf = obj.spec.get("address", "")
    if not gpu.vfs:
        return f"VF {vf} does not exist (SR-IOV off on GPU {address})"
    return f"VF {vf} is not a VF of GPU {address}"


def configured_here(
    configured: Iterable[str], desired: Mapping[PciAddress, DesiredGpu], inventory: Inventory
) -> frozenset[ConfiguredProfile]:
    """The ``configured`` profiles of this node, each on the kind of GPU the desired state puts
    it on: the interface of each managed GPU (of the predicted ``inventory``) whose desired
    entry names it, or the one its VFs will show once SR-IOV is on (as the host planner has
    it), with its VFs' device id. A profile no managed GPU names counts as mdev."""
    names = frozenset(configured)
    out: set[ConfiguredProfile] = set()
    placed: set[str] = set()
    fallback: Interface | None = None
    for address, entry in desired.items():
        gpu = inventory.gpu(address)
        if gpu is None or not entry.sriov:
            continue
        if entry.profiles:
            wanted = {name for name, count in entry.profiles.items() if count > 0}
        else:
            wanted = set((entry.vgpus or {}).values())
        wanted &= names
        if not wanted:
            continue
        interface = gpu.interface
        if interface is Interface.NONE:
            if fallback is None:
                fallback = likely_interface(inventory)
            interface = fallback
        for name in wanted:
            out.add(ConfiguredProfile(name, interface, gpu.vf_device))
        placed |= wanted
    out.update(ConfiguredProfile(name) for name in names - placed)
    return frozenset(out)


def hosted_profiles(inventory: Inventory) -> frozenset[ConfiguredProfile]:
    """The profiles of the vGPUs ``inventory``'s GPUs have, each on its GPU's kind (pure). A
    type the host could not name (an mdev whose type could not be read, ``UNKNOWN_TYPE``; a
    vfio type shown by its id only, ``type 1147``) is left out: no entry can name it.
    """
    out: set[ConfiguredProfile] = set()
    for gpu in inventory.gpus:
        for vf in gpu.vfs:
            if vf.vgpu is not None and _nameable(vf.vgpu.type_name):
                out.add(ConfiguredProfile(vf.vgpu.type_name, gpu.interface, gpu.vf_device))
    return frozenset(out)


def _nameable(type_name: str) -> bool:
    """Whether an allow-list entry can name ``type_name`` as the host shows it."""
    return (
        type_name != UNKNOWN_TYPE
        and unresolved_type_id(type_name) is None
        and is_type_name(type_name)
    )


def _pci_wanted(configured: frozenset[ConfiguredProfile]) -> dict[str, str]:
    """resourceName → pciVendorSelector of the vfio profiles ("" when no VF device id is
    known); of two selectors for one resource, the first in order (one entry per resource)."""
    out: dict[str, str] = {}
    for p in sorted(configured, key=ConfiguredProfile.sort_key):
        if not p.vfio:
            continue
        selector = p.pci_vendor_selector
        if not out.get(p.resource_name):
            out[p.resource_name] = selector
    return out


def _unselectable_notes(
    kubevirt: KubeVirtConfig, configured: frozenset[ConfiguredProfile]
) -> list[str]:
    """A note per vfio profile whose missing pciHostDevices entry cannot be written: the
    device id of its VFs is not known."""
    present = {str(e.get("resourceName", "")) for e in kubevirt.pci_host_devices}
    wanted = _pci_wanted(configured)
    names = sorted(
        {
            p.name
            for p in configured
            if p.vfio and not wanted[p.resource_name] and p.resource_name not in present
        }
    )
    return [
        f"profile {name} is configured on NVIDIA's vfio interface but its VFs' PCI device id "
        "is not known: no pciHostDevices entry added"
        for name in names
    ]


def served_by_kubevirt_blocks(kubevirt: KubeVirtConfig) -> dict[str, str]:
    """Why vGPUs of a type KubeVirt serves itself are not made, by the type as KubeVirt
    compares it (:func:`~reconciler.model.cluster.kubevirt_selector`): one reason per
    ``mediatedDevices`` entry without ``externalResourceProvider: true`` (the first of several
    for one type). Such a type gets no entry of vgpuctl's: KubeVirt's device plugin and
    vgpuctl's would hand out the same vGPUs, and virt-handler's sweep spares them only when
    its own ``mediatedDevicesConfiguration`` asks for the type (docs/domain.md §10)."""
    out: dict[str, str] = {}
    for entry in kubevirt.mediated_devices:
        selector = entry.get("mdevNameSelector")
        if not isinstance(selector, str) or entry.get("externalResourceProvider") is True:
            continue
        out.setdefault(
            kubevirt_selector(selector),
            f"KubeVirt serves {excerpt(selector)} itself: the {kubevirt.target} "
            "mediatedDevices entry for it (resourceName "
            f"{excerpt(str(entry.get('resourceName', '')))}) is not externalResourceProvider: "
            "true, so virt-handler runs its own device plugin for these vGPUs and removes "
            "them unless its mediatedDevicesConfiguration asks for the type; make that entry "
            "external (or remove it) for vgpuctl to manage the type",
        )
    return out


def _served_by_kubevirt_notes(
    kubevirt: KubeVirtConfig, needed: frozenset[ConfiguredProfile]
) -> list[str]:
    """A note per mdev profile a node has or wants that KubeVirt serves itself (vgpuctl lists
    no entry for it and makes none of it: :func:`served_by_kubevirt_blocks`), or whose
    selector another entry holds under another resourceName (vgpuctl's is not added)."""
    reasons = served_by_kubevirt_blocks(kubevirt)
    notes = []
    for name in sorted({p.name for p in needed if not p.vfio}):
        if kubevirt_selector(name) in reasons:
            notes.append(
                f"{reasons[kubevirt_selector(name)]}. vgpuctl adds no allow-list entry for "
                f"{excerpt(name)} and makes no vGPU of it"
            )
            continue
        if kubevirt.lists_external(name):
            continue
        for entry in kubevirt.mediated_devices:
            if entry.get("mdevNameSelector") == name:
                whose = (
                    "vgpuctl changes none of its entries in place: remove it by hand and the "
                    "next run writes it anew"
                    if name in kubevirt.owned
                    else "an entry vgpuctl did not add is never changed"
                )
                notes.append(
                    f"the {kubevirt.target} mediatedDevices entry for {excerpt(name)} names "
                    f"resourceName {excerpt(str(entry.get('resourceName', '')))}, not "
                    f"{resource_name(name)} that vgpuctl advertises: left as it is ({whose})"
                )
                break
    return notes


def _kubevirt_steps(
    kubevirt: KubeVirtConfig,
    *,
    needed: frozenset[ConfiguredProfile],
    keep: frozenset[ConfiguredProfile],
    retiring: Retiring,
    intent: Intent | None = None,
) -> tuple[KubevirtAllow | None, KubevirtUpdate | None, list[str]]:
    """The allow-list's additions before the host phase (every ``needed`` profile missing:
    mediatedDevices entries for those on mdev GPUs, pciHostDevices entries for those on vfio
    GPUs; and every mdev type the host phase creates, listed or not, its mark cleared), its
    retirements after it (the mdev entries vgpuctl owns whose profile is not in ``keep``, a
    subset of ``needed``: marked, or removed once marked long enough; the pci ones removed),
    each None when there is none, and a note per entry still waiting out its grace. Owned
    entries someone removed are forgotten by whichever step writes; by the second when
    neither adds. Marks of entries kept again or gone are cleared by the second. ``intent``
    (of types among those created, so only with a first step) is published by the first."""
    present = {str(e.get("mdevNameSelector", "")) for e in kubevirt.mediated_devices}
    mine = kubevirt.owned & present
    need_m = frozenset(p.name for p in needed if not p.vfio)
    keep_m = frozenset(p.name for p in keep if not p.vfio)
    # Listed is as KubeVirt reads the list (spaces → _, external, vgpuctl's resourceName),
    # whoever wrote the entry; a type KubeVirt serves itself gets no entry of vgpuctl's beside
    # it (served_by_kubevirt_blocks: its creates are blocked, a note says why). An entry is
    # vgpuctl's by its selector, so none is added where the same selector is (a note says so).
    missing = sorted(
        p
        for p in need_m - present
        if not kubevirt.lists_external(p) and kubevirt.served_by_kubevirt(p) is None
    )
    # Every type created is made sure of, listed or not: the step is the same either way.
    ensured = retiring.created
    added = sorted(set(missing) | ensured)
    claimed = {p for p in added if p not in present and not kubevirt.lists_external(p)}
    add = tuple(MediatedDevice(selector=p, resource_name=resource_name(p)) for p in added)
    marks = kubevirt.retiring
    leaving = mine - keep_m
    when, grace = retiring.observed_at, retiring.grace
    remove = sorted(s for s in leaving if expired(marks.get(s), when, grace))
    retire = sorted(s for s in leaving - set(remove) if seconds(marks.get(s, "")) is None)
    waiting = sorted(leaving - set(remove) - set(retire))
    unmark = sorted(set(marks) - leaving - ensured)

    present_pci = {str(e.get("resourceName", "")) for e in kubevirt.pci_host_devices}
    mine_pci = kubevirt.owned_pci & present_pci
    pci = _pci_wanted(needed)
    added_pci = sorted(r for r in frozenset(pci) - present_pci if pci[r])
    add_pci = tuple(PciHostDevice(selector=pci[r], resource_name=r) for r in added_pci)
    remove_pci = sorted(mine_pci - frozenset(_pci_wanted(keep)))

    before: KubevirtAllow | None = None
    if add or add_pci:
        before = KubevirtAllow(
            target=kubevirt.target,
            reason=_allow_reason(missing, sorted(ensured), added_pci, pci),
            namespace=kubevirt.namespace,
            name=kubevirt.name,
            resource_version=kubevirt.resource_version,
            add=add,
            owned=tuple(sorted(mine | claimed)),
            add_pci=add_pci,
            owned_pci=tuple(sorted(mine_pci | set(added_pci))),
            unmark=tuple(sorted(ensured)),
            intent=intent,
        )
    notes = [
        f"KubeVirt allow-list: {s} retiring since {marks[s]} (no node has or wants vGPUs of "
        f"it): removed by a run at least {_duration(retiring.grace)} after that, if still so"
        for s in waiting
    ]
    # Owned entries no longer present are forgotten by any write; say so when only this one.
    forget = sorted(kubevirt.owned - present) if before is None else []
    forget_pci = sorted(kubevirt.owned_pci - present_pci) if before is None else []
    if not (remove or retire or unmark or remove_pci or forget or forget_pci):
        return before, None, notes
    parts = []
    if remove or retire or unmark or forget:
        why = _why(remove, forget, retire=retire, unmark=unmark, grace=retiring.grace)
        parts.append("mediated devices allow-list: " + "; ".join(why))
    if remove_pci or forget_pci:
        parts.append("PCI host devices allow-list: " + "; ".join(_why(remove_pci, forget_pci)))
    after = KubevirtUpdate(
        target=kubevirt.target,
        reason="; ".join(parts),
        namespace=kubevirt.namespace,
        name=kubevirt.name,
        resource_version=kubevirt.resource_version,
        remove=tuple(remove),
        owned=tuple(sorted(mine - set(remove))),
        remove_pci=tuple(remove_pci),
        owned_pci=tuple(sorted(mine_pci - set(remove_pci))),
        retire=tuple(retire),
        unmark=tuple(unmark),
    )
    return before, after, notes


def _allow_reason(
    missing: Sequence[str],
    ensured: Sequence[str],
    added_pci: Sequence[str],
    pci: Mapping[str, str],
) -> str:
    """Why the kubevirt-allow: the entries it adds, and the types it makes sure of."""
    parts = []
    wanted = "(a node has or wants vGPUs of it)"
    if missing:
        parts.append(f"mediated devices allow-list: add {', '.join(missing)} {wanted}")
    listed = [s for s in ensured if s not in missing]
    if listed:
        parts.append(
            f"mediated devices allow-list: {', '.join(listed)} listed now; made sure of at apply "
            "(added if gone, its retiring mark cleared) before this run creates vGPUs of it"
        )
    if added_pci:
        shown = ", ".join(f"{r} ({pci[r]})" for r in added_pci)
        parts.append(f"PCI host devices allow-list: add {shown} {wanted}")
    return "; ".join(parts)


def _duration(grace: float) -> str:
    """``15m``, ``90s``, ``2h``: a grace period as people write it."""
    whole = int(grace)
    for unit, size in (("h", 3600), ("m", 60)):
        if whole and whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def _why(
    removed: Sequence[str],
    forgotten: Sequence[str],
    *,
    retire: Sequence[str] = (),
    unmark: Sequence[str] = (),
    grace: float = 0.0,
) -> list[str]:
    why: list[str] = []
    if retire:
        why.append(
            "mark " + ", ".join(retire) + " retiring (no node has or wants vGPUs of it; "
            f"removed after {_duration(grace)} if still so)"
        )
    if removed:
        long = f", retiring for {_duration(grace)} or more" if grace > 0 else ""
        why.append("remove " + ", ".join(removed) + f" (no node has or wants vGPUs of it{long})")
    if unmark:
        why.append("clear the retiring mark of " + ", ".join(unmark) + " (kept again, or gone)")
    if forgotten:
        why.append("forget entries removed by hand: " + ", ".join(forgotten))
    return why
