"""When the watch loop acts, on a fake clock: retries after transient and permanent failures,
the triggers that cut a wait short, the debounce of file events, the rescan cadence, stopping.

The expected delays are written from the policy in ``reconciler/watch/scheduler.py``'s
docstring (1 s doubling to 60 s for a transient error; the resync interval for a permanent
one), with the jitter switched off so they are exact. Nothing here sleeps: :meth:`wait` is only
called when something is already due or queued.
"""

from __future__ import annotations

import pytest

from reconciler.apply.errors import (
    CommandFailedError,
    CommandTimeoutError,
    DeviceBusyError,
    DriverRefusedError,
    HostChangedError,
    MandateError,
    PathEscapeError,
    VerificationError,
    WriteTimeoutError,
)
from reconciler.model import (
    ClusterUnavailableError,
    ConflictError,
    ForbiddenError,
    LockHeldError,
    ObserveError,
    PlanError,
    ResourceMissingError,
    ValidationError,
)
from reconciler.observe.host import SysfsChangedError
from reconciler.watch.scheduler import Retry, Scheduler, Trigger, is_transient
from reconciler.watch.timing import Backoff


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(clock: FakeClock, *, rescan: float = 10.0, resync: float = 300.0) -> Scheduler:
    return Scheduler(
        rescan_interval=rescan,
        debounce=0.2,
        backoff=Backoff(initial=1.0, cap=60.0, jitter=0.0),
        resync_interval=resync,
        clock=clock,
        rng=lambda: 0.5,
    )


def due_after(s: Scheduler, clock: FakeClock, delay: float) -> bool:
    """The retry is not due a moment before ``delay`` seconds from now, and is due then."""
    start = clock.now
    clock.now = start + delay - 0.001
    early = s.reconcile_due()
    clock.now = start + delay
    on_time = s.reconcile_due()
    return not early and on_time


# -- transient failures --------------------------------------------------------------------------


def test_a_transient_failure_is_retried_after_a_backoff_that_doubles_up_to_a_minute() -> None:
    clock = FakeClock()
    s = make(clock)
    delays = []
    for n in range(1, 9):
        retry = s.failed(transient=True)
        assert retry == Retry(failures=n, transient=True, delay=retry.delay)
        delays.append(retry.delay)
        assert due_after(s, clock, retry.delay), n
        assert s.take() == "retry"
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60]


def test_drift_is_not_looked_for_while_a_transient_failure_waits() -> None:
    s = make(FakeClock())
    assert s.looks_for_drift
    s.failed(transient=True)
    assert not s.looks_for_drift
    assert s.failing
    s.succeeded()
    assert s.looks_for_drift
    assert not s.failing


def test_success_ends_the_streak_of_failures() -> None:
    s = make(FakeClock())
    for _ in range(4):
        s.failed(transient=True)
    s.take()
    s.succeeded()
    assert s.failed(transient=True) == Retry(failures=1, transient=True, delay=1.0)


# -- permanent failures --------------------------------------------------------------------------


def test_a_permanent_failure_is_not_retried_before_the_resync_interval() -> None:
    clock = FakeClock()
    s = make(clock, resync=300.0)
    for n in range(1, 5):
        retry = s.failed(transient=False)
        # The same wait every time: no timer brings it sooner, none makes it grow.
        assert retry == Retry(failures=n, transient=False, delay=300.0)
        assert due_after(s, clock, 300.0)
        assert s.take() == "retry"


@pytest.mark.parametrize("trigger", [Trigger.DESIRED, Trigger.HOST, Trigger.CLUSTER])
def test_a_permanent_failure_is_tried_again_as_soon_as_an_input_changes(
    trigger: Trigger,
) -> None:
    clock = FakeClock()
    s = make(clock)
    s.failed(transient=False)
    clock.now += 15  # a rescan or two later
    assert not s.reconcile_due()
    assert s.looks_for_drift  # the host and the cluster are compared at each rescan
    s.want(trigger)
    assert s.reconcile_due()
    assert s.take() == ",".join(sorted([trigger.value, "retry"]))
    assert not s.reconcile_due()


def test_a_desired_change_cuts_a_transient_backoff_short() -> None:
    clock = FakeClock()
    s = make(clock)
    for _ in range(7):
        s.failed(transient=True)
        s.take()
    assert s.failed(transient=True).delay == 60
    assert not s.reconcile_due()
    s.want(Trigger.DESIRED)
    assert s.reconcile_due()


