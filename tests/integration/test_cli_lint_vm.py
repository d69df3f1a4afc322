"""``vgpuctl lint-vm`` (issue 15 item 3) on real-looking VM manifests with comments
(``tests/fixtures/vms/``), offline against the seed's desired state (it offers
NVIDIA_A2-4A and NVIDIA_A2-4Q) and against a cluster's nodes. Expected findings by hand from
the catalogue's facts (an A2 allows several vGPUs in one VM only for the Q series) and
KubeVirt's defaults (a vGPU's display and its ramFB are on unless set false)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import REPO, SEED, run_vgpuctl

VMS = REPO / "tests" / "fixtures" / "vms"
Q, A = "nvidia.com/NVIDIA_A2-4Q", "nvidia.com/NVIDIA_A2-4A"


def test_offline_findings_with_file_line_and_column(tmp_path: Path) -> None:
    vms = tmp_path / "two-gpus.yaml"
    shutil.copy(VMS / "two-gpus.yaml", vms)
    res = run_vgpuctl("lint-vm", vms, "--desired", SEED)
    assert res.returncode == 1
    assert res.stderr.splitlines() == [
        # win11: two A2-4Q (Q may be combined), both with a display and ramFB: the second errs.
        f"{vms}:16:15: error: GPU gpu2 has a display with ramFB, as an earlier GPU of this VM "
        "has: only one may (set virtualGPUOptions.display.ramFB.enabled: false, or run with "
        "--fix)",
        # render: L40S-8Q is not offered; b has the first ramFB (a's display is off), so c's
        # is a second; two A2-4A may not share a VM (series A); the L40S's rule is not in the
        # catalogue.
        f"{vms}:38:23: error: nvidia.com/NVIDIA_L40S-8Q is not on offer (offered: {A}, {Q})",
        f"{vms}:37:11: error: GPU c has a display with ramFB, as an earlier GPU of this VM "
        "has: only one may (set virtualGPUOptions.display.ramFB.enabled: false, or run with "
        "--fix)",
        f"{vms}:31:23: error: {A}: NVIDIA A2 allows several vGPUs in one VM only for series "
        "Q, not A",
        f"{vms}:36:23: error: {A}: NVIDIA A2 allows several vGPUs in one VM only for series "
        "Q, not A",
        f"{vms}:38:23: warning: nvidia.com/NVIDIA_L40S-8Q: whether NVIDIA L40S allows several "
        "vGPUs per VM is not known to the catalogue",
    ]


def test_fix_disables_the_second_ramfb_and_keeps_the_file_as_written(tmp_path: Path) -> None:
    vms = tmp_path / "two-gpus.yaml"
    shutil.copy(VMS / "two-gpus.yaml", vms)
    before = vms.read_text()
    res = run_vgpuctl("lint-vm", vms, "--desired", SEED, "--fix")
    assert res.returncode == 1  # the render VM's errors are not the fix's to make
    assert "ramFB" not in res.stderr
    after = vms.read_text()
    # Only gpu2 and c gained the lines; comments, order and quoting are as they were.
    expected = before.replace(
        "              deviceName: 'nvidia.com/NVIDIA_A2-4Q'\n",
        "              deviceName: 'nvidia.com/NVIDIA_A2-4Q'\n"
        "              virtualGPUOptions:\n"
        "                display:\n"
        "                  ramFB:\n"
        "                    enabled: false\n",
    ).replace(
        "          deviceName: nvidia.com/NVIDIA_L40S-8Q\n",
        "          deviceName: nvidia.com/NVIDIA_L40S-8Q\n"
        "          virtualGPUOptions:\n"
        "            display:\n"
        "              ramFB:\n"
        "                enabled: false\n",
    )
    assert after == expected
    again = run_vgpuctl("lint-vm", vms, "--desired", SEED)
    assert "ramFB" not in again.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["two-gpus.yaml"]  # no leftover


def test_what_the_cluster_offers(tmp_path: Path, emu: ApiServerEmulator) -> None:
    emu.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
              "status": {"allocatable": {Q: "2", "cpu": "8"}}})  # fmt: skip
    ok = tmp_path / "one.yaml"
    ok.write_text(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: x}\n"
        f"spec:\n  domain:\n    devices:\n      gpus:\n        - {{name: g, deviceName: {Q}}}\n"
    )
    kubeconfig = emu.kubeconfig(tmp_path / "kubeconfig")
    res = run_vgpuctl("lint-vm", ok, "--kubeconfig", kubeconfig)
    assert (res.returncode, res.stderr) == (0, "")
    res = run_vgpuctl("lint-vm", ok)
    assert res.returncode == 1
    assert "lint-vm needs what is on offer: --kubeconfig" in res.stderr


def test_a_document_that_is_no_vm_is_skipped_and_nonsense_is_no_traceback(tmp_path: Path) -> None:
    odd = tmp_path / "odd.yaml"
    odd.write_text("apiVersion: 7\nkind: VirtualMachine\n---\n- a list\n---\nkind: Pod\n")
    res = run_vgpuctl("lint-vm", odd, "--desired", SEED)
    assert (res.returncode, res.stderr) == (0, "")
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed\n")
    res = run_vgpuctl("lint-vm", broken, "--desired", SEED)
    assert res.returncode == 1
    assert res.stderr.startswith(f"{broken}:1:1: error: not YAML")
    assert "Traceback" not in res.stderr


def test_a_node_groups_profiles_are_on_offer(tmp_path: Path) -> None:
    """Offline, what the desired state's node groups give is on offer too: with L40S-8Q given
    by a group, only the ramFB and series findings remain."""
    vms = tmp_path / "two-gpus.yaml"
    shutil.copy(VMS / "two-gpus.yaml", vms)
    grouped = tmp_path / "grouped.yaml"
    grouped.write_text(
        SEED.read_text() + '  nodeGroups:\n    - name: l40s\n      selector: {names: ["gpu-*"]}\n'
        "      gpus: [{match: {model: L40S}, sriov: enabled, profiles: {L40S-8Q: 4}}]\n"
    )
    res = run_vgpuctl("lint-vm", vms, "--desired", grouped)
    assert res.returncode == 1
    assert not [line for line in res.stderr.splitlines() if "is not on offer" in line]
    assert len(res.stderr.splitlines()) == 5
