"""The watch loop in process, against a simulated host: what starts a reconcile, what a failure
or an invalid desired state does, what the device plugins and the probes are told.

The loop runs on a thread with a short rescan interval; every wait is bounded. Device plugins
and Events are fakes of the ports the loop speaks (the real ones have their own tests).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply import NodeLock
from reconciler.cli.host import Host
from reconciler.cli.options import GlobalOptions
from reconciler.engine import NodePorts
from reconciler.model import Inventory, ReconcilerError
from reconciler.sim import SimHost, hold, init_host, reboot, release
from reconciler.sim.state import locked
from reconciler.watch.loop import WatchLoop, WatchSettings
from reconciler.watch.metrics import DRIFT_SOURCES, ERROR_KINDS, RESULTS, WatchMetrics
from reconciler.watch.signature import HostSignature
from reconciler.watch.source import DesiredSource
from reconciler.watch.timing import Backoff

REPO = Path(__file__).resolve().parents[2]
SEED = REPO / "desired-state" / "harvester-kgd9c.yaml"
NODE = "harvester-kgd9c"
#: vGPU UUIDs are uuid5(namespace, "<node>/<VF>"): the seed's, as the README shows them.
U4 = "5adb8e42-c29a-5705-8ae0-584ba08668af"
U5 = "5ed3b3e8-ffe3-55db-be73-567bd703a205"
WAIT = 15.0


def seed_text(vf4: str = "NVIDIA A2-4A", vf5: str = "NVIDIA A2-4Q") -> str:
    return (
        SEED.read_text()
        .replace('"0000:08:00.4": NVIDIA A2-4A', f'"0000:08:00.4": {vf4}')
        .replace('"0000:08:00.5": NVIDIA A2-4Q', f'"0000:08:00.5": {vf5}')
    )


def wait_for(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


@dataclass
class FakePlugins:
    """The DevicePlugins port: records each update (then fails with ``failure``, if set)."""

    updates: list[tuple[frozenset[str], frozenset[str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    failure: Exception | None = None

    def update(self, inventory: Inventory, *, removed_on_purpose: Iterable[str] = ()) -> None:
        uuids = frozenset(
            vf.vgpu.uuid for gpu in inventory.gpus for vf in gpu.vfs if vf.vgpu is not None
        )
        with self.lock:
            self.updates.append((uuids, frozenset(removed_on_purpose)))
            failure = self.failure
        if failure is not None:
            raise failure

    def last(self) -> tuple[frozenset[str], frozenset[str]] | None:
        with self.lock:
            return self.updates[-1] if self.updates else None


@dataclass
class FakeEvents:
    """The EventSink port: records each Event."""

    recorded: list[dict[str, Any]] = field(default_factory=list)

    def event(self, kind: str, name: str, **kw: Any) -> None:
        self.recorded.append({"kind": kind, "name": name, **kw})


@dataclass
class Node:
    """A simulated host, a desired-state file and a loop watching it."""

    host: SimHost
    desired: Path
    loop: WatchLoop
    plugins: FakePlugins
    events: FakeEvents
    state_dir: Path
    #: What the loop builds its ports with, at each use: a test replaces it to inject a fault.
    ports: Callable[[], NodePorts]

    def vgpus(self) -> dict[str, str]:
        """uuid → type name, as the host has them now."""
        inventory = Host(_options(self.host)).observe()
        return {
            vf.vgpu.uuid: vf.vgpu.type_name
            for gpu in inventory.gpus
            for vf in gpu.vfs
            if vf.vgpu is not None
        }

    def sample(self, name: str, **labels: str) -> float:
        value = self.loop.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


def _options(host: SimHost) -> GlobalOptions:
    return GlobalOptions(
        sysfs_root=host.sysfs_root,
        sriov_manage=None,
        node=NODE,
        state_dir=None,
        no_color=True,
        kubelet_dir=host.directory / "kubelet",
    )


def make_node(
    tmp_path: Path,
    text: str,
    *,
    with_events: bool = False,
    clock: Callable[[], float] = time.monotonic,
    rescan_interval: float = 0.05,
    resync_interval: float = 300.0,
    wrap_signature: Callable[[Callable[[], str]], Callable[[], str]] = lambda f: f,
) -> Node:
    host = init_host(tmp_path / "host", ["A2@0000:08:00.0"])
    desired = tmp_path / "desired.yaml"
    desired.write_text(text)
    plugins, events = FakePlugins(), FakeEvents()
    composed = Host(_options(host))

    def ports() -> NodePorts:
        built = composed.ports(command_timeout=30)
        return replace(built, events=events) if with_events else built

    def current_ports() -> NodePorts:
        return node.ports()  # looked up at each use: a test may replace it

    loop = WatchLoop(
        source=DesiredSource.at(desired),
        node=NODE,
        catalog=composed.catalog,
        ports=current_ports,
        host_signature=wrap_signature(HostSignature(host.sysfs_root).compute),
        plugins=plugins,
        metrics=WatchMetrics(),
        settings=WatchSettings(
            rescan_interval=rescan_interval,
            debounce=0.01,
            verify_timeout=10,
            backoff=Backoff(initial=0.05, cap=0.2),
            resync_interval=resync_interval,
        ),
        clock=clock,
    )
    node = Node(host, desired, loop, plugins, events, composed.state_dir, ports)
    return node


@contextmanager
def running(loop: WatchLoop) -> Iterator[None]:
    thread = threading.Thread(target=loop.run, name="test-watch-loop", daemon=True)
    thread.start()
    try:
        yield
    finally:
        loop.stop()
        thread.join(timeout=WAIT)
        assert not thread.is_alive(), "the loop did not stop"


def converged(node: Node, *, reconciles: int = 1) -> Callable[[], bool]:
    """The ``reconciles``-th converged reconcile is over (the gauge alone may be a stale 1)."""
    return lambda: (
        node.sample("vgpuctl_reconciles_total", result="converged") >= reconciles
        and node.sample("vgpuctl_converged") == 1
    )


# -- start, edits, drift -----------------------------------------------------------------------


def test_converges_at_start_and_says_so(tmp_path: Path) -> None:
    node = make_node(tmp_path, seed_text())
    assert not node.loop.readiness().ok
    assert node.loop.readiness().reason == "no desired state read yet"
    with running(node.loop):
        wait_for(converged(node), "the first reconcile")
        assert node.vgpus()[U4] == "NVIDIA A2-4A"
        assert node.loop.readiness().reason == "ready: converged"
        assert node.loop.health().ok
        assert node.sample("vgpuctl_reconciles_total", result="converged") == 1
        assert node.sample("vgpuctl_actions_applied_total", kind="vgpu-create") == 4
        assert node.sample("vgpuctl_actions_applied_total", kind="sriov-enable") == 1
        assert node.sample("vgpuctl_last_success_timestamp_seconds") > 1e9
    assert not node.loop.health().ok  # stopped


def test_an_edit_is_applied_and_its_removal_told_to_the_plugins(tmp_path: Path) -> None:
    node = make_node(tmp_path, seed_text())
    with running(node.loop):
        wait_for(converged(node), "the first reconcile")
        node.desired.write_text(seed_text(vf4="NVIDIA A2-4C"))
        node.loop.desired_changed()
        wait_for(converged(node, reconciles=2), "convergence after the edit")
        assert node.vgpus()[U4] == "NVIDIA A2-4C"
        # Same VF, same UUID, another profile: the old device was removed on purpose.
        assert any(removed == {U4} and U4 in uuids for uuids, removed in node.plugins.updates)
        assert node.sample("vgpuctl_drift_detected_total", source="desired") == 1
        assert node.sample("vgpuctl_actions_applied_total", kind="vgpu-remove") == 1


def test_host_drift_is_repaired_at_the_next_rescan(tmp_path: Path) -> None:
    node = make_node(tmp_path, seed_text())
    with running(node.loop):
        wait_for(converged(node), "the first reconcile")
        node.host.writer().write(f"bus/mdev/devices/{U4}/remove", "1")
        wait_for(lambda: node.sample("vgpuctl_drift_detected_total", source="host") >= 1, "drift")
        wait_for(converged(node, reconciles=2), "the vGPU re-created")
        assert U4 in node.vgpus()
        # Plugins first heard it vanished (not on purpose), then that it is back.
        assert any(U4 not in uuids and not removed for uuids, removed in node.plugins.updates)
        assert node.plugins.last() == (frozenset(node.vgpus()), frozenset())


def test_device_plugins_that_fail_are_counted_and_never_fail_a_reconcile(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The device plugins failing, whether the reconcile tells them or a rescan that found the
    host changed does at once, is logged and counted under kind="deviceplugin": the node is
    converged all the same and the loop goes on."""
    caplog.set_level(logging.ERROR, logger="vgpuctl.watch")
    node = make_node(tmp_path, seed_text())
    node.plugins.failure = ReconcilerError("kubelet.sock: connection refused")
    with running(node.loop):
        wait_for(converged(node), "the first reconcile")
        assert node.sample("vgpuctl_errors_total", kind="deviceplugin") == 1
        node.plugins.failure = RuntimeError("a bug in the plugins")
        node.host.writer().write(f"bus/mdev/devices/{U4}/remove", "1")
        wait_for(converged(node, reconciles=2), "the vGPU re-created")
    assert U4 in node.vgpus()
    # Told twice more: at once when the rescan found the vGPU gone, then by the reconcile.
    assert len(node.plugins.updates) == 3
    assert node.sample("vgpuctl_errors_total", kind="deviceplugin") == 3
    assert node.sample("vgpuctl_reconciles_total", result="failed") == 0
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("device plugins: kubelet.sock: connection refused") == 1
    assert messages.count("device plugins: update failed") == 2


