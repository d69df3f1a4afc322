"""Faults survived under ``vgpuctl watch``: the world misbehaves while the agent runs. Watch
must never crash (nor exit: a DaemonSet would crash-loop it), must say what is wrong (an error
log line, ``vgpuctl_errors_total``, ``/readyz``'s text), must keep what is in force, and must
converge once the fault is gone, by itself: nobody runs anything but the fault.

- the desired-state file deleted (after watch converged): watch stays up and ready, the host
  is untouched, the error names the file, ``vgpuctl_desired_state_valid`` goes 0; the file put
  back with an edit is converged on;
- the file made invalid, each of several ways (a bad value, mixed vGPU sizes, a YAML syntax
  error, a duplicate key, a truncated or emptied file): the last valid state stays in force
  (the host untouched, and host drift, ``vgpuctl sim reboot`` or a vGPU removed by a direct
  sysfs write, still repaired to it), the error line carries ``file`` and ``line``; fixed with
  the other valid state, watch converges on that;
- the simulated sysfs tree renamed away (under ``kernel_quiet``) while watch is idle, or in the
  middle of the reconcile of an edit (a busy host: 33 actions), and put back after 0.5-3 s (and
  not before watch noticed: a fault watch never looked at tested nothing): ``/healthz`` 200
  throughout, failed reconciles counted and logged, retried with growing delays, no traceback;
- the API server (``tests/doubles/emulator.py``) stopped, then an edit: the reconcile stops at the
  cluster read, before any host action; started again: the edit is converged on, the cluster
  objects are right;
- ``sriov-manage`` hanging (``sim fail --sriov hang``) past ``watch --timeout 2`` on an edit
  that enables SR-IOV: the reconcile fails naming the timeout, nothing is left running, the
  retry converges;
- a kubelet restart (``tests/doubles/fake_kubelet.py``) with watch's device plugins: every
  plugin registers again (timed: the device-plugin issue asks ≤ 1 s), the kubelet's allocatable
  is back to the same counts, the host untouched; an edit afterwards moves the allocatable.

Every attempt ends with SIGTERM: watch must exit 0. Throughout, ``/healthz`` is sampled and
must answer 200; any traceback or internal error logged is a failure. Figures per fault: as
``faults.py``'s, plus the error counts by kind, what ``/readyz`` said, the seconds from the end
of the fault to the converged log line, and the kubelet re-registration times.
"""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import math
import os
import random
import re
import shutil
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from reconciler.sim import SimHost
from tests.doubles.fake_kubelet import FakeKubelet, make_plugin_dir, remove_plugin_dir
from tests.reliability.faults import (
    BUSY_GPU,
    GPU,
    NODE,
    SEED,
    Attempt,
    busy_host,
    check_cluster_objects,
    check_untouched,
    cluster_host,
    emulator,
    seed_host,
)
from tests.reliability.hosts import (
    SimNode,
    histogram,
    kernel_quiet,
    read_truth,
    reap_strays,
    safety,
)
from tests.reliability.sizes import Context
from tests.reliability.watching import WatchProcess

#: What watch is given for the hang: shorter than WatchProcess's ``--timeout 30``, which it
#: follows on the command line (the last one given wins).
HANG_TIMEOUT = 2.0
#: A hung sriov-manage must cost its timeout, not much more.
HANG_SLACK = 10.0
#: Generous bounds (two shared cores): only real misbehaviour may exceed them.
START_TIMEOUT = 60.0
WAIT = 30.0
CONVERGE_TIMEOUT = 90.0
REREGISTER_TIMEOUT = 15.0
#: Edits made until one's reconcile is under way when sysfs goes away.
MID_TRIES = 3
#: Long enough for a few rescans (``--rescan-interval 0.5``): time for watch to misbehave.
HOLD = 1.5
#: The device-plugin issue's target for a plugin to register again after a kubelet restart.
REREGISTER_TARGET = 1.0
FAILURES_SHOWN = 10

SEED_LAYOUT = {
    "0000:08:00.4": "NVIDIA A2-4A",
    "0000:08:00.5": "NVIDIA A2-4Q",
    "0000:08:00.6": "NVIDIA A2-4A",
    "0000:08:00.7": "NVIDIA A2-4Q",
}
EDITED_LAYOUT = {**SEED_LAYOUT, "0000:08:00.4": "NVIDIA A2-4C"}
A2_4A, A2_4Q, A2_4C = (f"nvidia.com/NVIDIA_A2-{p}" for p in ("4A", "4Q", "4C"))
SEED_ALLOCATABLE = {A2_4A: 2, A2_4Q: 2}
EDITED_ALLOCATABLE = {A2_4A: 1, A2_4C: 1, A2_4Q: 2}


