"""``vgpuctl device-plugin`` without the CLI: :func:`run_standalone` on a simulated host, learning
on-purpose removals from the apply journal; and the journal rule itself."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from reconciler.apply import Journal, JournalRecord, Phase, Removal
from reconciler.catalog import default_catalog
from reconciler.deviceplugin import Backoff, PluginDirError, removals, run_standalone
from reconciler.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from reconciler.model import ObserveError, PciAddress, TypeNames
from reconciler.sim import SimHost, build_host

NODE = "node-1"
SOCKET_4Q = "vgpuctl-nvidia.com_NVIDIA_A2-4Q.sock"
SOCKET_4A = "vgpuctl-nvidia.com_NVIDIA_A2-4A.sock"
U1 = "dd6772a8-7db8-4e96-9a73-f94c389d9bc3"
U2 = "5b5b7326-6bb8-48cb-a321-8fa58ccbb38c"


def wait_until(condition: Callable[[], bool], timeout: float = 1.0) -> bool:
    """For a socket to appear: the plugin thread announces nothing to the test."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def sim_uuid(vf: str) -> str:
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"sim/{vf}"))


U5 = sim_uuid("0000:08:00.5")
U7 = sim_uuid("0000:08:00.7")


def record(kind: str, phase: Phase, message: str, removed: dict[str, str] | None = None) -> str:
    """A journal line as the file holds it."""
    raw: dict[str, object] = {
        "ts": "2026-01-14T09:30:12.000+00:00",
        "run": "r",
        "seq": 1,
        "kind": kind,
        "target": "0000:08:00.5",
        "phase": phase.value,
        "message": message,
    }
    if removed is not None:
        raw["removed"] = removed
    return json.dumps(raw)


# -- the journal rule -----------------------------------------------------------------------------


def test_removals_are_the_structured_uuids_of_done_vgpu_removes_never_the_message() -> None:
    vf = "0000:08:00.5"
    lines = [
        record("vgpu-remove", Phase.DONE, "gone", {"vf": vf, "uuid": U1, "type": "NVIDIA A2-4Q"}),
        record("vgpu-remove", Phase.DONE, "", {"vf": vf, "uuid": U2}),
        # The message says so, but a record without the field is not a removal.
        record("vgpu-remove", Phase.DONE, f"removed NVIDIA A2-4Q {U5}"),
        record("vgpu-remove", Phase.INTENT, f"remove NVIDIA A2-4Q {U5}", {"vf": vf, "uuid": U5}),
        record("vgpu-remove", Phase.NOOP, f"already gone {U5}", {"vf": vf, "uuid": U5}),
        record("vgpu-remove", Phase.FAILED, f"vGPU {U5} on {vf} is in use", {"vf": vf, "uuid": U5}),
        record("vgpu-create", Phase.DONE, f"created NVIDIA A2-4Q {U7}", {"vf": vf, "uuid": U7}),
    ]
    records = [JournalRecord.from_json(json.loads(line)) for line in lines]

    assert removals(records) == [U1, U2]


