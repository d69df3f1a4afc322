"""Delegate mode on a MIG-capable GPU (issue 30: MIG), end to end against the API-server
emulator and the pcidevices-controller double (``tests/doubles/pcidevices.py``) on a simulated
A100 40GB (vendor-specific VFIO interface, SR-IOV off).

The facts (harvester/pcidevices bdd8025, docs/domain.md §10): enabling a MIG-capable GPU's
SRIOVGPUDevice makes ``reconcileMIGConfiguration`` turn MIG mode on and create a MigConfiguration
named as the GPU; from then on its VFs offer no time-sliced type, and MIG-backed ones only for
GPU instances (none exist). So vgpuctl refuses, before writing anything, a time-sliced profile on
it and any MIG-backed profile. Positions in the file are counted by hand: the VF key on line 11,
column 13.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from tests.doubles.emulator import ApiServerEmulator
from tests.doubles.pcidevices import MIGCONFIGURATIONS, SRIOVGPUS, VGPUS
from tests.harvester_node import NODE, Cluster, harvester_node
from tests.simnode import run_vgpuctl
from tests.watch_agent import wait_for

# The client is only partly typed: its entry points are used as Any.
new_client_from_config: Any = config.new_client_from_config
CRD_SETS = ("harvester",)
GPU = f"{NODE}-000008000"
DESIRED = """\
apiVersion: vgpu.reconciler.dev/v1alpha1
kind: VGPUDesiredState
metadata: {{name: lab}}
spec:
  nodes:
    harvester-kgd9c:
      gpus:
        - address: "0000:08:00.0"
          sriov: enabled
          vgpus:
            "0000:08:00.4": {profile}
"""
TIME_SLICED_REASON = (
    "pcidevices-controller turns MIG mode on when it enables SR-IOV on a MIG-capable GPU "
    "(gpu_controller.go reconcileMIGConfiguration), after which the driver offers only "
    "MIG-backed vGPU types; time-sliced vGPUs on this GPU are made only in node-local mode, "
    "on a node where pcidevices-controller does not run (vgpuctl never acts on a host beside it)"
)
A100_IS = "it is an NVIDIA A100 40GB, a MIG-capable GPU (the catalogue lists MIG-backed profiles)"
MIG_BACKED_REASON = (
    "delegate mode does not make MIG-backed vGPUs: their GPU instances are set up through "
    "Harvester's MigConfiguration, which vgpuctl does not write, and which VF the driver then "
    "offers them on is not modelled here; configure MIG in Harvester's UI, or use node-local mode "
    "on a node where pcidevices-controller does not run"
)


@pytest.fixture
def a100(emu: ApiServerEmulator, tmp_path: Path) -> Iterator[Cluster]:
    with harvester_node(emu, tmp_path, model="A100") as cluster:
        yield cluster


def desired(tmp_path: Path, profile: str) -> Path:
    path = tmp_path / "a100.yaml"
    path.write_text(DESIRED.format(profile=profile))
    return path


def assert_nothing_written(c: Cluster) -> None:
    """The SRIOVGPUDevice still disabled, no MigConfiguration, the host's SR-IOV still off, and
    no spec written by vgpuctl (its writes are patches)."""
    gpu = c.emu.get_object(*SRIOVGPUS, GPU)
    assert gpu is not None and gpu["spec"]["enabled"] is False
    assert c.emu.objects(*MIGCONFIGURATIONS) == []
    pf = c.host.sysfs_root / "bus/pci/devices/0000:08:00.0"
    assert (pf / "sriov_numvfs").read_text().strip() == "0"
    assert c.ctl.sriov_manage_calls == []
    assert [r for r in c.emu.requests if r.verb == "patch"] == []


def test_a_time_sliced_profile_on_an_a100_is_refused_at_plan_and_apply(
    a100: Cluster, tmp_path: Path
) -> None:
    path = desired(tmp_path, "GRID A100-10C")
    expected = (
        f"{path}:11:13: GPU 0000:08:00.0 on node {NODE}: GRID A100-10C is a time-sliced "
        f"profile, and {A100_IS}: {TIME_SLICED_REASON}"
    )
    for command in ("plan", "apply"):
        extra = ("--yes",) if command == "apply" else ()
        res = a100.run(command, path, "--delegate", "harvester", *extra)
        assert res.returncode == 1, res.stdout + res.stderr
        # Delegate mode shows each node's failure as error lines (cli/delegate.py).
        assert f"error: {expected}" in res.stderr.splitlines(), res.stderr
    assert_nothing_written(a100)


def test_validate_delegate_harvester_refuses_it_offline(tmp_path: Path) -> None:
    path = desired(tmp_path, "GRID A100-10C")
    res = run_vgpuctl("validate", path, "--delegate", "harvester")  # no cluster
    assert res.returncode == 1
    assert res.stderr.splitlines() == [
        f"{path}:11:13: GPU 0000:08:00.0 of node {NODE}: GRID A100-10C is a time-sliced "
        f"profile, and {A100_IS}: {TIME_SLICED_REASON}"
    ]
    # Without --delegate (node-local mode's rules) it is valid, as before.
    plain = run_vgpuctl("validate", path)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout == f"{path}: valid (1 node, 1 GPU, 1 vGPU)\n"
    assert run_vgpuctl("validate", path, "--delegate", "none").returncode == 0


def test_a_mig_backed_profile_is_refused_clearly(a100: Cluster, tmp_path: Path) -> None:
    path = desired(tmp_path, "GRID A100-1-5C")
    res = a100.run("plan", path, "--delegate", "harvester")
    assert res.returncode == 1, res.stdout + res.stderr
    expected = (
        f"{path}:11:13: GPU 0000:08:00.0 on node {NODE}: GRID A100-1-5C is MIG-backed: "
        f"{MIG_BACKED_REASON}"
    )
    assert f"error: {expected}" in res.stderr.splitlines(), res.stderr
    offline = run_vgpuctl("validate", path, "--delegate", "harvester")
    assert offline.returncode == 1
    assert "GRID A100-1-5C is MIG-backed" in offline.stderr
    assert_nothing_written(a100)


def test_after_harvesters_ui_enabled_it_the_mig_configuration_is_the_reason(
    a100: Cluster, tmp_path: Path
) -> None:
    """Enabled as Harvester's UI enables it: the double turns MIG mode on and makes the
    MigConfiguration; its VGPUDevices offer nothing. vgpuctl reads the MigConfiguration (the
    role's list) and names it."""
    api = new_client_from_config(config_file=str(a100.kubeconfig))
    try:
        client.CustomObjectsApi(api).patch_cluster_custom_object(
            *SRIOVGPUS, GPU, {"spec": {"enabled": True}}
        )
    finally:
        api.close()
    wait_for(
        lambda: (
            a100.emu.get_object(*MIGCONFIGURATIONS, GPU) is not None
            and len(a100.emu.objects(*VGPUS)) == 16
        ),
        "the MigConfiguration and the VGPUDevices",
        30,
    )
    path = desired(tmp_path, "GRID A100-10C")
    res = a100.run("plan", path, "--delegate", "harvester")
    assert res.returncode == 1, res.stdout + res.stderr
    assert (
        f"GRID A100-10C is a time-sliced profile, and Harvester has a MigConfiguration {GPU} "
        "for it (pcidevices-controller found it MIG-capable)"
    ) in res.stderr
