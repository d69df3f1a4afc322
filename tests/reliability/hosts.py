"""Common ground of the reliability scenarios: ``vgpuctl`` run as a user runs it, on a simulated
host, and the host's truth read straight from its sysfs tree.

The invariants are judged from the tree itself (``virtfn`` links, mdev directories and their
``mdev_type``, ``bus/mdev/devices``), never through ``reconciler.observe``: the code under test
does not grade itself (``plan_in_process``, vgpuctl's planner run in this process, only stages a
run: which vGPUs a VM holds, what a kill point ranges over). So is convergence:
``SimNode.converged`` asks the tests' own oracle (``tests/oracle.py``), the tree against the
desired file; a fresh ``vgpuctl plan`` is only an extra check that may add a finding (it covers
the cluster, which the oracle does not read).
Every subprocess has a timeout; a process that outlives it is killed with its whole process
group and reported, never waited for.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from reconciler.desired import load_desired
from reconciler.model import Plan
from reconciler.observe import observe_host
from reconciler.plan import plan_node
from reconciler.sim import SimHost
from reconciler.sim.nvidia_smi import TYPES_COUNTER
from reconciler.sim.state import load_state
from tests import oracle
from tests.reliability.generators import CATALOG

REPO = Path(__file__).resolve().parents[2]
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
#: ``apply``'s progress line: ``  ✓   2 vgpu-create 0000:08:00.4: created … (0.01 s)``.
PROGRESS = re.compile(
    r"^  (?P<mark>\S) +(?P<seq>\d+) (?P<kind>[a-z-]+) (?P<target>\S+): (?P<msg>.*)"
)
#: A created vGPU's UUID in apply's progress message (``created NVIDIA A2-2Q <uuid> (0.01 s)``)
#: and in watch's log message (``done vgpu-create <vf>: created NVIDIA A2-2Q <uuid>``).
CREATED_UUID = re.compile(
    r"\bcreated .*?\b([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\b"
)
#: What a bug looks like from outside: a traceback, or the CLI's last-resort handler.
BUG_MARKERS = ("Traceback (most recent call last)", "internal error:")
#: Seconds after which a vgpuctl command counts as hung (each scenario may pass less).
DEFAULT_TIMEOUT = 120.0


def environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without vgpuctl's own variables (flags say everything)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUCTL_")}
    env.pop("NODE_NAME", None)
    env.update(extra or {})
    return env


def vgpuctl_argv(*args: object) -> list[str]:
    return [sys.executable, "-m", "reconciler", *map(str, args)]


@dataclass(frozen=True, slots=True)
class Progress:
    mark: str  # ✓ done, = already done (no-op), ✗ failed, - skipped
    kind: str
    target: str
    message: str


@dataclass(frozen=True, slots=True)
class Run:
    """One finished (or killed) ``vgpuctl`` process."""

    argv: tuple[str, ...]
    pid: int
    returncode: int | None  # None: it hung and was killed at its timeout
    stdout: str
    stderr: str
    seconds: float

    @property
    def hung(self) -> bool:
        return self.returncode is None

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    @property
    def bug(self) -> str | None:
        """The first line that shows a bug (traceback or internal error), if any."""
        for line in (self.stderr + "\n" + self.stdout).splitlines():
            if any(marker in line for marker in BUG_MARKERS):
                return line.strip()
        return None

    def progress(self) -> list[Progress]:
        found = []
        for line in self.stderr.splitlines():
            m = PROGRESS.match(line)
            if m:
                found.append(Progress(m["mark"], m["kind"], m["target"], m["msg"]))
        return found

    def messages(self, limit: int = 4) -> list[str]:
        """The stderr lines that are not progress lines: what a person would read."""
        lines = [
            line.strip()
            for line in self.stderr.splitlines()
            if line.strip() and not PROGRESS.match(line)
        ]
        return lines[:limit]

    def outcome(self) -> str:
        if self.hung:
            return "hung"
        if self.killed:
            return "killed"
        return f"exit {self.returncode}"


class Started:
    """A ``vgpuctl`` process running in the background in its own process group.

    Output goes to files (a pipe nobody reads could block it); ``finish`` waits (bounded) and
    reads them.
    """

    def __init__(self, args: Sequence[object], *, out_dir: Path, label: str) -> None:
        self.argv = tuple(vgpuctl_argv(*args))
        self._out = out_dir / f"{label}.stdout"
        self._err = out_dir / f"{label}.stderr"
        self._started = time.monotonic()
        with self._out.open("wb") as out, self._err.open("wb") as err:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=environment(),
                cwd=REPO,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL the process group (the process and anything it started in its group)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def wait_for_progress(self, *, timeout: float) -> bool:
        """Wait (bounded) until the process reports its first action done; False when it ended,
        or the time ran out, first. (Python's stderr is line-buffered, even into a file.)"""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self._err.read_text(errors="replace")
            if any(PROGRESS.match(line) for line in text.splitlines()):
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.005)
        return False

    def finish(self, *, timeout: float = DEFAULT_TIMEOUT) -> Run:
        try:
            returncode: int | None = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait(timeout=30)
            returncode = None
        seconds = time.monotonic() - self._started
        return Run(
            self.argv,
            self.proc.pid,
            returncode,
            self._out.read_text(errors="replace"),
            self._err.read_text(errors="replace"),
            seconds,
        )


