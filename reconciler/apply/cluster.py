"""The cluster executor: carries out a plan's CR and KubeVirt writes through the ClusterApi port.

Optimistic concurrency all the way: every write carries the resourceVersion the action was
planned from, so a change made since (by a human, another controller, another vgpuctl) makes
the API server answer 409 instead of being overwritten. On a conflict the object is read again
and the action re-planned against what is there now (``replan``, the planner's
``replan_object``); the re-planned write carries the fresh resourceVersion. A bounded number of
rounds, then a clear failure: never a blind overwrite.

Status is written through the ``/status`` subresource: with one enabled, the main PUT/POST
ignores ``status``, so a create or a spec update is followed by a status write carrying the
resourceVersion the first write returned.

The KubeVirt CR is shared with KubeVirt itself and with other vgpuctl nodes: only entries of
``spec.configuration.permittedHostDevices.mediatedDevices`` and ``.pciHostDevices`` named in
the action change, and the ownership annotations with them. It is written with a JSON patch
(RFC 6902) that names only those paths, each guarded by a ``test`` of the value it was computed
from: a change elsewhere in the object (image registry, someone else's entry) is neither carried
nor overwritten, and a change to what we touch fails the patch (a conflict: read again and
re-plan). Removals are written only against the resourceVersion the plan read (or the one
this run's own kubevirt-allow wrote directly over it): otherwise they wait for the next run.
Retiring marks (``model.retiring``) are stamped with the time of the write. The admission
policy in deploy/ refuses the agent any other change to the object.
Outcomes reuse the host executor's :class:`Outcome`/:class:`ApplyResult`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from reconciler.apply.executor import ApplyResult, Outcome, OutcomeStatus
from reconciler.apply.mandate import ClusterMandate
from reconciler.model import (
    Action,
    ActionKind,
    ApplyError,
    Blocked,
    ClusterAction,
    ConflictError,
    CrCreate,
    CrDelete,
    CrUpdate,
    Intent,
    KubevirtAllow,
    KubevirtUpdate,
    PciAddress,
    Problem,
    ReconcilerError,
)
from reconciler.model.cluster import (
    GROUP_VERSIONS,
    KUBEVIRT_GROUP,
    KUBEVIRT_OWNED_ANNOTATION,
    KUBEVIRT_OWNED_PCI_ANNOTATION,
    KUBEVIRT_PLURAL,
    KUBEVIRT_VERSION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NODE_LABEL,
    NODE_STATE_KIND,
    PLURALS,
    SRIOV_GPU_KIND,
    VGPU_KIND,
    KubeObject,
    lists_external,
    object_name,
    resource_name,
    served_by_kubevirt,
)
from reconciler.model.clusterapi import ClusterApi
from reconciler.model.clustertext import ClusterTextError
from reconciler.model.errors import excerpt
from reconciler.model.nodestate import stamped
from reconciler.model.record import field, record, replace
from reconciler.model.retiring import (
    KUBEVIRT_RETIRING_ANNOTATION,
    format_marks,
    parse_marks,
    seconds,
)

SKIPPED_NOT_CLUSTER = "skipped: not a cluster action"


def utc_now() -> str:
    """The time now in UTC, RFC 3339 to the second (``2026-12-02T03:07:13Z``): a Kubernetes
    ``metav1.Time``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


#: The longest Event message vgpuctl records: Kubernetes truncates longer ones.
EVENT_MESSAGE_MAX = 1024


class EventSink(Protocol):
    """Where Events about our objects go (``kube.EventRecorder``); must never raise for a
    failure to record."""

    def event(
        self,
        kind: str,
        name: str,
        *,
        reason: str,
        message: str,
        type: str = "Normal",
        uid: str = "",
    ) -> None: ...


#: ``replan(intended, current)``: the write that takes ``current`` (None: absent) to
#: ``intended`` now, or None when nothing is needed any more.
Replan = Callable[[KubeObject, KubeObject | None], Action | None]


