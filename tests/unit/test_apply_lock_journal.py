"""The node lock (one apply per node, crash-safe) and the append-only journal."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import stat
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from reconciler.apply import Journal, NodeLock, Phase
from reconciler.model import ApplyError, LockHeldError

HOLDER = """\
import sys
from pathlib import Path
from reconciler.apply import NodeLock

with NodeLock(Path(sys.argv[1]), "n1"):
    print("locked", flush=True)
    sys.stdin.readline()
"""


@pytest.fixture
def holder(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Another process holding the lock for node n1 until its stdin closes (or it is killed)."""
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "state"), "apply", "lab.yaml"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "locked\n"
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def test_a_second_process_is_refused_with_the_holder_named(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    with pytest.raises(LockHeldError) as info, NodeLock(tmp_path / "state", "n1"):
        pass
    message = info.value.message
    prefix = f"another apply holds the lock for node n1: pid {holder.pid} ("
    assert message.startswith(prefix), message
    assert f"holder.py {tmp_path / 'state'} apply lab.yaml) since " in message
    since = message.rsplit(" since ", 1)[1]
    assert abs((datetime.now(UTC) - datetime.fromisoformat(since)).total_seconds()) < 60
    assert info.value.transient
    assert isinstance(info.value, ApplyError)


def test_other_nodes_are_not_blocked(tmp_path: Path, holder: subprocess.Popen[str]) -> None:
    with NodeLock(tmp_path / "state", "n2") as lock:
        assert lock.held


def test_a_lock_left_by_a_killed_process_is_taken_over(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    lock_file = tmp_path / "state" / "n1.lock"
    assert str(holder.pid) in lock_file.read_text()  # its identity is still in the file
    with NodeLock(tmp_path / "state", "n1", command="vgpuctl apply lab.yaml"):
        info = json.loads(lock_file.read_text())
        assert info["pid"] == os.getpid()
        assert info["command"] == "vgpuctl apply lab.yaml"


def test_a_stale_lock_file_with_garbage_does_not_block(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "n1.lock").write_text('{"pid": 999999, "command": "vgpuctl apply old.yaml"} junk')
    with NodeLock(state, "n1") as lock:
        assert lock.held


def test_the_lock_is_exclusive_within_one_process_too(tmp_path: Path) -> None:
    with NodeLock(tmp_path, "n1", command="first"), pytest.raises(LockHeldError) as info:
        NodeLock(tmp_path, "n1").acquire()
    assert f"pid {os.getpid()} (first) since " in info.value.message
    # Released on exit: the lock can be taken again and its identity is cleared.
    with NodeLock(tmp_path, "n1"):
        pass
    assert (tmp_path / "n1.lock").read_text() == ""


def test_a_holder_that_has_not_said_who_it_is(tmp_path: Path) -> None:
    lock_file = tmp_path / "n1.lock"
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(LockHeldError, match="it has not recorded who it is yet"):
            NodeLock(tmp_path, "n1").acquire()
    finally:
        os.close(fd)


def test_the_state_directory_is_created_private(tmp_path: Path) -> None:
    with NodeLock(tmp_path / "var" / "vgpuctl", "n1"):
        pass
    assert stat.S_IMODE((tmp_path / "var" / "vgpuctl").stat().st_mode) == 0o700


@pytest.mark.parametrize("node", ["../n1", "a/b", "", ".hidden", "n1\n"])
def test_node_names_that_are_not_file_names_are_refused(tmp_path: Path, node: str) -> None:
    with pytest.raises(ApplyError, match="invalid node name"):
        NodeLock(tmp_path, node)
    with pytest.raises(ApplyError, match="invalid node name"):
        Journal(tmp_path, node)


# -- journal --------------------------------------------------------------------------------------


def _clock() -> datetime:
    return datetime(2026, 1, 14, 9, 30, 12, 345000, tzinfo=UTC)


def test_journal_records_are_json_lines_with_the_agreed_fields(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "state", "n1", now=_clock)
    run = journal.new_run_id()
    assert run.startswith("20260114T093012Z-")
    journal.record(run=run, seq=0, kind="run", target="n1", phase=Phase.START, message="2 actions")
    journal.record(
        run=run, seq=1, kind="sriov-enable", target="0000:08:00.0", phase=Phase.INTENT, message="r"
    )
    path = tmp_path / "state" / "n1.journal.jsonl"
    assert journal.path == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {
            "ts": "2026-01-14T09:30:12.345+00:00",
            "run": run,
            "seq": 0,
            "kind": "run",
            "target": "n1",
            "phase": "start",
            "message": "2 actions",
        },
        {
            "ts": "2026-01-14T09:30:12.345+00:00",
            "run": run,
            "seq": 1,
            "kind": "sriov-enable",
            "target": "0000:08:00.0",
            "phase": "intent",
            "message": "r",
        },
    ]


def test_journal_appends_and_last_run_reads_only_the_last(tmp_path: Path) -> None:
    first = Journal(tmp_path, "n1")
    first.record(run="r1", seq=1, kind="vgpu-create", target="x", phase=Phase.INTENT, message="")
    first.record(run="r1", seq=1, kind="vgpu-create", target="x", phase=Phase.DONE, message="")
    # A new Journal object (a later process) appends to the same file.
    later = Journal(tmp_path, "n1")
    later.record(run="r2", seq=1, kind="vgpu-remove", target="y", phase=Phase.INTENT, message="")
    assert [r.run for r in later.records()] == ["r1", "r1", "r2"]
    assert [(r.run, r.kind) for r in later.last_run()] == [("r2", "vgpu-remove")]


def test_journal_reports_what_a_crash_interrupted(tmp_path: Path) -> None:
    journal = Journal(tmp_path, "n1")
    for seq, phase in [(1, Phase.INTENT), (1, Phase.DONE), (2, Phase.INTENT)]:
        journal.record(
            run="r1", seq=seq, kind="vgpu-create", target=f"vf{seq}", phase=phase, message=""
        )
    # The crash also cut the last line short.
    with journal.path.open("a") as f:
        f.write('{"ts": "2026-01-14T09:30:1')
    assert [(r.seq, r.target) for r in journal.interrupted()] == [(2, "vf2")]
    assert len(journal.last_run()) == 3


def test_an_empty_journal_has_no_last_run(tmp_path: Path) -> None:
    journal = Journal(tmp_path, "n1")
    assert journal.records() == []
    assert journal.last_run() == []
    assert journal.interrupted() == []


# -- the state directory: nobody else has a say in what vgpuctl writes there ----------------------


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722, 0o1777])
def test_a_state_directory_others_can_write_is_refused_naming_it(tmp_path: Path, mode: int) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(mode)
    for use in (
        lambda: NodeLock(state, "n1").acquire(),
        lambda: Journal(state, "n1").record(
            run="r", seq=0, kind="run", target="n1", phase=Phase.START, message=""
        ),
    ):
        with pytest.raises(ApplyError) as info:
            use()
        assert info.value.message.startswith(f"state directory {state} is writable by ")
        assert f"chmod go-w {state}" in info.value.message
    assert list(state.iterdir()) == []


