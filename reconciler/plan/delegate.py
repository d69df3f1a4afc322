"""Delegate mode's planner: one node's desired state → the spec writes Harvester's
pcidevices-controller acts on (docs/delegate.md). Pure.

The node is seen through Harvester's objects (``model/harvester.py``): each ``VGPUDevice`` is a
VF, enabled with a profile or not. That picture is given to the node-local planner as an
inventory, so delegate mode decides exactly as node-local mode does — which VF gets which
profile (the count form keeps what exists, then fills free VFs in index order), the equal-size
and per-size rules, what an in-use vGPU blocks — and its steps become spec writes:

- a vgpu-remove → ``vgpudevice-disable``; a vgpu-create → ``vgpudevice-enable``;
- an sriov-disable → ``sriovgpudevice-disable``; a GPU desired on whose ``SRIOVGPUDevice`` is
  disabled → ``sriovgpudevice-enable``, then its VFs' ``vgpudevice-enable`` steps planned ahead
  (:func:`plan_ahead`) on the ``VGPUDevice`` objects pcidevices-controller will make, where the
  catalogue knows where its VFs appear; otherwise they are planned once the objects exist (the
  plan says so in a note, and why).

The node-local planner is given what each VF's spec asks (``enabled`` with ``vGPUTypeName``):
that is what the controller converges to, and what a write changes, so a later run never writes
the same spec again. But a VF *hosts* a profile only when its status says so (``vGPUStatus``
configured, ``configureVGPUTypeName``, a ``uuid``: docs/domain.md §6): a spec the controller
has not carried out is a *pending* step (``pending``: nothing to write; apply waits for the
status again), so the node is not converged until the status catches up. What it can take is its
``status.availableTypes``, and its GPU's types are the catalogue's, found from the desired
``model`` or from the profile names the objects carry. A VF a VM uses (its allocation
annotation, or a running VMI of the profile) counts as in use: never disabled.

One spec is not given as it asks: a type change the controller ignores (an enabled VF whose
``vGPUTypeName`` is not the profile its status hosts: :func:`ignored_change`), which would be a
pending step forever. The VF is given as hosting what its status says, so another desired
profile is a profile change as any (disable, then enable; blocked while a VM uses it), and the
hosted one, desired, is a ``vgpudevice-enable`` that sets the spec back (:func:`_pending`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from reconciler.catalog import Catalog, GpuModel
from reconciler.model import (
    VGPU,
    Blocked,
    DelegateAction,
    DesiredGpu,
    DesiredNode,
    Gpu,
    Interface,
    Inventory,
    Noop,
    Observation,
    PciAddress,
    Plan,
    PlanError,
    Problem,
    SriovDisable,
    SriovGpuDeviceDisable,
    SriovGpuDeviceEnable,
    Vf,
    VgpuCreate,
    VgpuDeviceDisable,
    VgpuDeviceEnable,
    VgpuMode,
    VgpuRemove,
)
from reconciler.model.cluster import object_name
from reconciler.model.harvester import HarvesterGpu, HarvesterNode, HarvesterVf
from reconciler.model.record import record, replace
from reconciler.plan.check import located
from reconciler.plan.groups import GpuIdentity, resolve_on
from reconciler.plan.mig import catalogue_reason, mig_capable, mig_problems
from reconciler.plan.planner import NO_CLUSTER, plan_node

#: A plan's ``interface`` in delegate mode.
DELEGATE_INTERFACE = "harvester"
#: Why a GPU whose SR-IOV is on is not there yet: its VFs have no objects to write. Shown as
#: its blocked ``sriovgpudevice-enable`` (the step it waits on); apply waits for it.
WAITING = (
    "SR-IOV is on; waiting for pcidevices-controller to make its VGPUDevice objects (within a "
    "node resync: about 30 s): its VFs are planned then"
)


def waits_for_controller(plan: Plan) -> bool:
    """Whether ``plan`` has a GPU whose VFs wait for pcidevices-controller's objects."""
    return any(
        isinstance(b.action, SriovGpuDeviceEnable) and b.action.reason == WAITING
        for b in plan.blocked
    )


