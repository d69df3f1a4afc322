"""Delegate mode's executor: each spec write of a plan, in order, with the waits
pcidevices-controller needs between them (docs/delegate.md).

For each step, bounded by ``timeout`` (long enough for a node resync, about 30 s, by default):

1. **Before**, the state the webhook and the controller will check: a ``vgpudevice-enable``
   waits until the VF hosts nothing (``status.vGPUStatus`` empty) and its
   ``status.availableTypes`` lists the profile; a ``vgpudevice-disable`` or
   ``sriovgpudevice-disable`` first asks who uses the device *now* (VMs and VMIs read again) and
   never writes while anything does. A ``vgpudevice-enable`` planned ahead, on an object not
   made yet (``object_exists`` False: its GPU's SR-IOV was off), first waits for its
   ``VGPUDevice`` to appear and checks it is the one predicted (name, VF address, parent GPU,
   VF index), else fails naming both, before anything is written to it.
2. **The write**: a JSON patch that tests the spec field it changes still holds the planned
   value (so a concurrent edit is a conflict, "plan again", while the controller's own status
   writes, which bump ``resourceVersion``, are not), then sets it.
3. **After**, until the controller reports the step: ``vGPUStatus: vGPUConfigured`` with
   ``configureVGPUTypeName`` the profile and a ``uuid``; ``vGPUStatus`` empty; the GPU's
   ``VGPUDevice`` objects listed in its status; its ``vfAddresses`` gone.

A ``vgpudevice-enable`` of the profile an enabled VF hosts while its spec asks another (a type
change the controller ignores) writes the spec back to that profile: one JSON patch testing
``enabled`` and the type it replaces, no wait (the status already shows it).

Consecutive ``vgpudevice-enable`` steps on one GPU, and consecutive ``vgpudevice-disable``
steps of one node, go out together: each one's checks (1) and write (2), then the waits (3),
so the first wait covers the others (:meth:`DelegateExecutor._run_together`, which cites why
pcidevices allows it).

A step already in effect is a no-op. A step whose spec is written but whose status does not
show it (``pending``, or an earlier run's write the controller has not carried out) is not
written again: only its wait runs, and when that is over the failure says what the status
shows (the controller writes no Events or conditions to read a cause from). A webhook's denial
is reported with its words, and stops the run, as any failure does: the steps after it are not
run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

from reconciler.apply.executor import ApplyResult, Outcome, OutcomeStatus
from reconciler.model import (
    Action,
    Plan,
    ReconcilerError,
    SriovGpuDeviceDisable,
    SriovGpuDeviceEnable,
    VgpuDeviceDisable,
    VgpuDeviceEnable,
)
from reconciler.model.cluster import GROUP, SRIOV_GPU_PLURAL, VERSION, VGPU_PLURAL, object_name
from reconciler.model.clusterapi import ClusterApi
from reconciler.model.harvester import DriverPod, HarvesterGpu, HarvesterVf
from reconciler.model.record import record
from reconciler.observe.harvester_devices import ObjectError, parse_gpu, parse_vf

_T = TypeVar("_T")

#: How long one wait may take by default (a node resync is about 30 s; a vGPU create or
#: ``sriov-manage`` run on top of it).
DEFAULT_TIMEOUT = 180.0
#: How often the objects are read while waiting, at most (the first reads come sooner).
DEFAULT_POLL = 1.0
#: The first pause of a wait: the controller often reports a step within a fraction of a
#: second, and a wait should not cost a whole poll then.
FIRST_POLL = 0.05


def poll_delays(poll: float) -> Iterator[float]:
    """The pauses between two reads of a wait: 0.05 s doubling up to ``poll``, then ``poll``."""
    delay = min(FIRST_POLL, poll)
    while True:
        yield delay
        delay = min(delay * 2, poll)


class StepFailed(Exception):
    """A step that did not happen, and why (for the outcome)."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.transient = transient