def execute_cluster(
    actions: Sequence[Action],
    *,
    api: ClusterApi,
    events: EventSink | None = None,
    replan: Replan | None = None,
    max_conflict_retries: int = 3,
    on_outcome: Callable[[Outcome], None] | None = None,
    node: str = "",
    run_id: str = "",
    clock: Callable[[], float] = time.monotonic,
    mandate: ClusterMandate | None = None,
    now: Callable[[], str] | None = None,
    versions: dict[str, str] | None = None,
) -> ApplyResult:
    """Carry out the cluster actions among ``actions`` in order; stop at the first failure.

    Host actions are recorded as skipped (the host executor runs them). Each conflict (409)
    is answered by reading the object again and re-planning; after ``max_conflict_retries``
    retries the action fails ("… kept changing under us: gave up after N conflicts", N being
    retries + 1). Without ``replan`` a CR conflict fails at once (nothing can decide what the
    write should now be); KubeVirt updates re-plan themselves. An object found to be another
    controller's on re-reading is left alone (a no-op saying so) unless the action adopts it;
    one found gone makes a delete a no-op. A failure is an outcome (and, with ``events``, a
    Warning Event on the object), not an exception.

    ``replan`` is the planner's ``replan_object`` (bind ``adopt`` to the run's ``--adopt``).

    ``mandate`` (every apply and watch run passes one) is what the run may write: this node's
    objects vgpuctl manages (or adopts), and the KubeVirt entries it added.

    ``versions`` (resourceVersion planned from → the one a write of this run made directly
    over it, its patch testing that version; filled in here) lets the removals of a KubeVirt
    write planned from the version an earlier write of the same run replaced (the plan's
    kubevirt-update after its kubevirt-allow) go ahead: against any other version than the
    planned one or that, removals wait for the next run (``_Writer._kubevirt``).

    Raises :class:`ApplyError` before writing anything when an action's fields do not fit
    together, :class:`MandateError` when an action is outside the mandate.
    """
    if max_conflict_retries < 0:
        raise ValueError("max_conflict_retries must not be negative")
    _check(actions)
    if mandate is not None:
        mandate.check(actions)
    writer = _Writer(
        api=api,
        replan=replan,
        retries=max_conflict_retries,
        mandate=mandate,
        now=now or utc_now,
        versions=versions if versions is not None else {},
    )
    outcomes: list[Outcome] = []
    not_run: tuple[Action, ...] = ()
    for i, action in enumerate(actions):
        if not isinstance(action, CrCreate | CrUpdate | CrDelete | KubevirtUpdate):
            outcome = Outcome(action, OutcomeStatus.SKIPPED, SKIPPED_NOT_CLUSTER)
        else:
            started = clock()
            try:
                status, message = writer.run(action)
                outcome = Outcome(action, status, message, seconds=clock() - started)
            except ReconcilerError as e:
                outcome = Outcome(
                    action,
                    OutcomeStatus.FAILED,
                    e.message,
                    transient=e.transient,
                    seconds=clock() - started,
                )
                if events is not None:
                    _failure_event(events, action, e.message)
        outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)
        if outcome.status is OutcomeStatus.FAILED:
            not_run = tuple(actions[i + 1 :])
            break
    return ApplyResult(node=node, run_id=run_id, outcomes=tuple(outcomes), not_run=not_run)


# -- field checks -------------------------------------------------------------------------------


def _check(actions: Sequence[Action]) -> None:
    """Every cluster action's fields, checked before anything is written."""
    problems = []
    for a in actions:
        why = _problem(a)
        if why:
            problems.append(Problem(f"action {a.seq} ({a.kind} {a.target}): {why}"))
    if problems:
        raise ApplyError("the plan's cluster actions are malformed; nothing was written", problems)


def _object_kind(action: CrCreate | CrUpdate | CrDelete) -> str:
    return action.object_kind if isinstance(action, CrDelete) else action.object.kind


def _problem(a: Action) -> str | None:
    """What does not fit together in a cluster action (its types are the codec's concern)."""
    match a:
        case KubevirtAllow() if a.remove or a.remove_pci or a.retire:
            return "a kubevirt-allow only adds: its removals and marks belong in a kubevirt-update"
        case KubevirtUpdate():
            for key, value in (
                ("namespace", a.namespace),
                ("name", a.name),
                ("resourceVersion", a.resource_version),
            ):
                if not value:
                    return f"{key} must be a non-empty string"
            return None
        case CrCreate() | CrUpdate() | CrDelete():
            kind = _object_kind(a)
            if kind not in PLURALS:
                field = "objectKind" if isinstance(a, CrDelete) else "object.kind"
                return f"{field} must be one of {', '.join(sorted(PLURALS))}"
            if not isinstance(a, CrCreate) and not a.resource_version:
                return "resourceVersion must be a non-empty string"
            if not isinstance(a, CrDelete) and a.object.name != a.target:
                return f"object is named {a.object.name!r}, not {a.target!r}"
    return None


# -- the writes ---------------------------------------------------------------------------------


class _LeftAlone(Exception):
    """After a conflict, the object turned out to be another controller's: not written."""