def plan_delegate(desired: DesiredNode, observed: HarvesterNode, *, catalog: Catalog) -> Plan:
    """The spec writes that take ``observed`` to ``desired`` (raises :class:`PlanError` when the
    desired state cannot be reached there, each problem located in the desired-state file)."""
    # Node groups' entries become the GPUs of this node they match, as on a host.
    desired = resolve_on(desired, harvester_identities(observed, catalog))
    node = observed.node
    problems: list[Problem] = []
    # A VM whose allocation cannot be read holds what it could (observed.used_by): said here,
    # blocking nothing else.
    notes: list[str] = [*observed.notes, *observed.unread_holders]
    first: list[DelegateAction] = []
    noops: list[Noop] = []
    waiting: list[Blocked] = []
    planned: list[DesiredGpu] = []
    gpus: list[Gpu] = []
    for want in desired.gpus:
        hg = observed.gpu(want.address)
        if hg is None:
            problems.append(
                located(
                    f"GPU {want.address} has no SRIOVGPUDevice on node {node}: pcidevices-"
                    "controller makes one for each SR-IOV GPU it finds there",
                    want.location,
                )
            )
            continue
        if want.mode is VgpuMode.MIXED_SIZE:
            problems.append(
                located(
                    f"GPU {want.address}: mode: mixed-size is not made through pcidevices-"
                    "controller (it has no such setting); use node-local mode for it",
                    want.location,
                )
            )
            continue
        mig = _mig_capable(want, hg, observed, catalog)
        refused = _mig_refusals(want, mig, observed.node, catalog)
        if refused:
            problems.extend(refused)
            continue
        vfs = observed.vfs_of(want.address)
        if not want.sriov and not hg.enabled and not any(v.enabled for v in vfs):
            noops.append(Noop(hg.name, "SR-IOV disabled as desired"))
            continue
        if not want.sriov and not vfs:
            first.append(_gpu_step(SriovGpuDeviceDisable, hg, node, "desired disabled"))
            continue
        if want.sriov and not hg.enabled:
            first.append(_gpu_step(SriovGpuDeviceEnable, hg, node, "SR-IOV is off; desired on"))
            if mig is not None:
                # Nothing refused (no profile asked), but the enable changes the GPU's mode.
                notes.append(
                    f"GPU {want.address}: enabling its SR-IOV makes pcidevices-controller turn "
                    f"MIG mode on ({mig}; gpu_controller.go reconcileMIGConfiguration): only "
                    "MIG-backed types are offered afterwards"
                )
            if want.vgpus or want.profiles:
                ahead = plan_ahead(want, hg, vfs, observed, catalog, desired=desired.name)
                first.extend(ahead.steps)
                notes.extend(ahead.notes)
                problems.extend(ahead.problems)
            continue
        if want.sriov and not vfs:
            if want.vgpus or want.profiles:
                # Nothing to write, but not there either: a wait (apply waits for it).
                waiting.append(Blocked(_gpu_step(SriovGpuDeviceEnable, hg, node, WAITING)))
            continue
        checked = _check_model(want, observed, catalog)
        if isinstance(checked, Problem):
            problems.append(checked)
            continue
        if checked:
            notes.append(checked)
        model = _model(want, vfs, catalog)
        gpus.append(_as_gpu(hg, vfs, observed, model))
        planned.append(want)
    if problems:
        raise PlanError(
            f"the desired state of node {node} cannot be reached through pcidevices-controller "
            f"({len(problems)} problem{'s' * (len(problems) != 1)})",
            problems,
        )
    local = plan_node(
        DesiredNode(desired.name, tuple(planned)),
        Inventory(node, tuple(gpus)),
        catalog=catalog,
    )
    objects = {(vf.parent, vf.address): vf for vf in observed.vfs}
    by_gpu = {g.address: g for g in observed.gpus}
    actions: list[DelegateAction] = list(first)
    blocked: list[Blocked] = list(waiting)
    for action in local.actions:
        if isinstance(action, VgpuRemove | VgpuCreate | SriovDisable):
            step = _translate(action, node, objects, by_gpu)
            if step is not None:
                actions.append(step)
    for item in local.blocked:
        held = item.action
        if isinstance(held, VgpuRemove | VgpuCreate | SriovDisable):
            step = _translate(held, node, objects, by_gpu)
            if step is not None:
                blocked.append(Blocked(step))
    # Status is the truth: a VF whose spec asks what its status does not show has a pending
    # step (written, not carried out), unless the plan already has one for it.
    planned_gpus = {want.address for want in planned}
    touched = {a.target for a in actions} | {b.action.target for b in blocked}
    actions.extend(
        _pending(vf, node, observed)
        for vf in observed.vfs
        if vf.parent in planned_gpus and vf.name not in touched and vf.pending
    )
    if observed.notes and actions:
        # Some object could not be read: nothing is written on half a picture.
        unread = "some of the node's objects could not be read (see the notes)"
        blocked = [*(Blocked(replace(a, reason=unread)) for a in actions), *blocked]
        actions = []
    if observed.driver is not None:
        actions, blocked = _wait_for_driver(observed, actions, blocked)
    notes.extend(observed.driver_notes)
    actions.sort(key=lambda a: a.kind.order)
    blocked.sort(key=lambda b: b.kind.order)
    return Plan(
        node=node,
        interface=DELEGATE_INTERFACE,
        observed=Observation(fingerprint(observed)),
        actions=tuple(a.numbered(i) for i, a in enumerate(actions, start=1)),
        blocked=tuple(blocked),
        noops=(*noops, *local.noops),
        notes=(*notes, *(n for n in local.notes if n != NO_CLUSTER)),
    )


