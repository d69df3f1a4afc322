"""A hostile desired state costs bounded work: one located line (or the first twenty and a
count), never an internal error, and a peak memory under 128 MiB.

The attack (issue 10, item 3): a 1 MB desired state of one mapping of 120k tiny keys took the
watch agent to 295 MB (past the DaemonSet's 256 Mi limit: a crash loop), logged 120,001 lines
and blocked its loop for 25 s. Every document here is at most 1 MiB, the largest a ConfigMap
holds, and each shape is one the issue names: many tiny keys, deep nesting, long sequences,
alias bombs, long scalars, many documents. Memory is the child's own high-water mark
(``VmHWM`` of ``/proc/self/status``, read as it exits: ``ru_maxrss`` would carry over the
parent's across exec). The time limits only prove nothing hangs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.simnode import REPO, SimNode, make_sim, run_vgpuctl
from tests.watch_agent import Watch, wait_for

MiB = 1024 * 1024
PEAK_LIMIT_MIB = 128
HEAD = "apiVersion: vgpu.reconciler.dev/v1alpha1\nkind: VGPUDesiredState\nmetadata: {name: lab}\n"
LOCATED = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): \S")

#: Reports the peak resident memory of ``python -m reconciler ARGS`` as its last stderr line.
_MEASURED = """
import atexit, runpy, sys
def peak():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                print("PEAK-KIB", line.split()[1], file=sys.stderr)
atexit.register(peak)
sys.argv = ["vgpuctl", *sys.argv[1:]]
runpy.run_module("reconciler", run_name="__main__")
"""


def _fill(head: str, item: Callable[[int], str], tail: str = "", size: int = MiB - 64) -> str:
    """``head`` + as many ``item(i)`` as fit in ``size`` bytes + ``tail``."""
    parts, used, i = [head], len(head) + len(tail), 0
    while used + len(piece := item(i)) <= size:
        parts.append(piece)
        used += len(piece)
        i += 1
    return "".join(parts) + tail


def _billion_laughs(key: str = "a") -> str:
    lines = [f"{key}0: &{key}0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        refs = ", ".join([f"*{key}{i - 1}"] * 10)
        lines.append(f"{key}{i}: &{key}{i} [{refs}]")
    return "\n".join(lines) + "\n"


def _fleet(size: int = MiB - 1024) -> str:
    """A legitimate fleet: nodes of eight A2s with four vGPUs each, one line per VF (as
    ``vgpuctl export`` writes)."""
    head = HEAD + "spec:\n  nodes:\n"
    blocks, used, n = [head], len(head), 0
    while True:
        lines = [f"    node-{n:05d}:\n      gpus:\n"]
        for g in range(8):
            bus = 0x10 + g * 0x10
            lines.append(
                f'        - address: "0000:{bus:02x}:00.0"\n          model: NVIDIA A2\n'
                "          sriov: enabled\n          vgpus:\n"
            )
            lines += [f'            "0000:{bus:02x}:00.{4 + v}": NVIDIA A2-4Q\n' for v in range(4)]
        block = "".join(lines)
        if used + len(block) > size:
            return "".join(blocks)
        blocks.append(block)
        used += len(block)
        n += 1


def _fleet_in_flow_style(size: int = MiB - 1024) -> str:
    """The densest legitimate layout of the shipped formats: one GPU per line, counts."""
    gpu = "        - {{address: '0000:{bus:02x}:00.0', model: NVIDIA L40S, sriov: enabled, profiles: {{NVIDIA L40S-8Q: 6}}}}\n"  # noqa: E501
    return _fill(
        HEAD + "spec:\n  nodes:\n",
        lambda n: (
            f"    node-{n:05d}:\n      gpus:\n"
            + "".join(gpu.format(bus=0x10 + g * 0x10) for g in range(8))
        ),
        size=size,
    )


#: Hostile documents of at most 1 MiB: name → text.
HOSTILE: dict[str, Callable[[], str]] = {
    # The issue's: one mapping of tiny keys (about 120k of them fill a megabyte).
    "tiny-keys": lambda: _fill("", lambda i: f"k{i:x}: 0\n"),
    "tiny-keys-flow": lambda: _fill("{", lambda i: f"{i:x}: 0,", "}"),
    "tiny-node-names": lambda: _fill(HEAD + "spec:\n  nodes:\n", lambda i: f"    n{i:x}: 0\n"),
    "half-a-megabyte-of-tiny-keys": lambda: _fill("{", lambda i: f"{i:x}: 0,", "}", MiB // 2),
    "deep-flow-list": lambda: "[" * (MiB // 2 - 8) + "]" * (MiB // 2 - 8),
    "deep-flow-mapping": lambda: "{a: " * (MiB // 5) + "}" * (MiB // 5),
    "deep-block-list": lambda: _fill("", lambda i: " " * min(i, 2000) + "- \n"),
    "long-list": lambda: _fill("[", lambda i: "0,", "0]"),
    "long-gpu-list": lambda: _fill(HEAD + "spec: {nodes: {n1: {gpus: [", lambda i: "{},", "{}]}}}"),
    "billion-laughs": _billion_laughs,
    "billion-laughs-in-spec": lambda: (
        HEAD
        + "spec:\n  nodes:\n"
        + "".join(f"    {line}\n" for line in _billion_laughs("n").splitlines())
    ),
    "many-aliases": lambda: "a: &a x\nb: [" + ",".join(["*a"] * ((MiB - 32) // 3)) + "]\n",
    "long-value": lambda: HEAD + "spec: {nodes: {}}\nextra: " + "x" * (MiB - 200) + "\n",
    "long-key": lambda: HEAD + "spec:\n  nodes:\n    " + "n" * (MiB - 200) + ": {gpus: []}\n",
    "many-documents": lambda: "---\n" * (MiB // 4),
    "many-unknown-profiles": lambda: (
        HEAD
        + "spec: {nodes: {n1: {gpus: [{address: '0000:08:00.0', sriov: enabled, profiles: {"
        + ", ".join(f"X{i}-1Q: 1" for i in range(60_000))
        + "}}]}}}\n"
    ),
}


def _validate(path: Path) -> tuple[subprocess.CompletedProcess[str], int]:
    """``vgpuctl validate PATH``: its result, stderr without the measurement, and its peak."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUCTL_")}
    result = subprocess.run(
        [sys.executable, "-c", _MEASURED, "validate", str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
        check=False,
    )
    *lines, last = result.stderr.splitlines() or [""]
    assert last.startswith("PEAK-KIB "), result.stderr[-2000:]
    result.stderr = "".join(f"{line}\n" for line in lines)
    return result, int(last.split()[1]) // 1024


def _assert_located(stderr: str, path: Path, text: str) -> list[str]:
    lines = stderr.splitlines()
    assert lines and "internal error" not in stderr and "Traceback" not in stderr, stderr
    for line in lines:
        if line.startswith(f"error: {path}: … and "):
            continue  # how many more problems the file has
        m = LOCATED.match(line)
        assert m is not None and m["file"] == str(path), line[:300]
        assert 1 <= int(m["line"]) <= text.count("\n") + 1, line[:300]
        # One line to act on, not the file's content read back.
        assert len(line) < 400, line[:300]
    return lines


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_megabyte_is_refused_in_a_few_located_lines(name: str, tmp_path: Path) -> None:
    text = HOSTILE[name]()
    assert len(text.encode()) <= MiB
    path = tmp_path / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    result, peak_mib = _validate(path)
    assert result.returncode == 1, result.stderr[-2000:]
    lines = _assert_located(result.stderr, path, text)
    assert len(lines) <= 21  # the first twenty, then how many more
    assert peak_mib < PEAK_LIMIT_MIB, f"{name}: {peak_mib} MiB"


@pytest.mark.parametrize(
    ("fleet", "vgpus_per_node"),
    [(_fleet, 8 * 4), (_fleet_in_flow_style, 8 * 6)],
    ids=["block", "flow"],
)
def test_a_legitimate_megabyte_fleet_is_valid(
    fleet: Callable[[], str], vgpus_per_node: int, tmp_path: Path
) -> None:
    text = fleet()
    assert MiB - 4096 < len(text.encode()) <= MiB
    path = tmp_path / "fleet.yaml"
    path.write_text(text, encoding="utf-8")
    result, peak_mib = _validate(path)
    assert result.returncode == 0, result.stderr[-2000:]
    nodes = text.count("\n    node-")
    vgpus = vgpus_per_node * nodes
    assert result.stdout == f"{path}: valid ({nodes} nodes, {8 * nodes} GPUs, {vgpus} vGPUs)\n"
    assert peak_mib < PEAK_LIMIT_MIB


def test_problems_are_capped_per_file_with_a_count_of_the_rest(tmp_path: Path) -> None:
    # 200 GPUs without 'sriov': 200 problems, the first twenty listed, in file order.
    gpus = "".join(f"        - address: '0000:{bus:02x}:00.0'\n" for bus in range(200))
    path = tmp_path / "many.yaml"
    path.write_text(HEAD + "spec:\n  nodes:\n    n1:\n      gpus:\n" + gpus, encoding="utf-8")
    result = run_vgpuctl("validate", path)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 21
    for i, line in enumerate(lines[:20]):
        assert line == (
            f"{path}:{8 + i}:11: spec.nodes.n1.gpus[{i}]: missing required field 'sriov'"
        )
    assert lines[20] == f"error: {path}: … and 180 more problems"


def test_each_file_is_capped_on_its_own(tmp_path: Path) -> None:
    files = [tmp_path / "a.yaml", tmp_path / "b.yaml"]
    for path in files:
        path.write_text("{" + ", ".join(f"k{i}: 0" for i in range(50)) + "}\n")
    result = run_vgpuctl("validate", *files)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    # Per file: 50 unknown fields and 4 missing ones, 20 listed and "… and 34 more".
    assert len(lines) == 42
    assert lines[0].startswith(f"{files[0]}:1:1: ")
    assert lines[20] == f"error: {files[0]}: … and 34 more problems"
    assert lines[21].startswith(f"{files[1]}:1:1: ")
    assert lines[41] == f"error: {files[1]}: … and 34 more problems"


def test_names_longer_than_a_resource_name_are_refused_without_quoting_them(
    tmp_path: Path,
) -> None:
    """A profile or model name becomes a Kubernetes resource name (at most 63 characters), and
    a message must not quote a kilobyte of it: it is refused by its length alone, at its field
    (as every problem with a value's form: 'model:' starts at column 11)."""
    long = "A" * 1000
    path = tmp_path / "long.yaml"
    path.write_text(
        HEAD + "spec:\n  nodes:\n    n1:\n      gpus:\n"
        f'        - address: "0000:08:00.0"\n          sriov: enabled\n'
        f"          model: {long}\n          vgpus: {{0: {long}}}\n"
        f'        - address: "0000:09:00.0"\n          sriov: enabled\n'
        f"          profiles: {{{long}: 1}}\n",
        encoding="utf-8",
    )
    result = run_vgpuctl("validate", path)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"{path}:10:11: spec.nodes.n1.gpus[0].model: 1,000 characters, more than the 63 allowed",
        f'{path}:11:19: spec.nodes.n1.gpus[0].vgpus["0"]: 1,000 characters, more than the 63 '
        "allowed",
        f"{path}:14:22: spec.nodes.n1.gpus[1].profiles: a key of 1,000 characters, more than "
        "the 63 allowed",
    ]