@record(frozen=True, slots=True)
class _Writer:
    api: ClusterApi
    replan: Replan | None
    retries: int
    #: Checks each write re-planned after a conflict, as the plan's were before the run.
    mandate: ClusterMandate | None = None
    #: The wall-clock time a VGPUNodeState's pending times are stamped with.
    now: Callable[[], str] = utc_now
    #: resourceVersion planned from → the one this run's own KubeVirt write made of it.
    versions: dict[str, str] = field(default_factory=dict)

    def run(self, action: ClusterAction) -> tuple[OutcomeStatus, str]:
        if isinstance(action, KubevirtUpdate):
            return self._kubevirt(action)
        action = self._over_intent(action)
        what = f"{PLURALS[_object_kind(action)]}/{action.target}"
        conflicts = 0
        # What was written so far: a create can succeed and its status write then conflict.
        done: list[str] = []
        current: CrCreate | CrUpdate | CrDelete | None = action
        while current is not None:
            try:
                self._write(current, done)
            except _LeftAlone as e:
                return OutcomeStatus.NOOP, f"{e}" + _after(conflicts)
            except ConflictError as e:
                conflicts += 1
                if conflicts > self.retries:
                    raise ConflictError(
                        f"{what} kept changing under us: gave up after {conflicts} conflicts"
                    ) from None
                try:
                    current = self._after_conflict(current, e)
                except _LeftAlone as left:
                    return OutcomeStatus.NOOP, f"{left}" + _after(conflicts)
                continue
            break
        if not done:
            state = "gone" if action.kind is ActionKind.CR_DELETE else "as intended"
            return OutcomeStatus.NOOP, f"{what} is already {state}" + _after(conflicts)
        return OutcomeStatus.DONE, ", ".join(done) + _after(conflicts)

    def _write(self, action: CrCreate | CrUpdate | CrDelete, done: list[str]) -> None:
        """The writes of one CR action, each appended to ``done`` once the server took it;
        raises ConflictError on a lost race."""
        kind = _object_kind(action)
        plural = PLURALS[kind]
        group, version = GROUP_VERSIONS[kind]
        name = action.target
        if isinstance(action, CrDelete):
            self.api.delete_object(
                group=group,
                version=version,
                plural=plural,
                name=name,
                resource_version=action.resource_version,
            )
            done.append(f"deleted {plural}/{name}")
            return
        body = action.object.to_json()
        body["apiVersion"] = f"{group}/{version}"
        body["kind"] = kind
        # An empty status is written too when it changed (a GPU whose VFs are all gone lists
        # none): left unwritten, the stored one would keep listing them.
        status = body.get("status")
        if status and kind == NODE_STATE_KIND:
            status = stamped(status, self.now())
        if isinstance(action, CrCreate):
            body["metadata"].pop("resourceVersion", None)
            created = self.api.create_object(group=group, version=version, plural=plural, body=body)
            done.append(f"created {plural}/{name}")
            if status:
                self._write_status(kind, name, created, status)
                done.append("status written")
            return
        # cr-update: what changed decides which of the two writes are needed.
        body["metadata"]["resourceVersion"] = action.resource_version
        spec_changed = action.spec_changed or any(
            c.path.startswith("metadata") for c in action.changes
        )
        stored: Mapping[str, Any] = body
        if spec_changed:
            stored = self.api.replace_object(
                group=group, version=version, plural=plural, name=name, body=body
            )
            done.append(
                f"updated {plural}/{name}" + (" (hand edits reset)" if action.drift else "")
            )
        if status is not None and action.status_changed:
            self._write_status(kind, name, stored, status)
            done.append("status written" if done else f"wrote the status of {plural}/{name}")

    def _write_status(
        self, kind: str, name: str, stored: Mapping[str, Any], status: Mapping[str, Any]
    ) -> dict[str, Any]:
        """PUT ``/status`` on top of what the server just returned (its resourceVersion);
        the object as the server then has it."""
        group, version = GROUP_VERSIONS[kind]
        body = _plain(stored)
        body["status"] = _plain(status)
        return self.api.replace_status(
            group=group, version=version, plural=PLURALS[kind], name=name, body=body
        )

    def _after_conflict(
        self, action: CrCreate | CrUpdate | CrDelete, conflict: ConflictError
    ) -> CrCreate | CrUpdate | CrDelete | None:
        """Re-read the object and decide the write it needs now (None: nothing)."""
        kind = _object_kind(action)
        plural = PLURALS[kind]
        group, version = GROUP_VERSIONS[kind]
        raw = self.api.get_object(group=group, version=version, plural=plural, name=action.target)
        current = None if raw is None else KubeObject.from_json({**raw, "kind": kind})
        if (
            current is not None
            and not current.managed_by_us
            and not (isinstance(action, CrUpdate) and action.adopt)
        ):
            # Another controller took it over (or made it) meanwhile: its object now, as the
            # planner would say; only an explicit adoption writes over it.
            who = current.labels.get(MANAGED_BY_LABEL) or "another controller"
            raise _LeftAlone(f"{plural}/{action.target} is now managed by {who}: left alone")
        if isinstance(action, CrDelete):
            # Whatever changed, the decision to delete does not depend on the content.
            if current is None:
                return None
            return replace(action, resource_version=current.resource_version)
        if self.replan is None:
            raise ConflictError(
                f"{conflict.message}; run plan again (nothing here can re-plan the write)"
            )
        nxt = self.replan(action.object, current)
        if nxt is None:
            return None
        if (
            not isinstance(nxt, CrCreate | CrUpdate | CrDelete)
            or nxt.target != action.target
            or _problem(nxt)
        ):
            raise ApplyError(
                f"re-planning {plural}/{action.target} after a conflict gave an unusable "
                f"action ({nxt.kind} {nxt.target}: {_problem(nxt) or 'wrong kind'})"
            )
        if self.mandate is not None:
            self.mandate.check_rewrite(nxt)
        return nxt

    # -- intent -----------------------------------------------------------------------------------

    def _over_intent(
        self, action: CrCreate | CrUpdate | CrDelete
    ) -> CrCreate | CrUpdate | CrDelete:
        """``action`` over this run's own intent write (:meth:`_publish`): a VGPUNodeState
        write planned from the version that write replaced (or, for a create, from no object)
        carries the version it made instead. Only our intent changed in between, and the
        planned write replaces the whole status: it is what would have been written."""
        if action.kind is ActionKind.CR_DELETE or _object_kind(action) != NODE_STATE_KIND:
            return action
        if isinstance(action, CrUpdate):
            made = self.versions.get(_intent_key(action.target, action.resource_version))
            return action if made is None else replace(action, resource_version=made)
        if isinstance(action, CrCreate):
            made = self.versions.get(_intent_key(action.target, ""))
            if made is None:
                return action
            created = _intent_object(action.target)
            obj = action.object
            return CrUpdate(
                seq=action.seq,
                target=action.target,
                reason=action.reason,
                resource_version=made,
                object=obj,
                # The intent's create wrote the labels and spec; PUT again only if they differ.
                spec_changed=bool(obj.annotations)
                or dict(obj.labels) != created["metadata"]["labels"]
                or dict(obj.spec) != created["spec"],
                status_changed=True,
            )
        return action

    def _publish(self, intent: Intent) -> str:
        """Write ``intent`` in the node's VGPUNodeState before the allow-list is read: the
        stored status with each profile's ``wanted`` set (every other field as stored), or,
        with no object yet, one created with just those profiles, its times stamped as any
        VGPUNodeState's. Written with the resourceVersion read; a conflict reads it again
        (bounded). Raises when it cannot be written: the allow step fails, no host action
        runs. The version made is recorded (:attr:`versions`) for the cluster phase's write
        of the same object (:meth:`_over_intent`)."""
        group, version = GROUP_VERSIONS[NODE_STATE_KIND]
        plural = PLURALS[NODE_STATE_KIND]
        name = intent.node
        what = f"{plural}/{name}"
        shown = ", ".join(f"{p.name} (wanted {p.wanted})" for p in intent.profiles)
        conflicts = 0
        while True:
            raw = self.api.get_object(group=group, version=version, plural=plural, name=name)
            try:
                if raw is None:
                    created = self.api.create_object(
                        group=group, version=version, plural=plural, body=_intent_object(name)
                    )
                    status = stamped(intent_status({}, intent), self.now())
                    written = self._write_status(NODE_STATE_KIND, name, created, status)
                    self.versions[_intent_key(name, "")] = _resource_version(written)
                    return f"{what}: created with the intent to create {shown}" + _after(conflicts)
                current = KubeObject.from_json({**raw, "kind": NODE_STATE_KIND})
                if not current.managed_by_us or current.labels.get(NODE_LABEL) != name:
                    raise ApplyError(
                        f"{what} is not vgpuctl's VGPUNodeState of node {name}: the intent to "
                        f"create {shown} cannot be published, and nothing else is written"
                    )
                before = _plain(raw.get("status") or {})
                status = intent_status(before, intent)
                if status == before:
                    return f"{what} already shows {shown}" + _after(conflicts)
                read = _resource_version(raw)
                body = _plain(raw)
                body["status"] = stamped(status, self.now())
                stored = self.api.replace_status(
                    group=group, version=version, plural=plural, name=name, body=body
                )
                self.versions[_intent_key(name, read)] = _resource_version(stored)
                return f"{what}: intent to create {shown} published" + _after(conflicts)
            except ConflictError:
                conflicts += 1
                if conflicts > self.retries:
                    raise ConflictError(
                        f"{what} kept changing under us: gave up after {conflicts} conflicts; "
                        f"the intent to create {shown} is not published"
                    ) from None

    # -- KubeVirt --------------------------------------------------------------------------------

    def _kubevirt(self, action: KubevirtUpdate) -> tuple[OutcomeStatus, str]:
        """Write ``action``'s allow-list change against the CR as read now.

        The plan holds only the change: the patch is computed against what is read, and
        tests every value it replaces or removes, so a stale read fails it as a conflict
        (read again, bounded). Removals are decided from the other nodes' summaries as the
        plan read them, so they are written only against the resourceVersion the plan read,
        or the one this run's own kubevirt-allow wrote directly over it (:attr:`versions`);
        against any other, they wait for the next run and the outcome says so (the rest,
        additions, marks and forgetting, is written: it is safe whatever changed)."""
        ns, name = action.namespace, action.name
        what = f"kubevirt/{ns}/{name}"
        # This run's intent first, then the CR read: a node that reads the summaries after
        # this write keeps the types listed; one that read them before wrote its mark before
        # (docs/architecture.md, "The KubeVirt allow-list").
        intent = ""
        if isinstance(action, KubevirtAllow) and action.intent is not None:
            intent = self._publish(action.intent) + "; "
        planned = action.resource_version
        ours = {planned, self.versions.get(planned, planned)}
        conflicts = 0
        deferred: tuple[str, ...] = ()
        raw = self._read_kubevirt(ns, name)
        while True:
            if raw is None:
                return OutcomeStatus.DONE if intent else OutcomeStatus.NOOP, (
                    f"{intent}{what} no longer exists: no allow-list to update"
                )
            read = _resource_version(raw)
            if read not in ours and (action.remove or action.remove_pci):
                deferred = (*action.remove, *action.remove_pci)
                action = replace(action, remove=(), remove_pci=())
            change = allow_list_patch(
                raw,
                add=[e.to_json() for e in action.add],
                remove=action.remove,
                owned=action.owned,
                add_pci=[e.to_json() for e in action.add_pci],
                remove_pci=action.remove_pci,
                owned_pci=action.owned_pci,
                retire=action.retire,
                unmark=action.unmark,
                now=self.now(),
            )
            waiting = _deferred(deferred)
            if change is None:
                lists = "mediatedDevices" + (
                    " and pciHostDevices"
                    if action.add_pci or action.remove_pci or action.owned_pci
                    else ""
                )
                status = OutcomeStatus.DONE if intent else OutcomeStatus.NOOP
                return status, (
                    f"{intent}{what}: {lists} already as planned" + waiting + _after(conflicts)
                )
            ops, summary = change
            # A removal only from the version read (issue 12), and the allow step's write from
            # the version planned when it can (its version then stands for the planned one,
            # for this run's removals): a write since, and the patch fails (read again).
            removes = bool(action.remove or action.remove_pci)
            tested = removes or (isinstance(action, KubevirtAllow) and read == planned)
            if tested:
                ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": read}, *ops]
            try:
                written = self.api.patch_object(
                    group=KUBEVIRT_GROUP,
                    version=KUBEVIRT_VERSION,
                    plural=KUBEVIRT_PLURAL,
                    name=name,
                    namespace=ns,
                    patch=ops,
                )
            except ConflictError:
                conflicts += 1
                if conflicts > self.retries:
                    raise ConflictError(
                        f"{what} kept changing under us: gave up after {conflicts} conflicts"
                    ) from None
                raw = self._read_kubevirt(ns, name)
                continue
            if read == planned and tested:
                # Only a write made directly over the planned version stands for it.
                self.versions[planned] = _resource_version(written)
            return OutcomeStatus.DONE, f"{intent}{what}: {summary}" + waiting + _after(conflicts)

    def _read_kubevirt(self, ns: str, name: str) -> dict[str, Any] | None:
        return self.api.get_object(
            group=KUBEVIRT_GROUP,
            version=KUBEVIRT_VERSION,
            plural=KUBEVIRT_PLURAL,
            name=name,
            namespace=ns,
        )