def test_after_a_reboot_every_vgpu_comes_back_with_its_uuid(tmp_path: Path) -> None:
    node = make_node(tmp_path, seed_text())
    # A real host is never observed half rebooted (the agent goes down with it); the simulated
    # reboot empties the tree in place, under the simulator's lock. Observations take that lock
    # here, so a rescan sees the host before or after the reboot, never in between: in between,
    # the observation failed (a VF gone under it), the gap went unadvertised and this test
    # failed about once in six runs on a loaded machine, before this change too.
    inner = node.ports

    def whole_observations() -> NodePorts:
        built = inner()
        observe = built.observe_host

        def observe_whole(*, availability: bool = True) -> Inventory:
            with locked(node.host.sysfs_root):
                return observe(availability=availability)

        return replace(built, observe_host=observe_whole)

    node.ports = whole_observations
    with running(node.loop):
        wait_for(converged(node), "the first reconcile")
        before = node.vgpus()
        reboot(node.host.directory)
        wait_for(converged(node, reconciles=2), "every vGPU re-created")
        assert node.vgpus() == before
        assert any(not uuids for uuids, _ in node.plugins.updates)  # the gap was advertised
        assert node.plugins.last() == (frozenset(before), frozenset())


def test_an_unchanged_node_is_not_reconciled_again(tmp_path: Path) -> None:
    node = make_node(tmp_path, seed_text())
    with running(node.loop):
        wait_for(converged(node), "the first reconcile")
        rescans = node.sample("vgpuctl_rescan_duration_seconds_count")
        wait_for(
            lambda: node.sample("vgpuctl_rescan_duration_seconds_count") >= rescans + 10,
            "ten rescans",
        )
        assert node.sample("vgpuctl_reconcile_duration_seconds_count") == 1
        assert node.sample("vgpuctl_drift_detected_total", source="host") == 0


