"""The simulated driver's pure rules: VF placement, creatable types, GPU placement."""

from __future__ import annotations

import pytest

from reconciler.catalog import default_catalog
from reconciler.model import PciAddress
from reconciler.model.mode import VgpuMode
from reconciler.sim.rules import (
    GpuRequest,
    SimModel,
    creatable,
    create_refusal,
    model_vf_addresses,
    place_gpus,
    vf_addresses,
)


def model(name: str) -> SimModel:
    m = default_catalog().model(name)
    assert m is not None
    return SimModel.from_catalog(m)


A2 = model("A2")
VFS = [str(a) for a in model_vf_addresses(PciAddress.parse("0000:08:00.0"), A2)]


def test_a2_vfs_follow_offset_and_stride() -> None:
    assert VFS[0] == "0000:08:00.4"
    assert VFS[4] == "0000:08:01.0"
    assert VFS[-1] == "0000:08:02.3"
    assert len(VFS) == 16


def test_vf_routing_ids_cross_into_the_next_bus() -> None:
    vfs = vf_addresses(PciAddress.parse("0000:08:1f.0"), total=10, offset=4, stride=1)
    assert str(vfs[3]) == "0000:08:1f.7"
    assert str(vfs[4]) == "0000:09:00.0"


def test_type_ids_count_every_catalogue_profile() -> None:
    a100 = model("A100")
    catalogue = default_catalog().model("A100")
    assert catalogue is not None
    # Invented ids (the catalogue has none), from where Open-ForBC's A100 branch starts: 468.
    assert [t.type_id for t in a100.types] == [
        468 + i for i, p in enumerate(catalogue.profiles) if not p.mig
    ]
    assert all("-" not in t.name.split("A100-")[1] for t in a100.types)  # no MIG names


def hosted(**by_index: str) -> dict[str, str | None]:
    out: dict[str, str | None] = dict.fromkeys(VFS)
    for k, v in by_index.items():
        out[VFS[int(k[1:])]] = v
    return out


def test_an_empty_gpu_offers_everything_everywhere() -> None:
    everything = frozenset(t.name for t in A2.types)
    assert set(creatable(A2, hosted()).values()) == {everything}


def test_after_one_vgpu_only_its_size_is_offered_elsewhere() -> None:
    c = creatable(A2, hosted(v0="NVIDIA A2-4Q"))
    assert c[VFS[0]] == frozenset()
    assert c[VFS[1]] == {"NVIDIA A2-4Q", "NVIDIA A2-4A", "NVIDIA A2-4C"}


def test_the_maximum_counts_every_series_of_a_size() -> None:
    full = hosted(v0="NVIDIA A2-8Q", v1="NVIDIA A2-8A")
    assert set(creatable(A2, full).values()) == {frozenset()}
    assert create_refusal(A2, full, VFS[2], "NVIDIA A2-8C") is not None


def test_refusal_reasons_name_the_rule() -> None:
    h = hosted(v0="NVIDIA A2-4Q")
    assert create_refusal(A2, h, VFS[1], "NVIDIA A2-4A") is None
    assert "equal-size" in (create_refusal(A2, h, VFS[1], "NVIDIA A2-2Q") or "")
    assert "one vGPU per VF" in (create_refusal(A2, h, VFS[0], "NVIDIA A2-4Q") or "")
    assert "does not offer" in (create_refusal(A2, h, VFS[1], "NVIDIA L4-4Q") or "")


def test_description_is_the_drivers_line() -> None:
    q4 = A2.type_named("NVIDIA A2-4Q")
    assert q4 is not None
    assert q4.description == (
        "num_heads=4, frl_config=60, framebuffer=4096M, max_resolution=7680x4320, max_instance=4"
    )
    assert q4.mdev_type == f"nvidia-{q4.type_id}"


def test_placement_puts_requested_gpus_first_and_defaults_on_free_buses() -> None:
    a16 = model("A16")
    placed = place_gpus(
        [GpuRequest(A2), GpuRequest(a16, PciAddress.parse("0000:08:00.0")), GpuRequest(A2)]
    )
    assert [(str(p.address), p.board) for p in placed] == [
        ("0000:18:00.0", 0),
        ("0000:08:00.0", 1),
        ("0000:09:00.0", 1),
        ("0000:0a:00.0", 1),
        ("0000:0b:00.0", 1),
        ("0000:28:00.0", 2),
    ]


def test_a_board_does_not_straddle_a_taken_bus() -> None:
    a16 = model("A16")
    placed = place_gpus([GpuRequest(A2, PciAddress.parse("0000:0a:00.0")), GpuRequest(a16)])
    assert [str(p.address) for p in placed][1:] == [
        "0000:18:00.0",
        "0000:19:00.0",
        "0000:1a:00.0",
        "0000:1b:00.0",
    ]


