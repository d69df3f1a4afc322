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
    # Sorted by file and position (issue 34, item 6); two findings at one place in the order
    # they are found.
    assert res.stderr.splitlines() == [
        # win11: two A2-4Q (Q may be combined), both with a display and ramFB: the second errs.
        f"{vms}:16:15: error: GPU gpu2 has a display with ramFB, as an earlier GPU of this VM "
        "has: only one may (set virtualGPUOptions.display.ramFB.enabled: false, or run with "
        "--fix)",
        # render: two A2-4A may not share a VM (series A); b has the first ramFB (a's display
        # is off), so c's is a second; L40S-8Q is not offered, and the L40S's rule is not in
        # the catalogue.
        f"{vms}:31:23: error: {A}: NVIDIA A2 allows several vGPUs in one VM only for series "
        "Q, not A",
        f"{vms}:36:23: error: {A}: NVIDIA A2 allows several vGPUs in one VM only for series "
        "Q, not A",
        f"{vms}:37:11: error: GPU c has a display with ramFB, as an earlier GPU of this VM "
        "has: only one may (set virtualGPUOptions.display.ramFB.enabled: false, or run with "
        "--fix)",
        f"{vms}:38:23: error: nvidia.com/NVIDIA_L40S-8Q is not on offer (offered: {A}, {Q})",
        f"{vms}:38:23: warning: nvidia.com/NVIDIA_L40S-8Q: whether NVIDIA L40S allows several "
        "vGPUs per VM is not known to the catalogue",
    ]


def test_findings_of_several_files_are_sorted_by_file(tmp_path: Path) -> None:
    """Files given out of order: b.yaml's finding comes after a.yaml's."""
    vm = (
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: x}\n"
        "spec:\n  domain:\n    devices:\n      gpus:\n"
        "        - {name: g, deviceName: nvidia.com/NVIDIA_L4-3Q}\n"
    )
    (tmp_path / "a.yaml").write_text(vm)
    (tmp_path / "b.yaml").write_text(vm)
    res = run_vgpuctl("lint-vm", tmp_path / "b.yaml", tmp_path / "a.yaml", "--desired", SEED)
    assert res.returncode == 1
    missing = f"nvidia.com/NVIDIA_L4-3Q is not on offer (offered: {A}, {Q})"
    assert res.stderr.splitlines() == [
        f"{tmp_path / 'a.yaml'}:8:33: error: {missing}",
        f"{tmp_path / 'b.yaml'}:8:33: error: {missing}",
    ]


FIXED_GPU2 = (
    "16:15: fixed: GPU gpu2: set virtualGPUOptions.display.ramFB.enabled: false (an earlier GPU "
    "of this VM has a display with ramFB)"
)
FIXED_C = (
    "37:11: fixed: GPU c: set virtualGPUOptions.display.ramFB.enabled: false (an earlier GPU "
    "of this VM has a display with ramFB)"
)