def test_a_node_the_desired_state_does_not_name_is_left_alone(tmp_path: Path) -> None:
    node = make_node(tmp_path, seed_text().replace(f"{NODE}:", "another-node:"))
    with running(node.loop):
        wait_for(converged(node), "the first reconcile")
        assert node.vgpus() == {}
        assert node.sample("vgpuctl_actions_applied_total", kind="sriov-enable") == 0


# -- invalid desired state ---------------------------------------------------------------------


def test_an_invalid_edit_keeps_the_last_valid_state_in_force(tmp_path: Path) -> None:
    node = make_node(tmp_path, seed_text(), with_events=True)
    with running(node.loop):
        wait_for(converged(node), "the first reconcile")
        node.desired.write_text(seed_text(vf4="NVIDIA A2-99Q"))
        node.loop.desired_changed()
        wait_for(lambda: node.sample("vgpuctl_desired_state_valid") == 0, "the invalid state")
        assert node.sample("vgpuctl_errors_total", kind="validation") == 1
        assert node.loop.readiness().ok  # still serving the last valid state
        assert "now invalid: " + str(node.desired) in node.loop.readiness().reason
        # Drift is repaired to the last valid state, not to nothing.
        node.host.writer().write(f"bus/mdev/devices/{U4}/remove", "1")
        wait_for(lambda: node.vgpus().get(U4) == "NVIDIA A2-4A", "the repair")
        # Reported once, as a Warning on the GPU's object.
        (event,) = node.events.recorded
        assert event["kind"] == "SRIOVGPUDevice"
        assert event["name"] == "harvester-kgd9c-000008000"
        assert event["reason"] == "InvalidDesiredState"
        assert event["type"] == "Warning"
        assert str(node.desired) in event["message"]
        # Fixed: valid again, and applied.
        node.desired.write_text(seed_text(vf4="NVIDIA A2-4C"))
        node.loop.desired_changed()
        wait_for(lambda: node.vgpus().get(U4) == "NVIDIA A2-4C", "the fixed edit applied")
        assert node.sample("vgpuctl_desired_state_valid") == 1