@record
class DelegateExecutor:
    """Runs a delegate plan's steps against the cluster."""

    api: ClusterApi
    #: Who uses each of the node's ``VGPUDevice``s now (name → ``VM <ns>/<name>``), read again
    #: right before every disable.
    used_by: Callable[[], Mapping[str, str]]
    timeout: float = DEFAULT_TIMEOUT
    poll: float = DEFAULT_POLL
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    on_outcome: Callable[[Outcome], None] | None = None
    #: Told of each step as it begins (its checks, write and wait), before it is run.
    on_step: Callable[[Action], None] | None = None
    #: Asked right before every write; raises (a :class:`ReconcilerError`) to stop the run
    #: there (the watch's leadership: a replica that lost its Lease writes nothing more).
    guard: Callable[[], None] | None = None
    #: The node's NVIDIA driver pod when it is not ready, read again when a wait times out:
    #: the cause its message names then (None: not read).
    driver: Callable[[], DriverPod | None] | None = None

    def run(self, plan: Plan, *, run_id: str = "") -> ApplyResult:
        outcomes: list[Outcome] = []
        actions = list(plan.actions)
        i = 0
        while i < len(actions):
            batch = _together(actions, i)
            if len(batch) > 1:
                done = self._run_together(batch)
            else:
                self._begin(actions[i])
                done = [self._outcome(actions[i], self.clock(), partial(self._step, actions[i]))]
            for outcome in done:
                outcomes.append(outcome)
                if self.on_outcome is not None:
                    self.on_outcome(outcome)
            failed = next((o for o in done if o.status is OutcomeStatus.FAILED), None)
            if failed is not None:
                ran = i + len(done)
                return ApplyResult(plan.node, run_id, tuple(outcomes), tuple(actions[ran:]))
            i += max(1, len(batch))
        return ApplyResult(plan.node, run_id, tuple(outcomes))

    def _begin(self, action: Action) -> None:
        if self.on_step is not None:
            self.on_step(action)

    def _outcome(
        self, action: Action, started: float, step: Callable[[], tuple[OutcomeStatus, str]]
    ) -> Outcome:
        """``step``'s outcome for ``action``; a failure is an outcome, not an exception."""
        try:
            status, message = step()
            return Outcome(action, status, message, seconds=self.clock() - started)
        except StepFailed as e:
            return Outcome(
                action,
                OutcomeStatus.FAILED,
                e.message,
                transient=e.transient,
                seconds=self.clock() - started,
            )
        except ReconcilerError as e:
            return Outcome(
                action,
                OutcomeStatus.FAILED,
                e.message,
                transient=getattr(e, "transient", False),
                seconds=self.clock() - started,
            )

    def _run_together(self, batch: Sequence[VgpuDeviceEnable | VgpuDeviceDisable]) -> list[Outcome]:
        """Steps that go out together (:func:`_together`): each one's checks and write in the
        plan's order, then each one's wait. A failed check or write stops the writes there;
        the steps written are still waited for and reported, the ones after the failure are
        not run. The first wait covers the others: they are carried out side by side.

        Enables of one GPU's VFs: the webhook admits each against its own object's
        ``status.availableTypes`` (pkg/webhook/vgpu.go ``Update``, ``validateVGPUProfiles``
        on the old object) and the controller carries each out on its own
        (vgpu_controller.go ``OnVGPUChange``: that object's sysfs status, ``enableVGPU`` of
        that object), so nothing in pcidevices orders one VF's enable after another's; they
        share the GPU's size (a delegate layout is equal-size: a plan only lines up enables
        of the size the GPU ends with), which the driver hosts side by side.

        Disables of one node's VFs: the webhook judges each on its own object alone
        (pkg/webhook/vgpu.go ``Update``: ``checkVGPUUsage`` of that VGPUDevice's name) and
        the controller removes each VF's vGPU on its own (vgpu_controller.go ``disableVGPU``:
        ``0`` written to that VF's ``nvidia/current_vgpu_type``, then that object's
        ``UpdateStatus``; ``reconcileDisabledVGPUStatus`` only requeues disabled siblings to
        refresh their ``availableTypes``). Who uses each VF is read again right before its
        own write, so a VM that takes one while the others are written still blocks it."""
        started = self.clock()
        results: list[Outcome | None] = []
        for a in batch:
            self._begin(a)
            first = self._outcome(a, started, partial(self._start, a))
            if first.status is OutcomeStatus.FAILED:
                results.append(first)
                break
            results.append(None if first.status is OutcomeStatus.SKIPPED else first)
        # The failed one, if any, is the last: the steps after it are not run.
        return [
            self._outcome(a, started, partial(self._finish, a)) if r is None else r
            for a, r in zip(batch, results, strict=False)
        ]

    def _start(self, a: VgpuDeviceEnable | VgpuDeviceDisable) -> tuple[OutcomeStatus, str]:
        if isinstance(a, VgpuDeviceEnable):
            return self._start_enable(a)
        return self._start_disable(a)

    def _finish(self, a: VgpuDeviceEnable | VgpuDeviceDisable) -> tuple[OutcomeStatus, str]:
        if isinstance(a, VgpuDeviceEnable):
            return self._finish_enable(a)
        return self._finish_disable(a)

    # -- one step ---------------------------------------------------------------------------

    def _step(self, action: Action) -> tuple[OutcomeStatus, str]:
        match action:
            case VgpuDeviceEnable():
                return self._enable_vf(action)
            case VgpuDeviceDisable():
                return self._disable_vf(action)
            case SriovGpuDeviceEnable():
                return self._enable_gpu(action)
            case SriovGpuDeviceDisable():
                return self._disable_gpu(action)
        return OutcomeStatus.SKIPPED, "skipped: not a delegate step"

    def _enable_vf(self, a: VgpuDeviceEnable) -> tuple[OutcomeStatus, str]:
        started = self._start_enable(a)
        if started[0] is not OutcomeStatus.SKIPPED:
            return started
        return self._finish_enable(a)

    def _start_enable(self, a: VgpuDeviceEnable) -> tuple[OutcomeStatus, str]:
        """An enable's checks and its write; SKIPPED: its wait is left to :meth:`_finish_enable`
        (written now, or written earlier and not carried out yet)."""
        if not a.object_exists:
            self._made_as_predicted(a)
        vf = self._vf(a.target)
        if vf.enabled and vf.type_name == a.type_name:
            # Written already (by an earlier run, or pending): never written again, waited for.
            if vf.hosts == a.type_name:
                return OutcomeStatus.NOOP, f"already hosts {a.type_name}"
        elif vf.enabled and vf.type_name and vf.hosts == a.type_name:
            # A type change pcidevices-controller ignores (plan/delegate.py ``ignored_change``)
            # over the profile the plan keeps: the spec is set back to it, the vGPU untouched.
            self._patch(
                VGPU_PLURAL,
                a.target,
                [
                    {"op": "test", "path": "/spec/enabled", "value": True},
                    {"op": "test", "path": "/spec/vGPUTypeName", "value": vf.type_name},
                    {"op": "replace", "path": "/spec/vGPUTypeName", "value": a.type_name},
                ],
            )
            return OutcomeStatus.DONE, f"spec set back to {a.type_name}, which it hosts"
        elif vf.enabled:
            raise StepFailed(
                f"{a.target} is enabled with {vf.type_name or 'no profile'}, but the plan expects "
                "it disabled: the object changed since the plan was made; run plan again"
            )
        else:
            vf = self._wait(
                lambda: self._vf(a.target),
                lambda v: not v.configured and a.type_name in v.available,
                lambda v: (
                    f"{a.target} never offered {a.type_name} within {self.timeout:g} s "
                    f"(status.availableTypes: {', '.join(sorted(v.available)) or 'none'}"
                    f"{'; it still hosts a vGPU' if v.configured else ''})"
                    f"{self._driver_cause(a.node, sriov=False, lead='; ')}"
                ),
            )
            self._set_enabled(
                VGPU_PLURAL,
                a.target,
                True,
                also=({"op": "add", "path": "/spec/vGPUTypeName", "value": a.type_name},),
            )
        return OutcomeStatus.SKIPPED, "written"

    def _finish_enable(self, a: VgpuDeviceEnable) -> tuple[OutcomeStatus, str]:
        """Waits until the VF hosts the enable's profile."""
        self._wait(
            lambda: self._vf(a.target),
            lambda v: v.hosts == a.type_name,
            lambda v: _not_carried_out(
                v,
                f"the enable of {a.type_name}",
                self.timeout,
                self._driver_cause(a.node, sriov=False, lead="; "),
            ),
        )
        return OutcomeStatus.DONE, f"enabled {a.type_name}"

    def _made_as_predicted(self, a: VgpuDeviceEnable) -> None:
        """A step planned ahead (``object_exists`` False): waits until the GPU's status lists
        its VGPUDevices (pcidevices-controller makes them at a node resync after the enable,
        ``status.vGPUDevices`` all at once: gpuhelper.go ``GenerateGPUStatus``) and the
        predicted one exists, then checks it is the object predicted: its name listed, its
        ``spec.address`` and ``spec.parentGPUDeviceAddress`` the planned VF and GPU, and its
        place among the GPU's VFs (address order) the planned VF index. Otherwise the VFs are
        not where the catalogue put them, and the step fails before anything is written."""
        parent = object_name(a.node, str(a.gpu))
        gpu = self._wait(
            lambda: self._gpu(parent),
            lambda g: (
                bool(g.vgpu_devices) and (a.target not in g.vgpu_devices or self._exists(a.target))
            ),
            lambda g: (
                f"pcidevices-controller made no VGPUDevice {a.target} (VF {a.vf}) within "
                f"{self.timeout:g} s (status.vGPUDevices of {parent}: "
                f"{_names(g.vgpu_devices) if g.vgpu_devices else 'none yet'})"
            ),
        )
        predicted = (
            f"the plan predicted VGPUDevice {a.target} for VF {a.vf} (VF {a.vf_index} of GPU "
            f"{a.gpu}, from the catalogue's VF offset and stride)"
        )
        again = "nothing was written to it: run plan again, which plans from the objects made"
        if a.target not in gpu.vgpu_devices:
            raise StepFailed(
                f"{predicted}, but pcidevices-controller made other VGPUDevices: "
                f"{_names(gpu.vgpu_devices)} (status.vGPUDevices of {parent}); {again}",
                transient=True,
            )
        vf = self._vf(a.target)
        order = sorted(gpu.vf_addresses)
        index = order.index(vf.address) if vf.address in order else None
        if (vf.address, vf.parent, index) != (a.vf, a.gpu, a.vf_index):
            found = f"VF {index}" if index is not None else "not listed in status.vfAddresses"
            raise StepFailed(
                f"{predicted}, but the object made is VF {vf.address} of GPU {vf.parent} "
                f"({found} of {parent}'s {len(order)}, first {order[0] if order else 'none'}); "
                f"{again}",
                transient=True,
            )

    def _disable_vf(self, a: VgpuDeviceDisable) -> tuple[OutcomeStatus, str]:
        started = self._start_disable(a)
        if started[0] is not OutcomeStatus.SKIPPED:
            return started
        return self._finish_disable(a)

    def _start_disable(self, a: VgpuDeviceDisable) -> tuple[OutcomeStatus, str]:
        """A disable's check (no VM uses the VF, read now) and its write; SKIPPED: its wait is
        left to :meth:`_finish_disable` (written now, or written earlier and not carried out
        yet)."""
        vf = self._vf(a.target)
        if vf.enabled:
            self._refuse_if_used((a.target,))
            self._set_enabled(VGPU_PLURAL, a.target, False)
        elif not vf.configured:
            return OutcomeStatus.NOOP, "already disabled"
        return OutcomeStatus.SKIPPED, "written"

    def _finish_disable(self, a: VgpuDeviceDisable) -> tuple[OutcomeStatus, str]:
        """Waits until the VF hosts no vGPU."""
        self._wait(
            lambda: self._vf(a.target),
            lambda v: not v.configured,
            lambda v: _not_carried_out(
                v, "the disable", self.timeout, self._driver_cause(a.node, sriov=False, lead="; ")
            ),
        )
        return OutcomeStatus.DONE, f"disabled ({a.type_name} removed)"

    def _enable_gpu(self, a: SriovGpuDeviceEnable) -> tuple[OutcomeStatus, str]:
        gpu = self._gpu(a.target)
        if gpu.enabled and gpu.vgpu_devices:
            return OutcomeStatus.NOOP, "already enabled"
        if not gpu.enabled:
            self._set_enabled(SRIOV_GPU_PLURAL, a.target, True)
        done = self._wait(
            lambda: self._gpu(a.target),
            lambda g: bool(g.vgpu_devices) and all(self._exists(n) for n in g.vgpu_devices),
            lambda g: (
                f"pcidevices-controller made no VGPUDevices for {a.target} within "
                f"{self.timeout:g} s (VFs: {len(g.vf_addresses)}, VGPUDevices listed: "
                f"{len(g.vgpu_devices)}"
                f"{self._driver_cause(a.node, sriov=True, lead='): ') or RESYNC}"
            ),
        )
        return OutcomeStatus.DONE, f"enabled ({len(done.vgpu_devices)} VGPUDevices)"

    def _disable_gpu(self, a: SriovGpuDeviceDisable) -> tuple[OutcomeStatus, str]:
        gpu = self._gpu(a.target)
        if not gpu.enabled and not gpu.vf_addresses:
            return OutcomeStatus.NOOP, "already disabled"
        if gpu.enabled:
            self._refuse_if_used(gpu.vgpu_devices)
            self._set_enabled(SRIOV_GPU_PLURAL, a.target, False)
        self._wait(
            lambda: self._gpu(a.target),
            lambda g: not g.vf_addresses,
            lambda g: (
                f"pcidevices-controller did not disable SR-IOV on {a.target} within "
                f"{self.timeout:g} s ({len(g.vf_addresses)} VFs still listed)"
                f"{self._driver_cause(a.node, sriov=True, lead=': ')}"
            ),
        )
        return OutcomeStatus.DONE, "disabled"

    # -- reads, writes, waits --------------------------------------------------------------

    def _vf(self, name: str) -> HarvesterVf:
        raw = self._get(VGPU_PLURAL, name)
        try:
            return parse_vf(raw)
        except ObjectError as e:
            raise StepFailed(f"VGPUDevice {e}") from None

    def _gpu(self, name: str) -> HarvesterGpu:
        raw = self._get(SRIOV_GPU_PLURAL, name)
        try:
            return parse_gpu(raw)
        except ObjectError as e:
            raise StepFailed(f"SRIOVGPUDevice {e}") from None

    def _exists(self, name: str) -> bool:
        found = self.api.get_object(group=GROUP, version=VERSION, plural=VGPU_PLURAL, name=name)
        return found is not None

    def _get(self, plural: str, name: str) -> dict[str, Any]:
        raw = self.api.get_object(group=GROUP, version=VERSION, plural=plural, name=name)
        if raw is None:
            raise StepFailed(f"{plural}/{name} is gone: run plan again")
        return raw

    def _set_enabled(
        self,
        plural: str,
        name: str,
        enabled: bool,
        *,
        also: Sequence[dict[str, Any]] = (),
    ) -> None:
        """Flip ``spec.enabled`` to ``enabled``: a JSON patch that first tests it still holds
        the other value (a concurrent edit is a conflict), with ``also`` between the two."""
        self._patch(
            plural,
            name,
            [
                {"op": "test", "path": "/spec/enabled", "value": not enabled},
                *also,
                {"op": "replace", "path": "/spec/enabled", "value": enabled},
            ],
        )

    def _patch(self, plural: str, name: str, ops: Sequence[dict[str, Any]]) -> None:
        if self.guard is not None:
            self.guard()
        self.api.patch_object(group=GROUP, version=VERSION, plural=plural, name=name, patch=ops)

    def _refuse_if_used(self, names: Sequence[str]) -> None:
        used = self.used_by()
        for name in names:
            if name in used:
                raise StepFailed(
                    f"{name} is in use by {used[name]} now: not disabled", transient=True
                )

    def _driver_cause(self, node: str, *, sriov: bool, lead: str) -> str:
        """Why a wait on ``node`` timed out when its NVIDIA driver pod is not ready now
        (``lead`` before it), else ""."""
        try:
            pod = self.driver() if self.driver is not None else None
        except ReconcilerError:  # the timeout's own message is said then
            pod = None
        return "" if pod is None else lead + pod.blocks(node, sriov=sriov)

    def _wait(
        self,
        read: Callable[[], _T],
        ready: Callable[[_T], bool],
        why: Callable[[_T], str],
    ) -> _T:
        deadline = self.clock() + self.timeout
        for delay in poll_delays(self.poll):
            value = read()
            if ready(value):
                return value
            if self.clock() >= deadline:
                raise StepFailed(why(value), transient=True)
            self.sleep(delay)
        raise AssertionError("unreachable: poll_delays never ends")  # pragma: no cover


