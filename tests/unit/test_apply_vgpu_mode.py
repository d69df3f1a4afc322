"""A GPU's vGPU mode on the host (docs/domain.md §4): ``nvidia-smi vgpu -i <GPU> -shm 0|1`` run
by the drivers, read back through ``nvidia-smi -q``, and the executor's vgpu-mode step, which
never runs the switch under a vGPU. Run against the simulator's ``nvidia-smi`` as a real
subprocess; expected modes come from the simulator's state, not from the driver's reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reconciler.apply import (
    CommandFailedError,
    CommandNotFoundError,
    ConfinedSysfsWriter,
    MdevDriver,
    PerVfDriver,
    SubprocessRunner,
    VfioDriver,
)
from reconciler.apply.executor import OutcomeStatus, execute
from reconciler.apply.journal import Journal
from reconciler.apply.sysfs import SysfsReader
from reconciler.model import Observation, PciAddress, Plan, VgpuMode, VgpuModeSet
from reconciler.sim import SimHost, build_host
from reconciler.sim.state import load_state

GPU = PciAddress.parse("0000:08:00.0")
VF0 = PciAddress.parse("0000:08:00.4")


def a2(tmp_path: Path, interface: str, vgpus: dict[int, str] | None = None) -> SimHost:
    gpu: dict[str, object] = {"model": "A2", "address": str(GPU), "sriov": "enabled"}
    if vgpus:
        gpu["vgpus"] = vgpus
    return build_host(tmp_path / interface, {"gpus": [gpu], "interface": interface})


def driver(sim: SimHost, nvidia_smi: str | None = None) -> PerVfDriver:
    writer = ConfinedSysfsWriter(sim.sysfs_root, kernel=sim.writer())
    bin_dir = sim.sysfs_root.parent / "bin"
    common = {
        "sysfs_root": sim.sysfs_root,
        "writer": writer,
        "runner": SubprocessRunner(),
        "sriov_manage": [str(bin_dir / "sriov-manage")],
        "nvidia_smi": [nvidia_smi or str(bin_dir / "nvidia-smi")],
    }
    return PerVfDriver(
        mdev=MdevDriver(**common),  # type: ignore[arg-type]
        vfio=VfioDriver(**common),  # type: ignore[arg-type]
        reader=SysfsReader(sim.sysfs_root),
    )


def sim_mode(sim: SimHost) -> str:
    """The simulated driver's own record of the GPU's mode."""
    state = load_state(sim.sysfs_root)
    gpu = state.gpu(str(GPU))
    assert gpu is not None
    return str(gpu.vgpu_mode)


@pytest.mark.parametrize("interface", ["mdev", "vfio"])
def test_the_switch_runs_nvidia_smi_and_the_query_reads_it_back(
    tmp_path: Path, interface: str
) -> None:
    sim = a2(tmp_path, interface)
    host = driver(sim)
    assert host.vgpu_modes().modes == {GPU: VgpuMode.EQUAL_SIZE}
    host.set_vgpu_mode(GPU, VgpuMode.MIXED_SIZE)
    assert sim_mode(sim) == "mixed-size"
    assert host.vgpu_modes().modes == {GPU: VgpuMode.MIXED_SIZE}
    host.set_vgpu_mode(GPU, VgpuMode.EQUAL_SIZE)
    assert sim_mode(sim) == "equal-size"


def test_a_refused_switch_names_the_command_and_what_the_driver_said(tmp_path: Path) -> None:
    sim = a2(tmp_path, "vfio", vgpus={0: "A2-4Q"})
    with pytest.raises(CommandFailedError) as caught:
        driver(sim).set_vgpu_mode(GPU, VgpuMode.MIXED_SIZE)
    assert caught.value.message.startswith(f"nvidia-smi vgpu -i {GPU} -shm 1 failed (exit 3): ")
    assert sim_mode(sim) == "equal-size"


def test_no_nvidia_smi_is_a_clear_error_and_a_reading_that_tells_nothing(
    tmp_path: Path,
) -> None:
    sim = a2(tmp_path, "vfio")
    missing = str(tmp_path / "no-such" / "nvidia-smi")
    host = driver(sim, nvidia_smi=missing)
    with pytest.raises(CommandNotFoundError, match="set --nvidia-smi"):
        host.set_vgpu_mode(GPU, VgpuMode.MIXED_SIZE)
    reading = host.vgpu_modes()
    assert reading.modes == {}
    assert reading.problem is not None and "nvidia-smi not found" in reading.problem


def test_a_failing_query_says_why(tmp_path: Path) -> None:
    sim = a2(tmp_path, "vfio")
    script = tmp_path / "broken-smi"
    script.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    os.chmod(script, 0o700)
    reading = driver(sim, nvidia_smi=str(script)).vgpu_modes()
    assert reading.modes == {}
    assert reading.problem == "exit 9: NVIDIA-SMI has failed"


def _run(sim: SimHost, tmp_path: Path, mode: VgpuMode = VgpuMode.MIXED_SIZE) -> OutcomeStatus:
    action = VgpuModeSet(seq=1, target=str(GPU), reason="r", gpu=GPU, mode=mode)
    plan = Plan(node="n", interface="vfio", observed=Observation("sha256:x"), actions=(action,))
    result = execute(
        plan,
        driver=driver(sim),
        journal=Journal(tmp_path / "state", "n"),
        verify_timeout=5,
    )
    (outcome,) = result.outcomes
    return outcome.status


def test_the_step_sets_the_mode_once(tmp_path: Path) -> None:
    sim = a2(tmp_path, "vfio")
    assert _run(sim, tmp_path) is OutcomeStatus.DONE
    assert sim_mode(sim) == "mixed-size"
    calls = sim.stats()["nvidiaSmiCalls"]
    # Run again: the precheck reads the mode and the step is a no-op, no switch run.
    assert _run(sim, tmp_path) is OutcomeStatus.NOOP
    assert sim.stats()["nvidiaSmiCalls"] == calls


def test_the_step_never_runs_under_a_vgpu(tmp_path: Path) -> None:
    # The plan was made from a host without vGPUs; one appeared since: the switch is not run
    # (the driver would refuse it anyway), and the run says to plan again.
    sim = a2(tmp_path, "vfio", vgpus={0: "A2-4Q"})
    assert _run(sim, tmp_path) is OutcomeStatus.FAILED
    assert sim.stats()["nvidiaSmiCalls"] == 0
    assert sim_mode(sim) == "equal-size"
