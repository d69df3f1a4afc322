"""The driver's placement rules (reconciler.rules), judged on offers written here by hand.

Every expectation comes from docs/domain.md §3-4, not from the catalogue or the code: an A2
has 16 GB and 16 VFs, its 4 GB types (4A, 4Q, 4C) allow 4 each and share that limit, 2Q allows
8, 16Q 1; an A100 40GB's MIG-backed A100-1-10C allows 4 and never shares a GPU with a
time-sliced vGPU.
"""

from __future__ import annotations

from collections.abc import Mapping

from reconciler.catalog import Catalog, GpuModel, PciId, Profile
from reconciler.model import PciAddress, SourceLocation
from reconciler.rules import (
    Offer,
    OfferedType,
    Request,
    Rule,
    Violation,
    index_out_of_range,
    named_twice,
    type_facts,
    violations,
)

GPU = PciAddress.parse("0000:08:00.0")
#: An empty catalogue: nothing below may lean on catalog.json's numbers.
NO_CATALOG = Catalog(())

A2_TYPES = {
    t.name: t
    for t in (
        OfferedType("NVIDIA A2-2Q", 2048, 8),
        OfferedType("NVIDIA A2-4A", 4096, 4),
        OfferedType("NVIDIA A2-4Q", 4096, 4),
        OfferedType("NVIDIA A2-4C", 4096, 4),
        OfferedType("NVIDIA A2-8Q", 8192, 2),
        OfferedType("NVIDIA A2-16Q", 16384, 1),
    )
}


def a2(*, complete: bool = True, types: Mapping[str, OfferedType] = A2_TYPES) -> Offer:
    return Offer("NVIDIA A2", types, complete=complete, vfs=16, catalog=NO_CATALOG)


def at(line: int) -> SourceLocation:
    return SourceLocation("d.yaml", line, 13)


def vf(profile: str, address: str, line: int) -> Request:
    return Request(profile, 1, address, at(line))


def count(profile: str, n: int, line: int) -> Request:
    return Request(profile, n, None, at(line))


def judged(offer: Offer, *requests: Request, hosted: tuple[str, ...] = ()) -> list[Violation]:
    return violations(GPU, offer, requests, hosted=hosted)


# ---------------------------------------------------------------- equal-size mode


def test_series_may_differ_within_one_size() -> None:
    # The seed's node hosts A2-4A and A2-4Q together.
    assert judged(a2(), count("NVIDIA A2-4A", 2, 10), count("NVIDIA A2-4Q", 2, 11)) == []


def test_two_sizes_on_one_gpu_break_equal_size_mode() -> None:
    [v] = judged(
        a2(), vf("NVIDIA A2-4A", "0000:08:00.4", 12), vf("NVIDIA A2-2Q", "0000:08:00.5", 13)
    )
    assert v == Violation(
        Rule.EQUAL_SIZE,
        "mixed framebuffer sizes on GPU 0000:08:00.0: 'NVIDIA A2-2Q' (2 GB) and 'NVIDIA A2-4A' "
        "(4 GB, line 12); time-sliced vGPUs on one GPU share one size (equal-size mode)",
        at(13),
    )


def test_sizes_come_from_the_name_when_nothing_lists_the_type() -> None:
    # A GPU nobody describes (SR-IOV off, unknown model): its names still say 4 GB and 8 GB.
    offer = Offer(None, {}, complete=False, vfs=None, catalog=NO_CATALOG)
    [v] = judged(offer, count("NVIDIA X1-4Q", 1, 5), count("NVIDIA X1-8Q", 1, 6))
    assert v.rule is Rule.EQUAL_SIZE
    assert v.message.startswith(
        "mixed framebuffer sizes on GPU 0000:08:00.0: 'NVIDIA X1-8Q' (8 GB) and 'NVIDIA X1-4Q' "
        "(4 GB, line 5)"
    )


def test_a_pair_without_a_place_names_no_line() -> None:
    first, second = Request("NVIDIA A2-4Q", 1, None, None), Request("NVIDIA A2-2Q", 1, None, None)
    [v] = judged(a2(), first, second)
    assert "'NVIDIA A2-2Q' (2 GB) and 'NVIDIA A2-4Q' (4 GB);" in v.message
    assert v.location is None


