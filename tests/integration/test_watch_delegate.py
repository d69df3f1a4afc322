"""``vgpuctl watch --delegate harvester`` end to end (docs/delegate.md): replicas run as the
Deployment runs them (subprocesses, the real kubernetes client over HTTP) against the API-server
emulator serving Harvester's CRDs, with the double of pcidevices-controller and its webhook
acting on a simulated A2 (``tests/harvester_node.py``).

Expectations from the facts, not from vgpuctl: the host's own files (the seed's four 4 GB vGPUs
on functions 4-7; type ids 751 for A2-4A and 746 for A2-4Q, docs/domain.md §4), the Lease as
client-go's leader election leaves it (holderIdentity, leaseTransitions; a release empties the
holder), and who wrote what as the emulator recorded it per user.
"""

from __future__ import annotations

import errno
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests import rbac
from tests.doubles.admission import UserInfo
from tests.doubles.emulator import ApiServerEmulator, Request
from tests.harvester_node import (
    DRIVER_POD,
    NODE,
    SEED,
    VFS,
    Cluster,
    driver_pod_on,
    harvester_node,
    layout,
    seed_with,
    vm_holds,
)
from tests.simnode import run_vgpuctl
from tests.watch_agent import Watch, wait_for

CRD_SETS = ("harvester",)  # the emu fixture serves Harvester's own CRDs (tests/conftest.py)
LEASE_NAMESPACE = "vgpuctl-delegate"
LEASE = ("coordination.k8s.io", "v1", "leases", "vgpuctl-delegate", LEASE_NAMESPACE)
SEED_TYPES = {VFS[0]: "751", VFS[1]: "746", VFS[2]: "751", VFS[3]: "746"}
#: How long a converge through the double may take (a GPU enable, a resync, four VFs).
CONVERGE = 120.0


@dataclass
class Replica:
    """One replica's flags (its own user, so the emulator tells who wrote what) and directory."""

    flags: list[str]
    dir: Path


@dataclass
class Writers:
    """Every request, by the user that sent it."""

    by_user: dict[str, list[Request]] = field(default_factory=dict)

    def __call__(self, request: Request, who: UserInfo) -> bool:
        self.by_user.setdefault(who.username, []).append(request)
        return True

    def writes(self, user: str) -> list[Request]:
        return [r for r in self.by_user.get(user, []) if r.verb in ("create", "update", "patch")]


@pytest.fixture
def harvester(emu: ApiServerEmulator, tmp_path: Path) -> Iterator[Cluster]:
    with harvester_node(emu, tmp_path) as cluster:
        emu.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NAMESPACE}})
        emu.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})
        yield cluster


def desired_dir(tmp_path: Path) -> Path:
    """A directory holding the seed's desired state, as the ConfigMap mounts it."""
    directory = tmp_path / "desired"
    directory.mkdir()
    (directory / "harvester-kgd9c.yaml").write_text(SEED.read_text())
    return directory


def start(
    cluster: Cluster,
    tmp_path: Path,
    name: str,
    desired: Path,
    *extra: str,
    user: UserInfo | None = None,
) -> Watch:
    who = user or UserInfo(f"replica-{name}")
    kubeconfig = cluster.emu.kubeconfig(tmp_path / f"{name}.kubeconfig", user=who)
    home = tmp_path / name
    home.mkdir()
    return Watch(
        Replica(["--kubeconfig", str(kubeconfig)], home),
        desired,
        "--identity",
        name,
        # Short for a test, long enough that a loaded machine (4 workers on 2 cores) does not
        # miss a leader's renewals for its 4 s renew deadline.
        "--lease-duration",
        "6",
        "--lease-namespace",
        LEASE_NAMESPACE,
        "--timeout",
        "60",
        *(extra or ("--delegate", "harvester")),
    )


def said(watch: Watch, start: str, timeout: float = CONVERGE) -> dict[str, Any]:
    return watch.wait_log(lambda d: str(d.get("msg", "")).startswith(start), start, timeout)