def _seed_text() -> str:
    return SEED.read_text()


def _edited_text() -> str:
    """The seed with its first vGPU changed to A2-4C: a remove and a create, no SR-IOV change."""
    return _seed_text().replace('"0000:08:00.4": NVIDIA A2-4A', '"0000:08:00.4": NVIDIA A2-4C')


def _sriov_off_text() -> str:
    spec = yaml.safe_load(_seed_text())
    gpu = spec["spec"]["nodes"][NODE]["gpus"][0]
    gpu["sriov"] = "disabled"
    del gpu["vgpus"]
    return yaml.safe_dump(spec, sort_keys=False)


#: Ways a valid desired state is broken (each is a located problem for ``vgpuctl validate``).
BREAKAGES: dict[str, Callable[[str], str]] = {
    "bad_value": lambda text: text.replace("sriov: enabled", "sriov: maybe"),
    "mixed_sizes": lambda text: text.replace("NVIDIA A2-4Q", "NVIDIA A2-2Q", 1),
    "yaml_syntax": lambda text: text + "  extra: [unclosed\n",
    "duplicate_key": lambda text: text.replace(
        "model: NVIDIA A2", "model: NVIDIA A2\n          model: x"
    ),
    "truncated": lambda text: text[: text.index("vgpus:") + len("vgpus:\n")],
    "emptied": lambda text: "",
}


@dataclass(slots=True)
class WatchAttempt(Attempt):
    """One go at one fault under watch (``outcome``: what watch did while it lasted)."""

    #: ``vgpuctl_errors_total`` increments while the fault lasted, by kind.
    errors: Counter[str] = field(default_factory=Counter)
    #: What ``/readyz`` said (status and text) while something was wrong.
    readyz: list[str] = field(default_factory=list)
    #: From the end of the fault to watch's "converged" log line.
    converge_seconds: list[float] = field(default_factory=list)
    #: How long the sysfs tree stayed away.
    outage_seconds: list[float] = field(default_factory=list)
    #: Kubelet restart: from restart to the last plugin registered again / allocatable back.
    reregister_seconds: list[float] = field(default_factory=list)
    allocatable_back_seconds: list[float] = field(default_factory=list)
    #: Kubelet restart: Register calls per plugin with the restarted kubelet.
    registrations: list[int] = field(default_factory=list)
    #: ``/healthz`` answers sampled (every one must be 200).
    probes: int = 0
    #: Which variants of the fault were tried (breakages, drifts).
    variants: list[str] = field(default_factory=list)


class _GiveUp(Exception):
    """The attempt cannot go on (the problem is already recorded)."""


# --- log lines ----------------------------------------------------------------------------------


def _ts(line: dict[str, Any]) -> float:
    """A JSON log line's wall-clock time (``ts``, UTC, milliseconds)."""
    try:
        return datetime.fromisoformat(str(line["ts"])).timestamp()
    except (KeyError, ValueError):
        return math.nan


def _is_failure(line: dict[str, Any]) -> bool:
    return str(line.get("msg", "")).startswith("reconcile failed")


def _is_converged(line: dict[str, Any]) -> bool:
    return str(line.get("msg", "")).startswith("converged")


def _done(lines: list[dict[str, Any]]) -> int:
    """How many actions these lines report carried out."""
    return sum(d.get("status") == "done" for d in lines)


def _done_at_least(n: int, lines: list[dict[str, Any]]) -> bool:
    return _done(lines) >= n


_PORT = re.compile(r"127\.0\.0\.1:\d+")
_RETRY = re.compile(r"; retrying in [\d.]+ s$")


