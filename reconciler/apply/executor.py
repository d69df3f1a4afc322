"""The executor: runs a plan's actions in order, idempotently, and reports each outcome.

For every action it journals an intent, re-reads the exact state the action depends on (the
effect already there → a no-op with its reason; the host not as planned → a clear failure
instead of a guess), acts through the :class:`~reconciler.apply.ports.HostDriver`, then waits a
bounded time for the effect to become visible, because a driver may report success having done
nothing (``sriov-manage`` exiting 0, docs/domain.md §2). The first failure stops the run.

Steps are looked up in a table by :class:`~reconciler.model.ActionKind`; only host steps exist
yet, and other kinds are recorded as skipped. Step logic speaks only the driver port, so a new
host interface is a new driver, not a new executor.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import Any, Protocol

from reconciler.apply.errors import (
    DeviceBusyError,
    DriverRefusedError,
    HostChangedError,
    VerificationError,
)
from reconciler.apply.journal import RUN_KIND, Journal, Phase, Removal
from reconciler.apply.mandate import HostMandate, refused
from reconciler.apply.ports import HostDriver
from reconciler.model import (
    Action,
    ApplyError,
    PciAddress,
    Plan,
    Problem,
    ReconcilerError,
    SriovDisable,
    SriovEnable,
    VgpuCreate,
    VgpuMode,
    VgpuModeSet,
    VgpuRemove,
)
from reconciler.model.plan_json import action_to_json
from reconciler.model.record import record


class OutcomeStatus(enum.StrEnum):
    DONE = "done"
    NOOP = "noop"
    FAILED = "failed"
    SKIPPED = "skipped"


@record(frozen=True, slots=True)
class Outcome:
    """What became of one action, and why."""

    action: Action
    status: OutcomeStatus
    message: str
    #: For a failure: whether running again later may succeed unchanged (a VM let go, …).
    transient: bool = False
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.action.seq,
            "kind": self.action.kind.value,
            "target": self.action.target,
            "status": self.status.value,
            "message": self.message,
            "transient": self.transient,
            "seconds": round(self.seconds, 3),
        }


@record(frozen=True, slots=True)
class ApplyCounts:
    done: int
    noop: int
    failed: int
    skipped: int
    not_run: int

    def to_json(self) -> dict[str, int]:
        return {
            "done": self.done,
            "noop": self.noop,
            "failed": self.failed,
            "skipped": self.skipped,
            "notRun": self.not_run,
        }

    def __str__(self) -> str:
        return (
            f"{self.done} done, {self.noop} no-op, {self.failed} failed, "
            f"{self.skipped} skipped, {self.not_run} not run"
        )


@record(frozen=True, slots=True)
class ApplyResult:
    """Every attempted action's outcome in plan order; the actions after a failure, not run."""

    node: str
    run_id: str
    outcomes: tuple[Outcome, ...]
    not_run: tuple[Action, ...] = ()

    @property
    def failed(self) -> Outcome | None:
        for o in self.outcomes:
            if o.status is OutcomeStatus.FAILED:
                return o
        return None

    @property
    def ok(self) -> bool:
        return self.failed is None

    @property
    def changed(self) -> bool:
        return any(o.status is OutcomeStatus.DONE for o in self.outcomes)

    @property
    def counts(self) -> ApplyCounts:
        def n(status: OutcomeStatus) -> int:
            return sum(1 for o in self.outcomes if o.status is status)

        return ApplyCounts(
            done=n(OutcomeStatus.DONE),
            noop=n(OutcomeStatus.NOOP),
            failed=n(OutcomeStatus.FAILED),
            skipped=n(OutcomeStatus.SKIPPED),
            not_run=len(self.not_run),
        )

    def to_json(self) -> dict[str, Any]:
        failed = self.failed
        return {
            "node": self.node,
            "run": self.run_id,
            "ok": self.ok,
            "outcomes": [o.to_json() for o in self.outcomes],
            "failed": None if failed is None else failed.to_json(),
            "notRun": [action_to_json(a) for a in self.not_run],
            "counts": self.counts.to_json(),
        }


# -- steps --------------------------------------------------------------------------------------