def test_invalid_from_the_start_changes_nothing_until_fixed(tmp_path: Path) -> None:
    node = make_node(tmp_path, seed_text().replace("sriov: enabled", "sriov: maybe"))
    with running(node.loop):
        wait_for(lambda: node.sample("vgpuctl_errors_total", kind="validation") == 1, "report")
        verdict = node.loop.readiness()
        assert not verdict.ok
        # file:line:col, as `vgpuctl validate` says it.
        assert verdict.reason.startswith(f"no valid desired state yet: {node.desired}:21:")
        assert node.vgpus() == {}
        assert node.sample("vgpuctl_reconcile_duration_seconds_count") == 0
        node.desired.write_text(seed_text())  # noticed by the rescan: no file event here
        wait_for(converged(node), "convergence once fixed")


# -- failures, blocked changes -----------------------------------------------------------------


def test_a_held_node_lock_is_retried_with_backoff(tmp_path: Path) -> None:
    node = make_node(tmp_path, seed_text())
    node.state_dir.mkdir(parents=True, exist_ok=True)
    lock = NodeLock(node.state_dir, NODE, command="vgpuctl apply (test)")
    lock.acquire()  # another apply, as far as the loop can tell (flock is per open file)
    try:
        with running(node.loop):
            wait_for(lambda: node.sample("vgpuctl_errors_total", kind="lock") >= 2, "retries")
            assert node.vgpus() == {}
            verdict = node.loop.readiness()
            assert not verdict.ok
            assert "another apply holds the lock" in verdict.reason
            assert node.loop.health().ok  # failing is not dead
            lock.release()
            wait_for(converged(node), "convergence once the lock is free")
    finally:
        lock.release()
    assert node.sample("vgpuctl_reconciles_total", result="failed") >= 2


def test_a_permanent_failure_waits_for_a_change_of_the_host_instead_of_retrying(
    tmp_path: Path,
) -> None:
    """An error that running again cannot cure (here the host cannot be read: a plain
    ObserveError, not transient) is not retried on a timer: ten rescans later there is still
    one failed reconcile; a change of the host (its fingerprint) brings the next try."""
    from reconciler.model import ObserveError

    generation = [0]

    def wrap(compute: Callable[[], str]) -> Callable[[], str]:
        return lambda: f"{compute()}/{generation[0]}"

    node = make_node(tmp_path, seed_text(), wrap_signature=wrap, resync_interval=3600)
    built = node.ports
    unreadable = threading.Event()
    unreadable.set()

    def ports() -> NodePorts:
        real = built()

        def observe(*, availability: bool = True) -> Inventory:
            if unreadable.is_set():
                raise ObserveError(f"sysfs root {node.host.sysfs_root} is not readable")
            return real.observe_host(availability=availability)

        return replace(real, observe_host=observe)

    node.ports = ports
    with running(node.loop):
        wait_for(lambda: node.sample("vgpuctl_errors_total", kind="observe") >= 1, "the failure")
        rescans = node.sample("vgpuctl_rescan_duration_seconds_count")
        wait_for(
            lambda: node.sample("vgpuctl_rescan_duration_seconds_count") >= rescans + 10,
            "ten rescans",
        )
        unreadable.clear()  # cured, but nothing the loop can see changed: still no retry
        rescans = node.sample("vgpuctl_rescan_duration_seconds_count")
        wait_for(
            lambda: node.sample("vgpuctl_rescan_duration_seconds_count") >= rescans + 10,
            "ten more rescans",
        )
        assert node.sample("vgpuctl_reconciles_total", result="failed") == 1
        assert node.sample("vgpuctl_reconcile_duration_seconds_count") == 1
        assert node.vgpus() == {}
        assert "is not readable" in node.loop.readiness().reason
        generation[0] += 1  # the host changed
        wait_for(converged(node), "convergence after the host changed")
        assert node.sample("vgpuctl_drift_detected_total", source="host") >= 1
    assert node.sample("vgpuctl_reconciles_total", result="failed") == 1