def _intent_object(node: str) -> dict[str, Any]:
    """The VGPUNodeState of ``node`` an intent write creates when there is none: labelled and
    specified as the planner renders it (``plan.nodestate``), its status written next."""
    group, version = GROUP_VERSIONS[NODE_STATE_KIND]
    return {
        "apiVersion": f"{group}/{version}",
        "kind": NODE_STATE_KIND,
        "metadata": {"name": node, "labels": {NODE_LABEL: node, MANAGED_BY_LABEL: MANAGED_BY}},
        "spec": {"nodeName": node},
    }


def _intent_key(node: str, resource_version: str) -> str:
    """:attr:`_Writer.versions`' key for the VGPUNodeState of ``node`` at ``resource_version``
    ("": none yet), apart from the KubeVirt CR's (keyed by its version alone)."""
    return f"{NODE_STATE_KIND}/{node}@{resource_version}"


def intent_status(status: Mapping[str, Any], intent: Intent) -> dict[str, Any]:
    """``status`` (a VGPUNodeState's, as stored) with ``intent`` published: each of its
    profiles' ``wanted`` in ``profiles`` set (an entry added, its other counts 0, when there is
    none), every other field as it is; the profiles sorted by name as the planner renders them
    (pure)."""
    out = _plain(status)
    listed = out.get("profiles")
    entries = (
        [dict(e) for e in listed if isinstance(e, Mapping)] if isinstance(listed, list) else []
    )
    by_name = {e.get("name"): e for e in entries}
    for p in intent.profiles:
        entry = by_name.get(p.name)
        if entry is None:
            entry = {
                "name": p.name,
                "resourceName": resource_name(p.name),
                "wanted": 0,
                "vgpus": 0,
                "inUse": 0,
                "creatable": 0,
            }
            entries.append(entry)
            by_name[p.name] = entry
        entry["wanted"] = p.wanted
    out["profiles"] = sorted(entries, key=lambda e: str(e.get("name", "")))
    return out