def lease(emu: ApiServerEmulator) -> dict[str, Any]:
    found = emu.get_object(*LEASE)
    assert found is not None
    return dict(found["spec"])


def test_two_replicas_one_leader_converges_the_seed_then_hands_over(
    harvester: Cluster, tmp_path: Path
) -> None:
    writers = Writers()
    harvester.emu.authorize_with(writers)
    desired = desired_dir(tmp_path)
    a = start(harvester, tmp_path, "a", desired)
    b: Watch | None = None
    try:
        said(a, "became the leader", timeout=20)
        b = start(harvester, tmp_path, "b", desired)
        wait_for(lambda: harvester.types() == SEED_TYPES, "the seed's vGPUs", CONVERGE)
        said(a, "converged: every node matches the desired state")
        assert lease(harvester.emu)["holderIdentity"] == "a"
        assert a.metric("vgpuctl_leader") == 1
        assert b.metric("vgpuctl_leader") == 0
        wait_for(a.ready, "the leader ready")
        # The standby is ready once it has read the Lease (a holds it).
        wait_for(lambda: b.get("/readyz") == (200, "standby: a holds the Lease\n"), "b standby")
        # The standby read, and wrote nothing: no spec, no Lease, no Event.
        assert writers.writes("replica-b") == []
        patched = {r.name for r in writers.writes("replica-a") if r.verb == "patch"}
        assert patched == {f"{NODE}-000008000", *(f"{NODE}-00000800{i}" for i in (4, 5, 6, 7))}

        # The leader stops (a rolling update): it releases the Lease, the standby takes over.
        assert a.stop() == 0
        assert "released the Lease vgpuctl-delegate/vgpuctl-delegate" in [
            d.get("msg") for d in a.logs()
        ]
        said(b, "became the leader", timeout=10)
        spec = lease(harvester.emu)
        assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)
        # The new leader acts on the next change: VF 7 from A2-4Q to A2-4A.
        (desired / "harvester-kgd9c.yaml").write_text(seed_with(VFS[3], "NVIDIA A2-4A"))
        wait_for(lambda: harvester.types() == {**SEED_TYPES, VFS[3]: "751"}, "VF 7 as 4A", CONVERGE)
        assert {r.name for r in writers.writes("replica-b") if r.verb == "patch"} == {
            f"{NODE}-000008007"
        }
        # Nothing the controller logs as an error (a conflict it is not: the leader patching a
        # spec while a handler updates that object's status is requeued, as lasso does).
        assert harvester.ctl.errors == []
    finally:
        a.kill()
        if b is not None:
            b.kill()


def test_a_leader_that_dies_is_replaced_once_its_lease_runs_out(
    harvester: Cluster, tmp_path: Path
) -> None:
    desired = desired_dir(tmp_path)
    a = start(harvester, tmp_path, "a", desired)
    b: Watch | None = None
    try:
        said(a, "became the leader", timeout=20)
        b = start(harvester, tmp_path, "b", desired)
        wait_for(lambda: harvester.types() == SEED_TYPES, "the seed's vGPUs", CONVERGE)
        said(b, "watching", timeout=20)
        a.stop(signal.SIGKILL)  # no release: the Lease still names a
        assert lease(harvester.emu)["holderIdentity"] == "a"
        said(b, "became the leader", timeout=25)
        spec = lease(harvester.emu)
        assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)
        wait_for(lambda: b.metric("vgpuctl_leader") == 1, "b's vgpuctl_leader")
        said(b, "converged: every node matches the desired state")
    finally:
        a.kill()
        if b is not None:
            b.kill()