def test_a_permanent_failure_is_tried_again_after_the_resync_interval(tmp_path: Path) -> None:
    """Nothing changes, but the resync interval passes: tried again (an RBAC rule granted, a
    CRD installed meanwhile: changes no fingerprint sees)."""
    from reconciler.model import ForbiddenError

    node = make_node(tmp_path, seed_text(), resync_interval=0.3)
    built = node.ports
    refusals: list[int] = []

    def ports() -> NodePorts:
        real = built()

        def observe(*, availability: bool = True) -> Inventory:
            if not refusals:
                refusals.append(1)
                raise ForbiddenError("list sriovgpudevices: forbidden (RBAC)")
            return real.observe_host(availability=availability)

        return replace(real, observe_host=observe)

    node.ports = ports
    with running(node.loop):
        wait_for(converged(node), "convergence at the resync")
    assert node.sample("vgpuctl_errors_total", kind="cluster") == 1
    assert node.sample("vgpuctl_reconciles_total", result="failed") == 1


def test_work_another_apply_did_meanwhile_is_planned_again_under_the_lock(
    tmp_path: Path,
) -> None:
    """Between the loop's first look and its taking the lock, an apply of another desired state
    (an operator by hand) changes the host: the loop plans again under the lock and acts on
    the host as it now is, with no failed reconcile on a stale plan."""
    from reconciler.cli.main import main as vgpuctl

    node = make_node(tmp_path, seed_text())
    other = tmp_path / "by-hand.yaml"
    other.write_text(seed_text(vf4="NVIDIA A2-4C"))
    built = node.ports
    applied_by_hand: list[int] = []

    def ports() -> NodePorts:
        real = built()

        def observe(*, availability: bool = True) -> Inventory:
            inventory = real.observe_host(availability=availability)
            if not applied_by_hand:
                argv = ["apply", str(other), "--yes", "--node", NODE]
                argv += ["--sysfs-root", str(node.host.sysfs_root)]
                applied_by_hand.append(vgpuctl(argv))
            return inventory

        return replace(real, observe_host=observe)

    node.ports = ports
    with running(node.loop):
        wait_for(converged(node), "the first reconcile")
    assert applied_by_hand == [0]
    assert node.vgpus()[U4] == "NVIDIA A2-4A"
    assert node.sample("vgpuctl_reconciles_total", result="failed") == 0
    # What the loop did was the replacement of the hand-made vGPU, nothing planned before.
    assert node.sample("vgpuctl_actions_applied_total", kind="sriov-enable") == 0
    assert node.sample("vgpuctl_actions_applied_total", kind="vgpu-remove") == 1
    assert node.sample("vgpuctl_actions_applied_total", kind="vgpu-create") == 1


def test_a_scan_spoiled_by_an_apply_at_work_is_a_lock_wait_not_an_error(tmp_path: Path) -> None:
    """VFs vanishing mid-scan while an apply holds the lock (it is disabling SR-IOV): the loop
    looks again under the lock, so it reports the lock, not a failed observation."""
    from reconciler.model import ObserveError

    node = make_node(tmp_path, seed_text())
    node.state_dir.mkdir(parents=True, exist_ok=True)
    lock = NodeLock(node.state_dir, NODE, command="vgpuctl apply (test)")
    built = node.ports
    spoiled: list[int] = []

    def ports() -> NodePorts:
        real = built()

        def observe(*, availability: bool = True) -> Inventory:
            if lock.held and not spoiled:
                spoiled.append(1)
                raise ObserveError(
                    "0000:08:00.4 disappeared while scanning, twice: devices are changing"
                )
            return real.observe_host(availability=availability)

        return replace(real, observe_host=observe)

    node.ports = ports
    lock.acquire()
    try:
        with running(node.loop):
            wait_for(lambda: node.sample("vgpuctl_errors_total", kind="lock") >= 1, "the lock wait")
            assert spoiled == [1]
            assert node.sample("vgpuctl_errors_total", kind="observe") == 0
            lock.release()
            wait_for(converged(node), "convergence once the lock is free")
    finally:
        lock.release()