def _deferred(removals: Sequence[str]) -> str:
    """The outcome's words for removals not written: the CR changed since the plan."""
    if not removals:
        return ""
    return (
        "; the CR changed since the plan: removal of "
        + ", ".join(removals)
        + " waits for the next run"
    )


def _resource_version(raw: Mapping[str, Any]) -> str:
    return str((raw.get("metadata") or {}).get("resourceVersion") or "")


@record(frozen=True, slots=True)
class _AllowList:
    """One of the KubeVirt CR's allow-lists vgpuctl keeps entries in."""

    #: Where it lives, as JSON pointer tokens.
    path: tuple[str, ...]
    #: The field that says which entry is whose (the ownership annotation lists its values).
    key: str
    annotation: str
    #: How the summary names its entries.
    label: str
    #: Whether an entry counts as listed the way virt-handler reads it (mediatedDevices:
    #: spaces → ``_``, external, vgpuctl's resourceName) rather than by its key alone.
    as_kubevirt_reads: bool = False


#: Where the mediated-devices allow-list lives in the KubeVirt CR, as JSON pointer tokens.
MEDIATED_DEVICES_PATH = ("spec", "configuration", "permittedHostDevices", "mediatedDevices")
#: Where the PCI host devices allow-list lives (NVIDIA's vfio interface: the VF is the vGPU).
PCI_HOST_DEVICES_PATH = ("spec", "configuration", "permittedHostDevices", "pciHostDevices")
_MEDIATED = _AllowList(
    MEDIATED_DEVICES_PATH, "mdevNameSelector", KUBEVIRT_OWNED_ANNOTATION, "", as_kubevirt_reads=True
)
_PCI = _AllowList(PCI_HOST_DEVICES_PATH, "resourceName", KUBEVIRT_OWNED_PCI_ANNOTATION, "PCI ")
_ALLOW_LISTS = (_MEDIATED, _PCI)


