"""The apply journal's structured removal record, its rotation (bounded whatever the number of
runs, crash-safe, never through a link) and the incremental reader the device plugin uses."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply import Journal, JournalReader, JournalRecord, Phase, Removal
from reconciler.model import ApplyError, PciAddress

NODE = "n1"
MIB = 1 << 20
U1 = "dd6772a8-7db8-4e96-9a73-f94c389d9bc3"
U2 = "5b5b7326-6bb8-48cb-a321-8fa58ccbb38c"
U3 = "0e6a0f1d-4b8e-5c3a-9d2f-7a1b2c3d4e5f"
VF5 = "0000:08:00.5"


def line(**fields: Any) -> str:
    """A journal line as the file holds it (the agreed fields, overridable)."""
    base: dict[str, Any] = {
        "ts": "2026-01-14T09:30:12.000+00:00",
        "run": "r",
        "seq": 1,
        "kind": "vgpu-remove",
        "target": VF5,
        "phase": "done",
        "message": "",
    }
    base.update(fields)
    return json.dumps(base) + "\n"


def append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def state(tmp_path: Path) -> Path:
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700, exist_ok=True)
    return directory


def run(journal: Journal, name: str, actions: int, message: str = "") -> None:
    """What an apply writes: start, intent and outcome per action, end."""
    journal.record(run=name, seq=0, kind="run", target=NODE, phase=Phase.START, message="")
    for seq in range(1, actions + 1):
        for phase in (Phase.INTENT, Phase.DONE):
            journal.record(
                run=name, seq=seq, kind="vgpu-create", target=VF5, phase=phase, message=message
            )
    journal.record(run=name, seq=0, kind="run", target=NODE, phase=Phase.END, message="")


# -- the structured removal record -----------------------------------------------------------------


def test_a_removal_record_carries_the_vf_uuid_and_type_as_fields(tmp_path: Path) -> None:
    journal = Journal(state(tmp_path), NODE)
    journal.record(
        run="r1",
        seq=3,
        kind="vgpu-remove",
        target=VF5,
        phase=Phase.DONE,
        message=f"removed NVIDIA A2-4Q {U1}",
        removed=Removal(vf=PciAddress.parse(VF5), uuid=U1, type_name="NVIDIA A2-4Q"),
    )
    raw = json.loads(journal.path.read_text())
    assert raw["removed"] == {"vf": VF5, "uuid": U1, "type": "NVIDIA A2-4Q"}
    (back,) = journal.records()
    assert back.removed == Removal(vf=PciAddress(0, 8, 0, 5), uuid=U1, type_name="NVIDIA A2-4Q")


def test_an_old_journal_without_the_field_is_read_and_has_no_removals(tmp_path: Path) -> None:
    journal = Journal(state(tmp_path), NODE)
    append(journal.path, line(message=f"removed NVIDIA A2-4Q {U1}"))
    (record,) = journal.records()
    assert record.message == f"removed NVIDIA A2-4Q {U1}"
    assert record.removed is None


@pytest.mark.parametrize(
    ("removed", "why"),
    [
        ({"vf": VF5, "uuid": U1.upper()}, "field 'removed.uuid' \"DD6772A8-"),
        ({"vf": VF5, "uuid": "../../../etc/passwd"}, "field 'removed.uuid'"),
        ({"vf": VF5, "uuid": f"{{{U1}}}"}, "field 'removed.uuid'"),
        ({"vf": VF5}, "field 'removed.uuid' (missing) is not a vGPU UUID"),
        ({"vf": "0000:08:00.5/../x", "uuid": U1}, "field 'removed.vf'"),
        ({"vf": " 0000:08:00.5", "uuid": U1}, "field 'removed.vf'"),
        ({"vf": 5, "uuid": U1}, "field 'removed.vf' 5 is not a PCI address"),
        ({"vf": VF5, "uuid": U1, "type": "A2\x1b[2J"}, "field 'removed.type'"),
        ({"vf": VF5, "uuid": U1, "type": ["x"]}, "field 'removed.type'"),
        ([VF5, U1], "field 'removed' is not an object"),
        ("removed", "field 'removed' is not an object"),
    ],
)
def test_a_bad_removal_record_is_skipped_naming_file_line_and_field(
    tmp_path: Path, removed: object, why: str
) -> None:
    journal = Journal(state(tmp_path), NODE)
    append(journal.path, line(seq=1, removed={"vf": VF5, "uuid": U2}))
    append(journal.path, line(seq=2, removed=removed))
    append(journal.path, line(seq=3, removed={"vf": VF5, "uuid": U3}))
    read = JournalReader(journal).read_new()
    assert [(r.seq, r.removed.uuid if r.removed else None) for r in read.records] == [
        (1, U2),
        (3, U3),
    ]
    (skipped,) = read.skipped
    assert str(skipped).startswith(f"{journal.path}:2: {why}")
    assert "\x1b" not in str(skipped)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("not json at all", "not a JSON record"),
        ("[1, 2]", "not a JSON object"),
        (json.dumps({"ts": "t", "run": "r", "kind": "k", "target": "t", "phase": "done"}), "seq"),
        (line(seq="1").strip(), "field 'seq' \"1\" is not an integer"),
        (line(phase="exploded").strip(), "field 'phase' \"exploded\" is not a journal phase"),
        ("[" * 30_000 + "]" * 30_000, "not a JSON record"),
        ('{"ts": "\xff\xfe', "not a JSON record"),
    ],
    ids=["text", "array", "no-seq", "seq-string", "bad-phase", "nested-deep", "cut"],
)
def test_a_line_that_is_no_record_is_skipped_and_reading_goes_on(
    tmp_path: Path, text: str, why: str
) -> None:
    journal = Journal(state(tmp_path), NODE)
    append(journal.path, text + "\n" + line(seq=7))
    read = JournalReader(journal).read_new()
    assert [r.seq for r in read.records] == [7]
    assert [(s.line, why in s.why) for s in read.skipped] == [(1, True)]


# -- bounded: rotation -----------------------------------------------------------------------------


def test_the_journal_stays_bounded_whatever_the_number_of_runs(tmp_path: Path) -> None:
    journal = Journal(state(tmp_path), NODE)
    # Each run writes 8 records of about 1.1 KiB: 600 runs are over 5 MiB of records.
    one_record = len(line(message="m" * 1000).encode()) + 100
    largest = 0
    for i in range(600):
        run(journal, f"r{i:04d}", actions=3, message="m" * 1000)
        total = sum(p.stat().st_size for p in journal.path.parent.iterdir())
        largest = max(largest, total)
    assert largest <= 2 * (MIB + 8 * one_record)
    assert sorted(p.name for p in journal.path.parent.iterdir()) == [
        f"{NODE}.journal.1.jsonl",
        f"{NODE}.journal.jsonl",
    ]
    # The newest runs are all there, whole, and in order.
    last = journal.last_run()
    assert [(r.seq, r.phase.value) for r in last] == [
        (0, "start"),
        *[(s, p) for s in (1, 2, 3) for p in ("intent", "done")],
        (0, "end"),
    ]
    assert last[0].run == "r0599"
    runs = [r.run for r in journal.records()]
    assert runs == sorted(runs)
    assert len(set(runs)) >= MIB // (8 * one_record)


def test_a_journal_past_the_limit_is_rotated_before_the_next_record(tmp_path: Path) -> None:
    journal = Journal(state(tmp_path), NODE)
    old = "".join(line(run="old", seq=i) for i in range(MIB // 100)).encode()
    assert len(old) > MIB
    journal.path.write_bytes(old)
    journal.path.chmod(0o600)
    journal.rotated_path.write_bytes(b"the generation before: replaced\n")
    journal.rotated_path.chmod(0o600)
    run(journal, "new", actions=1)
    assert journal.rotated_path.read_bytes() == old
    assert [r.run for r in journal.last_run()] == ["new"] * 4
    assert {r.run for r in JournalReader(journal).read_new().records} == {"new"}


def test_a_run_is_never_split_by_two_rotations(tmp_path: Path) -> None:
    # A run longer than the limit rotates once (at its first record past it), not again: the
    # generation that holds its beginning is never replaced while it runs.
    journal = Journal(state(tmp_path), NODE, rotate_bytes=2000)
    run(journal, "before", actions=20)
    run(journal, "long", actions=100)
    last = journal.last_run()
    assert [r.seq for r in last if r.phase is Phase.DONE] == list(range(1, 101))
    assert last[0].phase is Phase.START and last[-1].phase is Phase.END
    assert journal.interrupted() == []
    # The next run rotates again; the long one is then the old generation, still whole.
    run(journal, "after", actions=1)
    assert {r.run for r in journal.records()} == {"long", "after"}


def test_a_crash_after_rotating_loses_none_of_the_running_records(tmp_path: Path) -> None:
    journal = Journal(state(tmp_path), NODE)
    journal.record(run="r1", seq=0, kind="run", target=NODE, phase=Phase.START, message="")
    journal.record(run="r1", seq=1, kind="vgpu-create", target=VF5, phase=Phase.INTENT, message="")
    # The crash came right after the rename, before the next record made the new file.
    os.rename(journal.path, journal.rotated_path)
    later = Journal(journal.state_dir, NODE)
    assert [(r.seq, r.phase) for r in later.interrupted()] == [(1, Phase.INTENT)]
    # Running again goes on: a new current file; both generations read as one journal.
    later.record(run="r2", seq=0, kind="run", target=NODE, phase=Phase.START, message="")
    assert [r.run for r in later.records()] == ["r1", "r1", "r2"]
    assert journal.path.exists()


def test_rotation_never_replaces_a_link_or_a_second_hard_link(tmp_path: Path) -> None:
    victim = tmp_path / "shadow"
    victim.write_text("secret\n")
    journal = Journal(state(tmp_path), NODE, rotate_bytes=10)
    journal.record(run="r1", seq=0, kind="run", target=NODE, phase=Phase.START, message="")
    journal.rotated_path.symlink_to(victim)
    with pytest.raises(ApplyError, match=r"journal\.1\.jsonl is a symbolic link: vgpuctl never"):
        journal.record(run="r2", seq=0, kind="run", target=NODE, phase=Phase.START, message="")
    journal.rotated_path.unlink()
    os.link(victim, journal.rotated_path)
    with pytest.raises(ApplyError, match=r"journal\.1\.jsonl has 2 hard links"):
        journal.record(run="r2", seq=0, kind="run", target=NODE, phase=Phase.START, message="")
    assert victim.read_text() == "secret\n"
    assert [r.run for r in JournalReader(journal).read_new().records] == ["r1"]


def test_a_long_message_is_cut(tmp_path: Path) -> None:
    journal = Journal(state(tmp_path), NODE)
    rec = journal.record(
        run="r", seq=1, kind="vgpu-create", target=VF5, phase=Phase.FAILED, message="x" * 100_000
    )
    assert len(rec.message) == 4096 and rec.message.endswith("…")
    assert journal.path.stat().st_size < 5000


# -- read incrementally ----------------------------------------------------------------------------


def seqs(reader: JournalReader) -> list[int]:
    read = reader.read_new()
    assert read.skipped == ()
    return [r.seq for r in read.records]


def test_the_reader_returns_only_what_was_appended_since(tmp_path: Path) -> None:
    journal = Journal(state(tmp_path), NODE)
    reader = JournalReader(journal)
    assert seqs(reader) == []  # no journal yet
    append(journal.path, line(seq=1) + line(seq=2))
    assert seqs(reader) == [1, 2]
    assert seqs(reader) == []
    append(journal.path, line(seq=3))
    assert seqs(reader) == [3]


def test_a_partial_last_line_is_left_for_the_next_read(tmp_path: Path) -> None:
    journal = Journal(state(tmp_path), NODE)
    reader = JournalReader(journal)
    whole = line(seq=2)
    append(journal.path, line(seq=1) + whole[:20])
    assert seqs(reader) == [1]
    assert seqs(reader) == []
    append(journal.path, whole[20:] + line(seq=3)[:-1])
    assert seqs(reader) == [2]
    append(journal.path, "\n")
    assert seqs(reader) == [3]


def test_skip_to_end_starts_after_what_is_there(tmp_path: Path) -> None:
    journal = Journal(state(tmp_path), NODE)
    whole = line(seq=2)
    append(journal.path, line(seq=1) + whole[:30])
    reader = JournalReader(journal)
    reader.skip_to_end()
    append(journal.path, whole[30:])
    assert seqs(reader) == [2]  # the line being written when it started is not lost


def test_the_reader_finishes_the_rotated_generation_then_reads_the_new_file(
    tmp_path: Path,
) -> None:
    journal = Journal(state(tmp_path), NODE, rotate_bytes=1)
    reader = JournalReader(journal)
    assert seqs(reader) == []  # no journal yet
    # r1's second record rotates: its first is in the old generation, made since that read.
    run(journal, "r1", actions=0)
    assert [r.phase for r in reader.read_new().records] == [Phase.START, Phase.END]
    journal.record(run="r2", seq=0, kind="run", target=NODE, phase=Phase.START, message="")
    assert [(r.run, r.phase) for r in reader.read_new().records] == [("r2", Phase.START)]
    journal.record(run="r2", seq=1, kind="vgpu-remove", target=VF5, phase=Phase.DONE, message="")
    # r3's first record rotates: r2's last record (not yet read) is now in the old generation.
    run(journal, "r3", actions=1)
    assert journal.rotated_path.exists()
    read = reader.read_new()
    assert [(r.run, r.seq, r.phase.value) for r in read.records] == [
        ("r2", 1, "done"),
        ("r3", 0, "start"),
        ("r3", 1, "intent"),
        ("r3", 1, "done"),
        ("r3", 0, "end"),
    ]
    assert reader.read_new().records == ()


def test_the_reader_across_a_rotation_with_a_partial_line_and_no_new_file_yet(
    tmp_path: Path,
) -> None:
    journal = Journal(state(tmp_path), NODE)
    reader = JournalReader(journal)
    whole = line(seq=2)
    append(journal.path, line(seq=1) + whole[:25])
    assert seqs(reader) == [1]
    append(journal.path, whole[25:])
    os.rename(journal.path, journal.rotated_path)  # rotated; the next record not written yet
    assert seqs(reader) == [2]
    assert seqs(reader) == []
    append(journal.path, line(seq=3))
    assert seqs(reader) == [3]


def test_a_replaced_journal_is_read_from_its_start(tmp_path: Path) -> None:
    journal = Journal(state(tmp_path), NODE)
    reader = JournalReader(journal)
    append(journal.path, line(seq=1) + line(seq=2))
    assert seqs(reader) == [1, 2]
    journal.path.write_text(line(seq=9))  # shorter than what was read: another file
    assert seqs(reader) == [9]


def test_reads_are_bounded_and_lose_nothing(tmp_path: Path) -> None:
    journal = Journal(state(tmp_path), NODE)
    one = line(seq=1, message="m" * 900)
    count = (5 * MIB) // len(one) + 1
    append(journal.path, one * count)
    reader = JournalReader(journal)
    first = reader.read_new().records
    assert 0 < len(first) < count  # at most READ_BUDGET (4 MiB) at once
    second = reader.read_new().records
    assert len(first) + len(second) == count


def test_an_overlong_line_is_skipped_once(tmp_path: Path) -> None:
    journal = Journal(state(tmp_path), NODE)
    reader = JournalReader(journal)
    append(journal.path, line(seq=1) + "x" * (200 << 10))
    assert seqs(reader) == [1]
    append(journal.path, "y" * (100 << 10) + "\n" + line(seq=2))
    read = reader.read_new()
    assert [r.seq for r in read.records] == [2]
    assert [(s.line, s.why) for s in read.skipped] == [(2, "longer than 65536 bytes")]


def test_records_read_both_generations_and_at_most_the_last_8_mib_of_each(
    tmp_path: Path,
) -> None:
    journal = Journal(state(tmp_path), NODE)
    append(journal.rotated_path, line(run="old", seq=1))
    big = line(run="big", seq=2, message="m" * 900)
    append(journal.path, big * ((9 * MIB) // len(big)) + line(run="big", seq=3))
    records = journal.records()
    assert records[0] == JournalRecord.from_json(json.loads(line(run="old", seq=1)))
    assert records[-1].seq == 3
    assert len(records) - 1 <= (8 * MIB) // len(big) + 1


def test_skip_to_end_skips_a_journal_larger_than_one_read(tmp_path: Path) -> None:
    journal = Journal(state(tmp_path), NODE)
    one = line(seq=1, message="m" * 900)
    append(journal.path, one * ((5 * MIB) // len(one) + 1))
    reader = JournalReader(journal)
    reader.skip_to_end()
    append(journal.path, line(seq=2))
    assert seqs(reader) == [2]


def test_a_journal_made_and_rotated_between_two_reads_is_read_whole(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "state", NODE, rotate_bytes=1)
    reader = JournalReader(journal)
    assert seqs(reader) == []  # no state directory yet
    journal.record(run="r1", seq=1, kind="run", target=NODE, phase=Phase.START, message="")
    journal.record(run="r1", seq=2, kind="run", target=NODE, phase=Phase.END, message="")
    assert journal.rotated_path.exists()
    assert seqs(reader) == [1, 2]