def test_a_vgpu_a_vm_uses_is_blocked_reported_and_left_alone(
    harvester: Cluster, tmp_path: Path
) -> None:
    desired = desired_dir(tmp_path)
    a = start(harvester, tmp_path, "a", desired)
    try:
        wait_for(lambda: harvester.types() == SEED_TYPES, "the seed's vGPUs", CONVERGE)
        said(a, "converged: every node matches the desired state")
        used = vm_holds(harvester, VFS[1])
        (desired / "harvester-kgd9c.yaml").write_text(seed_with(VFS[1], "NVIDIA A2-4A"))
        said(a, "2 change(s) blocked")
        wait_for(lambda: a.metric("vgpuctl_blocked_actions") == 2, "two blocked steps")
        code, body = a.get("/readyz")
        assert code == 200
        assert body.startswith("ready: 2 changes blocked: vgpudevice-disable " + used)
        assert "in use by VM default/win11" in body
        events = [
            e
            for e in harvester.emu.objects("", "v1", "events", "default")
            if e["involvedObject"]["name"] == used
        ]
        assert {(e["involvedObject"]["kind"], e["reason"], e["type"]) for e in events} == {
            ("VGPUDevice", "Blocked", "Warning")
        }
        assert any("in use by VM default/win11" in e["message"] for e in events)
        assert harvester.types() == SEED_TYPES  # VF 5 keeps its 4Q
        # The VM goes: the next rescan plans again and makes the change.
        harvester.emu.delete_object("kubevirt.io", "v1", "virtualmachines", "win11", "default")
        wait_for(lambda: harvester.types() == {**SEED_TYPES, VFS[1]: "751"}, "VF 5 as 4A", CONVERGE)
    finally:
        a.kill()


def test_the_delegate_role_is_enough_for_the_watch_and_every_rule_is_used(
    harvester: Cluster, tmp_path: Path
) -> None:
    """deploy/harvester/rbac.yaml enforced on a replica's requests (auto-detection, the Lease,
    the watches, the spec patches, an Event for a blocked step), together with what the CLI
    tests record: no request refused, no rule unused."""
    role = rbac.enforce(harvester.emu, rbac.DELEGATE_RBAC, rbac.DELEGATE_ACCOUNT)
    # The seed's layout from a node group (the Nodes are listed), then the node's own entry.
    harvester.emu.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    desired = tmp_path / "desired"
    desired.mkdir()
    (desired / "fleet.yaml").write_text(
        "apiVersion: vgpu.reconciler.dev/v1alpha1\nkind: VGPUDesiredState\n"
        "metadata: {name: lab}\nspec:\n  nodeGroups:\n    - name: a2\n"
        '      selector: {names: ["harvester-*"]}\n'
        "      gpus: [{match: {deviceId: 25b6}, sriov: enabled,\n"
        "              vgpus: {0: A2-4A, 1: A2-4Q, 2: A2-4A, 3: A2-4Q}}]\n"
    )
    a = start(harvester, tmp_path, "a", desired, "--delegate", "auto", user=role.user)
    try:
        # Found on its own, and said as a log line in the log's format (JSON here).
        said(a, "Harvester's pcidevices-controller runs (ValidatingWebhookConfiguration", 20)
        wait_for(lambda: harvester.types() == SEED_TYPES, "the seed's vGPUs", CONVERGE)
        said(a, "converged: every node matches the desired state")
        vm_holds(harvester, VFS[1])
        (desired / "harvester-kgd9c.yaml").write_text(seed_with(VFS[1], "NVIDIA A2-4A"))
        said(a, "2 change(s) blocked")
        wait_for(lambda: any(r.resource == "events" for r in role.requests), "the Event", 10)
        assert a.stop() == 0
    finally:
        a.kill()
    assert role.refused() == []
    assert rbac.unused(role.granted, role.requests) == set()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ("--lease-namespace", "Bad_NS"),
            "error: --lease-namespace 'Bad_NS' is not a namespace name",
        ),
        (("--lease-name", "a/b"), "error: --lease-name 'a/b' is not an object name"),
        (("--lease-duration", "1"), "error: --lease-duration must be at least 3 seconds"),
        (("--identity", "a\x1bb"), "error: --identity must be 1 to 253 printable characters"),
    ],
)
def test_a_bad_lease_option_is_an_error_before_anything(
    tmp_path: Path, args: tuple[str, ...], error: str
) -> None:
    # Checked before the cluster is asked anything: no kubeconfig is needed to be told.
    res = run_vgpuctl("watch", tmp_path, "--delegate", "harvester", *args)
    assert res.returncode == 1
    assert res.stderr.strip() == error