# ---------------------------------------------------------------- per-size maximum


def test_the_maximum_is_reached_but_not_passed() -> None:
    assert judged(a2(), count("NVIDIA A2-4Q", 4, 10)) == []
    assert judged(a2(), count("NVIDIA A2-2Q", 8, 10)) == []


def test_4a_and_4q_share_one_limit() -> None:
    found = judged(
        a2(),
        vf("NVIDIA A2-4A", "0000:08:00.4", 10),
        vf("NVIDIA A2-4Q", "0000:08:00.5", 11),
        vf("NVIDIA A2-4A", "0000:08:00.6", 12),
        vf("NVIDIA A2-4Q", "0000:08:00.7", 13),
        vf("NVIDIA A2-4Q", "0000:08:01.0", 14),
    )
    assert [(v.rule, str(v), v.location) for v in found] == [
        (
            Rule.MAXIMUM,
            "5 vGPUs of 4 GB on GPU 0000:08:00.0, but 'NVIDIA A2-4Q' allows at most 4 per "
            "NVIDIA A2; first over the limit: VF 0000:08:01.0; "
            "profiles that allow 5: A2-2Q",  # 2Q allows 8; the others fewer than 5
            at(14),
        )
    ]


def test_the_count_form_names_no_vf_and_reports_where_the_limit_is_passed() -> None:
    [v] = judged(a2(), count("NVIDIA A2-8Q", 1, 20), count("NVIDIA A2-8Q", 2, 21))
    assert v.message == (
        "3 vGPUs of 8 GB on GPU 0000:08:00.0, but 'NVIDIA A2-8Q' allows at most 2 per NVIDIA A2"
    )
    assert v.location == at(21)
    assert v.hint == "profiles that allow 3: A2-2Q A2-4A A2-4Q A2-4C"


def test_the_lowest_limit_of_a_size_is_the_one_that_stops_a_create() -> None:
    # Mixed-size-capable drivers list other maxima (L40S-4C: 8 in mixed-size mode instead of
    # 12): within one size, the driver refuses a create once the count reaches the type's own.
    types = {
        "NVIDIA L40S-4C": OfferedType("NVIDIA L40S-4C", 4096, 8),
        "NVIDIA L40S-4Q": OfferedType("NVIDIA L40S-4Q", 4096, 12),
    }
    offer = Offer("NVIDIA L40S", types, complete=True, vfs=32, catalog=NO_CATALOG)
    [v] = judged(offer, count("NVIDIA L40S-4Q", 6, 1), count("NVIDIA L40S-4C", 3, 2))
    assert v.message == (
        "9 vGPUs of 4 GB on GPU 0000:08:00.0, but 'NVIDIA L40S-4C' allows at most 8 per NVIDIA L40S"
    )


def test_an_unknown_model_is_named_as_the_gpu() -> None:
    types = {"NVIDIA L20-4Q": OfferedType("NVIDIA L20-4Q", 4096, 12)}
    offer = Offer(None, types, complete=True, vfs=32, catalog=NO_CATALOG)
    [v] = judged(offer, count("NVIDIA L20-4Q", 13, 12))
    assert v.message == (
        "13 vGPUs of 4 GB on GPU 0000:08:00.0, but 'NVIDIA L20-4Q' allows at most 12 per GPU"
    )


def test_a_name_only_type_has_no_maximum_to_judge() -> None:
    offer = Offer(None, {}, complete=False, vfs=None, catalog=NO_CATALOG)
    assert judged(offer, count("NVIDIA X1-4Q", 40, 1)) == []


# ---------------------------------------------------------------- MIG-backed profiles

A100_TYPES = {
    t.name: t
    for t in (
        OfferedType("GRID A100-4C", 4096, 10),
        OfferedType("GRID A100-5C", 5120, 8),
        OfferedType("GRID A100-1-10C", 10240, 4, mig=True),
        OfferedType("GRID A100-1-5CME", 5120, 1, mig=True),
    )
}


def a100() -> Offer:
    return Offer("NVIDIA A100 40GB", A100_TYPES, complete=True, vfs=16, catalog=NO_CATALOG)


