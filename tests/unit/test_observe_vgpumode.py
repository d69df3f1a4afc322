"""Reading a GPU's vGPU mode from ``nvidia-smi -q`` (``observe/vgpumode.py``), and what counts
where it cannot be read. The output below is laid out as real captures of ``nvidia-smi -q``
(R550 and later) are: the ``GPU Virtualization Mode`` block with ``vGPU Heterogeneous Mode``;
real hosts without vGPU print ``N/A`` there."""

from __future__ import annotations

from dataclasses import replace

from reconciler.model import Inventory, PciAddress, VgpuMode
from reconciler.observe.vgpumode import ModeReading, parse_vgpu_modes, with_vgpu_modes
from tests.gpus import A2, A2_B, A2_C, NODE, a2

#: A host with three GPUs, as nvidia-smi prints them: upper-case hex, a 32-bit domain.
OUTPUT = """
==============NVSMI LOG==============

Timestamp                                 : Wed Dec  2 12:26:04 2026
Driver Version                            : 550.127.06
CUDA Version                              : Not Found

Attached GPUs                             : 3
GPU 00000000:08:00.0
    Product Name                          : NVIDIA A2
    GPU Virtualization Mode
        Virtualization Mode               : Host VGPU
        Host VGPU Mode                    : SR-IOV
        vGPU Heterogeneous Mode           : Enabled
    GPU Reset Status
        Reset Required                    : No

GPU 00000000:09:00.0
    Product Name                          : NVIDIA A2
    GPU Virtualization Mode
        Virtualization Mode               : Host VGPU
        Host VGPU Mode                    : SR-IOV
        vGPU Heterogeneous Mode           : Disabled

GPU 00000000:AF:00.0
    Product Name                          : NVIDIA A2
    GPU Virtualization Mode
        Virtualization Mode               : Pass-Through
        Host VGPU Mode                    : N/A
        vGPU Heterogeneous Mode           : N/A
"""


def test_each_gpu_section_says_its_mode() -> None:
    assert parse_vgpu_modes(OUTPUT) == {
        PciAddress.parse("0000:08:00.0"): VgpuMode.MIXED_SIZE,
        PciAddress.parse("0000:09:00.0"): VgpuMode.EQUAL_SIZE,
        # N/A (what real non-vGPU hosts print) is no mode: not known.
    }


def test_only_the_two_words_are_modes() -> None:
    for word in ("N/A", "enabled", "On", "Enabled (pending)", ""):
        text = f"GPU 00000000:08:00.0\n    vGPU Heterogeneous Mode           : {word}\n"
        assert parse_vgpu_modes(text) == {}, word


def test_a_line_outside_a_gpu_section_or_a_bad_bus_id_counts_for_nothing() -> None:
    text = (
        "    vGPU Heterogeneous Mode           : Enabled\n"  # before any section
        "GPU 100000000:08:00.0\n"  # a domain beyond 16 bits
        "    vGPU Heterogeneous Mode           : Enabled\n"
        "GPU 00000000:08:00.9\n"  # function 9
        "    vGPU Heterogeneous Mode           : Enabled\n"
        "GPU 00000000:0a:00.0 trailing\n"
        "    vGPU Heterogeneous Mode           : Enabled\n"
    )
    assert parse_vgpu_modes(text) == {}


def test_the_output_read_is_bounded() -> None:
    padding = " " * (5 << 20) + "\n"  # more than is read, before the section
    text = padding + "GPU 00000000:08:00.0\n    vGPU Heterogeneous Mode : Enabled\n"
    assert parse_vgpu_modes(text) == {}


def _inventory() -> Inventory:
    return Inventory(
        NODE,
        (
            a2(A2),  # SR-IOV on, no vGPU
            a2(A2_B, {0: "A2-4Q"}),  # SR-IOV on, one vGPU
            a2(A2_C, enabled=False),
        ),
    )


def _modes(inventory: Inventory) -> dict[str, VgpuMode]:
    return {str(g.address): g.vgpu_mode for g in inventory.gpus}


def test_a_reading_sets_the_modes_it_names() -> None:
    reading = ModeReading({A2: VgpuMode.MIXED_SIZE, A2_B: VgpuMode.MIXED_SIZE})
    got = with_vgpu_modes(_inventory(), [A2, A2_B], reading)
    assert _modes(got) == {
        "0000:08:00.0": VgpuMode.MIXED_SIZE,
        "0000:09:00.0": VgpuMode.MIXED_SIZE,
        "0000:0a:00.0": VgpuMode.EQUAL_SIZE,
    }
    assert got.notes == ()


def test_without_a_reading_the_drivers_default_decides_or_the_mode_is_unknown() -> None:
    got = with_vgpu_modes(_inventory(), [A2, A2_B, A2_C], ModeReading(problem="not found"))
    # No vGPU (or SR-IOV off): equal-size, as sriov-manage leaves it. Hosting vGPUs: unknown.
    assert _modes(got) == {
        "0000:08:00.0": VgpuMode.EQUAL_SIZE,
        "0000:09:00.0": VgpuMode.UNKNOWN,
        "0000:0a:00.0": VgpuMode.EQUAL_SIZE,
    }
    assert got.notes == (
        "vGPU mode of GPU 0000:09:00.0 not known: nvidia-smi -q: not found; a GPU that hosts "
        "vGPUs is not switched on a guess",
    )


def test_a_gpu_with_sriov_off_is_equal_size_whatever_a_reading_says() -> None:
    # sriov-manage -d clears the mode: a stale or wrong reading does not outlive it.
    got = with_vgpu_modes(_inventory(), [A2_C], ModeReading({A2_C: VgpuMode.MIXED_SIZE}))
    assert _modes(got)["0000:0a:00.0"] is VgpuMode.EQUAL_SIZE


def test_gpus_not_asked_about_keep_what_was_observed() -> None:
    inventory = _inventory()
    marked = replace(inventory, gpus=(replace(inventory.gpus[0], vgpu_mode=VgpuMode.MIXED_SIZE),))
    got = with_vgpu_modes(marked, [], ModeReading({A2: VgpuMode.EQUAL_SIZE}))
    assert got.gpus == marked.gpus
