"""The files vgpuctl opens as root in its state directory (issue 10, item 2), driven as a user
drives it: ``vgpuctl apply`` in a subprocess, on a simulated host, ``--state-dir`` given.

The node lock (``<node>.lock``) is truncated and rewritten on every apply, the journal
(``<node>.journal.jsonl``) appended to. Whoever could plant a link there made root truncate and
overwrite any file; so a state directory others can write (or another user owns) is refused,
and a link or a second hard link in place of either file is never written through.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.simnode import NODE, SEED, SimNode, make_sim

#: What a root-owned file outside the state directory holds: it must never change.
SHADOW = "root:$6$Kx8.salt$Q1w2E3r4T5y6U7i8O9p0AsDfGhJkLzXcVbNm:19000:0:99999:7:::\n"


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    return make_sim(tmp_path / "host", ["A2@0000:08:00.0"])


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A root-owned file outside the state directory, standing in for ``/etc/shadow``."""
    path = tmp_path / "etc" / "shadow"
    path.parent.mkdir()
    path.write_text(SHADOW)
    path.chmod(0o600)
    return path


def vgpu_count(node: SimNode) -> int:
    inventory = json.loads(node.ok("status", "-o", "json").stdout)
    return sum(1 for gpu in inventory["gpus"] for vf in gpu["vfs"] if vf["vgpu"])


@pytest.mark.parametrize("suffix", [".lock", ".journal.jsonl"])
def test_a_link_planted_in_the_state_directory_does_not_overwrite_its_target(
    tmp_path: Path, node: SimNode, victim: Path, suffix: str
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    planted = state / f"{NODE}{suffix}"
    planted.symlink_to(victim)
    res = node.run("apply", SEED, "--yes", "--state-dir", state)
    assert victim.read_text() == SHADOW
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"{planted} is a symbolic link: vgpuctl never opens one in its state directory" in (
        res.stderr
    )
    assert "Traceback" not in res.stderr


def test_a_link_planted_as_the_old_journal_generation_is_never_rotated_over(
    tmp_path: Path, node: SimNode, victim: Path
) -> None:
    # A journal past its limit is renamed to <node>.journal.1.jsonl before the next record;
    # a link in that place is refused as in the current file's (and the target left alone).
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    journal = state / f"{NODE}.journal.jsonl"
    journal.write_text("{}\n" * (1 << 19))
    journal.chmod(0o600)
    planted = state / f"{NODE}.journal.1.jsonl"
    planted.symlink_to(victim)
    res = node.run("apply", SEED, "--yes", "--state-dir", state)
    assert victim.read_text() == SHADOW
    assert planted.is_symlink()
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"{planted} is a symbolic link: vgpuctl never opens one in its state directory" in (
        res.stderr
    )
    assert "Traceback" not in res.stderr
    assert vgpu_count(node) == 0  # refused at the run's first record, before any change


def test_a_second_hard_link_to_the_lock_does_not_overwrite_its_target(
    tmp_path: Path, node: SimNode, victim: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.link(victim, state / f"{NODE}.lock")
    res = node.run("apply", SEED, "--yes", "--state-dir", state)
    assert victim.read_text() == SHADOW
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"{state / f'{NODE}.lock'} has 2 hard links" in res.stderr


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775])
def test_a_state_directory_others_can_write_is_refused(
    tmp_path: Path, node: SimNode, mode: int
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(mode)
    res = node.run("apply", SEED, "--yes", "--state-dir", state)
    assert res.returncode == 1, res.stdout + res.stderr
    who = "group and others" if mode & 0o002 else "group"
    assert (
        f"error: state directory {state} is writable by {who} (mode {mode:04o}): they could "
        f"plant a link there that vgpuctl would write through; chmod go-w {state}"
    ) in res.stderr
    assert vgpu_count(node) == 0  # nothing was applied
    assert list(state.iterdir()) == []


def test_a_state_directory_owned_by_another_user_is_refused(tmp_path: Path, node: SimNode) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a directory away takes root")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chown(state, 65534, 65534)
    res = node.run("apply", SEED, "--yes", "--state-dir", state)
    assert res.returncode == 1, res.stdout + res.stderr
    assert (
        f"error: state directory {state} is owned by uid 65534, not by uid 0 that vgpuctl runs "
        f"as: its owner could plant a link there that vgpuctl would write through; make it "
        f"yours (chown 0 {state}; chmod 700 {state}) or give another --state-dir"
    ) in res.stderr
    assert vgpu_count(node) == 0


def test_a_missing_state_directory_is_created_private_and_used(
    tmp_path: Path, node: SimNode
) -> None:
    state = tmp_path / "var" / "lib" / "vgpuctl"
    node.ok("apply", SEED, "--yes", "--state-dir", state)
    assert oct(state.stat().st_mode & 0o777) == "0o700"
    assert sorted(p.name for p in state.iterdir()) == [f"{NODE}.journal.jsonl", f"{NODE}.lock"]
    assert vgpu_count(node) == 4