def test_mig_backed_and_time_sliced_never_share_a_gpu() -> None:
    [v] = judged(a100(), count("GRID A100-5C", 1, 13), count("GRID A100-1-10C", 1, 14))
    assert v == Violation(
        Rule.MIG_ONLY,
        "MIG-backed and time-sliced profiles on GPU 0000:08:00.0: 'GRID A100-1-10C' and "
        "'GRID A100-5C' (line 13); a GPU in MIG mode hosts MIG-backed vGPUs only",
        at(14),
    )


def test_a_mig_backed_type_counts_its_own_vgpus_only() -> None:
    # 4 × 1-10C and 1 × 1-5CME: each at its own maximum, sizes do not matter.
    assert judged(a100(), count("GRID A100-1-10C", 4, 1), count("GRID A100-1-5CME", 1, 2)) == []
    [v] = judged(a100(), count("GRID A100-1-10C", 5, 1))
    assert v.rule is Rule.MAXIMUM
    assert v.message == (
        "5 vGPUs of 'GRID A100-1-10C' on GPU 0000:08:00.0, but it allows at most 4 per "
        "NVIDIA A100 40GB"
    )


def test_a_driver_type_is_mig_backed_by_its_name() -> None:
    # Sysfs does not say a type is MIG-backed; its name does (A100-1-5C: one slice, 5 GB).
    driver_type = OfferedType("GRID A100-1-5C", 5120, 7)
    assert driver_type.is_mig
    assert not OfferedType("GRID A100-5C", 5120, 8).is_mig


# ---------------------------------------------------------------- one vGPU per VF


def test_no_more_vgpus_than_vfs() -> None:
    # Names nothing describes have no maximum: the VF count is what stops them.
    offer = Offer(None, {}, complete=False, vfs=4, catalog=NO_CATALOG)
    [v] = judged(offer, count("NVIDIA X1-1Q", 3, 7), count("NVIDIA X1-1A", 2, 8))
    assert v == Violation(
        Rule.ONE_PER_VF,
        "5 vGPUs requested on GPU 0000:08:00.0, but it has 4 VFs (one vGPU per VF)",
        at(8),
    )


def test_a_passed_maximum_is_the_only_sentence() -> None:
    # A maximum is never above the VF count (docs/domain.md §4): 17 × 1Q on an A2 is one problem.
    types = {"NVIDIA A2-1Q": OfferedType("NVIDIA A2-1Q", 1024, 16)}
    found = judged(a2(types=types), count("NVIDIA A2-1Q", 17, 3))
    assert [v.rule for v in found] == [Rule.MAXIMUM]


def test_a_vf_count_the_offer_does_not_know_is_not_judged() -> None:
    offer = Offer(None, {}, complete=False, vfs=None, catalog=NO_CATALOG)
    assert judged(offer, count("NVIDIA X1-1Q", 1000, 1)) == []


def test_a_vf_named_by_index_and_by_address_is_reported_where_written_last() -> None:
    vf0 = PciAddress.parse("0000:08:00.4")
    assert named_twice(GPU, vf0, 0, at(18), at(16)) == Violation(
        Rule.ONE_PER_VF,
        "VF 0000:08:00.4 of GPU 0000:08:00.0 is named twice: as index 0 (line 18) and by its "
        "address (line 16) (one vGPU per VF)",
        at(18),
    )
    assert named_twice(GPU, vf0, 0, at(11), at(12)).location == at(12)
    assert named_twice(GPU, vf0, 0, None, None).message == (
        "VF 0000:08:00.4 of GPU 0000:08:00.0 is named twice: as index 0 and by its address "
        "(one vGPU per VF)"
    )


def test_vf_indexes_run_below_the_vf_count() -> None:
    # An A2 has 16 VFs: indexes 0..15.
    assert index_out_of_range(GPU, "NVIDIA A2", 16, 16, at(15)) == Violation(
        Rule.VF_INDEX,
        "VF index 16 is out of range for GPU 0000:08:00.0: NVIDIA A2 has 16 VFs (indexes 0..15)",
        at(15),
    )
    assert index_out_of_range(GPU, None, 32, 32, None).message == (
        "VF index 32 is out of range for GPU 0000:08:00.0: it has 32 VFs (indexes 0..31)"
    )


# ---------------------------------------------------------------- offered types


