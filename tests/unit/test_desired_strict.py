"""Strict profile names (issue 34, item 2): ``vgpuctl validate`` refuses a profile name the
catalogue does not list for a model it lists in full, and only then.

The facts: the A2's whole list is the driver's own (harvester/pcidevices
pkg/util/gpuhelper/testdata/sys/class/mdev_bus/0000:08:01.7/mdev_supported_types, one
directory per type the driver has for the GPU: 15 names, written out below); no other model's
list was checked to be whole, so for them an unknown name stays a note (a driver newer than
the catalogue adds names, as vGPU 16 added L40S-3B).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.catalog import Catalog, default_catalog
from reconciler.desired import load_desired
from reconciler.model import PciAddress, ValidationError

HEADER = "apiVersion: vgpu.reconciler.dev/v1alpha1\nkind: VGPUDesiredState\nmetadata: {name: t}\n"
#: The names of the 15 types in the capture above, read one by one from its ``name`` files.
A2_TYPES = {
    f"NVIDIA A2-{n}"
    for n in [
        "1A",
        "2A",
        "4A",
        "8A",
        "16A",
        "1B",
        "2B",
        "4C",
        "8C",
        "16C",
        "1Q",
        "2Q",
        "4Q",
        "8Q",
        "16Q",
    ]
}


VF0 = PciAddress.parse("0000:08:00.4")


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return default_catalog()


def _file(tmp_path: Path, model: str, address: str, vgpus: dict[str, str]) -> Path:
    lines = "".join(f'            "{vf}": {profile}\n' for vf, profile in vgpus.items())
    path = tmp_path / "desired.yaml"
    path.write_text(
        HEADER
        + "spec:\n  nodes:\n    n1:\n      gpus:\n"
        + f'        - address: "{address}"\n          model: {model}\n'
        + "          sriov: enabled\n          vgpus:\n"
        + lines
    )
    return path


def _problems(path: Path, catalog: Catalog) -> list[str]:
    with pytest.raises(ValidationError) as raised:
        load_desired([path], catalog=catalog, strict=True)
    return [str(p) for p in raised.value.problems]


def test_the_a2_is_the_model_listed_in_full_and_its_list_is_the_drivers(catalog: Catalog) -> None:
    whole = [m for m in catalog.models if m.profiles_complete]
    assert [m.name for m in whole] == ["NVIDIA A2"]
    assert {p.name for p in whole[0].profiles} == A2_TYPES


def test_a_typo_of_an_a2_profile_is_an_error_with_the_name_meant(
    catalog: Catalog, tmp_path: Path
) -> None:
    path = _file(tmp_path, "NVIDIA A2", "0000:08:00.0", {"0000:08:00.4": "NVIDIA A2-4QQ"})
    assert _problems(path, catalog) == [
        f"{path}:12:13: unknown profile 'NVIDIA A2-4QQ': not one of NVIDIA A2's, which the "
        "catalogue lists in full; did you mean 'NVIDIA A2-4Q'? (--lenient accepts a name a "
        "newer driver adds)"
    ]


def test_a_name_of_no_known_shape_on_an_a2_is_an_error_too(
    catalog: Catalog, tmp_path: Path
) -> None:
    """``A2-4O`` (a letter O for a Q) does not parse as a profile name; the GPU's ``model``
    says it is an A2, whose names are all known."""
    path = _file(tmp_path, "NVIDIA A2", "0000:08:00.0", {"0000:08:00.4": "A2-4O"})
    assert _problems(path, catalog) == [
        f"{path}:12:13: unknown profile 'A2-4O': not one of NVIDIA A2's, which the catalogue "
        "lists in full; did you mean 'NVIDIA A2-4Q'? (--lenient accepts a name a newer driver "
        "adds)"
    ]


def test_a_size_the_a2_does_not_have_is_answered_with_the_sizes_it_has(
    catalog: Catalog, tmp_path: Path
) -> None:
    path = _file(tmp_path, "NVIDIA A2", "0000:08:00.0", {"0000:08:00.4": "NVIDIA A2-3C"})
    assert _problems(path, catalog) == [
        f"{path}:12:13: unknown profile 'NVIDIA A2-3C': not one of NVIDIA A2's, which the "
        "catalogue lists in full; its C profiles are of 4, 8 and 16 GB (--lenient accepts a "
        "name a newer driver adds)"
    ]


def test_without_strict_the_same_names_are_a_note(catalog: Catalog, tmp_path: Path) -> None:
    path = _file(tmp_path, "NVIDIA A2", "0000:08:00.0", {"0000:08:00.4": "NVIDIA A2-4QQ"})
    desired = load_desired([path], catalog=catalog)
    assert dict(desired.nodes["n1"].gpus[0].vgpus or {}) == {VF0: "NVIDIA A2-4QQ"}
    assert desired.notes == (
        "the catalogue does not know 1 name, accepted as written: plan checks it against what "
        "the host offers\n"
        f"  {path}:12:13: 'NVIDIA A2-4QQ' (NVIDIA A2 is listed with A2-1A 2A 4A 8A 16A 1B 2B "
        "4C 8C 16C 1Q 2Q 4Q 8Q 16Q)",
    )


def test_a_model_not_listed_in_full_keeps_the_note_when_strict(
    catalog: Catalog, tmp_path: Path
) -> None:
    """The L40S's list was not checked to be whole: a name it lacks may be a newer driver's."""
    path = _file(tmp_path, "NVIDIA L40S", "0000:09:00.0", {"0000:09:00.4": "NVIDIA L40S-5Q"})
    desired = load_desired([path], catalog=catalog, strict=True)
    assert dict(desired.nodes["n1"].gpus[0].vgpus or {}) == {
        PciAddress.parse("0000:09:00.4"): "NVIDIA L40S-5Q"
    }
    assert len(desired.notes) == 1 and "'NVIDIA L40S-5Q'" in desired.notes[0]


def test_a_known_a2_profile_passes_strict(catalog: Catalog, tmp_path: Path) -> None:
    path = _file(tmp_path, "NVIDIA A2", "0000:08:00.0", {"0000:08:00.4": "NVIDIA A2-4Q"})
    desired = load_desired([path], catalog=catalog, strict=True)
    assert desired.notes == ()