class _Watched:
    """``vgpuctl watch`` for one attempt: started and ready on entry; ``/healthz`` and
    ``/readyz`` sampled in the background; SIGTERM on exit (exit 0 expected), any traceback
    or internal error it logged, or a stray ``sriov-manage``, recorded as a problem."""

    def __init__(
        self,
        attempt: WatchAttempt,
        node: SimNode,
        desired: Path,
        directory: Path,
        *,
        extra: tuple[str, ...] = (),
        must_stay_ready: bool = False,
        scrub: tuple[Path, ...] = (),
    ) -> None:
        self.attempt = attempt
        self.node = node
        self.directory = directory
        self.scrub = (directory, *scrub)
        self.must_stay_ready = must_stay_ready
        self.watch = WatchProcess(node, desired, out_dir=directory, label="watch", extra=extra)
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self._unhealthy: list[str] = []
        self._unready: list[str] = []
        self._samples = 0

    def __enter__(self) -> _Watched:
        try:
            if not self.watch.wait_ready(timeout=START_TIMEOUT):
                answer = self.watch.get("/readyz")
                state = "exited" if not self.watch.alive() else f"/readyz {answer}"
                self.attempt.problems.append(f"watch never ready at start ({state})")
                raise _GiveUp
        except BaseException:
            self._end()
            raise
        self._sampler = threading.Thread(target=self._sample, name="probe", daemon=True)
        self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._end()

    def _sample(self) -> None:
        while not self._stop.wait(0.25):
            health = self.watch.get("/healthz")
            if health is None or health[0] != 200:
                if self.watch.alive():
                    self._unhealthy.append(f"/healthz {health}")
                continue
            ready = self.watch.get("/readyz")
            self._samples += 1
            if ready is None:
                self._unready.append("/readyz did not answer")
                continue
            text = f"{ready[0]} {ready[1].strip()}"
            if text != "200 ready: converged":
                self.note_readyz(text)
            if ready[0] != 200:
                self._unready.append(text)

    def note_readyz(self, text: str) -> None:
        text = self.clean(text)
        if text not in self.attempt.readyz:
            self.attempt.readyz.append(text)

    def _end(self) -> None:
        a = self.attempt
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join(timeout=10)
        a.probes += self._samples
        if self._unhealthy:
            a.problems.append(
                f"/healthz not 200 {len(self._unhealthy)} time(s): {self._unhealthy[0]}"
            )
        if self.must_stay_ready and self._unready:
            a.problems.append(f"not ready {len(self._unready)} time(s): {self._unready[0]}")
        crashed = not self.watch.alive()
        run = self.watch.terminate(timeout=60)
        if crashed:
            a.problems.append(f"watch exited on its own ({run.outcome()})")
        elif run.hung:
            a.problems.append("watch did not stop within 60 s of SIGTERM")
        elif run.returncode != 0:
            a.problems.append(f"watch ended {run.outcome()} on SIGTERM, expected exit 0")
        a.problems += [f"watch logged a bug: {bug}" for bug in self.watch.bugs()[:3]]
        left = reap_strays(self.node.sriov_manage, wait=5)
        if left:
            a.problems.append(f"{len(left)} sriov-manage process(es) left running")

    # -- what it says ------------------------------------------------------------------------

    def clean(self, text: str) -> str:
        """A message without this attempt's paths, ports and retry delays (comparable)."""
        for path in self.scrub:
            text = text.replace(str(path), "<dir>")
        return _RETRY.sub("; retrying in … s", _PORT.sub("127.0.0.1:<port>", text))

    def mark(self) -> int:
        return len(self.watch.logs())

    def since(self, mark: int) -> list[dict[str, Any]]:
        return self.watch.logs()[mark:]

    def wait_line(
        self, mark: int, match: Callable[[dict[str, Any]], bool], *, timeout: float = WAIT
    ) -> dict[str, Any] | None:
        """The first line after ``mark`` that ``match`` accepts (waiting, bounded)."""
        deadline = time.monotonic() + timeout
        while True:
            found = next((d for d in self.since(mark) if match(d)), None)
            if found is not None or time.monotonic() > deadline or not self.watch.alive():
                return found
            time.sleep(0.01)

    def wait_lines(
        self, mark: int, match: Callable[[list[dict[str, Any]]], bool], *, timeout: float = WAIT
    ) -> bool:
        deadline = time.monotonic() + timeout
        while not match(self.since(mark)):
            if time.monotonic() > deadline or not self.watch.alive():
                return False
            time.sleep(0.005)
        return True

    def told(self, mark: int) -> None:
        """Keep what watch logged as errors and warnings since ``mark`` (errors first)."""
        lines = [
            d
            for d in self.since(mark)
            if d.get("level") in ("error", "critical", "warning")
            and str(d.get("logger", "")).startswith("vgpuctl")
        ]
        lines.sort(key=lambda d: d.get("level") == "warning")
        for line in lines:
            text = self.clean(str(line.get("msg")))
            if text not in self.attempt.messages:
                self.attempt.messages.append(text)

    def errors(self) -> Counter[str]:
        return Counter(
            {
                dict(labels).get("kind", ""): value
                for (name, labels), value in self.watch.metrics().items()
                if name == "vgpuctl_errors_total"
            }
        )

    def count_errors(self, before: Counter[str]) -> Counter[str]:
        moved = Counter({k: int(v - before[k]) for k, v in self.errors().items() if v > before[k]})
        self.attempt.errors.update(moved)
        return moved

    def wait_metric(self, name: str, value: float, *, timeout: float = WAIT) -> bool:
        deadline = time.monotonic() + timeout
        while self.watch.metric(name) != value:
            if time.monotonic() > deadline or not self.watch.alive():
                return False
            time.sleep(0.05)
        return True

    def converged_after(self, mark: int, ended: float, what: str, *, timed: bool = True) -> None:
        """Wait for the converged line after the fault ended (wall time ``ended``); time it."""
        line = self.wait_line(mark, lambda d: _is_converged(d) and _ts(d) >= ended - 0.002,
                              timeout=CONVERGE_TIMEOUT)  # fmt: skip
        if line is None:
            answer = self.watch.get("/readyz")
            self.attempt.problems.append(
                f"not converged {CONVERGE_TIMEOUT:g} s after {what} "
                f"(/readyz {self.clean(str(answer))})"
            )
            raise _GiveUp
        if timed:
            self.attempt.converge_seconds.append(round(max(0.0, _ts(line) - ended), 3))

    def backed_off(self, mark: int) -> None:
        """The failed reconciles since ``mark`` were retried with growing delays: the
        ``failures`` field counts up by one, ``retry_in`` never shrinks (before its cap) from
        one transient failure to the next (a permanent one waits for a change instead, with
        the resync interval as its ``retry_in``)."""
        lines = []
        for d in self.since(mark):
            if _is_converged(d):
                break
            if _is_failure(d):
                lines.append(d)
        counts = [int(d.get("failures") or 0) for d in lines]
        delays = [float(d.get("retry_in") or 0) for d in lines if d.get("transient") is True]
        if counts and counts != list(range(counts[0], counts[0] + len(counts))):
            self.attempt.problems.append(f"failures counted {counts}: not one more each time")
        if any(b < a * 0.999 for a, b in itertools.pairwise(delays)) or (delays and delays[0] <= 0):
            self.attempt.problems.append(f"retry delays {delays}: no backoff")