def test_a_state_directory_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a directory away takes root")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chown(state, 65534, -1)
    with pytest.raises(ApplyError) as info:
        NodeLock(state, "n1").acquire()
    assert info.value.message.startswith(
        f"state directory {state} is owned by uid 65534, not by uid 0 that vgpuctl runs as"
    )
    assert list(state.iterdir()) == []


def test_a_state_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "state").symlink_to(real)
    with pytest.raises(ApplyError, match=f"state directory {tmp_path / 'state'} is a symbolic"):
        NodeLock(tmp_path / "state", "n1").acquire()
    assert list(real.iterdir()) == []


@pytest.mark.parametrize("suffix", [".lock", ".journal.jsonl"])
@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
def test_a_link_planted_in_the_state_directory_is_never_written_through(
    tmp_path: Path, suffix: str, kind: str
) -> None:
    victim = tmp_path / "shadow"
    victim.write_text("root:$6$salt$hash:19000:0:99999:7:::\n")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    if kind == "symlink":
        (state / f"n1{suffix}").symlink_to(victim)
    else:
        os.link(victim, state / f"n1{suffix}")
    journal = Journal(state, "n1")

    def use() -> None:
        if suffix == ".lock":
            NodeLock(state, "n1").acquire()
        else:
            journal.record(run="r", seq=0, kind="run", target="n1", phase=Phase.START, message="")

    with pytest.raises(ApplyError) as info:
        use()
    why = "is a symbolic link" if kind == "symlink" else "has 2 hard links"
    assert info.value.message.startswith(f"{state / f'n1{suffix}'} {why}")
    assert victim.read_text() == "root:$6$salt$hash:19000:0:99999:7:::\n"
    if suffix == ".journal.jsonl":
        with pytest.raises(ApplyError, match=why):
            journal.records()


def test_a_fifo_in_place_of_the_journal_is_refused_not_waited_for(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.mkfifo(state / "n1.journal.jsonl")
    journal = Journal(state, "n1")
    with pytest.raises(ApplyError, match="is not a regular file"):
        journal.records()


def test_reading_a_journal_creates_no_state_directory(tmp_path: Path) -> None:
    assert Journal(tmp_path / "state", "n1").records() == []
    assert not (tmp_path / "state").exists()