def test_a_later_wish_never_postpones_an_earlier_one() -> None:
    clock = FakeClock()
    s = make(clock)
    s.want(Trigger.START)
    s.failed(transient=False)  # asks for a retry 300 s on: the start is still due now
    assert s.reconcile_due()


def test_the_log_line_says_when_the_retry_comes() -> None:
    assert Retry(failures=1, transient=True, delay=1.234).when == "retrying in 1.23 s"
    assert Retry(failures=3, transient=False, delay=300.0).when == (
        "retrying when the desired state, the host or the cluster changes, or in 300 s"
    )


# -- which errors are transient ------------------------------------------------------------------

TRANSIENT = [
    LockHeldError("another apply holds the lock"),
    ClusterUnavailableError("cannot reach the Kubernetes API server"),
    ConflictError("resourceVersion conflict"),
    CommandTimeoutError("sriov-manage did not finish within 30 s"),
    WriteTimeoutError("write to sriov_numvfs did not return within 60 s"),
    DeviceBusyError("the vGPU is in use"),
    CommandFailedError("sriov-manage -e 0000:08:00.0 failed (exit 1): GPU is in use"),
    DriverRefusedError("the driver failed to create (I/O error)", transient=True),
    VerificationError("SR-IOV enable reported success but the VF count never appeared"),
    HostChangedError("the host changed since the plan was made; run plan again"),
    SysfsChangedError("0000:08:00.4 disappeared while scanning, twice"),
    RuntimeError("a bug"),  # unknown: retried
    OSError(24, "Too many open files"),
    None,
]
PERMANENT = [
    ValidationError("desired.yaml:3:1: unknown key"),
    PlanError("the desired profile is not offered by the driver"),
    MandateError("0000:09:00.0 is not managed by the desired state"),
    ForbiddenError("RBAC denied list sriovgpudevices"),
    ResourceMissingError("the CRDs are not installed"),
    ObserveError("sysfs root /sys does not exist"),
    DriverRefusedError("the driver refused to create: Invalid argument (EINVAL)"),
    PathEscapeError("the path leaves the sysfs root"),
]


@pytest.mark.parametrize("error", TRANSIENT, ids=lambda e: type(e).__name__)
def test_errors_worth_retrying_on_a_timer(error: BaseException | None) -> None:
    assert is_transient(error)


@pytest.mark.parametrize("error", PERMANENT, ids=lambda e: type(e).__name__)
def test_errors_that_wait_for_a_change(error: BaseException) -> None:
    assert not is_transient(error)


# -- file events, rescans, stopping --------------------------------------------------------------


def test_a_burst_of_file_events_is_read_once_after_the_quiet_period() -> None:
    clock = FakeClock()
    s = make(clock)
    for _ in range(3):
        s.desired_changed()
    s.wait()  # returns at once: the events are queued; all three are taken
    assert s.desired_pending
    assert s.wake_at() == pytest.approx(clock.now + 0.2)
    clock.now += 0.1
    assert not s.desired_due()
    clock.now += 0.1
    assert s.desired_due()
    assert not s.desired_pending
    assert not s.desired_due()


def test_rescans_come_an_interval_after_the_end_of_the_previous_one() -> None:
    clock = FakeClock()
    s = make(clock, rescan=10.0)
    assert s.wake_at() == 1010.0
    clock.now = 1009.9
    assert not s.rescan_due()
    clock.now = 1010.0
    assert s.rescan_due()
    clock.now = 1012.5  # the rescan took 2.5 s
    s.rescanned()
    assert not s.rescan_due()
    assert s.wake_at() == 1022.5


def test_the_worker_wakes_for_the_earliest_thing_due() -> None:
    clock = FakeClock()
    s = make(clock, rescan=10.0)
    s.failed(transient=True)
    assert s.wake_at() == 1001.0  # the retry, before the rescan
    s.take()
    s.failed(transient=False)
    assert s.wake_at() == 1010.0  # the rescan, which looks for changes, before the resync


def test_stop_wakes_the_worker() -> None:
    clock = FakeClock()
    s = make(clock, rescan=1.0)
    assert not s.stopping
    s.stop()
    s.wait()  # returns at once: the stop is queued
    assert s.stopping


def test_wait_returns_at_once_when_something_is_already_due() -> None:
    clock = FakeClock()
    s = make(clock, rescan=1.0)
    clock.now += 5
    s.wait()
    assert s.rescan_due()