def fingerprint(observed: HarvesterNode) -> str:
    """What the plan was made from: every object's name and resourceVersion, and who uses
    what (a fresh plan under the same fingerprint sees the same objects)."""
    digest = hashlib.sha256(observed.node.encode())
    for g in observed.gpus:
        digest.update(f"\0g{g.name}\0{g.resource_version}".encode())
    for v in observed.vfs:
        digest.update(f"\0v{v.name}\0{v.resource_version}".encode())
    for name in sorted(observed.used_by):
        digest.update(f"\0u{name}\0{observed.used_by[name]}".encode())
    return "sha256:" + digest.hexdigest()


def _gpu_step(
    kind: type[SriovGpuDeviceEnable | SriovGpuDeviceDisable], hg: HarvesterGpu, node: str, why: str
) -> SriovGpuDeviceEnable | SriovGpuDeviceDisable:
    return kind(
        target=hg.name,
        reason=why,
        node=node,
        gpu=hg.address,
        resource_version=hg.resource_version,
    )


def harvester_identities(observed: HarvesterNode, catalog: Catalog) -> list[GpuIdentity]:
    """What node groups can match each GPU of ``observed`` by: its address, and the models and
    device ID its ``PCIDevice`` names (vendor and device only: no subsystem ids)."""
    found = []
    for gpu in observed.gpus:
        ids = observed.pci_ids.get(gpu.address)
        models = frozenset(
            m.name for m in catalog.models for i in m.pci_ids if ids and (i.vendor, i.device) == ids
        )
        found.append(GpuIdentity(gpu.address, models, ids[1] if ids else ""))
    return found


def _check_model(want: DesiredGpu, observed: HarvesterNode, catalog: Catalog) -> Problem | str:
    """The desired ``model`` against the GPU's ``PCIDevice`` ids: a problem when they name
    another model, a note when nothing can tell ("" when it matches or none is desired). The
    ids carry no subsystem ids, so models that share them (A2 and A16) are both accepted."""
    if want.model is None:
        return ""
    ids = observed.pci_ids.get(want.address)
    if ids is None:
        return (
            f"GPU {want.address}: desired model {want.model} not checked: no PCIDevice object "
            f"of it on node {observed.node}"
        )
    named = sorted(
        {m.name for m in catalog.models for i in m.pci_ids if (i.vendor, i.device) == ids}
    )
    if not named:
        return (
            f"GPU {want.address}: desired model {want.model} not checked: the catalogue does "
            f"not know PCI ids {ids[0]}:{ids[1]}"
        )
    wanted = catalog.model(want.model)
    if wanted is not None and wanted.name in named:
        return ""
    return located(
        f"GPU {want.address} is {' or '.join(named)} (PCIDevice {ids[0]}:{ids[1]}), not the "
        f"desired {want.model}",
        want.location,
    )