def test_a_complete_offer_refuses_what_it_does_not_list() -> None:
    [v] = judged(a2(), vf("NVIDIA A2-3Q", "0000:08:00.4", 12))
    assert v.rule is Rule.NOT_OFFERED
    assert str(v) == (
        "VF 0000:08:00.4: GPU 0000:08:00.0 (NVIDIA A2) does not offer 'NVIDIA A2-3Q'; "
        "offered: NVIDIA A2-2Q, -4A, -4Q, -4C, -8Q, -16Q"
    )


def test_a_type_a_vf_hosts_is_offered_even_when_no_longer_listed() -> None:
    # vfio's creatable list drops a type once it is in use (docs/domain.md §3b).
    listed = {k: v for k, v in A2_TYPES.items() if k != "NVIDIA A2-4Q"}
    assert judged(a2(types=listed), count("NVIDIA A2-4Q", 1, 1), hosted=("NVIDIA A2-4Q",)) == []


def test_a_catalogue_offer_never_refuses_a_name() -> None:
    # Catalogues lag drivers (L40S-3B came with vGPU 16).
    assert judged(a2(complete=False), count("NVIDIA A2-3B", 1, 1)) == []


def _model(name: str, short: str, profile: Profile) -> GpuModel:
    return GpuModel(
        name, short, (short,), "Ada", (PciId("10de", "0001"),), 16384, 16, 4, 1, 1, None, (profile,)
    )


TWO_MODELS = Catalog(
    (
        _model("NVIDIA A2", "A2", Profile("NVIDIA A2-4Q", "Q", 4096, 4)),
        _model("NVIDIA L4", "L4", Profile("NVIDIA L4-4Q", "Q", 4096, 6)),
    )
)


def test_a_catalogue_offer_refuses_a_profile_of_another_model() -> None:
    offer = Offer("NVIDIA A2", {}, complete=False, vfs=16, catalog=TWO_MODELS)
    found = judged(offer, vf("NVIDIA L4-4Q", "0000:08:00.4", 11), count("GRID T4-4Q", 1, 12))
    assert [str(v) for v in found] == [
        "VF 0000:08:00.4: GPU 0000:08:00.0 (NVIDIA A2) does not offer 'NVIDIA L4-4Q' "
        "(a profile of NVIDIA L4); offered: none",
        "GPU 0000:08:00.0 (NVIDIA A2) does not offer 'GRID T4-4Q'; offered: none",
    ]
    # Its own model's names, listed or not, are the driver's to judge.
    assert judged(offer, count("NVIDIA A2-3B", 1, 1)) == []
    # A model the catalogue does not know refuses nothing by name.
    unknown = Offer("NVIDIA X9", {}, complete=False, vfs=16, catalog=TWO_MODELS)
    assert judged(unknown, count("NVIDIA L4-4Q", 1, 1)) == []


def test_a_quoted_name_is_escaped() -> None:
    [v] = judged(a2(), count("NVIDIA A2-4Q\x1b[2J", 1, 1))
    assert "\x1b" not in v.message


def test_type_facts_fall_back_to_the_name() -> None:
    assert type_facts("NVIDIA X1-6Q", NO_CATALOG) == OfferedType(
        "NVIDIA X1-6Q", 6144, None, mig=False
    )
    assert type_facts("GRID X1-2-12CME", NO_CATALOG) == OfferedType(
        "GRID X1-2-12CME", 12288, None, mig=True
    )
    assert type_facts("something else", NO_CATALOG) is None


# ---------------------------------------------------------------- mixed-size mode
# docs/domain.md §4: an L40S has 48 GB; sizes may differ up to that total in mixed-size mode;
# L40S-4C allows 8 there (12 in equal-size mode). The catalogue below is written here.