def vgpuctl(*args: object, timeout: float = DEFAULT_TIMEOUT) -> Run:
    """Run ``vgpuctl ARGS`` to completion (killed with its group at ``timeout``)."""
    argv = vgpuctl_argv(*args)
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        env=environment(),
        cwd=REPO,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        returncode: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=30)
        returncode = None
    return Run(tuple(argv), proc.pid, returncode, stdout, stderr, time.monotonic() - started)


# --- a simulated node ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SimNode:
    """A simulated host (``dir/sys``, ``dir/bin/sriov-manage``) as the node ``node``."""

    dir: Path
    node: str
    #: More global flags (``--kubeconfig K --kubelet-dir D``).
    extra: tuple[str, ...] = ()
    #: The host as it was when this was made (make it right after building the host, before
    #: any vgpuctl runs): which vGPUs were there before, and the GPUs nobody may touch.
    before: oracle.Snapshot | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.before is None:
            object.__setattr__(self, "before", oracle.snapshot(self.sysfs_root))

    @property
    def sysfs_root(self) -> Path:
        return self.dir / "sys"

    @property
    def sriov_manage(self) -> Path:
        return self.dir / "bin" / "sriov-manage"

    @property
    def flags(self) -> list[str]:
        return [
            "--sysfs-root",
            str(self.sysfs_root),
            "--sriov-manage",
            str(self.sriov_manage),
            "--node",
            self.node,
            *self.extra,
        ]

    def run(self, *args: object, timeout: float = DEFAULT_TIMEOUT) -> Run:
        return vgpuctl(*args, *self.flags, timeout=timeout)

    def start(self, *args: object, out_dir: Path, label: str) -> Started:
        return Started([*args, *self.flags], out_dir=out_dir, label=label)

    @property
    def state_dir(self) -> Path:
        """vgpuctl's state directory on the simulator (the record of vfio types, the journal,
        the lock): ``DIR/state``."""
        return self.dir / "state"

    def forget(self) -> bool:
        """Delete the state directory, as a node whose disk was lost would have it (no record
        of the vfio types vgpuctl wrote); whether there was one."""
        existed = self.state_dir.is_dir()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        return existed

    def sim(self, command: str, *args: object) -> Run:
        """``vgpuctl sim COMMAND DIR ARGS`` (hold, release, fail, reboot)."""
        return vgpuctl("sim", command, self.dir, *args, timeout=60)

    def stats(self) -> dict[str, int]:
        host = SimHost.open(self.sysfs_root)
        return host.stats() if host is not None else {}

    def driver_type_queries(self) -> int:
        """How many times the simulator's ``nvidia-smi vgpu -s -v`` was asked to name vfio
        types (``nvidiaSmiTypeQueries``): vgpuctl asks only for an id no list or record names."""
        return load_state(self.sysfs_root).counters.get(TYPES_COUNTER, 0)

    def converged(self, desired: Path, held: Iterable[str] = ()) -> list[str]:
        """What is left between the host and ``desired`` (empty: converged; vGPUs in ``held``,
        by UUID, may stay, with what they block). The verdict is the tests' oracle's; then, as
        an extra, a fresh ``vgpuctl plan`` (cluster included) must have no action left."""
        return self.verdict(desired, held)[0]

    def verdict(
        self, desired: Path, held: Iterable[str] = (), *, since: oracle.Snapshot | None = None
    ) -> tuple[list[str], dict[str, Any] | None]:
        """``converged``'s answer, and the plan document of its extra check (None: none made).
        ``since``: the host when ``desired`` took over from an earlier desired state (default:
        when this node was made)."""
        before = since or self.before
        assert before is not None
        problems = oracle.judge(self.sysfs_root, desired, self.node, before=before, held=held)
        if problems:
            return [f"oracle: {p}" for p in problems], None
        run, plan = self.plan(desired)
        if plan is None:
            return [f"plan failed: {run.outcome()} {run.messages()}"], None
        if plan.get("actions"):
            shown = [f"{a.get('kind')} {a.get('target')}" for a in plan["actions"][:3]]
            return [f"the oracle finds the host converged, vgpuctl still plans {shown}"], plan
        return [], plan

    def plan(self, desired: Path, *more: object) -> tuple[Run, dict[str, Any] | None]:
        """``plan -o json``: the run and the plan document (None if there was none)."""
        import json

        run = self.run("plan", desired, "-o", "json", *more, timeout=60)
        try:
            return run, json.loads(run.stdout) if run.returncode == 0 else None
        except ValueError:
            return run, None