@record(frozen=True, slots=True)
class _Context:
    driver: HostDriver
    verify_timeout: float
    wait_until: Callable[[Callable[[], bool]], bool]
    #: What the run may touch; None: unchecked (the executor's own unit tests).
    mandate: HostMandate | None = None
    #: Called before each action; raises (a ``ReconcilerError``) when the run may no longer
    #: act: a node agent's rollout slot it could not renew (``slots.py``).
    guard: Callable[[], None] | None = None


class _Step(Protocol):
    """One action's host logic. Constructed from the action (its fields checked then)."""

    #: The GPU (PF) the action acts on.
    gpu: PciAddress

    def precheck(self, ctx: _Context) -> str | None:
        """Re-read the host: a no-op reason when the effect is there, ``None`` to act.

        Raises ``ApplyError`` when the host is not as the plan expects.
        """
        ...

    def act(self, ctx: _Context) -> None: ...

    def visible(self, ctx: _Context) -> bool:
        """Whether the effect can be seen on the host now."""
        ...

    def unverified(self, ctx: _Context) -> str:
        """Why the effect never showed (called after the bounded wait ran out)."""
        ...

    def done(self) -> str: ...


class _BadParams(Exception):
    """An action's fields do not fit together (collected for every action before any runs)."""


def _text(value: str, name: str) -> str:
    if not value:
        raise _BadParams(f"{name} must not be empty")
    return value


def _address(text: object, what: str) -> PciAddress:
    try:
        return PciAddress.parse(str(text))
    except ValueError as e:
        raise _BadParams(f"{what}: {e}") from None


def _check_nvidia_bound(ctx: _Context, gpu: PciAddress) -> None:
    """Refuse to run sriov-manage on a PF another driver has: ``sriov-manage -e`` unbinds it
    (docs/domain.md §2), and a GPU bound to vfio-pci is a VM's whole GPU. The planner never plans
    that; this guards against a plan that does anyway."""
    driver = ctx.driver.pf_driver(gpu)
    if driver != "nvidia":
        bound = f"bound to {driver}" if driver else "bound to no driver"
        raise DriverRefusedError(
            f"{gpu} is {bound}, not nvidia: it is passed through whole or reserved; "
            "sriov-manage is not run on it"
        )


class _EnableStep:
    def __init__(self, action: SriovEnable) -> None:
        self.gpu = action.gpu
        if _address(action.target, "target") != self.gpu:
            raise _BadParams(f"target {action.target} is not gpu {self.gpu}")
        self.want: int = action.num_vfs
        if self.want < 1:
            raise _BadParams("numVFs must be at least 1")

    def _seen(self, ctx: _Context) -> tuple[int, int]:
        return ctx.driver.num_vfs(self.gpu), len(ctx.driver.vf_addresses(self.gpu))

    def precheck(self, ctx: _Context) -> str | None:
        _check_nvidia_bound(ctx, self.gpu)
        num, links = self._seen(ctx)
        if num == links == self.want:
            return f"already enabled ({num} VFs)"
        if num and num != self.want:
            raise HostChangedError(
                f"{self.gpu} already has {num} VFs but the plan expects {self.want}: "
                "the host changed since the plan was made; run plan again"
            )
        return None

    def act(self, ctx: _Context) -> None:
        ctx.driver.enable_sriov(self.gpu)

    def visible(self, ctx: _Context) -> bool:
        return self._seen(ctx) == (self.want, self.want)

    def unverified(self, ctx: _Context) -> str:
        num, links = self._seen(ctx)
        return (
            f"SR-IOV enable on {self.gpu} reported success but the VF count never appeared: "
            f"expected {self.want} VFs within {ctx.verify_timeout:g} s, "
            f"found sriov_numvfs {num} and {links} virtfn links"
        )

    def done(self) -> str:
        return f"enabled {self.want} VFs"


