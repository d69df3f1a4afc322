"""The picture of a GPU ``vgpuctl status`` opens with (issue 15 item 5), on GPUs built by hand
from the catalogue's facts: an A2 has 16 GB and, in equal-size mode, at most 16/8/4/2/1 vGPUs
of 1/2/4/8/16 GB; an L40S has 48 GB. Expected lines written by hand: the bar's cells are the
framebuffer's share (a 4 GB vGPU is a quarter of an A2), labelled with the profile's part
after the model (``4Q``), ``*`` when a VM holds it, ``.`` where nothing is."""

from __future__ import annotations

import re

from reconciler.catalog import default_catalog
from reconciler.cli.render import Style, gpu_picture, size_counts
from reconciler.model import VGPU, Gpu, PciAddress, Vf, VgpuMode

CATALOG = default_catalog()


def gpu(model: str, vgpus: dict[int, str], *, held: int | None = None, mode: str = "") -> Gpu:
    m = CATALOG.model(model)
    assert m is not None
    address = PciAddress.parse("0000:08:00.0")
    vfs = tuple(
        Vf(
            PciAddress.parse(f"0000:08:{(4 + i) // 8:02x}.{(4 + i) % 8}"),
            i,
            VGPU(uuid=f"u{i}", type_name=vgpus[i], in_use=i == held) if i in vgpus else None,
        )
        for i in range(m.vfs)
    )
    return Gpu(
        address=address, vendor_id="10de", device_id="25b6", model=m.name, total_vfs=m.vfs,
        num_vfs=m.vfs, vfs=vfs, types=tuple(p.vgpu_type() for p in m.time_sliced_profiles),
        vgpu_mode=VgpuMode(mode) if mode else VgpuMode.EQUAL_SIZE,
    )  # fmt: skip


def picture(g: Gpu, columns: int) -> str:
    m = CATALOG.model(g.model or "")
    assert m is not None
    return gpu_picture(g, total_mib=m.framebuffer_mib, model_short=m.short, columns=columns)


SEED = {0: "NVIDIA A2-4A", 1: "NVIDIA A2-4Q", 2: "NVIDIA A2-4A", 3: "NVIDIA A2-4Q"}
HEAD = "GPU 0000:08:00.0  NVIDIA A2"


def test_the_seeds_a2_four_quarters() -> None:
    # 93 columns leave a bar of 40 cells (93 - 27 for the GPU - 20 for the counts - 6): 10 each.
    assert picture(gpu("A2", SEED), 93) == (
        f"{HEAD}  [4A=======|4Q=======|4A=======|4Q=======|]  4 GB: 4 used, 0 free"
    )


def test_a_held_vgpu_is_marked_and_free_space_is_dotted() -> None:
    two = {0: "NVIDIA A2-4Q", 1: "NVIDIA A2-4Q"}
    # 40 cells again (the counts are as long): the two vGPUs take half, the rest is free.
    assert picture(gpu("A2", two, held=1), 93) == (
        f"{HEAD}  [4Q=======|4Q*======|....................]  4 GB: 2 used, 2 free"
    )


def test_equal_size_mode_offers_only_the_size_in_use_and_mixed_size_what_fits() -> None:
    one = {0: "NVIDIA L40S-16Q"}
    equal = size_counts(gpu("L40S", one), 48 * 1024)
    assert [(s // 1024, n, f) for s, n, f in equal if n or f] == [(16, 1, 2)]
    mixed = size_counts(gpu("L40S", one, mode="mixed-size"), 48 * 1024)
    # 32 GB left: 1 GB vGPUs up to the per-size maximum (32) and the 31 free VFs; 2 GB: 16;
    # 3 GB: 10; 4 GB: 8; 6 GB: 5; 8 GB: 4; 12 GB: 2; 16 GB: 2 more; 24 GB: 1; 48 GB: none.
    assert [(s // 1024, n, f) for s, n, f in mixed] == [
        (1, 0, 31), (2, 0, 16), (3, 0, 10), (4, 0, 8), (6, 0, 5), (8, 0, 4), (12, 0, 2),
        (16, 1, 2), (24, 0, 1), (48, 0, 0),
    ]  # fmt: skip


def test_an_empty_gpu_lists_every_size_and_a_narrow_terminal_drops_the_bar() -> None:
    empty = gpu("A2", {})
    counts = (
        "1 GB: 0 used, 16 free  2 GB: 0 used, 8 free  4 GB: 0 used, 4 free  "
        "8 GB: 0 used, 2 free  16 GB: 0 used, 1 free"
    )
    assert picture(empty, 100) == f"{HEAD}  {counts}"  # no room for a bar of 16
    # 210 columns: 210 - 27 - 110 - 6 = 67 cells, but never wider than 60.
    assert picture(empty, 210) == f"{HEAD}  [{'.' * 60}]  {counts}"
    assert picture(empty, 159) == f"{HEAD}  [{'.' * 16}]  {counts}"  # the narrowest bar
    assert picture(empty, 158) == f"{HEAD}  {counts}"
    # The seed's A2 in 60 columns: 6 cells left for the bar, fewer than 16: counts only.
    assert picture(gpu("A2", SEED), 60) == f"{HEAD}  4 GB: 4 used, 0 free"


def test_sriov_off_says_so() -> None:
    g = gpu("A2", {})
    off = Gpu(address=g.address, vendor_id="10de", device_id="25b6", model="NVIDIA A2",
              total_vfs=16, types=g.types)  # fmt: skip
    assert picture(off, 100) == f"{HEAD}  SR-IOV off"


def test_colour_only_wraps_the_same_cells() -> None:
    # In a terminal the vGPUs are green (held ones yellow) and free space dim; without colour
    # (--no-color, NO_COLOR, not a terminal) the same characters, nothing else.
    g = gpu("A2", {0: "NVIDIA A2-4Q", 1: "NVIDIA A2-4Q"}, held=1)
    m = CATALOG.model("A2")
    assert m is not None
    coloured = gpu_picture(g, total_mib=m.framebuffer_mib, model_short=m.short, columns=93,
                           style=Style(True))  # fmt: skip
    assert "\033[33m4Q*======|\033[0m" in coloured
    assert re.sub(r"\033\[[0-9;]*m", "", coloured) == picture(g, 93)
