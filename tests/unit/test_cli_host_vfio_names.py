"""The Host names vfio type ids nothing else names by asking the driver (``cli/host.py``):
once per GPU and process, only for such ids, never across a driver change, and a command that
cannot run is not run again for the next GPU of the same scan.

On the simulator, whose ``DIR/bin/nvidia-smi`` answers ``vgpu -s -v -i`` and counts the calls
(``nvidiaSmiTypeQueries``); ids and names come from the host's own files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reconciler.apply import sriov
from reconciler.apply.errors import CommandTimeoutError
from reconciler.apply.ports import CommandResult
from reconciler.apply.sriov import read_supported_types
from reconciler.cli.host import Host
from reconciler.cli.options import GlobalOptions
from reconciler.model import PciAddress
from reconciler.model.record import replace
from reconciler.observe.vgputypes import SupportedTypes
from reconciler.sim import SimHost, build_host
from reconciler.sim.state import load_state

GPU, OTHER = "0000:08:00.0", "0000:41:00.0"


def full_l40s(tmp_path: Path, *gpus: str) -> SimHost:
    """vfio GPUs, each with two L40-24Q the simulator made: no list names the type."""
    spec: dict[str, Any] = {
        "interface": "vfio",
        "extraDevices": False,
        "gpus": [
            {"model": "L40", "address": g, "vgpus": {0: "NVIDIA L40-24Q", 1: "NVIDIA L40-24Q"}}
            for g in gpus
        ],
    }
    return build_host(tmp_path / "host", spec)


def host(sim: SimHost, nvidia_smi: str | None = None) -> Host:
    return Host(
        GlobalOptions(
            sysfs_root=sim.sysfs_root,
            sriov_manage=None,
            node="n1",
            state_dir=None,
            no_color=True,
            nvidia_smi=nvidia_smi,
        )
    )


def queries(sim: SimHost) -> int:
    return load_state(sim.sysfs_root).counters.get("nvidiaSmiTypeQueries", 0)


def hosted(h: Host) -> list[str]:
    return [vf.vgpu.type_name for g in h.observe().gpus for vf in g.vfs if vf.vgpu is not None]


def test_the_driver_is_asked_once_per_gpu_for_the_life_of_the_process(tmp_path: Path) -> None:
    sim = full_l40s(tmp_path, GPU, OTHER)
    h = host(sim)
    assert hosted(h) == ["NVIDIA L40-24Q"] * 4
    assert queries(sim) == 2  # one per GPU
    assert hosted(h) == ["NVIDIA L40-24Q"] * 4
    assert queries(sim) == 2  # a rescan (watch) asks nothing more


def test_what_another_driver_named_names_nothing(tmp_path: Path) -> None:
    sim = full_l40s(tmp_path, GPU)
    h = host(sim)
    assert hosted(h) == ["NVIDIA L40-24Q"] * 2
    (sim.sysfs_root / "module/nvidia/version").write_text("570.0.1\n")
    # The new driver's nvidia-smi cannot say: nothing from the old one is reused.
    h.options = replace(h.options, nvidia_smi="/bin/false")
    names = hosted(h)
    assert all(n.startswith("type ") for n in names), names


def test_a_command_that_cannot_run_is_not_run_again_in_the_same_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each call is bounded (60 s); one that timed out (or is not there) is not tried again
    for the next GPU: a scan of eight GPUs never waits eight minutes."""
    sim = full_l40s(tmp_path, GPU, OTHER)
    calls: list[PciAddress] = []

    def timing_out(runner: Any, argv: Any, gpu: PciAddress, **kw: Any) -> SupportedTypes:
        calls.append(gpu)
        return SupportedTypes(problem="nvidia-smi did not finish within 60 s", ran=False)

    monkeypatch.setattr(sriov, "read_supported_types", timing_out)
    inventory = host(sim).observe()
    assert calls == [PciAddress.parse(GPU)]
    notes = [n for n in inventory.notes if "could not be named" in n]
    assert len(notes) == 2  # each GPU says why, from the one attempt
    assert all("did not finish within 60 s" in n for n in notes)


class TimingOut:
    def run(self, argv: Any, *, timeout: float) -> CommandResult:
        raise CommandTimeoutError(f"nvidia-smi did not finish within {timeout:g} s")


class Failing:
    def run(self, argv: Any, *, timeout: float) -> CommandResult:
        return CommandResult(6, "", "No devices were found")


def test_a_read_that_cannot_run_says_so_and_a_failed_one_says_why() -> None:
    gpu = PciAddress.parse(GPU)
    timed_out = read_supported_types(TimingOut(), ["nvidia-smi"], gpu, timeout=1)
    assert not timed_out.ran and timed_out.names == {}
    assert timed_out.problem is not None and "did not finish within 1 s" in timed_out.problem
    failed = read_supported_types(Failing(), ["nvidia-smi"], gpu, timeout=1)
    assert failed.ran and failed.names == {}
    assert failed.problem == (
        "nvidia-smi vgpu -s -v -i 00000000:08:00.0: exit 6: No devices were found"
    )