# -- run_standalone -------------------------------------------------------------------------------


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(dir="/tmp", prefix="dp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def seed_host(tmp_path: Path) -> SimHost:
    spec = {
        "gpus": [
            {
                "model": "A2",
                "address": "0000:08:00.0",
                "vgpus": {1: "NVIDIA A2-4Q", 2: "NVIDIA A2-4A", 3: "NVIDIA A2-4Q"},
            }
        ]
    }
    return build_host(tmp_path / "host", spec)


def start(
    host: SimHost,
    plugin_dir: Path,
    state_dir: Path,
    known_types: Callable[[], TypeNames] | None = None,
) -> tuple[threading.Event, list[BaseException], threading.Thread]:
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            run_standalone(
                sysfs_root=host.sysfs_root,
                plugin_dir=plugin_dir,
                node=NODE,
                state_dir=state_dir,
                catalog=default_catalog(),
                hold_probe=host.hold_probe(),
                rescan_interval=0.05,
                stop_event=stop,
                backoff=Backoff(initial=0.05, cap=0.1),
                known_types=known_types,
            )
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return stop, errors, thread


def test_standalone_follows_the_host_and_the_journal(
    seed_host: SimHost, plugin_dir: Path, tmp_path: Path
) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    journal = Journal(state_dir, NODE)
    # Before the plugins start: concerns nothing they advertise, must not confuse them.
    journal.record(
        run="old",
        seq=1,
        kind="vgpu-remove",
        target="0000:08:01.1",
        phase=Phase.DONE,
        message=f"removed NVIDIA A2-4Q {U5}",
        removed=Removal(PciAddress.parse("0000:08:01.1"), U5, "NVIDIA A2-4Q"),
    )
    stop, errors, thread = start(seed_host, plugin_dir, state_dir)
    sock = plugin_dir / SOCKET_4Q
    try:
        # Dial once it serves: a channel that failed to connect waits a second before retrying.
        assert wait_until(sock.is_socket, timeout=2)
        with grpc.insecure_channel(f"unix://{sock}") as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            stream = stub.ListAndWatch(api_pb2.Empty(), timeout=5)
            lists = ([(d.ID, d.health) for d in m.devices] for m in stream)
            assert next(lists) == [(U5, "Healthy"), (U7, "Healthy")]
            assert (plugin_dir / SOCKET_4A).is_socket()

            # apply removes U7 on purpose: the vGPU goes, then the journal says so.
            seed_host.writer().write(f"bus/mdev/devices/{U7}/remove", "1")
            journal.record(
                run="r1",
                seq=1,
                kind="vgpu-remove",
                target="0000:08:00.7",
                phase=Phase.DONE,
                message=f"removed NVIDIA A2-4Q {U7}",
                removed=Removal(PciAddress.parse("0000:08:00.7"), U7, "NVIDIA A2-4Q"),
            )
            # A scan between the two may list U7 Unhealthy for a moment; then it is dropped.
            seen = next(lists)
            while seen != [(U5, "Healthy")]:
                assert seen == [(U5, "Healthy"), (U7, "Unhealthy")]
                seen = next(lists)

            # U5 vanishes out of band: listed Unhealthy, the profile stays.
            seed_host.writer().write(f"bus/mdev/devices/{U5}/remove", "1")
            assert next(lists) == [(U5, "Unhealthy")]
            stream.cancel()
    finally:
        stop.set()
        thread.join(timeout=2)
    assert not thread.is_alive()
    assert errors == []
    assert list(plugin_dir.glob("vgpuctl-*")) == []


def test_standalone_fails_clearly_when_the_first_scan_fails(
    plugin_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(ObserveError):
        run_standalone(
            sysfs_root=tmp_path / "no-sys",
            plugin_dir=plugin_dir,
            node=NODE,
            state_dir=tmp_path,
            catalog=default_catalog(),
            stop_event=threading.Event(),
        )
    assert list(plugin_dir.iterdir()) == []


def test_standalone_fails_clearly_without_a_plugin_dir(seed_host: SimHost, tmp_path: Path) -> None:
    with pytest.raises(PluginDirError, match="does not exist"):
        run_standalone(
            sysfs_root=seed_host.sysfs_root,
            plugin_dir=tmp_path / "no-plugins",
            node=NODE,
            state_dir=tmp_path,
            catalog=default_catalog(),
            stop_event=threading.Event(),
        )


def test_on_vfio_a_type_no_list_names_is_advertised_by_the_record(
    plugin_dir: Path, tmp_path: Path
) -> None:
    """An A2-16Q on a vfio A2: one per GPU, so every list is a header only. The plugins name it
    through the record of configured types (asked at every rescan), and advertise the VF."""
    spec = {
        "gpus": [{"model": "A2", "address": "0000:08:00.0", "vgpus": {0: "NVIDIA A2-16Q"}}],
        "interface": "vfio",
        "extraDevices": False,
    }
    host = build_host(tmp_path / "host", spec)
    vf = host.sysfs_root / "bus" / "pci" / "devices" / "0000:08:00.4" / "nvidia"
    type_id = (vf / "current_vgpu_type").read_text().strip()
    assert (vf / "creatable_vgpu_types").read_text().splitlines()[1:] == []
    record: dict[tuple[PciAddress, str], str] = {}
    stop, errors, thread = start(host, plugin_dir, tmp_path / "state", lambda: dict(record))
    sock = plugin_dir / "vgpuctl-nvidia.com_NVIDIA_A2-16Q.sock"
    try:
        time.sleep(0.3)  # several rescans: nothing nameable, so no plugin at all
        assert list(plugin_dir.glob("vgpuctl-*")) == []
        record[(PciAddress.parse("0000:08:00.0"), type_id)] = "NVIDIA A2-16Q"
        assert wait_until(sock.is_socket, timeout=2)
        with grpc.insecure_channel(f"unix://{sock}") as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            stream = stub.ListAndWatch(api_pb2.Empty(), timeout=5)
            first = next(iter(stream))
            assert [(d.ID, d.health) for d in first.devices] == [("0000:08:00.4", "Healthy")]
            stream.cancel()
    finally:
        stop.set()
        thread.join(timeout=2)
    assert errors == []
