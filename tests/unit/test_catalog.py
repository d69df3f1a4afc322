"""The profile catalogue: its data against DOMAIN.md §4, and its pure look-ups.

The desired-state checks (``reconciler.desired.checks``) trust these facts: a profile name's GPU
part leads back to its model, maxima follow min(framebuffer / size, VFs), and A2/A16 are told
apart by subsystem id.
"""

from __future__ import annotations

import pytest

from reconciler.catalog import (
    Catalog,
    GpuModel,
    default_catalog,
    long_profile_name,
    parse_profile_name,
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
    assert catalog.model_names() == [
        "NVIDIA A2",
        "NVIDIA A16",
        "NVIDIA A10",
        "NVIDIA A40",
        "NVIDIA L4",
        "NVIDIA L40",
        "NVIDIA L40S",
        "NVIDIA A100 40GB",
        "NVIDIA A100 80GB",
        "NVIDIA H100 80GB",
    ]


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
        ("NVIDIA A100 40GB", "NVIDIA A100-5C", 8),
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
    for name in ("NVIDIA A100 40GB", "NVIDIA A100 80GB", "NVIDIA H100 80GB"):
        assert {p.series for p in _model(catalog, name).profiles} == {"C"}


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
    h100_sxm = catalog.model_for_ids("10de", "2330")
    assert h100_sxm is not None
    assert h100_sxm.name == "NVIDIA H100 80GB"
    assert catalog.model_for_ids("10de", "1eb8") is None  # a T4: no SR-IOV vGPU


def test_vf_offsets_put_the_first_vf_where_the_kernel_does(catalog: Catalog) -> None:
    # DOMAIN.md §1: VF0 is function .4 on an A2, .2 on the other cards.
    assert _model(catalog, "A2").vf_offset == 4
    for m in catalog.models:
        if m.short != "A2":
            assert m.vf_offset == 2, m.name
        assert m.vf_stride == 1


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


@pytest.mark.parametrize(
    "name", ["A2-4Q", "NVIDIA A2-4X", "NVIDIA A2 4Q", "NVIDIA A2-Q", "nvidia A2-4Q", "NVIDIA -4Q"]
)
def test_parse_profile_name_rejects(name: str) -> None:
    assert parse_profile_name(name) is None


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