@pytest.mark.parametrize(
    ("document", "where", "message"),
    [
        ("nodes: {n1: !!bool maybe}", "5:15", "'maybe' is not true or false (tag !!bool)"),
        ("kind: !!bool maybe", "5:9", "'maybe' is not true or false (tag !!bool)"),
        ("nodes: {n1: !!float ''}", "5:15", "'' is not a number (tag !!float)"),
    ],
)
def test_the_reliability_suites_three_internal_errors_are_located_problems(
    document: str, where: str, message: str, tmp_path: Path
) -> None:
    # Found by the full bad_input scenario (seed as shipped): KeyError and IndexError out of
    # PyYAML's constructors, shown as "internal error".
    path = tmp_path / "tagged.yaml"
    path.write_text(HEAD + "spec:\n  " + document + "\n", encoding="utf-8")
    result = run_vgpuctl("validate", path)
    assert result.returncode == 1
    assert "internal error" not in result.stderr
    assert f"{path}:{where}: unsupported YAML: {message}\n" in result.stderr


# -- one watch reconcile -----------------------------------------------------------------------


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    return make_sim(tmp_path / "host", ["A2@0000:08:00.0"])


def _peak_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024
    raise AssertionError("no VmHWM")


@pytest.mark.parametrize("name", ["tiny-keys", "half-a-megabyte-of-tiny-keys", "billion-laughs"])
def test_the_watch_agent_reports_a_hostile_megabyte_in_a_few_lines(
    name: str, node: SimNode, tmp_path: Path, start_watch: Callable[..., Watch]
) -> None:
    path = tmp_path / "desired.yaml"
    path.write_text(HOSTILE[name](), encoding="utf-8")
    watch = start_watch(node, path)
    watch.wait_log(lambda d: "nothing is changed until it is fixed" in d.get("msg", ""), "refusal")
    assert watch.get("/healthz")[0] == 200
    peak = _peak_mib(watch.proc.pid)
    assert watch.stop() == 0
    invalid = [d for d in watch.logs() if d.get("msg", "").startswith("invalid desired state")]
    assert 1 <= len(invalid) <= 21
    for line in invalid:
        if " … and " in line["msg"]:
            continue
        assert line["file"] == str(path) and line["line"] >= 1 and line["column"] >= 1, line
    assert not [d for d in watch.logs() if "internal error" in d.get("msg", "")]
    assert peak < PEAK_LIMIT_MIB, f"{name}: {peak} MiB"


def test_the_watch_agent_takes_a_legitimate_megabyte_fleet(
    node: SimNode, tmp_path: Path, start_watch: Callable[..., Watch]
) -> None:
    # The seed's node among a megabyte of others: converged, under the memory bound.
    fleet = _fleet_in_flow_style(MiB - 2048)
    seed = (REPO / "desired-state" / "harvester-kgd9c.yaml").read_text().split("  nodes:\n")[1]
    path = tmp_path / "desired.yaml"
    path.write_text(fleet + seed, encoding="utf-8")
    assert len(path.read_bytes()) <= MiB
    watch = start_watch(node, path)
    watch.wait_log(lambda d: d.get("msg", "").startswith("converged"), "convergence", timeout=60)
    peak = _peak_mib(watch.proc.pid)
    assert watch.stop() == 0
    wait_for(lambda: watch.proc.poll() is not None, "exit")
    assert peak < PEAK_LIMIT_MIB, f"{peak} MiB"