def plan_in_process(node: SimNode, desired_file: Path) -> Plan:
    """The plan for ``node`` now, made in this process (no CLI start-up cost): what the harness
    stages a run with (which vGPUs a VM holds, how many actions a kill point ranges over),
    never what it judges by. vfio type ids no list names are named as the driver would (the
    CLI asks ``nvidia-smi vgpu -s -v``; here the oracle reads the simulator's own word), so the
    vGPUs of a GPU at a maximum are planned."""
    sim = SimHost.open(node.sysfs_root)
    assert sim is not None
    desired = load_desired([desired_file], catalog=CATALOG).node(node.node)
    known = {
        (gpu.address, type_id): name
        for gpu in sim.gpus()
        if gpu.interface == "vfio"
        for type_id, name in oracle.vfio_type_names(node.sysfs_root, str(gpu.address), ()).items()
    }
    inventory = observe_host(
        node.sysfs_root,
        node=node.node,
        catalog=CATALOG,
        hold_probe=sim.hold_probe(),
        known_types=known,
    )
    return plan_node(desired, inventory, catalog=CATALOG)


@contextlib.contextmanager
def kernel_quiet(sysfs_root: Path) -> Iterator[None]:
    """Hold the simulator's host lock: no simulated sysfs write or sriov-manage change is half
    done while this is held.

    A real sysfs write is one system call; a signal cannot land in the middle of the kernel's
    work. The simulator does that work in the writing process, so a kill sent at a random
    moment must be sent with this held, or it would tear the simulated kernel's own state.
    """
    from reconciler.sim.state import locked

    with locked(sysfs_root):
        yield


def disarm_faults(sysfs_root: Path) -> dict[str, Any]:
    """Clear the simulator's pending one-shot faults; return those a killed run left unused.

    ``vgpuctl sim fail`` can arm faults but not clear them, and a rerun must run without them.
    """
    from reconciler.sim.state import Faults, load_state, locked, save_state

    with locked(sysfs_root):
        state = load_state(sysfs_root)
        left = {
            "writes": state.faults.writes,
            "sriovManage": state.faults.sriov_manage,
            "crashAfter": state.faults.crash_after,
        }
        state.faults = Faults()
        save_state(sysfs_root, state)
    return {k: v for k, v in left.items() if v}