# --- the host -----------------------------------------------------------------------------------


def _write(path: Path, text: str, rng: random.Random) -> None:
    """As people and tools write: in place, or an editor's write-and-rename-over."""
    if rng.random() < 0.5:
        path.write_text(text)
        return
    temp = path.with_name(f".{path.name}.swp")
    temp.write_text(text)
    os.replace(temp, path)


def _vf_layout(node: SimNode, gpu: str = GPU) -> dict[str, str]:
    return {v.vf: v.type_name for v in read_truth(node.sysfs_root, [gpu]).on(gpu)}


def _wait_layout(node: SimNode, layout: dict[str, str], *, timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if _vf_layout(node) == layout:
                return True
        except OSError:
            pass  # the tree is being changed under us
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _settled(
    attempt: WatchAttempt,
    node: SimNode,
    desired: Path,
    layout: dict[str, str],
    *,
    counts: dict[str, dict[str, int]] | None = None,
) -> None:
    """The host as the desired state says, read from the tree, and the oracle's verdict."""
    gpus = [GPU, *(counts or {})]
    truth = read_truth(node.sysfs_root, gpus)
    attempt.problems += safety(truth, {}).problems()
    now = {v.vf: v.type_name for v in truth.on(GPU)}
    if now != layout:
        attempt.problems.append(f"the A2 has {now}, desired {layout}")
    for gpu, want in (counts or {}).items():
        have = dict(Counter(v.type_name for v in truth.on(gpu)))
        if have != want:
            attempt.problems.append(f"{gpu} has {have}, desired {want}")
    attempt.problems += node.converged(desired)


# --- the faults ---------------------------------------------------------------------------------

Fault = Callable[[Path, random.Random], WatchAttempt]


def _fault(body: Callable[[WatchAttempt, Path, random.Random], None]) -> Fault:
    """A fault's body fills in its attempt; giving up, or the harness failing, ends it there
    (a harness exception counts as a fault not survived)."""

    @functools.wraps(body)
    def run(directory: Path, rng: random.Random) -> WatchAttempt:
        attempt = WatchAttempt()
        try:
            body(attempt, directory, rng)
        except _GiveUp:
            pass
        except Exception as exc:
            attempt.problems.append(f"harness error: {type(exc).__name__}: {exc}")
        return attempt

    return run


@_fault
def desired_deleted(a: WatchAttempt, directory: Path, rng: random.Random) -> None:
    node, desired = seed_host(directory)
    with _Watched(a, node, desired, directory, must_stay_ready=True) as w:
        time.sleep(rng.uniform(0.0, 1.0))
        before, errors, mark = node.stats(), w.errors(), w.mark()
        desired.unlink()
        named = w.wait_line(
            mark, lambda d: d.get("level") == "error" and d.get("file") == str(desired)
        )
        if named is None:
            a.problems.append(f"no error log line with file {desired}")
        if not w.wait_metric("vgpuctl_desired_state_valid", 0.0):
            a.problems.append("vgpuctl_desired_state_valid did not go 0")
        time.sleep(HOLD)
        check_untouched(a, node, before, "with the file gone")
        a.outcome = "kept the last valid state" if named else "said nothing"
        w.told(mark)
        w.count_errors(errors)
        mark = w.mark()
        ended = time.time()
        _write(desired, _edited_text(), rng)
        w.converged_after(mark, ended, "the file came back with an edit")
        if w.watch.metric("vgpuctl_desired_state_valid") != 1.0:
            a.problems.append("vgpuctl_desired_state_valid not back to 1")
    _settled(a, node, desired, EDITED_LAYOUT)


def _drift(node: SimNode, rng: random.Random) -> str:
    """Change the host behind watch's back: a reboot, or one vGPU removed by a sysfs write."""
    if rng.random() < 0.5:
        run = node.sim("reboot")
        if run.returncode != 0:
            raise RuntimeError(f"sim reboot: {run.messages(2)}")
        return "sim reboot"
    host = SimHost.open(node.sysfs_root)
    assert host is not None
    victim = rng.choice(sorted(v.uuid for v in read_truth(node.sysfs_root, [GPU]).on(GPU)))
    host.writer().write(f"bus/mdev/devices/{victim}/remove", "1")
    return "a vGPU removed"


@_fault
def desired_invalid(a: WatchAttempt, directory: Path, rng: random.Random) -> None:
    """Every breakage in turn, in a random order; each followed by host drift while the file
    is still broken, then fixed with the other valid state."""
    node, desired = seed_host(directory)
    valid = [(_seed_text(), SEED_LAYOUT), (_edited_text(), EDITED_LAYOUT)]
    kinds = list(BREAKAGES)
    rng.shuffle(kinds)
    outcomes = []
    with _Watched(a, node, desired, directory, must_stay_ready=True) as w:
        for turn, kind in enumerate(kinds):
            text, layout = valid[turn % 2]
            before, errors, mark = node.stats(), w.errors(), w.mark()
            _write(desired, BREAKAGES[kind](text), rng)
            located = w.wait_line(
                mark,
                lambda d: (
                    d.get("level") == "error"
                    and d.get("file") == str(desired)
                    and isinstance(d.get("line"), int)
                ),
            )
            if located is None:
                a.problems.append(f"{kind}: no error log line with file and line")
            if not w.wait_metric("vgpuctl_desired_state_valid", 0.0):
                a.problems.append(f"{kind}: vgpuctl_desired_state_valid did not go 0")
            time.sleep(HOLD / 2)
            check_untouched(a, node, before, f"{kind}")
            drifted = w.mark()
            how = _drift(node, rng)
            a.variants.append(f"{kind}, then {how}")
            repaired = w.wait_line(
                drifted, lambda d: _is_converged(d) and "host" in str(d.get("reason"))
            )
            if repaired is None or not _wait_layout(node, layout, timeout=5):
                a.problems.append(f"{kind}: after {how}, not repaired to the last valid state")
            outcomes.append("kept the last valid state" if located else "said nothing")
            w.told(mark)
            w.count_errors(errors)
            text, layout = valid[(turn + 1) % 2]
            mark = w.mark()
            ended = time.time()
            _write(desired, text, rng)
            w.converged_after(mark, ended, f"{kind} was fixed")
            if not _wait_layout(node, layout, timeout=5):
                a.problems.append(f"{kind} fixed: the A2 has {_vf_layout(node)}")
            if w.watch.metric("vgpuctl_desired_state_valid") != 1.0:
                a.problems.append(f"{kind} fixed: vgpuctl_desired_state_valid not back to 1")
    a.outcome = "; ".join(sorted(set(outcomes)))
    _settled(a, node, desired, layout)


def _sysfs_outage(w: _Watched, node: SimNode, rng: random.Random, mark: int) -> float:
    """Rename the tree away, leave it away 0.5-3 s (and until watch noticed), put it back.
    Returns the wall time it was back."""
    a = w.attempt
    away = node.dir / "sys.away"
    with kernel_quiet(node.sysfs_root):  # between two simulated kernel calls
        node.sysfs_root.rename(away)
    gone = time.monotonic()
    try:
        time.sleep(rng.uniform(0.5, 3.0))
        # A fault watch never looked at tested nothing: keep it until watch has failed once.
        if w.wait_line(mark, _is_failure, timeout=WAIT) is None:
            a.problems.append("watch never noticed that sysfs was gone")
        answer = w.watch.get("/readyz")
        if answer is not None:
            w.note_readyz(f"{answer[0]} {answer[1].strip()}")
    finally:
        with kernel_quiet(away):
            away.rename(node.sysfs_root)
    a.outage_seconds.append(round(time.monotonic() - gone, 2))
    return time.time()


@_fault
def sysfs_gone_idle(a: WatchAttempt, directory: Path, rng: random.Random) -> None:
    node, desired = seed_host(directory)
    with _Watched(a, node, desired, directory) as w:
        time.sleep(rng.uniform(0.0, 1.5))
        errors, mark = w.errors(), w.mark()
        back = _sysfs_outage(w, node, rng, mark)
        w.converged_after(mark, back, "sysfs came back")
        w.told(mark)
        w.count_errors(errors)
        w.backed_off(mark)
        kinds = histogram(d.get("error") for d in w.since(mark) if _is_failure(d))
        a.outcome = f"failed reconciles {kinds}"
    _settled(a, node, desired, SEED_LAYOUT)


@_fault
def sysfs_gone_mid_reconcile(a: WatchAttempt, directory: Path, rng: random.Random) -> None:
    """The edit adds 32 vGPUs on an L40S (33 actions); the tree goes away after the k-th is
    done, k random in 1..8, while the simulated kernel is idle. A reconcile that ended before
    the tree went away (the harness was slower than watch) tested the idle case only: the L40S
    is emptied again and the edit made again, with k = 1, at most ``MID_TRIES`` times."""
    node, desired, _ = busy_host(directory)
    busy = desired.read_text()
    spec = yaml.safe_load(busy)
    spec["spec"]["nodes"][NODE]["gpus"][1] = {"address": BUSY_GPU, "sriov": "disabled"}
    empty = yaml.safe_dump(spec, sort_keys=False)
    desired.write_text(empty)
    with _Watched(a, node, desired, directory) as w:
        for attempt in range(MID_TRIES):
            errors, mark = w.errors(), w.mark()
            k = rng.randint(1, 8) if attempt == 0 else 1
            _write(desired, busy, rng)
            if not w.wait_lines(mark, functools.partial(_done_at_least, k)):
                a.problems.append(f"the edit's reconcile never did {k} action(s)")
                raise _GiveUp
            back = _sysfs_outage(w, node, rng, mark)
            w.converged_after(mark, back, "sysfs came back")
            w.told(mark)
            w.count_errors(errors)
            w.backed_off(mark)
            lines = w.since(mark)
            end = next((i for i, d in enumerate(lines) if _is_failure(d) or _is_converged(d)), 0)
            first = lines[end] if lines else {}
            if _is_failure(first) and "desired" in str(first.get("reason")):
                a.outcome = (
                    f"the edit's reconcile failed ({first.get('error')}) after {_done(lines[:end])}"
                    " done"
                )
                break
            a.variants.append("the edit's reconcile ended before sysfs went away: tried again")
            mark, ended = w.mark(), time.time()
            _write(desired, empty, rng)
            w.converged_after(mark, ended, "the L40S was emptied again", timed=False)
        else:
            a.problems.append(f"the edit's reconcile was never interrupted in {MID_TRIES} tries")
    _settled(a, node, desired, SEED_LAYOUT, counts={BUSY_GPU: {"NVIDIA L40S-1Q": 32}})


@_fault
def api_down(a: WatchAttempt, directory: Path, rng: random.Random) -> None:
    # The emulator's HTTP server reports the connections it cuts on stderr: expected here.
    with emulator() as emu, contextlib.redirect_stderr(io.StringIO()):
        node, desired = cluster_host(directory, emu)
        with _Watched(a, node, desired, directory) as w:
            check_cluster_objects(a, emu)
            time.sleep(rng.uniform(0.0, 1.0))
            before, errors, mark = node.stats(), w.errors(), w.mark()
            emu.stop()
            time.sleep(rng.uniform(0.0, 1.0))
            _write(desired, _edited_text(), rng)
            failed = w.wait_line(mark, lambda d: _is_failure(d) and d.get("error") == "cluster")
            if failed is None:
                a.problems.append("no reconcile failed on the cluster while it was down")
            time.sleep(rng.uniform(0.5, 3.0))
            answer = w.watch.get("/readyz")
            if answer is not None:
                w.note_readyz(f"{answer[0]} {answer[1].strip()}")
            check_untouched(a, node, before, "with the API server down")
            emu.start()
            back = time.time()
            w.converged_after(mark, back, "the API server came back")
            w.told(mark)
            w.count_errors(errors)
            w.backed_off(mark)
            failures = sum(_is_failure(d) for d in w.since(mark))
            a.outcome = f"{failures} failed reconcile(s), host untouched"
        _settled(a, node, desired, EDITED_LAYOUT)
        check_cluster_objects(a, emu)


@_fault
def sriov_manage_hangs(a: WatchAttempt, directory: Path, rng: random.Random) -> None:
    node, desired = seed_host(directory)
    desired.write_text(_sriov_off_text())
    extra = ("--timeout", f"{HANG_TIMEOUT:g}")
    with _Watched(a, node, desired, directory, extra=extra) as w:
        time.sleep(rng.uniform(0.0, 1.0))
        armed = node.sim("fail", "--sriov", "hang")
        if armed.returncode != 0:
            raise RuntimeError(f"sim fail: {armed.messages(2)}")
        errors, mark = w.errors(), w.mark()
        _write(desired, _seed_text(), rng)
        failed = w.wait_line(mark, _is_failure, timeout=HANG_TIMEOUT + HANG_SLACK + WAIT)
        if failed is None:
            a.problems.append("no reconcile failed with sriov-manage hanging")
            raise _GiveUp
        answer = w.watch.get("/readyz")
        if answer is not None:
            w.note_readyz(f"{answer[0]} {answer[1].strip()}")
        fragment = f"did not finish within {HANG_TIMEOUT:g} s"
        if fragment not in str(failed.get("msg")):
            a.problems.append(f"the failure does not say {fragment!r}: {failed.get('msg')}")
        if float(failed.get("seconds") or 0) > HANG_TIMEOUT + HANG_SLACK:
            a.problems.append(f"the hung reconcile took {failed.get('seconds')} s")
        left = reap_strays(node.sriov_manage, wait=3)
        if left:
            a.problems.append(f"{len(left)} sriov-manage process(es) left hanging")
        a.outcome = f"reconcile failed ({failed.get('error')}) in {failed.get('seconds')} s"
        w.converged_after(mark, _ts(failed), "the hung sriov-manage was killed")
        w.told(mark)
        w.count_errors(errors)
    _settled(a, node, desired, SEED_LAYOUT)


@_fault
def kubelet_restart(a: WatchAttempt, directory: Path, rng: random.Random) -> None:
    node, desired = seed_host(directory)
    kubelet_dir = make_plugin_dir("wfk")  # AF_UNIX paths are short: not under the scratch dir
    plugin_dir = kubelet_dir / "device-plugins"
    plugin_dir.mkdir()
    extra = ("--kubelet-dir", str(kubelet_dir), "--plugin-dir", str(plugin_dir))

    def within(k: FakeKubelet, what: str, test: Callable[[], bool], timeout: float) -> float:
        started = time.monotonic()
        try:
            k.wait_for(test, timeout=timeout, what=what)
        except AssertionError as exc:
            a.problems.append(str(exc)[:300])
            raise _GiveUp from None
        return time.monotonic() - started

    try:
        watched = _Watched(a, node, desired, directory, extra=extra, scrub=(kubelet_dir,))
        with FakeKubelet(plugin_dir) as k, watched as w:
            within(k, "the seed advertised", lambda: k.allocatable_all() == SEED_ALLOCATABLE, WAIT)
            resources = k.resources()
            time.sleep(rng.uniform(0.0, 1.0))
            before, errors, mark = node.stats(), w.errors(), w.mark()
            epoch = k.epoch
            started = time.monotonic()
            k.restart()

            def registered() -> bool:
                return all(k.accepted(r, epoch=epoch + 1) for r in resources)

            within(k, "every plugin registered again", registered, REREGISTER_TIMEOUT)
            last = max(k.accepted(r, epoch=epoch + 1)[0].at for r in resources)
            a.reregister_seconds.append(round(last - started, 3))
            within(k, "allocatable back", lambda: k.allocatable_all() == SEED_ALLOCATABLE, WAIT)
            a.allocatable_back_seconds.append(round(time.monotonic() - started, 3))
            time.sleep(HOLD)
            a.registrations += [len(k.accepted(r, epoch=epoch + 1)) for r in sorted(resources)]
            if k.allocatable_all() != SEED_ALLOCATABLE:
                a.problems.append(f"allocatable changed after the restart: {k.describe()}")
            check_untouched(a, node, before, "after the kubelet restart")
            w.told(mark)
            w.count_errors(errors)
            a.outcome = f"{len(resources)} plugins registered again"
            mark = w.mark()
            ended = time.time()
            _write(desired, _edited_text(), rng)
            within(
                k, "the edit advertised", lambda: k.allocatable_all() == EDITED_ALLOCATABLE, WAIT
            )
            a.converge_seconds.append(round(time.time() - ended, 3))
    finally:
        remove_plugin_dir(kubelet_dir)
    _settled(a, node, desired, EDITED_LAYOUT)


FAULTS: dict[str, Fault] = {
    "desired_file_deleted": desired_deleted,
    "desired_file_invalid": desired_invalid,
    "sysfs_unreadable_while_idle": sysfs_gone_idle,
    "sysfs_unreadable_mid_reconcile": sysfs_gone_mid_reconcile,
    "api_server_down_then_back": api_down,
    "sriov_manage_hangs_past_timeout": sriov_manage_hangs,
    "kubelet_restart": kubelet_restart,
}


def _spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
    }