def test_overlapping_functions_are_refused() -> None:
    with pytest.raises(ValueError, match="overlaps"):
        place_gpus(
            [
                GpuRequest(A2, PciAddress.parse("0000:08:01.0")),
                GpuRequest(A2, PciAddress.parse("0000:08:00.0")),
            ]
        )


# --- mixed-size mode ------------------------------------------------------------------------------

L40S = model("L40S")
L40S_VFS = [str(a) for a in model_vf_addresses(PciAddress.parse("0000:08:00.0"), L40S)]
MIXED = VgpuMode.MIXED_SIZE


def l40s_hosted(*types: str) -> dict[str, str | None]:
    """The L40S's VFs, the first ones hosting ``types`` in order."""
    out: dict[str, str | None] = dict.fromkeys(L40S_VFS)
    for vf, t in zip(L40S_VFS, types, strict=False):
        out[vf] = t
    return out


def test_the_l40s_copy_knows_its_framebuffer_and_the_one_mixed_size_maximum() -> None:
    assert L40S.framebuffer_mib == 49152
    c4 = L40S.type_named("NVIDIA L40S-4C")
    q4 = L40S.type_named("NVIDIA L40S-4Q")
    assert c4 is not None and q4 is not None
    assert (c4.limit(VgpuMode.EQUAL_SIZE), c4.limit(MIXED)) == (12, 8)
    assert (q4.limit(VgpuMode.EQUAL_SIZE), q4.limit(MIXED)) == (12, 12)
    assert SimModel.from_json(L40S.to_json()) == L40S


def test_in_mixed_size_mode_sizes_may_differ_up_to_the_framebuffer() -> None:
    h = l40s_hosted("NVIDIA L40S-8Q")
    assert create_refusal(L40S, h, L40S_VFS[1], "NVIDIA L40S-16Q", mode=MIXED) is None
    c = creatable(L40S, l40s_hosted("NVIDIA L40S-8Q", "NVIDIA L40S-16Q"), mode=MIXED)
    assert c[L40S_VFS[0]] == c[L40S_VFS[1]] == frozenset()
    # 24 GB of 48 used: every type of 24 GB or less, none of 48 GB.
    assert "NVIDIA L40S-24Q" in c[L40S_VFS[2]]
    assert "NVIDIA L40S-48Q" not in c[L40S_VFS[2]]
    assert len(c[L40S_VFS[2]]) == 30 - 3  # 30 types (10 Q, 10 A, 7 C, 3 B); not the 48 GB ones


def test_a_full_framebuffer_in_mixed_size_mode_refuses_with_the_free_space() -> None:
    full = l40s_hosted("NVIDIA L40S-24Q", "NVIDIA L40S-16Q", "NVIDIA L40S-8Q")
    assert set(creatable(L40S, full, mode=MIXED).values()) == {frozenset()}
    assert create_refusal(L40S, full, L40S_VFS[3], "NVIDIA L40S-1Q", mode=MIXED) == (
        "NVIDIA L40S-1Q has 1024 MiB of framebuffer but only 0 of the GPU's 49152 MiB are "
        "free (mixed-size mode)"
    )


def test_the_mixed_size_maximum_replaces_max_instance_for_its_type_only() -> None:
    eight = l40s_hosted(*["NVIDIA L40S-4C"] * 8)
    c = creatable(L40S, eight, mode=MIXED)[L40S_VFS[8]]
    assert "NVIDIA L40S-4C" not in c
    assert "NVIDIA L40S-4Q" in c  # 8 of 4 GB: under 4Q's 12
    assert create_refusal(L40S, eight, L40S_VFS[8], "NVIDIA L40S-4C", mode=MIXED) == (
        "NVIDIA L40S-4C: the GPU already hosts 8 vGPUs of 4096 MiB (mixed-size maximum=8)"
    )
    # Equal-size mode: 12 4C vGPUs.
    assert create_refusal(L40S, eight, L40S_VFS[8], "NVIDIA L40S-4C") is None


def test_equal_size_mode_is_the_default_and_unchanged() -> None:
    h = l40s_hosted("NVIDIA L40S-8Q")
    assert "equal-size" in (create_refusal(L40S, h, L40S_VFS[1], "NVIDIA L40S-16Q") or "")
    assert creatable(L40S, h)[L40S_VFS[1]] == {
        "NVIDIA L40S-8Q",
        "NVIDIA L40S-8A",
        "NVIDIA L40S-8C",
    }