class _DisableStep:
    def __init__(self, action: SriovDisable) -> None:
        self.gpu = action.gpu
        if _address(action.target, "target") != self.gpu:
            raise _BadParams(f"target {action.target} is not gpu {self.gpu}")

    def _seen(self, ctx: _Context) -> tuple[int, int]:
        return ctx.driver.num_vfs(self.gpu), len(ctx.driver.vf_addresses(self.gpu))

    def precheck(self, ctx: _Context) -> str | None:
        _check_nvidia_bound(ctx, self.gpu)
        if self._seen(ctx) == (0, 0):
            return "already disabled"
        # Disabling destroys every vGPU on the GPU; the plan removes them first, so one still
        # there means the host changed (or a removal was blocked): never sweep it away.
        for vf in ctx.driver.vf_addresses(self.gpu):
            hosted = ctx.driver.vgpu_on(vf)
            if hosted is not None:
                raise HostChangedError(
                    f"{self.gpu} still hosts vGPU {hosted.uuid} ({hosted.type_name}) on {vf}: "
                    "not disabling SR-IOV under it; run plan again"
                )
            pending = ctx.driver.removal_pending(vf)
            if pending is not None:
                raise DeviceBusyError(
                    f"{self.gpu}: vGPU {pending} on {vf} is still being removed (the kernel waits "
                    "for whatever holds it to let go): not disabling SR-IOV under it"
                )
        return None

    def act(self, ctx: _Context) -> None:
        ctx.driver.disable_sriov(self.gpu)

    def visible(self, ctx: _Context) -> bool:
        return self._seen(ctx) == (0, 0)

    def unverified(self, ctx: _Context) -> str:
        num, links = self._seen(ctx)
        return (
            f"SR-IOV disable on {self.gpu} reported success but VFs remained after "
            f"{ctx.verify_timeout:g} s: sriov_numvfs {num}, {links} virtfn links"
        )

    def done(self) -> str:
        return "disabled SR-IOV"


class _ModeStep:
    """``nvidia-smi vgpu -i <gpu> -shm 0|1``: taken by the driver only while SR-IOV is on and
    the GPU hosts no vGPU, which the precheck re-reads (a vGPU found means the host changed:
    the switch is never forced under it)."""

    def __init__(self, action: VgpuModeSet) -> None:
        self.gpu = action.gpu
        if _address(action.target, "target") != self.gpu:
            raise _BadParams(f"target {action.target} is not gpu {self.gpu}")
        if action.mode is VgpuMode.UNKNOWN:
            raise _BadParams("mode must be equal-size or mixed-size")
        self.mode = action.mode
        self._shown = True

    def _now(self, ctx: _Context) -> VgpuMode | None:
        return ctx.driver.vgpu_modes().modes.get(self.gpu)

    def precheck(self, ctx: _Context) -> str | None:
        _check_nvidia_bound(ctx, self.gpu)
        vfs = ctx.driver.vf_addresses(self.gpu)
        if not vfs or ctx.driver.num_vfs(self.gpu) == 0:
            raise HostChangedError(
                f"{self.gpu} has SR-IOV off: its vGPU mode is set after sriov-manage -e; "
                "run plan again"
            )
        for vf in vfs:
            hosted = ctx.driver.vgpu_on(vf)
            if hosted is not None:
                raise HostChangedError(
                    f"{self.gpu} hosts vGPU {hosted.uuid} ({hosted.type_name}) on {vf}: the "
                    f"driver sets the vGPU mode only while a GPU hosts none; {self.mode} not set; "
                    "run plan again"
                )
            pending = ctx.driver.removal_pending(vf)
            if pending is not None:
                raise DeviceBusyError(
                    f"{self.gpu}: vGPU {pending} on {vf} is still being removed: "
                    f"{self.mode} not set"
                )
        if self._now(ctx) is self.mode:
            return f"already in {self.mode} mode"
        return None

    def act(self, ctx: _Context) -> None:
        ctx.driver.set_vgpu_mode(self.gpu, self.mode)

    def visible(self, ctx: _Context) -> bool:
        now = self._now(ctx)
        # Where nvidia-smi -q does not show the mode, the command's success is all there is.
        self._shown = now is not None
        return now is None or now is self.mode

    def unverified(self, ctx: _Context) -> str:
        now = self._now(ctx)
        return (
            f"nvidia-smi reported success, but {self.gpu} still shows "
            f"{now or 'no'} vGPU mode after {ctx.verify_timeout:g} s (wanted {self.mode})"
        )

    def done(self) -> str:
        if self._shown:
            return f"set vGPU mode {self.mode}"
        return (
            f"set vGPU mode {self.mode} (nvidia-smi -q does not show it: its exit status says so)"
        )