def test_a_leader_asked_to_stop_writes_nothing_more_and_the_next_one_finishes(
    harvester: Cluster, tmp_path: Path
) -> None:
    writers = Writers()
    harvester.emu.authorize_with(writers)
    desired = desired_dir(tmp_path)
    a = start(harvester, tmp_path, "a", desired)
    stopped: list[str] = []

    def sigterm_at_the_first_vf_step(request: Request) -> None:
        # SIGTERM while a's first VF patch is in flight: that step is under way, the rest not.
        vf_step = (request.verb, request.resource, request.subresource) == (
            "patch", "vgpudevices", None
        )  # fmt: skip
        if vf_step and not stopped:
            stopped.append(str(request.name))
            a.proc.send_signal(signal.SIGTERM)

    harvester.emu.on_before_write(sigterm_at_the_first_vf_step)
    b: Watch | None = None
    try:
        assert a.proc.wait(timeout=60) == 0
        messages = [str(d.get("msg")) for d in a.logs()]
        assert "stopped between two steps (asked to stop); the next leader carries on" in messages
        assert sum(m.startswith("not run (stopping): vgpudevice-enable") for m in messages) == 1
        assert not any(m.startswith("failed ") for m in messages)
        # The GPU, then the one VF step under way when the signal came: nothing after it.
        patched = [r.name for r in writers.writes("replica-a") if r.verb == "patch"]
        assert patched == [f"{NODE}-000008000", *stopped]
        harvester.emu.on_before_write(None)
        b = start(harvester, tmp_path, "b", desired)
        said(b, "became the leader", timeout=10)  # released: no lease duration to wait
        wait_for(lambda: harvester.types() == SEED_TYPES, "the seed's vGPUs", CONVERGE)
    finally:
        a.kill()
        if b is not None:
            b.kill()


def test_a_replica_that_cannot_create_its_lease_acts_on_nothing_and_is_not_ready(
    harvester: Cluster, tmp_path: Path
) -> None:
    writers = Writers()
    harvester.emu.authorize_with(writers)
    a = start(harvester, tmp_path, "a", desired_dir(tmp_path), "--delegate", "harvester",
              "--lease-namespace", "nowhere")  # fmt: skip
    try:
        said(a, "cannot read or renew the Lease", timeout=20)
        wait_for(lambda: a.get("/readyz")[0] == 503, "/readyz 503")
        code, body = a.get("/readyz")
        assert code == 503
        assert body.startswith("cannot read or renew the Lease: ")
        assert 'namespaces "nowhere" not found' in body
        assert a.metric("vgpuctl_errors_total", kind="lease") >= 1
        assert a.metric("vgpuctl_leader") == 0
        assert [r for r in writers.writes("replica-a") if r.resource != "leases"] == []
        assert harvester.types() == {}
    finally:
        a.kill()


