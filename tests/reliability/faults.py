"""Faults survived: the world misbehaves for a while, ``vgpuctl apply`` says so clearly, and once
the fault is gone the next apply converges.

- sysfs unreadable: the simulated tree renamed away before an apply, or in the middle of one
  (while the simulated kernel is idle) and put back while it runs, or only after it ended;
- API server down: the emulator stopped before an apply (nothing may happen on the host), or at
  the apply's first cluster write (the host is done, the cluster is not), then started again;
- ``sriov-manage`` hanging (``sim fail --sriov hang``) past ``apply --timeout 2``: it is killed,
  the apply fails naming the timeout, nothing is left running;
- the desired-state file deleted, or made invalid: apply refuses before touching the host.

A fault is survived when every failing run failed cleanly (exit 1, a message, no traceback, no
hang, the host untouched where promised) and the host converged afterwards with no duplicate
vGPU. Watch mode's faults (a file going bad while it runs, a kubelet restart) come with watch.
"""

from __future__ import annotations

import contextlib
import io
import random
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from reconciler.sim import build_host
from tests.doubles.emulator import ApiServerEmulator, Request
from tests.reliability.hosts import (
    REPO,
    Run,
    SimNode,
    histogram,
    kernel_quiet,
    read_truth,
    reap_strays,
    safety,
)
from tests.reliability.sizes import Context

SEED = REPO / "desired-state" / "harvester-kgd9c.yaml"
NODE = "harvester-kgd9c"
GPU = "0000:08:00.0"
BUSY_GPU = "0000:41:00.0"
MAX_RERUNS = 3
HANG_TIMEOUT = 2.0
#: ``apply --verify-timeout`` where sysfs goes away: how long an action waits for its effect.
VERIFY_TIMEOUT = 10.0
#: A hung sriov-manage must cost its timeout, not much more.
HANG_SLACK = 10.0


_TELLS = re.compile(r"error|failed|cannot|did not|not run|refused|invalid|no such", re.I)


@dataclass(slots=True)
class Attempt:
    """One go at one fault: what was seen, and what went wrong."""

    messages: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    reruns: int = 0
    #: How the apply that met the fault ended (exit 1, or exit 0 when it finished first).
    outcome: str = ""

    def saw(self, run: Run) -> None:
        self.outcome = self.outcome or run.outcome()
        # What the user is told about the failure first, then the rest.
        lines = sorted(run.messages(6), key=lambda line: not _TELLS.search(line))
        for line in lines[:3]:
            if line not in self.messages:
                self.messages.append(line)

    def expect_clean_failure(self, run: Run, what: str, *, fragment: str | None = None) -> None:
        """The run failed as a user should see it: exit 1, a message (with ``fragment``)."""
        self.saw(run)
        if run.bug:
            self.problems.append(f"{what}: {run.bug}")
        if run.returncode != 1:
            self.problems.append(f"{what}: {run.outcome()}, expected exit 1")
        elif not run.messages():
            self.problems.append(f"{what}: exit 1 without a message")
        elif fragment is not None and fragment not in run.stderr:
            self.problems.append(f"{what}: no {fragment!r} in {run.messages()}")


def seed_host(directory: Path, *, extra: tuple[str, ...] = ()) -> tuple[SimNode, Path]:
    """The seed's node (one A2, SR-IOV off) and a copy of its desired state to break."""
    build_host(
        directory / "host", {"gpus": [{"model": "A2", "address": GPU}], "extraDevices": False}
    )
    desired = directory / "desired.yaml"
    shutil.copyfile(SEED, desired)
    return SimNode(directory / "host", NODE, extra), desired


def busy_host(directory: Path) -> tuple[SimNode, Path, list[str]]:
    """The seed's A2 and an L40S to fill with 32 vGPUs: an apply long enough to interrupt."""
    gpus = [{"model": "A2", "address": GPU}, {"model": "L40S", "address": BUSY_GPU}]
    build_host(directory / "host", {"gpus": gpus, "extraDevices": False})
    spec = yaml.safe_load(SEED.read_text())
    spec["spec"]["nodes"][NODE]["gpus"].append(
        {"address": BUSY_GPU, "sriov": "enabled", "profiles": {"NVIDIA L40S-1Q": 32}}
    )
    desired = directory / "desired.yaml"
    desired.write_text(yaml.safe_dump(spec, sort_keys=False))
    return SimNode(directory / "host", NODE), desired, [GPU, BUSY_GPU]


