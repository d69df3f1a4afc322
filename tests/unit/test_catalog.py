"""The profile catalogue: its data against docs/domain.md §4, and its pure look-ups.

The desired-state checks (``reconciler.desired.checks``) trust these facts: a profile name's GPU
part leads back to its model, maxima follow min(framebuffer / size, VFs), and A2/A16 are told
apart by subsystem id.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import reconciler.catalog
from reconciler.catalog import (
    Catalog,
    GpuModel,
    default_catalog,
    long_profile_name,
    parse_profile_name,
    profile_body,
    resolve_profile_name,
)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return default_catalog()


def _model(catalog: Catalog, name: str) -> GpuModel:
    model = catalog.model(name)
    assert model is not None, name
    return model


def _maxima(model: GpuModel, series: str) -> dict[int, int]:
    return {
        p.size_gb: p.max_instances
        for p in model.time_sliced_profiles
        if p.series == series and not p.mig
    }


def test_the_catalogue_has_the_domain_models(catalog: Catalog) -> None:
    assert [m.name for m in catalog.models] == [
        "NVIDIA A2",
        "NVIDIA A16",
        "NVIDIA A10",
        "NVIDIA A40",
        "NVIDIA L4",
        "NVIDIA L40",
        "NVIDIA L40S",
        "NVIDIA A100 40GB",
        "NVIDIA A100X",
        "NVIDIA A100 80GB",
        "NVIDIA A100DX",
        "NVIDIA H100 80GB",
        "NVIDIA H100XM",
    ]


def test_the_catalogue_holds_no_type_ids() -> None:
    """Type ids belong to a driver branch, not a GPU model (docs/domain.md §4)."""
    text = (Path(reconciler.catalog.__file__).parent / "catalog.json").read_text()
    assert "firstTypeId" not in text
    assert "nvidia-" not in text


@pytest.mark.parametrize(
    ("model", "vfs", "offset"),
    [
        # docs/domain.md §1 and §4, and public captures (the models' ``sources``).
        ("NVIDIA A2", 16, 4),
        ("NVIDIA A10", 32, 4),
        ("NVIDIA A40", 32, 4),
        ("NVIDIA L40S", 32, 4),
        ("NVIDIA A100 40GB", 16, 4),
        ("NVIDIA A100 80GB", 20, 4),
        # Not seen on a real host: no offset is claimed.
        ("NVIDIA A16", 16, None),
        ("NVIDIA L4", 32, None),
        ("NVIDIA H100 80GB", 32, None),
    ],
)
def test_vf_counts_and_where_vf0_sits(
    catalog: Catalog, model: str, vfs: int, offset: int | None
) -> None:
    found = _model(catalog, model)
    assert (found.vfs, found.vf_offset, found.vf_stride) == (vfs, offset, 1)


@pytest.mark.parametrize(
    ("name", "maximum"),
    [
        ("NVIDIA L40S-3B", 16),
        ("NVIDIA L4-3B", 8),
        ("GRID A100-1-10C", 4),
        ("GRID A100D-1-20C", 4),
        ("GRID A100-1-5CME", 1),
        ("GRID A100D-1-10CME", 1),
        ("NVIDIA H100-1-10CME", 1),
        ("GRID A100X-4C", 10),
        ("GRID A100DX-80C", 1),
        ("NVIDIA H100XM-80C", 1),
    ],
)
def test_profiles_often_missed_are_there(catalog: Catalog, name: str, maximum: int) -> None:
    found = catalog.profile(name)
    assert found is not None, name
    assert found[1].max_instances == maximum


@pytest.mark.parametrize(
    ("name", "resolution", "heads", "frl"),
    [
        # The A2 capture (harvester/pcidevices testdata): every series of one real host.
        ("NVIDIA A2-1B", "5120x2880", 4, 45),
        ("NVIDIA A2-1Q", "5120x2880", 4, 60),
        ("NVIDIA A2-2Q", "7680x4320", 4, 60),
        ("NVIDIA A2-16Q", "7680x4320", 4, 60),
        ("NVIDIA A2-4A", "1280x1024", 1, 60),
        ("NVIDIA A2-4C", "4096x2400", 1, 60),
    ],
)
def test_resolutions_follow_the_series(
    catalog: Catalog, name: str, resolution: str, heads: int, frl: int
) -> None:
    found = catalog.profile(name)
    assert found is not None
    p = found[1]
    assert (p.max_resolution, p.num_heads, p.frl_config) == (resolution, heads, frl)


@pytest.mark.parametrize("name", [m.name for m in default_catalog().models])
def test_every_time_sliced_maximum_is_framebuffer_over_size_capped_by_vfs(name: str) -> None:
    model = _model(default_catalog(), name)
    assert model.time_sliced_profiles, f"{name} has no time-sliced profiles"
    for p in model.time_sliced_profiles:
        assert p.max_instances == min(model.framebuffer_mib // p.framebuffer_mib, model.vfs), p


@pytest.mark.parametrize("name", [m.name for m in default_catalog().models])
def test_every_profile_name_parses_back_to_its_model(name: str) -> None:
    catalog = default_catalog()
    model = _model(catalog, name)
    for p in model.profiles:
        parsed = parse_profile_name(p.name)
        assert parsed is not None, p.name
        # The offline checks find a GPU's model from its profile names this way.
        assert catalog.model(parsed.gpu) is model, p.name
        assert parsed.series == p.series
        assert parsed.size_gb * 1024 == p.framebuffer_mib
        assert parsed.mig_slices == p.gpu_instance_slices
        assert bool(parsed.mig_slices) is p.mig
        assert catalog.profile(p.name) == (model, p)


def test_profile_names_are_unique_across_models(catalog: Catalog) -> None:
    names = [p.name for m in catalog.models for p in m.profiles]
    assert len(names) == len(set(names))


def test_pci_ids_are_unique_across_models(catalog: Catalog) -> None:
    ids = [
        (i.vendor, i.device, i.subsystem_vendor, i.subsystem_device)
        for m in catalog.models
        for i in m.pci_ids
    ]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(
    ("model", "profile", "maximum"),
    [
        ("NVIDIA A2", "NVIDIA A2-4Q", 4),
        ("NVIDIA A10", "NVIDIA A10-3Q", 8),
        ("NVIDIA L40S", "NVIDIA L40S-2Q", 24),
        ("NVIDIA A100 40GB", "GRID A100-5C", 8),
        ("NVIDIA H100 80GB", "NVIDIA H100-5C", 16),
    ],
)
def test_domain_example_maxima(catalog: Catalog, model: str, profile: str, maximum: int) -> None:
    found = _model(catalog, model).profile(profile)
    assert found is not None
    assert found.max_instances == maximum


@pytest.mark.parametrize(
    ("models", "series", "table"),
    [
        (["NVIDIA A2", "NVIDIA A16"], "Q", {1: 16, 2: 8, 4: 4, 8: 2, 16: 1}),
        (
            ["NVIDIA A10", "NVIDIA L4"],
            "Q",
            {1: 24, 2: 12, 3: 8, 4: 6, 6: 4, 8: 3, 12: 2, 24: 1},
        ),
        (
            ["NVIDIA A40", "NVIDIA L40", "NVIDIA L40S"],
            "Q",
            {1: 32, 2: 24, 3: 16, 4: 12, 6: 8, 8: 6, 12: 4, 16: 3, 24: 2, 48: 1},
        ),
        (["NVIDIA A100 40GB"], "C", {4: 10, 5: 8, 8: 5, 10: 4, 20: 2, 40: 1}),
        (["NVIDIA A100 80GB"], "C", {4: 20, 8: 10, 10: 8, 16: 5, 20: 4, 40: 2, 80: 1}),
        (
            ["NVIDIA H100 80GB"],
            "C",
            {4: 20, 5: 16, 8: 10, 10: 8, 16: 5, 20: 4, 40: 2, 80: 1},
        ),
    ],
)
def test_domain_maxima_tables(
    catalog: Catalog, models: list[str], series: str, table: dict[int, int]
) -> None:
    for name in models:
        assert _maxima(_model(catalog, name), series) == table, name


@pytest.mark.parametrize("name", ["NVIDIA A2", "NVIDIA A16", "NVIDIA A10", "NVIDIA L40S"])
def test_a_series_maxima_match_q(catalog: Catalog, name: str) -> None:
    model = _model(catalog, name)
    assert _maxima(model, "A") == _maxima(model, "Q")


def test_a100_and_h100_offer_compute_profiles_only(catalog: Catalog) -> None:
    for name in (
        "NVIDIA A100 40GB",
        "NVIDIA A100X",
        "NVIDIA A100 80GB",
        "NVIDIA A100DX",
        "NVIDIA H100 80GB",
        "NVIDIA H100XM",
    ):
        assert {p.series for p in _model(catalog, name).profiles} == {"C"}


def test_the_a100_family_is_named_grid_as_its_drivers_print_it(catalog: Catalog) -> None:
    for name in ("NVIDIA A100 40GB", "NVIDIA A100X", "NVIDIA A100 80GB", "NVIDIA A100DX"):
        assert all(p.name.startswith("GRID ") for p in _model(catalog, name).profiles), name
    assert all(p.name.startswith("NVIDIA ") for p in _model(catalog, "H100").profiles)


def test_a2_and_a16_share_a_device_id_and_differ_by_subsystem(catalog: Catalog) -> None:
    a2 = catalog.model_for_ids("10de", "25b6", "10de", "157e")
    a16 = catalog.model_for_ids("10DE", "25B6", "10de", "14A9")
    assert a2 is not None
    assert a2.name == "NVIDIA A2"
    assert a16 is not None
    assert a16.name == "NVIDIA A16"
    assert a16.gpus_per_board == 4
    # A shared device id with an unknown subsystem is ambiguous: no guess.
    assert catalog.model_for_ids("10de", "25b6", "10de", "0000") is None


def test_a_unique_device_id_needs_no_subsystem(catalog: Catalog) -> None:
    a10 = catalog.model_for_ids("10de", "2236")
    assert a10 is not None
    assert a10.name == "NVIDIA A10"
    assert catalog.model_for_ids("10de", "1eb8") is None  # a T4: no SR-IOV vGPU


@pytest.mark.parametrize(
    ("device", "model", "profile"),
    [
        # SXM parts have profile names of their own (docs/domain.md §4).
        ("20b0", "NVIDIA A100X", "GRID A100X-40C"),
        ("20b2", "NVIDIA A100DX", "GRID A100DX-80C"),
        ("2330", "NVIDIA H100XM", "NVIDIA H100XM-80C"),
        ("20f1", "NVIDIA A100 40GB", "GRID A100-40C"),
        ("20b5", "NVIDIA A100 80GB", "GRID A100D-80C"),
        ("2331", "NVIDIA H100 80GB", "NVIDIA H100-80C"),
    ],
)
def test_sxm_parts_are_their_own_models(
    catalog: Catalog, device: str, model: str, profile: str
) -> None:
    found = catalog.model_for_ids("10de", device)
    assert found is not None
    assert found.name == model
    assert found.profile(profile) is not None


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA A2", "NVIDIA A2"),
        ("A2", "NVIDIA A2"),
        ("nvidia a2", "NVIDIA A2"),
        ("NVIDIA_L40S", "NVIDIA L40S"),
        ("  L40S ", "NVIDIA L40S"),
        ("A100", "NVIDIA A100 40GB"),
        ("A100-40GB", "NVIDIA A100 40GB"),
        ("A100-80GB", "NVIDIA A100 80GB"),
        ("A100D", "NVIDIA A100 80GB"),
        ("A100X", "NVIDIA A100X"),
        ("A100DX", "NVIDIA A100DX"),
        ("H100XM", "NVIDIA H100XM"),
        ("NVIDIA A100 80GB", "NVIDIA A100 80GB"),
        ("H100-PCIE", "NVIDIA H100 80GB"),
    ],
)
def test_models_by_name_short_name_and_alias(catalog: Catalog, name: str, expected: str) -> None:
    assert _model(catalog, name).name == expected


@pytest.mark.parametrize("name", ["NVIDIA A3", "T4", "", "A2-4Q"])
def test_unknown_model_names(catalog: Catalog, name: str) -> None:
    assert catalog.model(name) is None


@pytest.mark.parametrize(
    ("name", "gpu", "size", "series", "slices"),
    [
        ("NVIDIA A2-4Q", "A2", 4, "Q", 0),
        ("NVIDIA A16-2B", "A16", 2, "B", 0),
        ("NVIDIA L40S-48A", "L40S", 48, "A", 0),
        ("GRID T4-2Q", "T4", 2, "Q", 0),
        ("NVIDIA A100-1-5C", "A100", 5, "C", 1),
        ("NVIDIA A100D-7-80C", "A100D", 80, "C", 7),
        ("NVIDIA RTXA6000-4Q", "RTXA6000", 4, "Q", 0),
        # Every shape NVIDIA's drivers print (docs/domain.md §4).
        ("GRID A100D-4C", "A100D", 4, "C", 0),
        ("NVIDIA RTX 5880 Ada-48C", "RTX 5880 Ada", 48, "C", 0),
        ("NVIDIA RTX Pro 6000 Blackwell DC-4-96Q", "RTX Pro 6000 Blackwell DC", 96, "Q", 4),
        ("NVIDIA RTX Pro 6000 Blackwell DC-3Q", "RTX Pro 6000 Blackwell DC", 3, "Q", 0),
        ("NVIDIA H100XM-80C", "H100XM", 80, "C", 0),
        ("GRID A100X-2-10C", "A100X", 10, "C", 2),
    ],
)
def test_parse_profile_name(name: str, gpu: str, size: int, series: str, slices: int) -> None:
    parsed = parse_profile_name(name)
    assert parsed is not None
    assert (parsed.name, parsed.gpu, parsed.size_gb, parsed.series, parsed.mig_slices) == (
        name,
        gpu,
        size,
        series,
        slices,
    )
    assert parsed.suffix == ""


@pytest.mark.parametrize(
    ("name", "gpu", "size", "slices", "suffix"),
    [
        ("GRID A100-1-5CME", "A100", 5, 1, "ME"),
        ("NVIDIA H100-1-10CME", "H100", 10, 1, "ME"),
        ("NVIDIA H100-1-10CNOME", "H100", 10, 1, "NOME"),
        ("NVIDIA H100-1-10CMEALL", "H100", 10, 1, "MEALL"),
        ("NVIDIA RTX Pro 6000 Blackwell DC-1-24CGFX", "RTX Pro 6000 Blackwell DC", 24, 1, "GFX"),
    ],
)
def test_mig_backed_names_with_suffixes(
    name: str, gpu: str, size: int, slices: int, suffix: str
) -> None:
    parsed = parse_profile_name(name)
    assert parsed is not None
    assert (parsed.gpu, parsed.size_gb, parsed.series, parsed.mig_slices, parsed.suffix) == (
        gpu,
        size,
        "C",
        slices,
        suffix,
    )


@pytest.mark.parametrize(
    "name", ["A2-4Q", "NVIDIA A2-4X", "NVIDIA A2 4Q", "NVIDIA A2-Q", "nvidia A2-4Q", "NVIDIA -4Q"]
)
def test_parse_profile_name_does_not_know_these_shapes(name: str) -> None:
    """None only says the name has no shape the parser knows: such a name is carried opaque,
    never refused for it (see the desired-state and planner tests)."""
    assert parse_profile_name(name) is None


@pytest.mark.parametrize(
    ("written", "spelled"),
    [
        ("A100-4C", "GRID A100-4C"),
        ("NVIDIA A100-4C", "GRID A100-4C"),
        ("GRID A100D-1-10CME", "GRID A100D-1-10CME"),
        ("A2-4Q", "NVIDIA A2-4Q"),
        ("GRID A2-4Q", "NVIDIA A2-4Q"),
        ("H100XM-80C", "NVIDIA H100XM-80C"),
        ("RTX 5880 Ada-48C", None),
        ("A2-3Q", None),
    ],
)
def test_the_catalogue_spells_a_profile_whatever_prefix_it_was_written_with(
    catalog: Catalog, written: str, spelled: str | None
) -> None:
    assert catalog.spelled(written) == spelled


def test_a_name_resolves_to_the_spelling_a_host_offers() -> None:
    offered = ["GRID A100-4C", "GRID A100-5C"]
    assert resolve_profile_name("A100-4C", offered) == "GRID A100-4C"
    assert resolve_profile_name("NVIDIA A100-4C", offered) == "GRID A100-4C"
    assert resolve_profile_name("GRID A100-4C", offered) == "GRID A100-4C"
    assert resolve_profile_name("A100-8C", offered) is None
    # Both spellings offered: the exact one; neither exact: no guess.
    both = ["GRID T4-2Q", "NVIDIA T4-2Q"]
    assert resolve_profile_name("NVIDIA T4-2Q", both) == "NVIDIA T4-2Q"
    assert resolve_profile_name("T4-2Q", both) is None
    assert profile_body("GRID A100-4C") == "A100-4C"
    assert profile_body("  NVIDIA  RTX 5880 Ada-48C ") == "RTX 5880 Ada-48C"


@pytest.mark.parametrize(
    ("name", "long"),
    [
        ("A2-4Q", "NVIDIA A2-4Q"),
        ("NVIDIA A2-4Q", "NVIDIA A2-4Q"),
        ("GRID T4-2Q", "GRID T4-2Q"),
        ("  NVIDIA   A2-4Q ", "NVIDIA A2-4Q"),
        ("A100-1-5C", "NVIDIA A100-1-5C"),
    ],
)
def test_long_profile_name(name: str, long: str) -> None:
    assert long_profile_name(name) == long


def test_default_catalog_is_loaded_once() -> None:
    assert default_catalog() is default_catalog()


def test_a_catalog_from_data() -> None:
    catalog = Catalog.from_json(
        {
            "models": [
                {
                    "name": "NVIDIA X1",
                    "short": "X1",
                    "pciIds": [{"vendor": "10de", "device": "ffff"}],
                    "framebufferMiB": 8192,
                    "vfs": 4,
                    "vfOffset": 2,
                    "vfStride": 1,
                    "profiles": [
                        {
                            "name": "NVIDIA X1-2Q",
                            "series": "Q",
                            "framebufferMiB": 2048,
                            "maxInstances": 4,
                        }
                    ],
                }
            ]
        }
    )
    model = _model(catalog, "X1")
    assert model.aliases == ()
    assert model.multi_vgpu_series is None
    assert catalog.profile("NVIDIA X1-2Q") == (model, model.profiles[0])
    assert catalog.model_for_ids("10de", "ffff") is model