def _model(want: DesiredGpu, vfs: Sequence[HarvesterVf], catalog: Catalog) -> GpuModel | None:
    """The GPU's catalogue model: the desired ``model``, else the one the profile names on its
    objects (or in the desired state) belong to."""
    if want.model is not None:
        found = catalog.model(want.model)
        if found is not None:
            return found
    names = [
        *(want.profiles or {}),
        *(want.vgpus or {}).values(),
        *(n for v in vfs for n in (v.type_name, v.configured_type, *v.available) if n),
    ]
    for name in names:
        known = catalog.profile(name)
        if known is not None:
            return known[0]
    return None


def _mig_refusals(
    want: DesiredGpu, capable: str | None, node: str, catalog: Catalog
) -> list[Problem]:
    """The profiles of ``want`` delegate mode refuses (``plan/mig.py``): MIG-backed ones, and
    time-sliced ones on a MIG-capable GPU (``capable``: why it is, from :func:`_mig_capable`),
    before anything is written for it."""
    group = f" (node group '{want.group}')" if want.group is not None else ""
    ref = f"{want.address} on node {node}{group}"
    return mig_problems(want, ref, capable=capable, catalog=catalog)


def _mig_capable(
    want: DesiredGpu, hg: HarvesterGpu, observed: HarvesterNode, catalog: Catalog
) -> str | None:
    """Why the GPU is MIG-capable, or None when nothing says so: Harvester's MigConfiguration
    of it (pcidevices-controller made one: its nvidia-smi said so), else the catalogue's model
    of its PCIDevice ids (every model they may name), else the model :func:`_model` finds."""
    if hg.name in observed.mig_configured:
        return (
            f"Harvester has a MigConfiguration {hg.name} for it (pcidevices-controller found it "
            "MIG-capable)"
        )
    ids = observed.pci_ids.get(want.address)
    named = {m.name: m for m in catalog.models for i in m.pci_ids if ids == (i.vendor, i.device)}
    if named:
        capable = [m for m in named.values() if mig_capable(m)]
        return catalogue_reason(capable[0]) if len(capable) == len(named) else None
    model = _model(want, observed.vfs_of(want.address), catalog)
    return catalogue_reason(model) if model is not None and mig_capable(model) else None


def _as_gpu(
    hg: HarvesterGpu, vfs: Sequence[HarvesterVf], observed: HarvesterNode, model: GpuModel | None
) -> Gpu:
    """The GPU as the node-local planner reads one: its VFs in address order (the index order),
    each hosting what its spec asks."""
    ids = model.pci_ids[0] if model is not None and model.pci_ids else None
    return Gpu(
        address=hg.address,
        vendor_id=ids.vendor if ids is not None else "10de",
        device_id=ids.device if ids is not None else "",
        subsystem_vendor_id=ids.subsystem_vendor if ids is not None else "",
        subsystem_device_id=ids.subsystem_device if ids is not None else "",
        model=model.name if model is not None else None,
        # How a vGPU is named on the host is the controller's business: the identities the
        # node-local plan gives its creates are not part of the spec writes.
        interface=Interface.VFIO,
        total_vfs=len(vfs),
        num_vfs=len(vfs),
        vfs=tuple(_as_vf(v, i, observed) for i, v in enumerate(vfs)),
        types=tuple(p.vgpu_type() for p in model.time_sliced_profiles) if model else (),
        driver="nvidia",
    )


def _as_vf(vf: HarvesterVf, index: int, observed: HarvesterNode) -> Vf:
    if not vf.enabled:
        return Vf(vf.address, index, None, frozenset(vf.available))
    holder = observed.used_by.get(vf.name, "")
    hosted = VGPU(
        uuid=vf.uuid or vf.name,
        # A type change the controller ignores: the VF hosts what its status says.
        type_name=ignored_change(vf) or vf.type_name or vf.configured_type,
        in_use=bool(holder),
        holder=holder,
    )
    return Vf(vf.address, index, hosted)


