"""The apply journal as a user sees it: ``vgpuctl apply`` on a simulated host, ``--state-dir``
given. A journal past its limit is rotated (kept whole as the old generation, the previous one
replaced), and a removal's record carries the VF, UUID and type as fields."""

from __future__ import annotations

import json
from pathlib import Path

from tests.simnode import NODE, SEED, SimNode, make_sim

MIB = 1 << 20


def old_record(seq: int) -> str:
    """A record as vgpuctl wrote them before removals had fields."""
    return (
        json.dumps(
            {
                "ts": "2026-01-14T09:30:12.000+00:00",
                "run": "20260114T093012Z-3f9a1c2e",
                "seq": seq,
                "kind": "vgpu-create",
                "target": "0000:08:00.4",
                "phase": "done",
                "message": "created NVIDIA A2-4A",
            },
            separators=(",", ":"),
        )
        + "\n"
    )


def test_apply_rotates_a_full_journal_and_records_removals_as_fields(tmp_path: Path) -> None:
    node: SimNode = make_sim(tmp_path / "host", ["A2@0000:08:00.0"])
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    journal = state / f"{NODE}.journal.jsonl"
    rotated = state / f"{NODE}.journal.1.jsonl"
    prefill = "".join(old_record(i) for i in range(MIB // 100)).encode()
    assert len(prefill) > MIB
    journal.write_bytes(prefill)
    journal.chmod(0o600)
    rotated.write_text(old_record(0))
    rotated.chmod(0o600)

    node.ok("apply", SEED, "--yes", "--state-dir", state)
    # The full journal became the old generation, whole; the previous one is gone.
    assert rotated.read_bytes() == prefill
    first = [json.loads(text) for text in journal.read_text().splitlines()]
    assert first[0]["phase"] == "start" and first[-1]["phase"] == "end"
    assert len({r["run"] for r in first}) == 1

    # VF .7: A2-4Q -> A2-4A. The removal's record names what was removed, as fields.
    inventory = json.loads(node.ok("status", "-o", "json").stdout)
    (vf7,) = (
        vf for gpu in inventory["gpus"] for vf in gpu["vfs"] if vf["address"] == "0000:08:00.7"
    )
    desired = tmp_path / "desired.yaml"
    desired.write_text(
        SEED.read_text().replace('"0000:08:00.7": NVIDIA A2-4Q', '"0000:08:00.7": NVIDIA A2-4A')
    )
    node.ok("apply", desired, "--yes", "--state-dir", state)
    records = [json.loads(text) for text in journal.read_text().splitlines()]
    removed = [r["removed"] for r in records if "removed" in r]
    assert removed == [{"vf": "0000:08:00.7", "uuid": vf7["vgpu"]["uuid"], "type": "NVIDIA A2-4Q"}]
    (done,) = (r for r in records if "removed" in r)
    assert (done["kind"], done["target"], done["phase"]) == ("vgpu-remove", "0000:08:00.7", "done")
    # Nothing else carries the field: a create is not a removal.
    assert all(r["kind"] == "vgpu-remove" for r in records if "removed" in r)
    assert sorted(p.name for p in state.iterdir()) == sorted(
        [journal.name, rotated.name, f"{NODE}.lock"]
    )