def allow_list_change(
    kubevirt: Mapping[str, Any],
    *,
    add: Sequence[Mapping[str, Any]],
    remove: Sequence[str],
    owned: Sequence[str] = (),
    add_pci: Sequence[Mapping[str, Any]] = (),
    remove_pci: Sequence[str] = (),
    owned_pci: Sequence[str] = (),
    retire: Sequence[str] = (),
    unmark: Sequence[str] = (),
    now: str = "",
) -> tuple[dict[str, Any], str] | None:
    """The KubeVirt CR with ``add`` entries appended to ``mediatedDevices`` (unless an entry
    for the selector is there already) and ``remove`` selectors dropped (only entries the
    ownership annotation says are ours), the same for ``pciHostDevices`` by resourceName
    (``add_pci``, ``remove_pci``, ``owned_pci``, their own annotation), and the retiring marks
    (``model.retiring``) of ``unmark`` and of the removed selectors cleared, those of
    ``retire`` set to ``now`` (an owned entry still there, not marked already), plus a
    summary; None when that changes nothing (pure).

    Owned afterwards = (owned as read ∪ added ∪ ``owned``) ∩ keys present, minus removed:
    another vgpuctl's concurrent addition stays owned. A list that does not change is left
    as it is (not even created empty).
    """
    body = _plain(kubevirt)
    meta = body.setdefault("metadata", {})
    annotations = meta.setdefault("annotations", {}) or {}
    meta["annotations"] = annotations
    config = body.setdefault("spec", {}).setdefault("configuration", {})
    permitted = config.get("permittedHostDevices") or {}
    config["permittedHostDevices"] = permitted
    parts: list[str] = []
    changed = False
    for allow, adds, removes, owns in (
        (_MEDIATED, add, remove, owned),
        (_PCI, add_pci, remove_pci, owned_pci),
    ):
        side = _side_change(permitted, annotations, allow, add=adds, remove=removes, owned=owns)
        if side is not None:
            changed = True
            parts.extend(side)
    marked = _marks_change(annotations, permitted, retire=retire, unmark=unmark, now=now)
    if marked is not None:
        changed = True
        parts.extend(marked)
    if not changed:
        return None
    if not parts:
        parts.append("ownership annotation updated")
    return body, "; ".join(parts)


def _side_change(
    permitted: dict[str, Any],
    annotations: dict[str, Any],
    allow: _AllowList,
    *,
    add: Sequence[Mapping[str, Any]],
    remove: Sequence[str],
    owned: Sequence[str],
) -> list[str] | None:
    """:func:`allow_list_change` on one allow-list, in place: the summary's parts, None when
    nothing changes."""
    owned_before = {
        s.strip() for s in str(annotations.get(allow.annotation, "")).split(",") if s.strip()
    }
    name = allow.path[-1]
    entries = list(permitted.get(name) or [])
    present = {str(e.get(allow.key)) for e in entries if isinstance(e, Mapping)}

    added = []
    for entry in add:
        key = str(entry[allow.key])
        if allow.as_kubevirt_reads:
            mapped = [e for e in entries if isinstance(e, Mapping)]
            theirs = served_by_kubevirt(mapped, key)
            if theirs is not None:
                # Written since the plan (which blocks such a type's creates): fail the step,
                # so no host action runs on an allow-list vgpuctl cannot complete.
                raise ApplyError(
                    f"{excerpt(key)} is now in the KubeVirt CR's {name} without "
                    "externalResourceProvider: true (resourceName "
                    f"{excerpt(str(theirs.get('resourceName', '')))}): KubeVirt serves it "
                    "itself; vgpuctl adds no entry beside it, and nothing was written"
                )
            if lists_external(mapped, key):
                continue
        if key not in present:
            entries.append(_plain(entry))
            present.add(key)
            added.append(key)
    removed = [s for s in dict.fromkeys(remove) if s in present and s in owned_before]
    if removed:
        gone = set(removed)
        entries = [e for e in entries if not (isinstance(e, Mapping) and e.get(allow.key) in gone)]
        present -= gone
    owned_after = ((owned_before | set(added) | set(owned)) & present) - set(removed)
    if not added and not removed and owned_after == owned_before:
        return None
    permitted[name] = entries
    if owned_after:
        annotations[allow.annotation] = ",".join(sorted(owned_after))
    else:
        annotations.pop(allow.annotation, None)
    parts = []
    if added:
        parts.append(f"allowed {allow.label}" + ", ".join(added))
    if removed:
        parts.append(f"removed {allow.label}" + ", ".join(removed))
    return parts