class _CreateStep:
    def __init__(self, action: VgpuCreate) -> None:
        self.vf = _address(action.target, "target")
        self.gpu = action.gpu
        self.index: int = action.vf_index
        if self.index < 0:
            raise _BadParams("vfIndex must not be negative")
        self.type_name: str = _text(action.type_name, "type")
        self.uuid: str = _text(action.uuid, "uuid")

    def precheck(self, ctx: _Context) -> str | None:
        # The plan may have predicted this VF's address before SR-IOV was on; now the
        # virtfn links say for sure. Acting on another VF than the one planned is a guess.
        vfs = ctx.driver.vf_addresses(self.gpu)
        if self.index >= len(vfs):
            raise HostChangedError(
                f"{self.gpu} has {len(vfs)} VFs, so VF index {self.index} ({self.vf}) does "
                "not exist: is SR-IOV enabled?"
            )
        if vfs[self.index] != self.vf:
            raise HostChangedError(
                f"VF index {self.index} of {self.gpu} is {vfs[self.index]}, but the plan "
                f"targets {self.vf}: refusing to guess; run plan again"
            )
        where = ctx.driver.vgpu_exists(self.uuid)
        if where is not None and where != self.vf:
            raise HostChangedError(
                f"a vGPU with UUID {self.uuid} already exists on {where}: "
                f"refusing to create a duplicate on {self.vf}"
            )
        hosted = ctx.driver.vgpu_on(self.vf)
        if hosted == (self.uuid, self.type_name):
            return f"already hosts that vGPU ({self.type_name} {self.uuid})"
        pending = ctx.driver.removal_pending(self.vf)
        if pending is not None:
            raise DeviceBusyError(
                f"{self.vf}: vGPU {pending} is still being removed (the kernel waits for whatever "
                f"holds it to let go): {self.type_name} not created"
            )
        if hosted is not None:
            raise HostChangedError(
                f"{self.vf} already hosts vGPU {hosted.uuid} ({hosted.type_name}), but the plan "
                f"expects it empty for {self.type_name}: run plan again"
            )
        # Right after an enable the VFs exist before the vGPU manager has registered them.
        if not ctx.wait_until(lambda: ctx.driver.vgpu_parent_ready(self.vf)):
            raise VerificationError(
                f"{self.vf} never offered vGPU types within {ctx.verify_timeout:g} s: "
                "is the NVIDIA vGPU manager running?"
            )
        return None

    def act(self, ctx: _Context) -> None:
        ctx.driver.create_vgpu(
            gpu=self.gpu, vf=self.vf, vf_index=self.index, type_name=self.type_name, uuid=self.uuid
        )

    def visible(self, ctx: _Context) -> bool:
        return ctx.driver.vgpu_on(self.vf) == (self.uuid, self.type_name)

    def unverified(self, ctx: _Context) -> str:
        hosted = ctx.driver.vgpu_on(self.vf)
        seen = "no vGPU" if hosted is None else f"{hosted.type_name} {hosted.uuid}"
        return (
            f"created {self.type_name} {self.uuid} on {self.vf}, but it did not appear within "
            f"{ctx.verify_timeout:g} s (the VF shows {seen})"
        )

    def done(self) -> str:
        return f"created {self.type_name} {self.uuid}"