def check_untouched(attempt: Attempt, node: SimNode, before: dict[str, int], what: str) -> None:
    if node.stats() != before:
        attempt.problems.append(f"{what}: the host was changed ({before} → {node.stats()})")


def _converge(
    attempt: Attempt, node: SimNode, desired: Path, *, gpus: tuple[str, ...] = (GPU,)
) -> None:
    """Apply until the oracle finds the host converged (bounded), checking the host each
    time."""
    left: list[str] = []
    for rerun in range(1, MAX_RERUNS + 1):
        run = node.run("apply", desired, "--yes", timeout=120)
        attempt.reruns = rerun
        if run.bug or run.hung:
            attempt.problems.append(f"apply after the fault: {run.bug or 'hung'}")
        attempt.problems += safety(read_truth(node.sysfs_root, gpus), {}).problems()
        left = node.converged(desired)
        if not left:
            return
    attempt.problems.append(f"not converged after {MAX_RERUNS} applies: {left[:3]}")


# --- the faults ---------------------------------------------------------------------------------


def sysfs_gone_before(directory: Path, rng: random.Random) -> Attempt:
    attempt = Attempt()
    node, desired = seed_host(directory)
    away = node.dir / "sys.away"
    node.sysfs_root.rename(away)
    run = node.run("apply", desired, "--yes", timeout=60)
    attempt.expect_clean_failure(run, "apply without sysfs", fragment=str(node.sysfs_root))
    away.rename(node.sysfs_root)
    _converge(attempt, node, desired)
    return attempt


def sysfs_gone_for_a_while(directory: Path, rng: random.Random) -> Attempt:
    """The tree vanishes at a random moment of an apply and comes back while it still runs."""
    attempt = Attempt()
    node, desired, gpus = busy_host(directory)
    away = node.dir / "sys.away"
    started = node.start(
        "apply", desired, "--yes", "--verify-timeout", str(VERIFY_TIMEOUT),
        out_dir=directory, label="apply",
    )  # fmt: skip
    started.wait_for_progress(timeout=60)  # among the actions, not in start-up
    time.sleep(rng.uniform(0.0, 0.3))
    with kernel_quiet(node.sysfs_root):  # between two simulated kernel calls
        node.sysfs_root.rename(away)
    time.sleep(rng.uniform(0.2, 2.0))
    with kernel_quiet(away):
        away.rename(node.sysfs_root)
    _interrupted_apply(attempt, started.finish(timeout=VERIFY_TIMEOUT + 60), "for a while")
    reap_strays(node.sriov_manage, wait=10)
    _converge(attempt, node, desired, gpus=tuple(gpus))
    return attempt


def sysfs_gone_until_failure(directory: Path, rng: random.Random) -> Attempt:
    """The tree vanishes at a random moment of an apply and stays away until the apply ends."""
    attempt = Attempt()
    node, desired, gpus = busy_host(directory)
    away = node.dir / "sys.away"
    started = node.start(
        "apply", desired, "--yes", "--verify-timeout", str(VERIFY_TIMEOUT),
        out_dir=directory, label="apply",
    )  # fmt: skip
    started.wait_for_progress(timeout=60)  # among the actions, not in start-up
    time.sleep(rng.uniform(0.0, 0.3))
    with kernel_quiet(node.sysfs_root):
        node.sysfs_root.rename(away)
    run = started.finish(timeout=VERIFY_TIMEOUT + 60)
    _interrupted_apply(attempt, run, "until it ends")
    if run.returncode == 1 and run.seconds > VERIFY_TIMEOUT + HANG_SLACK:
        attempt.problems.append(f"took {run.seconds:.0f} s to give up (--verify-timeout 10)")
    reap_strays(node.sriov_manage, wait=10)
    away.rename(node.sysfs_root)
    _converge(attempt, node, desired, gpus=tuple(gpus))
    return attempt


def _interrupted_apply(attempt: Attempt, run: Run, how: str) -> None:
    """An apply that lost sysfs may finish (it was done, or rode the outage out) or fail
    clearly; it may not hang or crash."""
    attempt.saw(run)
    if run.bug or run.hung or run.returncode not in (0, 1):
        attempt.problems.append(f"apply losing sysfs {how}: {run.outcome()} {run.bug or ''}")
    elif run.returncode == 1 and not run.messages():
        attempt.problems.append(f"apply losing sysfs {how}: exit 1 without a message")