def _marks_change(
    annotations: dict[str, Any],
    permitted: Mapping[str, Any],
    *,
    retire: Sequence[str],
    unmark: Sequence[str],
    now: str,
) -> list[str] | None:
    """:func:`allow_list_change` on the retiring marks, in place, after the lists changed: a
    mark is kept only on an owned mediatedDevices entry still there and not unmarked; a
    ``retire`` selector without a readable mark gets ``now``. A text that cannot be read
    counts as no mark (it is rewritten; the patch tests it as read). None: nothing changes."""
    before = annotations.get(KUBEVIRT_RETIRING_ANNOTATION)
    try:
        marks = parse_marks(before)
    except ClusterTextError:
        marks = {}
    owned = set(_split(annotations.get(KUBEVIRT_OWNED_ANNOTATION, "")))
    present = {_key_of(e, "mdevNameSelector") for e in permitted.get("mediatedDevices") or []}
    mine = owned & present
    after = {k: v for k, v in marks.items() if k in mine and k not in unmark}
    newly = [r for r in dict.fromkeys(retire) if r in mine and seconds(after.get(r, "")) is None]
    after.update(dict.fromkeys(newly, now))
    text = format_marks(after)
    if text == before or (text is None and before is None):
        return None
    if text is None:
        annotations.pop(KUBEVIRT_RETIRING_ANNOTATION, None)
    else:
        annotations[KUBEVIRT_RETIRING_ANNOTATION] = text
    cleared = sorted(k for k in marks if k not in after and k in set(unmark))
    parts = []
    if newly:
        parts.append("marked " + ", ".join(newly) + " retiring")
    if cleared:
        parts.append("cleared the retiring mark of " + ", ".join(cleared))
    return parts


def _split(text: object) -> list[str]:
    return [s.strip() for s in str(text or "").split(",") if s.strip()]


def allow_list_patch(
    kubevirt: Mapping[str, Any],
    *,
    add: Sequence[Mapping[str, Any]],
    remove: Sequence[str],
    owned: Sequence[str] = (),
    add_pci: Sequence[Mapping[str, Any]] = (),
    remove_pci: Sequence[str] = (),
    owned_pci: Sequence[str] = (),
    retire: Sequence[str] = (),
    unmark: Sequence[str] = (),
    now: str = "",
) -> tuple[list[dict[str, Any]], str] | None:
    """The JSON patch (RFC 6902 operations) that makes :func:`allow_list_change`'s change to
    ``kubevirt`` as read, plus its summary; None when nothing changes (pure).

    The patch names only ``mediatedDevices`` and ``pciHostDevices`` entries, the ownership
    annotations and the retiring marks' annotation. Every entry removed and each annotation's
    old value is tested first (a
    missing parent or key as ``null``: the API server's JSON patch, evanphx/json-patch v4,
    passes a ``null`` test of a missing key), so the patch fails, and writes nothing, if any
    of them changed since ``kubevirt`` was read. Entries are appended; removals go from the
    highest index down so each index still means the entry tested. A branch missing from the
    CR is added once, with every list that goes in it.
    """
    change = allow_list_change(
        kubevirt,
        add=add,
        remove=remove,
        owned=owned,
        add_pci=add_pci,
        remove_pci=remove_pci,
        owned_pci=owned_pci,
        retire=retire,
        unmark=unmark,
        now=now,
    )
    if change is None:
        return None
    after, summary = change
    tests: list[dict[str, Any]] = []
    writes: list[dict[str, Any]] = []
    #: Branches to add (their pointer tokens → value), each for one or both lists.
    branches: dict[tuple[str, ...], Any] = {}

    for allow in _ALLOW_LISTS:
        path = allow.path
        before_entries = _at(kubevirt, path)
        after_entries = list(_at(after, path) or [])
        if _at(after, path) is None or (
            isinstance(before_entries, list) and after_entries == before_entries
        ):
            continue  # this list does not change
        if not isinstance(before_entries, list):
            # No list yet (or null): create it at the first level that is missing.
            depth = _first_missing(kubevirt, path)
            value: Any = _thaw(after_entries)
            for key in reversed(path[depth + 1 :]):
                value = {key: value}
            branch = path[: depth + 1]
            branches[branch] = _merged(branches.get(branch), value)
            continue
        kept_keys = {_key_of(e, allow.key) for e in after_entries}
        gone = [i for i, e in enumerate(before_entries) if _key_of(e, allow.key) not in kept_keys]
        kept = [e for i, e in enumerate(before_entries) if i not in gone]
        appended = after_entries[len(kept) :]
        if after_entries[: len(kept)] != kept:  # allow_list_change only drops and appends
            raise ApplyError(f"the allow-list change is not removals and appends: {summary}")
        base = _pointer(*path)
        for i in gone:
            tests.append({"op": "test", "path": f"{base}/{i}", "value": _thaw(before_entries[i])})
        writes.extend({"op": "remove", "path": f"{base}/{i}"} for i in reversed(gone))
        writes.extend({"op": "add", "path": f"{base}/-", "value": _thaw(e)} for e in appended)
    for branch, value in branches.items():
        pointer = _pointer(*branch)
        tests.append({"op": "test", "path": pointer, "value": None})
        writes.append({"op": "add", "path": pointer, "value": value})

    annotations_before = _at(kubevirt, ("metadata", "annotations"))
    annotations_after = _at(after, ("metadata", "annotations")) or {}
    new_annotations: dict[str, Any] = {}
    for key in (*(a.annotation for a in _ALLOW_LISTS), KUBEVIRT_RETIRING_ANNOTATION):
        value_before = (
            annotations_before.get(key) if isinstance(annotations_before, Mapping) else None
        )
        value_after = annotations_after.get(key)
        if value_after == value_before:
            continue
        if not isinstance(annotations_before, Mapping):
            new_annotations[key] = value_after
            continue
        pointer = _pointer("metadata", "annotations", key)
        tests.append({"op": "test", "path": pointer, "value": value_before})
        if value_after is None:
            writes.append({"op": "remove", "path": pointer})
        else:
            writes.append({"op": "add", "path": pointer, "value": value_after})
    if new_annotations:
        pointer = _pointer("metadata", "annotations")
        tests.append({"op": "test", "path": pointer, "value": None})
        writes.append({"op": "add", "path": pointer, "value": new_annotations})
    return [*tests, *writes], summary


