"""``vgpuctl device-plugin``'s journal rule, seen by the fake kubelet: a vGPU vgpuctl removed (a
``done`` removal record carrying the structured ``removed`` field) is dropped; one that vanished
otherwise stays listed Unhealthy, even when some record's message says "removed <uuid>" (the
message is for people; only the field counts). Bad records are skipped with one warning each,
and the journal is followed across a rotation.

The journal lines are written here as the file holds them, not through vgpuctl's writer, so
the test judges the reader alone.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.catalog import default_catalog
from reconciler.deviceplugin import Backoff, run_standalone
from reconciler.sim import SimHost, build_host
from tests.doubles.fake_kubelet import (
    HEALTHY,
    UNHEALTHY,
    DeviceState,
    FakeKubelet,
    make_plugin_dir,
    remove_plugin_dir,
)

NODE = "node-1"
A2_4A = "nvidia.com/NVIDIA_A2-4A"
A2_4Q = "nvidia.com/NVIDIA_A2-4Q"


def sim_uuid(vf: str) -> str:
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"sim/{vf}"))


VF4, VF5, VF6, VF7 = (f"0000:08:00.{f}" for f in (4, 5, 6, 7))
U4, U5, U6, U7 = map(sim_uuid, (VF4, VF5, VF6, VF7))


def line(seq: int, vf: str, message: str, removed: object = None) -> str:
    raw: dict[str, object] = {
        "ts": "2026-01-14T09:30:12.000+00:00",
        "run": "20260114T093012Z-3f9a1c2e",
        "seq": seq,
        "kind": "vgpu-remove",
        "target": vf,
        "phase": "done",
        "message": message,
    }
    if removed is not None:
        raw["removed"] = removed
    return json.dumps(raw) + "\n"


@pytest.fixture
def host(tmp_path: Path) -> SimHost:
    spec = {
        "gpus": [
            {
                "model": "A2",
                "address": "0000:08:00.0",
                "vgpus": {
                    VF4: "NVIDIA A2-4A",
                    VF5: "NVIDIA A2-4Q",
                    VF6: "NVIDIA A2-4A",
                    VF7: "NVIDIA A2-4Q",
                },
            }
        ]
    }
    return build_host(tmp_path / "host", spec)


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    directory = make_plugin_dir()
    try:
        with FakeKubelet(directory) as k:
            yield k
    finally:
        remove_plugin_dir(directory)


def test_only_the_structured_record_of_a_removal_drops_a_vgpu(
    host: SimHost, kubelet: FakeKubelet, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="vgpuctl.deviceplugin")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    journal = state / f"{NODE}.journal.jsonl"
    journal.write_text(line(1, VF6, "from an earlier run", {"vf": VF6, "uuid": U6}))
    journal.chmod(0o600)

    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            run_standalone(
                sysfs_root=host.sysfs_root,
                plugin_dir=kubelet.plugin_dir,
                node=NODE,
                state_dir=state,
                catalog=default_catalog(),
                hold_probe=host.hold_probe(),
                rescan_interval=0.05,
                stop_event=stop,
                kubelet_socket=kubelet.socket,
                backoff=Backoff(initial=0.05, cap=0.1),
            )
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        kubelet.wait_for(
            lambda: kubelet.allocatable_all() == {A2_4A: 2, A2_4Q: 2},
            timeout=10,
            what="the host's vGPUs advertised",
        )
        for uuid in (U4, U5, U7):
            host.writer().write(f"bus/mdev/devices/{uuid}/remove", "1")
        with journal.open("a") as f:
            # Old format: the message says it, no field: not a removal.
            f.write(line(2, VF7, f"removed NVIDIA A2-4Q {U7}"))
            # A field that is not a canonical UUID: skipped, with one warning.
            f.write(line(3, VF5, f"removed NVIDIA A2-4Q {U5}", {"vf": VF5, "uuid": U5.upper()}))
            f.write(line(4, VF4, f"removed NVIDIA A2-4A {U4}", {"vf": VF4, "uuid": U4}))
        # U4's record is the last one: once it counts, every record before it was read. The
        # two profiles' lists come on two streams: wait for the A2-4Q one too.
        kubelet.wait_for(
            lambda: (
                kubelet.devices(A2_4A) == (DeviceState(U6, HEALTHY),)
                and not any(d.healthy for d in kubelet.devices(A2_4Q))
            ),
            timeout=10,
            what="U4 dropped, and the A2-4Q list updated",
        )
        assert set(kubelet.devices(A2_4Q)) == {
            DeviceState(U5, UNHEALTHY),
            DeviceState(U7, UNHEALTHY),
        }
        assert kubelet.allocatable_all() == {A2_4A: 1, A2_4Q: 0}

        # A removal journalled just before the writer rotates: read in the old generation
        # (or before the rotation), then the new file from its start.
        host.writer().write(f"bus/mdev/devices/{U6}/remove", "1")
        with journal.open("a") as f:
            f.write(line(5, VF6, "", {"vf": VF6, "uuid": U6, "type": "NVIDIA A2-4A"}))
        os.rename(journal, state / f"{NODE}.journal.1.jsonl")
        journal.write_text(
            line(1, VF7, "", {"vf": "0000:08:00.7/..", "uuid": U7})
            + line(2, VF5, "", {"vf": VF5, "uuid": U5})
        )
        kubelet.wait_for(
            lambda: (
                kubelet.devices(A2_4A) == ()
                and kubelet.devices(A2_4Q) == (DeviceState(U7, UNHEALTHY),)
            ),
            timeout=10,
            what="U6 and U5 dropped, U7 still Unhealthy",
        )
    finally:
        stop.set()
        thread.join(timeout=5)
    assert errors == []
    warnings = [r.getMessage() for r in caplog.records if "journal line" in r.getMessage()]
    assert warnings == [
        f"skipped a journal line, {journal}:3: field 'removed.uuid' \"{U5.upper()}\" is not a "
        "vGPU UUID in canonical lower-case form: not a record vgpuctl wrote",
        f"skipped a journal line, {journal}:1: field 'removed.vf' \"0000:08:00.7/..\" is not "
        "a PCI address such as 0000:08:00.4: not a record vgpuctl wrote",
    ]