def emulator(*, kubevirt: bool = True) -> ApiServerEmulator:
    """The API-server emulator with our CRDs, KubeVirt's resources, and (``kubevirt``) a
    KubeVirt CR with an empty allow-list in harvester-system."""
    emu = ApiServerEmulator()
    for path in sorted((REPO / "schemas" / "crds").glob("*.yaml")):
        emu.register_crd(yaml.safe_load(path.read_text()))
    emu.register("kubevirt.io", "v1", "kubevirts", "KubeVirt", True, True)
    emu.register(
        "kubevirt.io", "v1", "virtualmachineinstances", "VirtualMachineInstance", True, True
    )
    emu.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "harvester-system"}})
    if not kubevirt:
        return emu
    emu.seed(
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "KubeVirt",
            "metadata": {"name": "kubevirt", "namespace": "harvester-system"},
            "spec": {"configuration": {"permittedHostDevices": {"mediatedDevices": []}}},
        }
    )
    return emu


def cluster_host(directory: Path, emu: ApiServerEmulator) -> tuple[SimNode, Path]:
    kubelet = directory / "kubelet"
    (kubelet / "device-plugins").mkdir(parents=True)
    kubeconfig = emu.kubeconfig(directory / "kubeconfig")
    return seed_host(
        directory, extra=("--kubeconfig", str(kubeconfig), "--kubelet-dir", str(kubelet))
    )


def check_cluster_objects(attempt: Attempt, emu: ApiServerEmulator) -> None:
    sriov = emu.objects("devices.harvesterhci.io", "v1beta1", "sriovgpudevices")
    vgpus = emu.objects("devices.harvesterhci.io", "v1beta1", "vgpudevices")
    names = [o["metadata"]["name"] for o in vgpus]
    if len(sriov) != 1 or len(vgpus) != 16 or len(set(names)) != len(names):
        attempt.problems.append(
            f"cluster objects: {len(sriov)} SRIOVGPUDevice(s), {len(vgpus)} VGPUDevice(s)"
        )
    configured = [o for o in vgpus if o.get("status", {}).get("uuid")]
    if len(configured) != 4:
        attempt.problems.append(f"{len(configured)} VGPUDevices show a vGPU, expected 4")


def api_down_before(directory: Path, rng: random.Random) -> Attempt:
    attempt = Attempt()
    with emulator() as emu:
        node, desired = cluster_host(directory, emu)
        emu.stop()
        before = node.stats()
        run = node.run("apply", desired, "--yes", timeout=120)
        attempt.expect_clean_failure(run, "apply with the API server down")
        check_untouched(attempt, node, before, "apply with the API server down")
        emu.start()
        _converge(attempt, node, desired)
        check_cluster_objects(attempt, emu)
    return attempt


def api_down_mid_apply(directory: Path, rng: random.Random) -> Attempt:
    """The API server goes away while the apply's first cluster write is in flight."""
    attempt = Attempt()
    stopping: list[threading.Thread] = []
    # The emulator's HTTP server reports the connection it loses on stderr: expected here.
    with emulator() as emu, contextlib.redirect_stderr(io.StringIO()):
        node, desired = cluster_host(directory, emu)

        def go_down(request: Request) -> None:
            if stopping:
                return
            stopping.append(threading.Thread(target=emu.stop, daemon=True))
            stopping[0].start()
            stopping[0].join(timeout=10)  # this write's answer never reaches the client

        emu.on_before_write(go_down)
        run = node.run("apply", desired, "--yes", timeout=120)
        emu.on_before_write(None)
        attempt.saw(run)
        if not stopping:
            attempt.problems.append("the apply made no cluster write: nothing was tested")
        elif run.bug or run.hung or run.returncode != 1:
            attempt.problems.append(f"apply losing the API server: {run.outcome()} {run.bug or ''}")
        for thread in stopping:
            thread.join(timeout=10)
        emu.start()
        _converge(attempt, node, desired)
        check_cluster_objects(attempt, emu)
    return attempt