#: How a pending step's reason starts (``plan`` shows it; the step is marked ``pending``).
PENDING = "pending: pcidevices-controller has not carried out the spec"


def ignored_change(vf: HarvesterVf) -> str:
    """The profile ``vf`` hosts while its spec, enabled, asks another ("" otherwise): a type
    change pcidevices-controller ignores. Its ``OnVGPUChange`` (pkg/controller/gpudevice/
    vgpu_controller.go, bdd8025) calls ``enableVGPU`` only when sysfs shows no vGPU on the VF
    and ``disableVGPU`` only when ``spec.enabled`` is false; an enabled VF that hosts a vGPU
    gets a status refresh (``uuid``, ``vGPUStatus``, ``availableTypes``) and nothing more, so
    a ``vGPUTypeName`` written over a hosted profile (Harvester's UI, kubectl) is never carried
    out. The node-local planner is given the hosted profile (the truth), so a profile change
    is planned as any other: ``vgpudevice-disable``, then ``vgpudevice-enable`` once
    ``availableTypes`` lists the profile (and blocked while a VM uses the VF)."""
    hosted = vf.hosts
    if vf.enabled and vf.type_name and hosted and hosted != vf.type_name:
        return hosted
    return ""


def _ignored_cause(vf: HarvesterVf) -> str:
    """What a step of a VF with an ignored type change adds to its reason ("" for others)."""
    hosted = ignored_change(vf)
    if not hosted:
        return ""
    return (
        f" (spec.vGPUTypeName {vf.type_name} is not carried out: it hosts {hosted}, and "
        "pcidevices-controller ignores a type change on an enabled VGPUDevice)"
    )


def _pending(vf: HarvesterVf, node: str, observed: HarvesterNode) -> DelegateAction:
    """The step a VF's spec asks that its status does not show: nothing to write (the
    executor waits for the status again), the status in its reason.

    An ignored type change (:func:`ignored_change`) left here is one whose hosted profile the
    plan keeps: waiting would never end, so its step writes the spec back to the profile it
    hosts (one write, no vGPU touched: safe while a VM uses it; the webhook checks no type
    change on an enabled VGPUDevice, pkg/webhook/vgpu.go ``Update``)."""
    index = observed.vfs_of(vf.parent).index(vf)
    hosted = ignored_change(vf)
    if hosted:
        return VgpuDeviceEnable(
            target=vf.name,
            reason=(
                f"spec.vGPUTypeName {vf.type_name} is not carried out: it hosts {hosted}, as "
                "desired, and pcidevices-controller ignores a type change on an enabled "
                f"VGPUDevice: the spec is set back to {hosted}"
            ),
            node=node,
            gpu=vf.parent,
            vf=vf.address,
            vf_index=index,
            resource_version=vf.resource_version,
            type_name=hosted,
            replaces=vf.type_name,
        )
    shown = (
        f"status.vGPUStatus: {'vGPUConfigured' if vf.configured else 'empty'}, "
        f"configureVGPUTypeName: {vf.configured_type or 'empty'}, uuid: {vf.uuid or 'empty'}"
    )
    if vf.enabled:
        return VgpuDeviceEnable(
            target=vf.name,
            reason=f"{PENDING} (enabled: true, vGPUTypeName: {vf.type_name}; {shown})",
            node=node,
            gpu=vf.parent,
            vf=vf.address,
            vf_index=index,
            resource_version=vf.resource_version,
            type_name=vf.type_name,
            pending=True,
        )
    return VgpuDeviceDisable(
        target=vf.name,
        reason=f"{PENDING} (enabled: false; {shown})",
        node=node,
        gpu=vf.parent,
        vf=vf.address,
        vf_index=index,
        resource_version=vf.resource_version,
        type_name=vf.configured_type or vf.type_name or f"type id {vf.uuid or 'unknown'}",
        pending=True,
    )