def _together(actions: Sequence[Action], start: int) -> list[VgpuDeviceEnable | VgpuDeviceDisable]:
    """The steps from ``start`` on that go out together (:meth:`DelegateExecutor._run_together`):
    consecutive ``vgpudevice-enable`` steps on one GPU of one node, or consecutive
    ``vgpudevice-disable`` steps of one node; any other step goes alone (``[]``). The plan's
    order between kinds is kept: a batch ends at the first step of another kind, and is done
    (written and waited for) before that step starts."""
    first = actions[start]
    if isinstance(first, VgpuDeviceEnable):
        batch: list[VgpuDeviceEnable | VgpuDeviceDisable] = [first]
        for a in actions[start + 1 :]:
            if not isinstance(a, VgpuDeviceEnable) or (a.node, a.gpu) != (first.node, first.gpu):
                break
            batch.append(a)
        return batch
    if isinstance(first, VgpuDeviceDisable):
        batch = [first]
        for b in actions[start + 1 :]:
            if not isinstance(b, VgpuDeviceDisable) or b.node != first.node:
                break
            batch.append(b)
        return batch
    return []


#: How a wait for an enabled GPU's VGPUDevices ends its message when nothing more is known.
RESYNC = "; it makes them at a node resync)"


def _not_carried_out(vf: HarvesterVf, what: str, timeout: float, driver: str = "") -> str:
    """Why a VF's step is not done after its wait: the most specific cause vgpuctl can read.
    pcidevices-controller (bdd8025) writes no Events and no conditions: when ``enableVGPU`` or
    ``disableVGPU`` (pkg/controller/gpudevice/vgpu_controller.go) fails, it returns the error
    to wrangler, which logs it and retries, and the status stays as it was. ``driver``: the
    node's NVIDIA driver pod is not ready, said in place of the log hint."""
    other = vf.hosts if vf.enabled and vf.hosts != vf.type_name else ""
    hint = (
        f"; it hosts {other}: pcidevices-controller ignores a type change on an enabled "
        "VGPUDevice (disable it first)"
        if other
        else driver
        or "; pcidevices-controller writes no Events or conditions: its log names the error"
    )
    return (
        f"pcidevices-controller has not carried out {what} on {vf.name} after {timeout:g} s "
        f"(spec.enabled: {str(vf.enabled).lower()}; status.vGPUStatus: {_status(vf)}, "
        f"configureVGPUTypeName: {vf.configured_type or 'empty'}, uuid: {vf.uuid or 'empty'})"
        f"{hint}"
    )


def _names(names: Sequence[str], shown: int = 4) -> str:
    """The first ``shown`` of ``names`` (read from the API server), and how many in all."""
    names = sorted(names)  # status order is virtfn glob order; names sort as addresses do
    head = ", ".join(names[:shown])
    return head if len(names) <= shown else f"{head}, … ({len(names)} in all)"


def _status(vf: HarvesterVf) -> str:
    return "vGPUConfigured" if vf.configured else "empty"