def test_a_blocked_change_waits_for_the_vm_then_goes_through(tmp_path: Path) -> None:
    node = make_node(tmp_path, seed_text())
    with running(node.loop):
        wait_for(converged(node), "the first reconcile")
        hold(node.host.directory, U4)
        node.desired.write_text(seed_text(vf4="NVIDIA A2-4C"))
        node.loop.desired_changed()
        wait_for(lambda: node.sample("vgpuctl_blocked_actions") >= 1, "the blocked change")
        assert node.sample("vgpuctl_converged") == 0
        assert node.loop.readiness().ok
        assert "blocked" in node.loop.readiness().reason
        assert node.vgpus()[U4] == "NVIDIA A2-4A"  # never removed while held
        release(node.host.directory, U4)
        wait_for(lambda: node.vgpus().get(U4) == "NVIDIA A2-4C", "the change after release")
        wait_for(converged(node, reconciles=2), "convergence")
        assert node.sample("vgpuctl_blocked_actions") == 0


def test_a_bug_in_a_rescan_is_counted_and_the_loop_goes_on(tmp_path: Path) -> None:
    broken = threading.Event()

    def wrap(compute: Callable[[], str]) -> Callable[[], str]:
        def signature() -> str:
            if broken.is_set():
                broken.clear()
                raise RuntimeError("a bug")
            return compute()

        return signature

    node = make_node(tmp_path, seed_text(), wrap_signature=wrap)
    with running(node.loop):
        wait_for(converged(node), "the first reconcile")
        broken.set()
        wait_for(lambda: node.sample("vgpuctl_errors_total", kind="internal") == 1, "the bug")
        node.host.writer().write(f"bus/mdev/devices/{U4}/remove", "1")
        wait_for(converged(node, reconciles=2), "a repair: the loop still runs")
        assert node.loop.health().ok


# -- probes and metrics ------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_health_fails_when_the_loop_stops_ticking(tmp_path: Path) -> None:
    clock = FakeClock()
    # A rescan interval of an hour: the loop sleeps until told to stop.
    node = make_node(tmp_path, seed_text(), clock=clock, rescan_interval=3600)
    with running(node.loop):
        wait_for(lambda: node.loop.readiness().ok, "the first reconcile")
        assert node.loop.health().ok
        clock.now += 3 * 3600 + 1
        verdict = node.loop.health()
        assert not verdict.ok
        assert verdict.reason.startswith("stalled: no sign of life for 10801 s")


def test_every_metric_is_exported_with_its_label_values_from_the_start() -> None:
    text = WatchMetrics().exposition().decode()
    for name in (
        "vgpuctl_reconcile_duration_seconds_bucket",
        "vgpuctl_blocked_actions",
        "vgpuctl_last_success_timestamp_seconds",
        "vgpuctl_converged",
        "vgpuctl_desired_state_valid",
        "vgpuctl_rescan_duration_seconds_count",
    ):
        assert f"\n{name}" in text, name
    for result in RESULTS:
        assert f'vgpuctl_reconciles_total{{result="{result}"}} 0.0' in text
    for kind in ERROR_KINDS:
        assert f'vgpuctl_errors_total{{kind="{kind}"}} 0.0' in text
    for source in DRIFT_SOURCES:
        assert f'vgpuctl_drift_detected_total{{source="{source}"}} 0.0' in text
    assert 'vgpuctl_actions_applied_total{kind="vgpu-create"} 0.0' in text


def test_two_loops_do_not_share_metrics() -> None:
    a, b = WatchMetrics(), WatchMetrics()
    a.converged.set(1)
    assert b.registry.get_sample_value("vgpuctl_converged") == 0