def _wait_for_driver(
    observed: HarvesterNode, actions: list[DelegateAction], blocked: list[Blocked]
) -> tuple[list[DelegateAction], list[Blocked]]:
    """A node whose NVIDIA driver pod is not ready (``observed.driver``): every step is blocked
    with that cause (pcidevices-controller does no host work until the pod is ready, so a write
    now would only time out), a pending one keeping what its status shows."""
    driver = observed.driver
    if driver is None or not actions:
        return actions, blocked
    waits = []
    for a in actions:
        why = driver.blocks(
            observed.node, sriov=isinstance(a, SriovGpuDeviceEnable | SriovGpuDeviceDisable)
        )
        pending = getattr(a, "pending", False)
        waits.append(Blocked(replace(a, reason=f"{a.reason}; {why}" if pending else why)))
    return [], [*waits, *blocked]


def _translate(
    action: VgpuRemove | VgpuCreate | SriovDisable,
    node: str,
    objects: dict[tuple[PciAddress, PciAddress], HarvesterVf],
    by_gpu: dict[PciAddress, HarvesterGpu],
) -> DelegateAction | None:
    match action:
        case VgpuRemove() | VgpuCreate():
            vf = objects.get((action.gpu, PciAddress.parse(action.target)))
            if vf is None:  # the planner named a VF that has no object: nothing to write
                return None
            if isinstance(action, VgpuRemove):
                return VgpuDeviceDisable(
                    target=vf.name,
                    reason=action.reason + _ignored_cause(vf),
                    node=node,
                    gpu=action.gpu,
                    vf=vf.address,
                    vf_index=action.vf_index,
                    resource_version=vf.resource_version,
                    type_name=ignored_change(vf) or vf.type_name or action.type_name,
                    replaced_by=action.replaced_by,
                )
            return VgpuDeviceEnable(
                target=vf.name,
                reason=action.reason + _ignored_cause(vf),
                node=node,
                gpu=action.gpu,
                vf=vf.address,
                vf_index=action.vf_index,
                resource_version=vf.resource_version,
                type_name=action.type_name,
                replaces=action.replaces,
            )
        case SriovDisable():
            hg = by_gpu.get(action.gpu)
            return None if hg is None else _gpu_step(SriovGpuDeviceDisable, hg, node, action.reason)
    return None


# -- a GPU whose SR-IOV is off: its VFs planned ahead -------------------------------------------


@record(frozen=True, slots=True)
class Ahead:
    """What :func:`plan_ahead` found for one GPU whose SR-IOV is off: its VFs' steps (each on
    an object not made yet), or notes saying why they wait for the objects, or problems."""

    steps: tuple[VgpuDeviceEnable, ...] = ()
    notes: tuple[str, ...] = ()
    problems: tuple[Problem, ...] = ()


#: The note of a GPU whose VFs cannot be planned before their objects exist (and why, after it).
LATER = (
    "its VFs are planned once pcidevices-controller has made their VGPUDevice objects (after "
    "the enable, within a node resync: about 30 s)"
)