class _RemoveStep:
    def __init__(self, action: VgpuRemove) -> None:
        self.action = action
        self.vf = _address(action.target, "target")
        self.gpu = action.gpu
        self.uuid: str = _text(action.uuid, "uuid")
        self.type_name: str | None = action.type_name or None

    def precheck(self, ctx: _Context) -> str | None:
        where = ctx.driver.vgpu_exists(self.uuid)
        if where is None:
            if ctx.driver.removal_pending(self.vf) == self.uuid:
                raise DeviceBusyError(
                    f"vGPU {self.uuid} on {self.vf} is already being removed: an earlier removal "
                    "waits for whatever holds it (probably a VM vgpuctl could not see) to let go"
                )
            return "already gone"
        if where != self.vf:
            raise HostChangedError(
                f"vGPU {self.uuid} is on {where}, not on {self.vf} as planned: run plan again"
            )
        if self.vf not in ctx.driver.vf_addresses(self.gpu):
            # The action's gpu is what the mandate was checked against: the vGPU must be on it.
            raise refused(
                self.action,
                f"{self.vf} is not a VF of GPU {self.gpu}",
                "a vGPU is removed only from a VF of the GPU the action names",
            )
        hosted = ctx.driver.vgpu_on(self.vf)
        if (
            self.type_name is not None
            and hosted is not None
            and hosted.uuid == self.uuid
            and hosted.type_name != self.type_name
        ):
            raise HostChangedError(
                f"vGPU {self.uuid} on {self.vf} is {hosted.type_name}, but the plan expects "
                f"{self.type_name}: run plan again"
            )
        if ctx.mandate is not None:
            # Asked now, not taken from the plan: a VM may have been given it since.
            type_name = hosted.type_name if hosted is not None else self.type_name or ""
            ctx.mandate.check_unused(self.action, vf=self.vf, uuid=self.uuid, type_name=type_name)
        return None

    def act(self, ctx: _Context) -> None:
        ctx.driver.remove_vgpu(gpu=self.gpu, vf=self.vf, uuid=self.uuid)

    def visible(self, ctx: _Context) -> bool:
        return (
            ctx.driver.vgpu_exists(self.uuid) is None
            and ctx.driver.removal_pending(self.vf) != self.uuid
        )

    def unverified(self, ctx: _Context) -> str:
        return (
            f"removed vGPU {self.uuid} from {self.vf}, but it was still there after "
            f"{ctx.verify_timeout:g} s"
        )

    def done(self) -> str:
        return f"removed {self.type_name or 'vGPU'} {self.uuid}"

    def removal(self) -> Removal:
        """What the journal's record of this removal says (the device plugin reads it)."""
        return Removal(vf=self.vf, uuid=self.uuid, type_name=self.type_name)


def _host_step(action: Action) -> _Step | None:
    """The step that carries out a host action; None for the others (CR writes, KubeVirt,
    device plugin), which are recorded as skipped."""
    match action:
        case VgpuRemove():
            return _RemoveStep(action)
        case SriovDisable():
            return _DisableStep(action)
        case SriovEnable():
            return _EnableStep(action)
        case VgpuModeSet():
            return _ModeStep(action)
        case VgpuCreate():
            return _CreateStep(action)
    return None


SKIPPED_NOT_HOST = "skipped: not a host action"

#: Plan interfaces that name one host driver (a plan made while SR-IOV is off may say "none").
_INTERFACES = frozenset({"mdev", "vfio"})


# -- the run ------------------------------------------------------------------------------------


def execute(
    plan: Plan,
    *,
    driver: HostDriver,
    journal: Journal,
    verify_timeout: float = 60.0,
    poll_interval: float = 0.05,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    run_id: str | None = None,
    on_outcome: Callable[[Outcome], None] | None = None,
    mandate: HostMandate | None = None,
    guard: Callable[[], None] | None = None,
) -> ApplyResult:
    """Apply ``plan`` through ``driver``, journaling each step; stop at the first failure.

    ``on_outcome`` is told of each action's outcome as it happens (the CLI shows progress).
    ``mandate`` (every apply and watch run passes one) is what the run may touch: each action's
    GPU is checked against it before anything runs, and each removal's vGPU is checked to be
    unused right before it is removed (a violation fails that action and stops the run).
    ``guard`` is asked before each action; a ``ReconcilerError`` it raises fails that action
    (nothing of it is done) and stops the run.

    An action failure is an outcome in the result, not an exception. Raises ``ApplyError``
    before touching anything when an action's fields do not fit together, ``MandateError``
    when an action is outside the mandate, ``ValueError`` when the plan's node or interface
    does not match the journal's or driver's, and lets unexpected exceptions (bugs) through
    after journaling them.
    """
    if plan.node != journal.node:
        raise ValueError(f"plan for node {plan.node} given a journal for node {journal.node}")
    if (
        plan.interface in _INTERFACES
        and driver.interface in _INTERFACES
        and plan.interface != driver.interface
    ):
        raise ValueError(
            f"a plan for the {plan.interface} interface given the {driver.interface} driver"
        )
    steps = _prepare(plan)
    if mandate is not None:
        for action in plan.actions:
            step = steps.get(action.seq)
            if step is not None:
                mandate.check_target(action, step.gpu)
    run = run_id or journal.new_run_id()

    def wait_until(predicate: Callable[[], bool]) -> bool:
        deadline = clock() + verify_timeout
        while not predicate():
            now = clock()
            if now >= deadline:
                return False
            sleep(max(0.0, min(poll_interval, deadline - now)))
        return True

    ctx = _Context(
        driver=driver,
        verify_timeout=verify_timeout,
        wait_until=wait_until,
        mandate=mandate,
        guard=guard,
    )
    journal.record(
        run=run,
        seq=0,
        kind=RUN_KIND,
        target=plan.node,
        phase=Phase.START,
        message=f"{len(plan.actions)} actions, interface {driver.interface}, "
        f"observed {plan.observed_fingerprint}",
    )
    rec = _Recorder(journal, run)
    outcomes: list[Outcome] = []
    not_run: tuple[Action, ...] = ()
    for i, action in enumerate(plan.actions):
        step = steps.get(action.seq)
        if step is None:
            outcome = rec.outcome(action, OutcomeStatus.SKIPPED, SKIPPED_NOT_HOST)
        else:
            outcome = _run_step(rec, action, step, ctx=ctx, clock=clock)
        outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)
        if outcome.status is OutcomeStatus.FAILED:
            not_run = plan.actions[i + 1 :]
            break
    result = ApplyResult(node=plan.node, run_id=run, outcomes=tuple(outcomes), not_run=not_run)
    journal.record(
        run=run,
        seq=0,
        kind=RUN_KIND,
        target=plan.node,
        phase=Phase.END,
        message=str(result.counts),
    )
    return result