def _fixed(before: str) -> str:
    """two-gpus.yaml as --fix writes it: only gpu2 and c gain the lines; comments, order and
    quoting are as they were."""
    return before.replace(
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


def test_fix_disables_the_second_ramfb_and_keeps_the_file_as_written(tmp_path: Path) -> None:
    vms = tmp_path / "two-gpus.yaml"
    shutil.copy(VMS / "two-gpus.yaml", vms)
    before = vms.read_text()
    res = run_vgpuctl("lint-vm", vms, "--desired", SEED, "--fix")
    assert res.returncode == 1  # the render VM's errors are not the fix's to make
    # Each change is said where it was made (the positions of the file as it was read), in
    # order with the findings left.
    lines = res.stderr.splitlines()
    assert lines[0] == f"{vms}:{FIXED_GPU2}"
    assert lines[3] == f"{vms}:{FIXED_C}"
    assert len(lines) == 6
    assert "error: GPU" not in res.stderr  # no ramFB error is left
    assert vms.read_text() == _fixed(before)
    again = run_vgpuctl("lint-vm", vms, "--desired", SEED)
    assert "ramFB" not in again.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["two-gpus.yaml"]  # no leftover


def test_diff_shows_the_fix_and_writes_nothing(tmp_path: Path) -> None:
    vms = tmp_path / "two-gpus.yaml"
    shutil.copy(VMS / "two-gpus.yaml", vms)
    before = vms.read_text()
    res = run_vgpuctl("lint-vm", vms, "--desired", SEED, "--diff")
    assert res.returncode == 1
    assert vms.read_text() == before
    assert res.stdout == (
        f"--- {vms}\n"
        f"+++ {vms}\n"
        "@@ -15,6 +15,10 @@\n"
        "               deviceName: nvidia.com/NVIDIA_A2-4Q  # the first: its display is the "
        "VM's\n"
        '             - name: "gpu2"\n'
        "               deviceName: 'nvidia.com/NVIDIA_A2-4Q'\n"
        "+              virtualGPUOptions:\n"
        "+                display:\n"
        "+                  ramFB:\n"
        "+                    enabled: false\n"
        "         resources:\n"
        "           requests:\n"
        "             memory: 8Gi\n"
        "@@ -36,3 +40,7 @@\n"
        "           deviceName: nvidia.com/NVIDIA_A2-4A\n"
        "         - name: c\n"
        "           deviceName: nvidia.com/NVIDIA_L40S-8Q\n"
        "+          virtualGPUOptions:\n"
        "+            display:\n"
        "+              ramFB:\n"
        "+                enabled: false\n"
    )
    # Nothing written: the ramFB errors stand, as without --diff.
    assert res.stderr == run_vgpuctl("lint-vm", vms, "--desired", SEED).stderr
    assert "GPU gpu2 has a display with ramFB" in res.stderr
    both = run_vgpuctl("lint-vm", vms, "--desired", SEED, "--diff", "--fix")
    assert both.returncode == 1
    assert "argument --fix: not allowed with argument --diff" in both.stderr
    assert vms.read_text() == before


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


def _one_gpu_vm(path: Path) -> Path:
    path.write_text(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: x}\n"
        f"spec:\n  domain:\n    devices:\n      gpus:\n        - {{name: g, deviceName: {Q}}}\n"
    )
    return path


def test_offered_nothing_says_why_the_cluster_has_none(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """Nothing on offer is explained (issue 34, item 6): a cluster without nodes, then nodes
    whose allocatable and capacity have no nvidia.com/ resource (no device plugin registered
    one)."""
    vm = _one_gpu_vm(tmp_path / "one.yaml")
    kubeconfig = emu.kubeconfig(tmp_path / "kubeconfig")
    res = run_vgpuctl("lint-vm", vm, "--kubeconfig", kubeconfig)
    assert res.returncode == 1
    assert res.stderr.splitlines() == [
        f"{vm}:8:33: error: {Q} is not on offer (offered: nothing: the cluster has no node)"
    ]
    for name in ("n1", "n2"):
        emu.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                  "status": {"allocatable": {"cpu": "8"}, "capacity": {"cpu": "8"}}})  # fmt: skip
    res = run_vgpuctl("lint-vm", vm, "--kubeconfig", kubeconfig)
    assert res.returncode == 1
    assert res.stderr.splitlines() == [
        f"{vm}:8:33: error: {Q} is not on offer (offered: nothing: no node of the cluster's 2 "
        "has an nvidia.com/ resource in its allocatable or capacity (no device plugin "
        "registered one: is vgpuctl watch running there, with vGPUs made?))"
    ]


def test_offered_nothing_says_why_the_desired_state_has_none(tmp_path: Path) -> None:
    vm = _one_gpu_vm(tmp_path / "one.yaml")
    off = tmp_path / "off.yaml"
    off.write_text(
        "apiVersion: vgpu.reconciler.dev/v1alpha1\nkind: VGPUDesiredState\n"
        "metadata: {name: off}\nspec:\n  nodes:\n    n1:\n      gpus:\n"
        '        - {address: "0000:08:00.0", sriov: disabled}\n'
    )
    res = run_vgpuctl("lint-vm", vm, "--desired", off)
    assert res.returncode == 1
    assert res.stderr.splitlines() == [
        f"{vm}:8:33: error: {Q} is not on offer (offered: nothing: {off} names no vGPU "
        "profile on any node or node group)"
    ]


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