def watch_faults_survived(ctx: Context) -> dict[str, Any]:
    """Scenario: each fault ``fault_repeats`` times under watch. Returns figures per fault."""
    started = time.monotonic()
    base = ctx.scratch("watch-faults")
    figures: dict[str, Any] = {}
    failures: list[str] = []
    for name, fault in FAULTS.items():
        attempts: list[WatchAttempt] = []
        for repeat in range(ctx.size.fault_repeats):
            if time.monotonic() - started > ctx.size.budget:
                break
            directory = base / f"{name}-{repeat}"
            directory.mkdir()
            attempt = fault(directory, ctx.rng("watch-faults", name, repeat))
            attempts.append(attempt)
            if attempt.problems:
                failures += [f"{name} #{repeat}: {p}" for p in attempt.problems]
            else:
                shutil.rmtree(directory, ignore_errors=True)
        messages: list[str] = []
        readyz: list[str] = []
        errors: Counter[str] = Counter()
        for a in attempts:
            messages += [m for m in a.messages if m not in messages]
            readyz += [r for r in a.readyz if r not in readyz]
            errors.update(a.errors)
        entry: dict[str, Any] = {
            "survived": bool(attempts) and all(not a.problems for a in attempts)
            and len(attempts) == ctx.size.fault_repeats,
            "trials": len(attempts),
            "outcomes_under_the_fault": histogram(a.outcome for a in attempts),
            "errors_counted": dict(sorted(errors.items())),
            "messages": messages[:6],
            "readyz_under_the_fault": readyz[:3],
            "seconds_to_converge": _spread([s for a in attempts for s in a.converge_seconds]),
            "healthz_samples": sum(a.probes for a in attempts),
            "problems": [p for a in attempts for p in a.problems][:6],
        }  # fmt: skip
        variants = [v for a in attempts for v in a.variants]
        if variants:
            entry["variants"] = histogram(variants)
        outages = [s for a in attempts for s in a.outage_seconds]
        if outages:
            entry["outage_seconds"] = _spread(outages)
        if name == "kubelet_restart":
            rereg = [s for a in attempts for s in a.reregister_seconds]
            entry["reregistration_seconds"] = rereg
            entry["reregistrations_over_target"] = sum(s > REREGISTER_TARGET for s in rereg)
            entry["allocatable_back_seconds"] = [
                s for a in attempts for s in a.allocatable_back_seconds
            ]
            entry["registrations_per_plugin_after_restart"] = histogram(
                n for a in attempts for n in a.registrations
            )
        figures[name] = entry
    survived = sum(1 for f in figures.values() if f["survived"])
    converge = [
        f["seconds_to_converge"]["max"] for f in figures.values() if f["seconds_to_converge"]
    ]
    return {
        "faults": len(FAULTS),
        "survived": survived,
        **figures,
        "max_seconds_to_converge": max(converge, default=0.0),
        "seconds": round(time.monotonic() - started, 1),
        "budget_exceeded": any(f["trials"] < ctx.size.fault_repeats for f in figures.values()),
        "failures": failures[:FAILURES_SHOWN],
        "ok": survived == len(FAULTS),
    }