def processes_of(program: Path) -> list[int]:
    """Pids of running processes whose program (argv[0] or a script's argv[1]) is ``program``."""
    wanted = str(program).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path("/proc", entry, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if wanted in argv[:2]:
            found.append(int(entry))
    return found


def reap_strays(program: Path, *, wait: float = 15.0) -> list[int]:
    """Wait (bounded) for processes running ``program`` to end; SIGKILL, by pid, any left.

    Returns the pids that had to be killed (an ``sriov-manage`` a killed apply left behind
    finishes on its own; one that does not is a finding).
    """
    deadline = time.monotonic() + wait
    while True:
        pids = processes_of(program)
        if not pids:
            return []
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return pids


# --- the host's truth, from the tree ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TreeVgpu:
    uuid: str
    gpu: str
    vf: str
    index: int  # the VF's index: N of the PF's ``virtfn<N>`` link
    type_name: str
    #: On NVIDIA's vendor-specific VFIO the VF is the vGPU (``uuid`` is its address): no mdev,
    #: so no mdev bus link either.
    whole_vf: bool = False


@dataclass(frozen=True, slots=True)
class Held:
    """A vGPU a simulated VM holds, as it was when the hold began."""

    uuid: str
    vf: str
    type_name: str


@dataclass(frozen=True, slots=True)
class Truth:
    """What the sysfs tree shows for the GPUs asked about."""

    #: GPU address → its VFs' addresses by index (empty: SR-IOV off).
    vfs: Mapping[str, Mapping[int, str]]
    vgpus: tuple[TreeVgpu, ...]
    #: ``bus/mdev/devices``: UUID → the VF its link points into.
    bus: Mapping[str, str]

    def on(self, gpu: str) -> list[TreeVgpu]:
        return [v for v in self.vgpus if v.gpu == gpu]

    def index_of(self, gpu: str, vf: str) -> int | None:
        for index, address in self.vfs.get(gpu, {}).items():
            if address == vf:
                return index
        return None

    def snapshot(self, gpu: str) -> tuple[object, ...]:
        """Everything about one GPU, to compare before and after."""
        return (
            tuple(sorted(self.vfs.get(gpu, {}).items())),
            tuple(sorted((v.uuid, v.vf, v.type_name) for v in self.on(gpu))),
        )

    def held(self, uuids: Iterable[str]) -> dict[str, Held]:
        by_uuid = {v.uuid: v for v in self.vgpus}
        return {u: Held(u, by_uuid[u].vf, by_uuid[u].type_name) for u in uuids if u in by_uuid}


def read_truth(sysfs_root: Path, gpus: Iterable[str]) -> Truth:
    devices = sysfs_root / "bus" / "pci" / "devices"
    vfs: dict[str, dict[int, str]] = {}
    vgpus: list[TreeVgpu] = []
    for gpu in gpus:
        pf = devices / gpu
        links = {
            int(name.removeprefix("virtfn")): os.path.basename(os.readlink(pf / name))
            for name in os.listdir(pf)
            if name.startswith("virtfn")
        }
        vfs[gpu] = dict(sorted(links.items()))
        names = oracle.vfio_type_names(sysfs_root, gpu, (devices / vf for vf in vfs[gpu].values()))
        for index, vf in vfs[gpu].items():
            vf_dir = devices / vf
            current = vf_dir / "nvidia" / "current_vgpu_type"
            if current.is_file():
                # NVIDIA's vendor-specific VFIO: the VF is the vGPU, named by its address.
                type_id = current.read_text().strip()
                if type_id != "0":
                    name = names.get(type_id, f"type {type_id}")
                    vgpus.append(TreeVgpu(vf, gpu, vf, index, name, whole_vf=True))
                continue
            for entry in sorted(os.listdir(vf_dir)):
                if not UUID.match(entry) or not (vf_dir / entry).is_dir():
                    continue
                type_dir = os.path.basename(os.readlink(vf_dir / entry / "mdev_type"))
                name_file = vf_dir / "mdev_supported_types" / type_dir / "name"
                vgpus.append(TreeVgpu(entry, gpu, vf, index, name_file.read_text().strip()))
    bus_dir = sysfs_root / "bus" / "mdev" / "devices"
    bus = {
        entry: Path(os.readlink(bus_dir / entry)).parent.name
        for entry in (os.listdir(bus_dir) if bus_dir.is_dir() else [])
    }
    return Truth(vfs, tuple(vgpus), bus)


def unlisted_vfio_vgpus(sysfs_root: Path, gpus: Iterable[str]) -> int:
    """How many VFs of ``gpus`` on NVIDIA's vendor-specific VFIO interface have a type id that
    no VF of their GPU lists (read from the files: ``current_vgpu_type``,
    ``creatable_vgpu_types``): vGPUs only the driver (or vgpuctl's record) names."""
    devices = sysfs_root / "bus" / "pci" / "devices"
    count = 0
    for gpu in gpus:
        vf_dirs = [devices / gpu / n for n in os.listdir(devices / gpu) if n.startswith("virtfn")]
        listed: set[str] = set()
        currents: list[str] = []
        for vf in vf_dirs:
            nvidia = vf / "nvidia"
            if not (nvidia / "current_vgpu_type").is_file():
                continue
            currents.append((nvidia / "current_vgpu_type").read_text().strip())
            lines = (nvidia / "creatable_vgpu_types").read_text().splitlines()[1:]
            listed |= {ln.split(":", 1)[0].strip() for ln in lines if ":" in ln}
        count += sum(1 for c in currents if c != "0" and c not in listed)
    return count


# --- invariants ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Safety:
    """What must hold at every moment, crashed or not."""

    duplicates: tuple[str, ...]  # one UUID on two VFs (or twice)
    crowded: tuple[str, ...]  # a VF carrying more than one vGPU
    dangling: tuple[str, ...]  # a bus/mdev link without its device, or a device without link
    in_use_removed: tuple[str, ...]  # a held vGPU gone, moved or changed

    @property
    def ok(self) -> bool:
        return not (self.duplicates or self.crowded or self.dangling or self.in_use_removed)

    def problems(self) -> list[str]:
        return [*self.duplicates, *self.crowded, *self.dangling, *self.in_use_removed]


def safety(truth: Truth, held: Mapping[str, Held]) -> Safety:
    counts = Counter(v.uuid for v in truth.vgpus)
    duplicates = tuple(f"vGPU {u} exists {n} times" for u, n in counts.items() if n > 1)
    per_vf = Counter(v.vf for v in truth.vgpus)
    crowded = tuple(f"VF {vf} carries {n} vGPUs" for vf, n in per_vf.items() if n > 1)
    on_tree = {v.uuid: v.vf for v in truth.vgpus if not v.whole_vf}
    dangling = tuple(
        [f"bus/mdev/devices/{u} points at {vf}, no such vGPU there"
         for u, vf in truth.bus.items() if on_tree.get(u) != vf]
        + [f"vGPU {u} on {vf} has no bus/mdev/devices link"
           for u, vf in on_tree.items() if u not in truth.bus]
    )  # fmt: skip
    by_uuid = {v.uuid: v for v in truth.vgpus}
    removed = []
    for h in held.values():
        now = by_uuid.get(h.uuid)
        if now is None:
            removed.append(f"in-use vGPU {h.uuid} ({h.type_name} on {h.vf}) was removed")
        elif (now.vf, now.type_name) != (h.vf, h.type_name):
            removed.append(
                f"in-use vGPU {h.uuid} changed: {h.type_name} on {h.vf} → "
                f"{now.type_name} on {now.vf}"
            )
    return Safety(duplicates, crowded, dangling, tuple(removed))


@dataclass(slots=True, kw_only=True)
class Findings:
    """What a crash-safety run found wrong, filled in as it goes: every list empty, ``strays``
    0 means every invariant held. Results of the crash scenarios extend it with their own
    facts (their fields come first; these are keyword-only)."""

    orphans: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    crowded: list[str] = field(default_factory=list)
    dangling: list[str] = field(default_factory=list)
    in_use_removed: list[str] = field(default_factory=list)
    bugs: list[str] = field(default_factory=list)
    hung: list[str] = field(default_factory=list)
    strays: int = 0  # sriov-manage processes left running
    unmanaged_touched: list[str] = field(default_factory=list)
    #: What the oracle (or the extra plan check) still found at the end, when not converged.
    not_converged: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def add_safety(self, found: Safety) -> None:
        self.duplicates += found.duplicates
        self.crowded += found.crowded
        self.dangling += found.dangling
        self.in_use_removed += found.in_use_removed

    def problems(self) -> list[str]:
        """Every finding as a line, the most telling first."""
        found = [
            *self.errors, *self.bugs, *self.hung, *self.orphans, *self.duplicates, *self.crowded,
            *self.dangling, *self.in_use_removed,
            *self.unmanaged_touched, *self.not_converged,
        ]  # fmt: skip
        if self.strays:
            found.append(f"{self.strays} sriov-manage process(es) left running")
        return found


class _Judged(Protocol):
    @property
    def ok(self) -> bool: ...


C = TypeVar("C")
R = TypeVar("R", bound=_Judged)


def run_cases(
    cases: Sequence[C],
    run: Callable[[C, Path], R],
    broken: Callable[[C, str], R],
    *,
    base: Path,
    budget: float,
    jobs: int,
    index: Callable[[C], int],
) -> list[R]:
    """Run each case in a directory of its own (``base/run-NNNN``, removed once it passed) on
    ``jobs`` threads; no case starts once ``budget`` seconds have gone. A harness exception is
    the case's failure (``broken(case, message)``), never the scenario's end."""
    deadline = time.monotonic() + budget

    def one(case: C) -> R | None:
        if time.monotonic() > deadline:
            return None
        directory = base / f"run-{index(case):04d}"
        directory.mkdir(parents=True)
        try:
            result = run(case, directory)
        except Exception as exc:
            result = broken(case, f"harness error: {type(exc).__name__}: {exc}")
        if result.ok:
            shutil.rmtree(directory, ignore_errors=True)
        return result

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        done = list(pool.map(one, cases))
    return [r for r in done if r is not None]


def body(profile: str) -> str:
    """A profile name without its vendor prefix: drivers print ``NVIDIA`` or ``GRID`` by branch
    (docs/domain.md §4), so the oracle compares what follows it."""
    for prefix in ("NVIDIA ", "GRID "):
        if profile.startswith(prefix):
            return profile[len(prefix) :]
    return profile


def orphans(truth: Truth, desired_gpus: Sequence[Mapping[str, Any]], held: set[str]) -> list[str]:
    """vGPUs on managed GPUs that neither the desired state nor a VM accounts for.

    A VM accounts for its own vGPU and, while it holds one the desired state no longer wants
    and the GPU still lacks a wanted vGPU, for the free vGPUs of profiles the GPU no longer
    wants (or wants elsewhere than on their VF): their removal would only make room for what
    waits (docs/safety.md; the oracle judges that exactly)."""
    found: list[str] = []
    for entry in desired_gpus:
        gpu = entry["address"]
        present = truth.on(gpu)
        free = [v for v in present if v.uuid not in held]
        if entry.get("sriov") != "enabled":
            found += [f"{v.type_name} {v.uuid} on {v.vf}: SR-IOV desired off" for v in free]
        elif "profiles" in entry:
            want = {body(p): int(n) for p, n in entry["profiles"].items()}
            have = {b: sum(1 for v in present if body(v.type_name) == b) for b in want}
            waiting = any(have[b] < n for b, n in want.items()) and any(
                v.uuid in held and body(v.type_name) not in want for v in present
            )
            if waiting:
                present = [v for v in present if body(v.type_name) in want or v.uuid in held]
            for type_name in sorted({v.type_name for v in present}):
                of_type = [v for v in present if v.type_name == type_name]
                kept = sum(1 for v in of_type if v.uuid in held)
                extra = len(of_type) - max(want.get(body(type_name), 0), kept)
                spare = [v for v in of_type if v.uuid not in held][: max(extra, 0)]
                found += [f"{type_name} {v.uuid} on {v.vf}: beyond the desired count"
                          for v in spare]  # fmt: skip
        else:
            want_at: dict[int, str] = {}
            for key, profile in (entry.get("vgpus") or {}).items():
                index = key if isinstance(key, int) else truth.index_of(gpu, str(key))
                if index is not None:
                    want_at[index] = body(profile)
            there = {v.index: body(v.type_name) for v in present}
            waiting = any(there.get(i) != b for i, b in want_at.items()) and any(
                v.uuid in held and want_at.get(v.index) != body(v.type_name) for v in present
            )
            if waiting:
                wanted = set(want_at.values())
                free = [v for v in free if v.index not in want_at and body(v.type_name) in wanted]
            found += [
                f"{v.type_name} {v.uuid} on {v.vf} (VF {v.index}): desired "
                f"{want_at.get(v.index, 'nothing')}"
                for v in free
                if want_at.get(v.index) != body(v.type_name)
            ]
    return found


def histogram(values: Iterable[object]) -> dict[str, int]:
    counts = Counter(str(v) for v in values)
    return dict(sorted(counts.items(), key=lambda kv: (len(kv[0]), kv[0])))