def sriov_manage_hangs(directory: Path, rng: random.Random) -> Attempt:
    attempt = Attempt()
    node, desired = seed_host(directory)
    node.sim("fail", "--sriov", "hang")
    run = node.run("apply", desired, "--yes", "--timeout", str(HANG_TIMEOUT), timeout=120)
    attempt.expect_clean_failure(
        run, "apply with sriov-manage hanging", fragment=f"did not finish within {HANG_TIMEOUT:g} s"
    )
    if run.seconds > HANG_TIMEOUT + HANG_SLACK:
        attempt.problems.append(f"apply took {run.seconds:.1f} s with a {HANG_TIMEOUT:g} s timeout")
    left = reap_strays(node.sriov_manage, wait=3)
    if left:
        attempt.problems.append(f"{len(left)} sriov-manage process(es) left hanging")
    _converge(attempt, node, desired)
    return attempt


def desired_deleted(directory: Path, rng: random.Random) -> Attempt:
    attempt = Attempt()
    node, desired = seed_host(directory)
    desired.unlink()
    before = node.stats()
    run = node.run("apply", desired, "--yes", timeout=60)
    attempt.expect_clean_failure(run, "apply of a deleted file", fragment=str(desired))
    check_untouched(attempt, node, before, "apply of a deleted file")
    shutil.copyfile(SEED, desired)
    _converge(attempt, node, desired)
    return attempt


def desired_invalid(directory: Path, rng: random.Random) -> Attempt:
    attempt = Attempt()
    node, desired = seed_host(directory)
    broken = rng.choice(
        (
            SEED.read_text().replace("sriov: enabled", "sriov: maybe"),
            SEED.read_text().replace("NVIDIA A2-4Q", "NVIDIA A2-2Q", 1),  # mixed sizes
            SEED.read_text() + "  extra: [unclosed\n",
            SEED.read_text().replace("model: NVIDIA A2", "model: NVIDIA A2\n          model: x"),
        )
    )
    desired.write_text(broken)
    before = node.stats()
    run = node.run("apply", desired, "--yes", timeout=60)
    attempt.expect_clean_failure(run, "apply of an invalid file", fragment=f"{desired}:")
    check_untouched(attempt, node, before, "apply of an invalid file")
    shutil.copyfile(SEED, desired)
    _converge(attempt, node, desired)
    return attempt


FAULTS: dict[str, Callable[[Path, random.Random], Attempt]] = {
    "sysfs_unreadable_before_apply": sysfs_gone_before,
    "sysfs_unreadable_during_apply_for_a_while": sysfs_gone_for_a_while,
    "sysfs_unreadable_during_apply_until_it_ends": sysfs_gone_until_failure,
    "api_server_down_before_apply": api_down_before,
    "api_server_down_at_first_cluster_write": api_down_mid_apply,
    "sriov_manage_hangs_past_timeout": sriov_manage_hangs,
    "desired_file_deleted": desired_deleted,
    "desired_file_invalid": desired_invalid,
}


def faults_survived(ctx: Context) -> dict[str, Any]:
    """Scenario: each fault ``fault_repeats`` times. Returns figures per fault."""
    started = time.monotonic()
    base = ctx.scratch("faults")
    figures: dict[str, Any] = {}
    for name, fault in FAULTS.items():
        attempts: list[Attempt] = []
        for repeat in range(ctx.size.fault_repeats):
            if time.monotonic() - started > ctx.size.budget:
                break
            directory = base / f"{name}-{repeat}"
            directory.mkdir()
            try:
                attempt = fault(directory, ctx.rng("faults", name, repeat))
            except Exception as exc:  # the harness itself failed: a fault not survived
                attempt = Attempt(problems=[f"harness error: {type(exc).__name__}: {exc}"])
            attempts.append(attempt)
            if not attempt.problems:
                shutil.rmtree(directory, ignore_errors=True)
        messages: list[str] = []
        for a in attempts:
            messages += [m for m in a.messages if m not in messages]
        figures[name] = {
            "survived": bool(attempts) and all(not a.problems for a in attempts)
            and len(attempts) == ctx.size.fault_repeats,
            "trials": len(attempts),
            "max_applies_to_converge": max((a.reruns for a in attempts), default=0),
            "outcomes_under_the_fault": histogram(a.outcome for a in attempts),
            "messages": messages[:6],
            "problems": [p for a in attempts for p in a.problems][:6],
        }  # fmt: skip
    survived = sum(1 for f in figures.values() if f["survived"])
    return {
        "faults": len(FAULTS),
        "survived": survived,
        **figures,
        "seconds": round(time.monotonic() - started, 1),
        "ok": survived == len(FAULTS),
    }