L40S_PROFILES = (
    Profile("NVIDIA L40S-4C", "C", 4096, 12, mixed_size_max_instances=8),
    Profile("NVIDIA L40S-8Q", "Q", 8192, 6),
    Profile("NVIDIA L40S-16Q", "Q", 16384, 3),
    Profile("NVIDIA L40S-24Q", "Q", 24576, 2),
)
L40S_CATALOG = Catalog(
    (
        GpuModel(
            "NVIDIA L40S", "L40S", ("L40S",), "Ada", (PciId("10de", "26b9"),), 49152, 32, 4,
            1, 1, None, L40S_PROFILES,
        ),
    )
)  # fmt: skip
L40S_TYPES = {
    "NVIDIA L40S-4C": OfferedType("NVIDIA L40S-4C", 4096, 12),
    "NVIDIA L40S-8Q": OfferedType("NVIDIA L40S-8Q", 8192, 6),
    "NVIDIA L40S-16Q": OfferedType("NVIDIA L40S-16Q", 16384, 3),
    "NVIDIA L40S-24Q": OfferedType("NVIDIA L40S-24Q", 24576, 2),
}


def l40s() -> Offer:
    # The driver's offer (no mixed-size maxima in sysfs): the catalogue supplies the known one.
    return Offer("NVIDIA L40S", L40S_TYPES, complete=True, vfs=32, catalog=L40S_CATALOG)


def mixed(*requests: Request) -> list[Violation]:
    return violations(GPU, l40s(), requests, mixed_size=True)


def test_mixed_size_mode_lets_sizes_differ_within_the_framebuffer() -> None:
    # 8 + 16 = 24 GB of 48.
    assert mixed(count("NVIDIA L40S-8Q", 1, 10), count("NVIDIA L40S-16Q", 1, 11)) == []
    # 24 + 16 + 8 = 48 GB: exactly full.
    assert (
        mixed(
            count("NVIDIA L40S-24Q", 1, 10),
            count("NVIDIA L40S-16Q", 1, 11),
            count("NVIDIA L40S-8Q", 1, 12),
        )
        == []
    )


def test_the_same_pair_breaks_equal_size_mode() -> None:
    [v] = violations(GPU, l40s(), [count("NVIDIA L40S-8Q", 1, 10), count("NVIDIA L40S-16Q", 1, 11)])
    assert v.rule is Rule.EQUAL_SIZE


def test_mixed_size_mode_refuses_more_than_the_gpus_framebuffer() -> None:
    # 24 + 16 + 16 = 56 GB > 48 GB; the first entry past 48 GB is the second 16Q (line 11).
    [v] = mixed(count("NVIDIA L40S-24Q", 1, 10), count("NVIDIA L40S-16Q", 2, 11))
    assert v.rule is Rule.FRAMEBUFFER
    assert v.location == at(11)
    assert str(v) == (
        "56 GB of vGPUs on GPU 0000:08:00.0, but NVIDIA L40S has 48 GB of framebuffer "
        "(mixed-size mode: the sizes together must fit)"
    )


def test_mixed_size_mode_uses_the_published_mixed_maximum() -> None:
    # L40S-4C: 8 in mixed-size mode (36 GB of 48 fits: the maximum is what refuses 9).
    [v] = mixed(count("NVIDIA L40S-4C", 9, 10))
    assert v.rule is Rule.MAXIMUM
    assert str(v) == (
        "9 vGPUs of 4 GB on GPU 0000:08:00.0, but 'NVIDIA L40S-4C' allows at most 8 per "
        "NVIDIA L40S in mixed-size mode"
    )
    assert mixed(count("NVIDIA L40S-4C", 8, 10)) == []
    # Equal-size mode keeps 12.
    assert violations(GPU, l40s(), [count("NVIDIA L40S-4C", 12, 10)]) == []


def test_mixed_size_mode_keeps_the_equal_size_maximum_where_none_is_published() -> None:
    # No mixed-size maximum is known for 16Q: its equal-size 3 still bounds it (never higher);
    # four are 64 GB, past the 48 GB as well.
    found = mixed(count("NVIDIA L40S-16Q", 4, 10))
    assert [v.rule for v in found] == [Rule.FRAMEBUFFER, Rule.MAXIMUM]
    assert "allows at most 3 per NVIDIA L40S" in str(found[1])


def test_mixed_size_mode_of_an_unknown_model_leaves_the_total_to_the_driver() -> None:
    offer = Offer("NVIDIA X9", L40S_TYPES, complete=True, vfs=32, catalog=NO_CATALOG)
    found = violations(
        GPU,
        offer,
        [count("NVIDIA L40S-24Q", 1, 10), count("NVIDIA L40S-16Q", 2, 11)],
        mixed_size=True,
    )
    assert found == []