def _at(doc: Any, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(doc, Mapping):
            return None
        doc = doc.get(key)
    return doc


def _first_missing(doc: Any, path: Sequence[str]) -> int:
    """The index of the first key of ``path`` whose value in ``doc`` is missing (or not a
    mapping, for all but the last key): where a new branch has to be added."""
    for depth, key in enumerate(path[:-1]):
        doc = doc.get(key) if isinstance(doc, Mapping) else None
        if not isinstance(doc, Mapping):
            return depth
    return len(path) - 1


def _pointer(*tokens: str) -> str:
    """A JSON pointer (RFC 6901): ``~`` and ``/`` inside a token escaped."""
    return "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in tokens)


def _merged(into: Any, value: Any) -> Any:
    """``value`` deep-merged into ``into`` (None: nothing yet): two lists' branches as one."""
    if isinstance(into, dict) and isinstance(value, dict):
        for k, v in value.items():
            into[k] = _merged(into.get(k), v)
        return into
    return value


def _key_of(entry: Any, key: str) -> str | None:
    return str(entry.get(key)) if isinstance(entry, Mapping) else None


# -- events -------------------------------------------------------------------------------------

#: Host action kind → (object kind it is about, reason when done, reason when failed).
_HOST_EVENTS: Mapping[ActionKind, tuple[str, str, str]] = {
    ActionKind.VGPU_CREATE: (VGPU_KIND, "VGPUCreated", "VGPUCreateFailed"),
    ActionKind.VGPU_REMOVE: (VGPU_KIND, "VGPURemoved", "VGPURemoveFailed"),
    ActionKind.SRIOV_ENABLE: (SRIOV_GPU_KIND, "SRIOVEnabled", "SRIOVEnableFailed"),
    ActionKind.SRIOV_DISABLE: (SRIOV_GPU_KIND, "SRIOVDisabled", "SRIOVDisableFailed"),
    ActionKind.VGPU_MODE: (SRIOV_GPU_KIND, "VGPUModeSet", "VGPUModeSetFailed"),
}


def record_host_events(
    outcomes: Sequence[Outcome],
    *,
    node: str,
    events: EventSink,
    blocked: Sequence[Blocked] = (),
) -> None:
    """Events for what the host executor did (vGPU created / removed / failed, SR-IOV on or
    off) and what the plan blocked, on the VGPUDevice (VF) or SRIOVGPUDevice (GPU) object.

    Record them after the CR writes, so a first apply's objects exist when looked at.
    """
    for o in outcomes:
        spec = _HOST_EVENTS.get(o.action.kind)
        name = _object_for(node, o.action.target)
        if spec is None or name is None:
            continue
        kind, done, failed = spec
        if o.status is OutcomeStatus.DONE:
            events.event(kind, name, reason=done, message=o.message)
        elif o.status is OutcomeStatus.FAILED:
            events.event(kind, name, reason=failed, message=o.message, type="Warning")
    for b in blocked:
        spec = _HOST_EVENTS.get(b.kind)
        name = _object_for(node, b.target)
        if spec is None or name is None:
            continue
        reason = "VGPURemovalBlocked" if b.kind is ActionKind.VGPU_REMOVE else "Blocked"
        events.event(spec[0], name, reason=reason, message=b.reason, type="Warning")


def _object_for(node: str, target: str) -> str | None:
    if not PciAddress.is_valid(target):
        return None
    return object_name(node, str(PciAddress.parse(target)))


def _failure_event(events: EventSink, action: ClusterAction, message: str) -> None:
    if isinstance(action, KubevirtUpdate):
        return  # not one of our objects
    kind = _object_kind(action)
    reason = {
        ActionKind.CR_CREATE: "CreateFailed",
        ActionKind.CR_UPDATE: "UpdateFailed",
        ActionKind.CR_DELETE: "DeleteFailed",
    }[action.kind]
    events.event(kind, action.target, reason=reason, message=message, type="Warning")


# -- helpers ------------------------------------------------------------------------------------


def _after(conflicts: int) -> str:
    if not conflicts:
        return ""
    return f" (after {conflicts} conflict{'s' if conflicts > 1 else ''}: re-read and re-planned)"


def _plain(value: Mapping[str, Any]) -> dict[str, Any]:
    """A mutable deep copy of a (possibly read-only) JSON mapping."""
    out: dict[str, Any] = _thaw(value)
    return out


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_thaw(v) for v in value]
    return value