def plan_ahead(
    want: DesiredGpu,
    hg: HarvesterGpu,
    vfs: Sequence[HarvesterVf],
    observed: HarvesterNode,
    catalog: Catalog,
    *,
    desired: str,
) -> Ahead:
    """The ``vgpudevice-enable`` steps of GPU ``hg``, whose SR-IOV is off, planned before the
    ``VGPUDevice`` objects of its VFs exist (``object_exists`` False: after its enable).

    ``sriov-manage -e`` enables all of a GPU's VFs (docs/domain.md §2); the kernel puts VF
    ``i`` at the PF's routing id + ``sriov_offset`` + i × ``sriov_stride`` (§1), values the
    catalogue has for a model seen on real hosts (``vf_offset`` None: not known, nothing
    predicted). pcidevices-controller then makes one ``VGPUDevice`` per VF, named
    ``<node>-<VF address without ':' and '.'>`` (pcidevices bdd8025
    pkg/util/gpuhelper/gpuhelper.go ``generateVGPUDevice``, through
    pkg/apis/devices.harvesterhci.io/v1beta1/pcidevice.go ``PCIDeviceNameForHostname``), its
    ``spec.parentGPUDeviceAddress`` the PF, disabled, offering the model's time-sliced profiles.
    That node is planned by the node-local planner as an existing one is, so both forms
    (``vgpus``, ``profiles``) decide as they will once the objects exist; the executor checks
    each object against the prediction before writing it (``apply/delegate.py``)."""
    checked = _check_model(want, observed, catalog)
    if isinstance(checked, Problem):
        return Ahead(problems=(checked,))
    found = _ahead_model(want, observed, catalog)
    if isinstance(found, str):
        return Ahead(notes=(*filter(None, (checked,)), f"GPU {want.address}: {LATER}: {found}"))
    if vfs:
        why = (
            f"{len(vfs)} VGPUDevice objects of it are still there (pcidevices-controller "
            "removes them once its SR-IOV is off)"
        )
        return Ahead(notes=(*filter(None, (checked,)), f"GPU {want.address}: {LATER}: {why}"))
    try:
        predicted = predicted_vfs(hg, found, observed.node)
    except ValueError:  # beyond bus 0xff: the catalogue's layout cannot be this GPU's
        why = f"{found.name}'s VF layout (catalogue) puts its VFs beyond bus ff from {hg.address}"
        return Ahead(notes=(*filter(None, (checked,)), f"GPU {want.address}: {LATER}: {why}"))
    try:
        local = plan_node(
            DesiredNode(desired, (want,)),
            Inventory(observed.node, (_as_gpu(hg, predicted, observed, found),)),
            catalog=catalog,
        )
    except PlanError as e:
        return Ahead(problems=e.problems or (Problem(e.message),))
    objects = {(vf.parent, vf.address): vf for vf in predicted}
    steps = [
        replace(step, object_exists=False)
        for action in local.actions
        if isinstance(action, VgpuCreate)
        for step in (_translate(action, observed.node, objects, {}),)
        if isinstance(step, VgpuDeviceEnable)
    ]
    notes = [n for n in local.notes if n != NO_CLUSTER]
    return Ahead(steps=tuple(steps), notes=(*filter(None, (checked,)), *notes))


def predicted_vfs(hg: HarvesterGpu, model: GpuModel, node: str) -> tuple[HarvesterVf, ...]:
    """The ``VGPUDevice`` objects pcidevices-controller will make for ``hg``'s VFs once its
    SR-IOV is on (:func:`plan_ahead`), in address (index) order: disabled, no status but the
    model's time-sliced profiles (their type keys unknown yet), no ``resourceVersion``.
    Raises ValueError when the layout reaches beyond bus ff."""
    if model.vf_offset is None:  # pragma: no cover - plan_ahead checks it
        raise ValueError(f"{model.name}: VF offset not known")
    offered = {p.name: "" for p in model.time_sliced_profiles}
    out = []
    for i in range(model.vfs):
        address = PciAddress.from_routing_id(
            hg.address.domain, hg.address.routing_id + model.vf_offset + i * model.vf_stride
        )
        out.append(
            HarvesterVf(
                name=object_name(node, str(address)),
                resource_version="",
                address=address,
                parent=hg.address,
                enabled=False,
                available=offered,
            )
        )
    return tuple(out)


def _ahead_model(want: DesiredGpu, observed: HarvesterNode, catalog: Catalog) -> GpuModel | str:
    """The catalogue model whose VF layout the GPU's VFs are predicted from: the desired
    ``model`` (checked against the ``PCIDevice`` ids by :func:`_check_model`), else the model
    of the desired profiles, else the one model the ``PCIDevice`` ids name; or why none can
    be (words for the note)."""
    model = _model(want, (), catalog)
    ids = observed.pci_ids.get(want.address)
    if ids is not None:
        named = [m for m in catalog.models if any((i.vendor, i.device) == ids for i in m.pci_ids)]
        if model is None and len(named) == 1:
            model = named[0]
        elif model is not None and model not in named:
            return (
                f"the desired profiles are {model.name}'s, but its PCIDevice is {ids[0]}:{ids[1]}"
            )
    if model is None:
        return "the catalogue cannot tell its model (give the GPU's model in the desired state)"
    if model.vf_offset is None:
        return (
            f"the catalogue does not know where {model.name}'s VFs appear (its SR-IOV VF offset "
            "was not seen on a real host)"
        )
    return model
