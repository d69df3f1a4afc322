"""Files named on the command line are read bounded and written by replacement.

The attacks (issue 28, item 5), on the files ``lint-vm`` and ``validate --explain --inventory``
read and the one ``plan --out`` writes, as root: a link to ``/dev/zero`` exhausted memory; a
FIFO hung the command; deep nesting was an internal error (``RecursionError``); a link planted
at the ``--out`` path was followed, and its target overwritten. Each is now one line naming the
file, at once (every run here has 1 GiB of address space and a time limit), and the target of a
planted link is left as it was.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.simnode import NODE, REPO, SEED, make_sim

#: ``python -m reconciler ARGS`` within 1 GiB of address space: reading ``/dev/zero`` whole
#: would fail fast rather than take the machine's memory.
_LIMITED = """
import resource, runpy, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
sys.argv = ["vgpuctl", *sys.argv[1:]]
runpy.run_module("reconciler", run_name="__main__")
"""

#: How each command names the file it reads, and how its error names it.
COMMANDS: dict[str, tuple[Callable[[Path], list[str | Path]], str]] = {
    "lint-vm": (lambda path: ["lint-vm", "--desired", SEED, path], "{path}"),
    "explain": (
        lambda path: ["validate", SEED, "--explain", NODE, "--inventory", path],
        "--inventory {path}",
    ),
    "import": (lambda path: ["import", "vgpu-device-manager", path], "{path}"),
}


def vgpuctl(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``vgpuctl ARGS`` limited in memory; a run still going after ``timeout`` seconds fails
    the test (``TimeoutExpired``): it hung."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUCTL_")}
    return subprocess.run(
        [sys.executable, "-c", _LIMITED, *map(str, args)],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout, check=False,
    )  # fmt: skip


def assert_one_line(res: subprocess.CompletedProcess[str], line: str) -> None:
    assert res.returncode == 1, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr
    assert res.stderr.splitlines() == [line], res.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_a_link_to_dev_zero_is_refused_before_it_is_read(command: str, tmp_path: Path) -> None:
    args, named = COMMANDS[command]
    link = tmp_path / "input"
    link.symlink_to("/dev/zero")
    res = vgpuctl(*args(link), timeout=30)
    assert_one_line(res, f"error: {named.format(path=link)}: cannot read: not a regular file")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_fifo_is_refused_not_waited_on(command: str, tmp_path: Path) -> None:
    args, named = COMMANDS[command]
    fifo = tmp_path / "input"
    os.mkfifo(fifo)  # no writer ever comes: opening it to read would wait for ever
    res = vgpuctl(*args(fifo), timeout=30)
    assert_one_line(res, f"error: {named.format(path=fifo)}: cannot read: not a regular file")


def test_a_deeply_nested_manifest_is_a_located_error(tmp_path: Path) -> None:
    manifest = tmp_path / "vm.yaml"
    manifest.write_text("apiVersion: kubevirt.io/v1\nspec: " + "[" * 5000 + "]" * 5000 + "\n")
    res = vgpuctl("lint-vm", "--desired", SEED, manifest)
    # The list that opens the 65th level (the document's mapping is the first).
    assert_one_line(res, f"{manifest}:2:70: error: nested deeper than 64 levels")
    # At the bound, the manifest is read (no VM in it: nothing to say).
    manifest.write_text("apiVersion: kubevirt.io/v1\nspec: " + "[" * 63 + "]" * 63 + "\n")
    res = vgpuctl("lint-vm", "--desired", SEED, manifest)
    assert (res.returncode, res.stderr) == (0, "")


def test_a_deeply_nested_inventory_is_one_line(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.json"
    inventory.write_text('{"gpus": ' + "[" * 100_000 + "]" * 100_000 + "}")
    res = vgpuctl("validate", SEED, "--explain", NODE, "--inventory", inventory)
    assert_one_line(res, f"error: --inventory {inventory}: nested more than 64 levels deep")


def test_a_link_planted_at_the_plan_out_path_is_refused_and_its_target_untouched(
    tmp_path: Path,
) -> None:
    node = make_sim(tmp_path / "host", ["A2@0000:08:00.0"])
    victim = tmp_path / "shadow"
    victim.write_text("root:$6$secret:19000:0:99999:7:::\n")
    planted = tmp_path / "plan.json"
    planted.symlink_to(victim)
    res = vgpuctl("plan", SEED, *node.flags, "--out", planted)
    assert_one_line(
        res,
        f"error: cannot write the plan to {planted}: it is a symbolic link, which vgpuctl "
        "neither follows nor replaces (remove it, or save the plan elsewhere)",
    )
    assert victim.read_text() == "root:$6$secret:19000:0:99999:7:::\n"
    assert planted.is_symlink() and os.readlink(planted) == str(victim)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["host", "plan.json", "shadow"]


def test_the_plan_out_file_is_a_new_file_renamed_into_place(tmp_path: Path) -> None:
    """A hard link at the path (or an editor holding the old file) keeps the old content: the
    plan is written to a new file and renamed over the path, never written through it."""
    node = make_sim(tmp_path / "host", ["A2@0000:08:00.0"])
    other = tmp_path / "other-name"
    other.write_text("kept\n")
    out = tmp_path / "plan.json"
    os.link(other, out)
    res = vgpuctl("plan", SEED, *node.flags, "--out", out)
    assert res.returncode == 0, res.stderr
    assert other.read_text() == "kept\n"
    assert '"formatVersion"' in out.read_text() and out.stat().st_nlink == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["host", "other-name", "plan.json"]
    # The saved plan is the one apply runs.
    applied = vgpuctl("apply", out, *node.flags, "--yes")
    assert applied.returncode == 0, applied.stderr