def test_an_enable_the_controller_fails_after_admission_is_never_converged_nor_rewritten(
    harvester: Cluster, tmp_path: Path
) -> None:
    """Issue 30, item 1: the host refuses the vGPU after pcidevices' webhook admitted the spec
    (enableVGPU fails, is retried; no status). The watch stays not converged and says why (log,
    metric, /readyz, a Warning Event), waits again at every retry without writing the spec a
    second time, and converges once the controller is fixed."""
    writers = Writers()
    harvester.emu.authorize_with(writers)
    desired = tmp_path / "desired"
    desired.mkdir()
    layout(desired, {VFS[0]: "NVIDIA A2-4A"}).rename(desired / "harvester-kgd9c.yaml")
    name = f"{NODE}-000008004"
    cause = (
        f"pcidevices-controller has not carried out the enable of NVIDIA A2-4A on {name} after 3 s"
    )
    harvester.ctl.refuse_enable = errno.EPERM
    a = start(harvester, tmp_path, "a", desired, "--delegate", "harvester", "--timeout", "3")
    try:

        def failures() -> int:
            return sum(
                str(d.get("msg", "")).startswith("reconcile failed: ")
                and cause in str(d.get("msg", ""))
                for d in a.logs()
            )

        # Two reconciles failed on it: the second planned it pending and waited again.
        wait_for(lambda: failures() >= 2, "two failed reconciles", CONVERGE)
        messages = [str(d.get("msg", "")) for d in a.logs()]
        assert not any(m.startswith("converged") for m in messages)
        assert a.metric("vgpuctl_converged") == 0
        assert a.metric("vgpuctl_errors_total", kind="apply") >= 2
        code, body = a.get("/readyz")
        assert code == 503 and cause in body
        events = [
            e
            for e in harvester.emu.objects("", "v1", "events", "default")
            if e["involvedObject"]["name"] == name
        ]
        assert {(e["involvedObject"]["kind"], e["reason"], e["type"]) for e in events} == {
            ("VGPUDevice", "StepFailed", "Warning")
        }
        assert all(e["message"].startswith(cause) for e in events)

        def vf_patches() -> list[str | None]:
            return [
                r.name
                for r in writers.writes("replica-a")
                if r.verb == "patch" and r.resource == "vgpudevices"
            ]

        assert vf_patches() == [name]
        # Fixed: the controller's next retry makes the vGPU, the watch converges, one write.
        harvester.ctl.refuse_enable = None
        wait_for(lambda: harvester.types() == {VFS[0]: "751"}, "the vGPU", CONVERGE)
        said(a, "converged: every node matches the desired state")
        assert vf_patches() == [name]
    finally:
        a.kill()


def test_a_node_whose_driver_pod_is_not_ready_is_reported_blocked_then_converges(
    harvester: Cluster, tmp_path: Path
) -> None:
    """Issue 30, item 4: while the node's NVIDIA driver pod crash-loops, pcidevices-controller
    runs no sriov-manage (manageGPU's readiness check fails and the key is requeued): the watch
    writes nothing, reports the step blocked with the pod as its cause (log, metric, /readyz, a
    Warning Event on the SRIOVGPUDevice), and converges at a rescan once the pod runs."""
    writers = Writers()
    harvester.emu.authorize_with(writers)
    driver_pod_on(harvester, running=False)
    cause = (
        f"the NVIDIA driver pod harvester-system/{DRIVER_POD} on node {NODE} is not ready "
        "(phase Running; Ready: False (ContainersNotReady); container nvidia-driver-ctr "
        "waiting: CrashLoopBackOff)"
    )
    gpu = f"{NODE}-000008000"
    a = start(harvester, tmp_path, "a", desired_dir(tmp_path))
    try:
        a.wait_log(lambda d: "change(s) blocked" in str(d.get("msg", "")), "blocked", CONVERGE)
        wait_for(lambda: a.metric("vgpuctl_blocked_actions") >= 1, "a blocked step")
        assert a.metric("vgpuctl_converged") == 0
        code, body = a.get("/readyz")
        assert code == 200 and body.startswith("ready: ")
        assert f"sriovgpudevice-enable {gpu}: {cause}: pcidevices-controller waits" in body
        wait_for(
            lambda: any(
                e["involvedObject"]["name"] == gpu
                for e in harvester.emu.objects("", "v1", "events", "default")
            ),
            "the Event",
            10,
        )
        events = [
            e
            for e in harvester.emu.objects("", "v1", "events", "default")
            if e["involvedObject"]["name"] == gpu
        ]
        assert {(e["involvedObject"]["kind"], e["reason"], e["type"]) for e in events} == {
            ("SRIOVGPUDevice", "Blocked", "Warning")
        }
        assert all(e["message"].startswith(cause) for e in events)
        assert [r for r in writers.writes("replica-a") if r.resource != "events"] == [
            r for r in writers.writes("replica-a") if r.resource == "leases"
        ]  # no spec written
        assert harvester.ctl.sriov_manage_calls == []
        # The pod runs: the next rescan plans the node again and converges it.
        driver_pod_on(harvester, running=True)
        wait_for(lambda: harvester.types() == SEED_TYPES, "the seed's vGPUs", CONVERGE)
        said(a, "converged: every node matches the desired state")
    finally:
        a.kill()