def _prepare(plan: Plan) -> dict[int, _Step]:
    """Build every host step first, so a malformed plan fails before the host is touched."""
    steps: dict[int, _Step] = {}
    problems: list[Problem] = []
    seen: set[int] = set()
    for action in plan.actions:
        if action.seq in seen:
            problems.append(Problem(f"action {action.seq}: duplicate seq"))
        seen.add(action.seq)
        try:
            step = _host_step(action)
        except _BadParams as e:
            problems.append(Problem(f"action {action.seq} ({action.kind} {action.target}): {e}"))
            continue
        if step is not None:
            steps[action.seq] = step
    if problems:
        raise ApplyError("the plan's actions are malformed; nothing was applied", problems)
    return steps


@record(frozen=True, slots=True)
class _Recorder:
    """Journals one run's records and turns outcomes into :class:`Outcome` values."""

    journal: Journal
    run: str

    def intent(self, action: Action) -> None:
        self._record(action, Phase.INTENT, action.reason)

    def outcome(
        self,
        action: Action,
        status: OutcomeStatus,
        message: str,
        *,
        seconds: float = 0.0,
        transient: bool = False,
        removed: Removal | None = None,
    ) -> Outcome:
        self._record(action, Phase(status.value), message, removed=removed)
        return Outcome(action, status, message, transient=transient, seconds=seconds)

    def _record(
        self, action: Action, phase: Phase, message: str, *, removed: Removal | None = None
    ) -> None:
        self.journal.record(
            run=self.run,
            seq=action.seq,
            kind=action.kind.value,
            target=action.target,
            phase=phase,
            message=message,
            removed=removed,
        )


def _run_step(
    rec: _Recorder, action: Action, step: _Step, *, ctx: _Context, clock: Callable[[], float]
) -> Outcome:
    rec.intent(action)
    started = clock()
    try:
        if ctx.guard is not None:
            ctx.guard()
        noop = step.precheck(ctx)
        if noop is not None:
            return rec.outcome(action, OutcomeStatus.NOOP, noop, seconds=clock() - started)
        step.act(ctx)
        if not ctx.wait_until(lambda: step.visible(ctx)):
            raise VerificationError(step.unverified(ctx))
    except ReconcilerError as e:
        return rec.outcome(
            action,
            OutcomeStatus.FAILED,
            e.message,
            seconds=clock() - started,
            transient=e.transient,
        )
    except Exception as e:
        # A bug, not a host condition: leave evidence for the crash-repair story, then raise.
        rec.outcome(action, OutcomeStatus.FAILED, f"internal error: {e!r}")
        raise
    removed = step.removal() if isinstance(step, _RemoveStep) else None
    return rec.outcome(
        action, OutcomeStatus.DONE, step.done(), seconds=clock() - started, removed=removed
    )
