"""The observer's pure parsers on captured sysfs text (``tests/fixtures/sysfs/``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reconciler.catalog import default_catalog, parse_profile_name
from reconciler.model import ObserveError
from reconciler.observe.parse import (
    is_mdev_uuid,
    is_nvidia_sriov_gpu,
    link_basename,
    parse_class,
    parse_creatable_types,
    parse_description,
    parse_device_number,
    parse_framebuffer,
    parse_hex_id,
    parse_int,
    parse_type_name,
    type_id_order,
    virtfn_index,
    virtfn_links,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs"


def grep_lines(path: Path) -> dict[str, str]:
    """``file:value`` lines of a ``grep -H .`` capture, comments and links skipped."""
    values = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#") and " -> " not in line:
            key, _, value = line.partition(":")
            values[key] = value + "\n"  # the kernel ends every attribute with a newline
    return values


def type_files(fixture: str, file: str) -> dict[str, str]:
    """type id → content of one file (``name``, ``description``…) of an mdev-types capture."""
    return {
        key.partition("/")[0]: value
        for key, value in grep_lines(FIXTURES / "mdev-types" / fixture).items()
        if key.endswith(f"/{file}")
    }


# --- ids, numbers, classes ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0x10de\n", "10de"), ("0x25B6\n", "25b6"), ("25b6\n", "25b6"), ("0\n", "0000")],
)
def test_hex_ids(text: str, expected: str) -> None:
    assert parse_hex_id(text) == expected


@pytest.mark.parametrize("text", ["", "\n", "0x", "nvidia", "0x10de 0x10de", "-1"])
def test_malformed_hex_id_names_its_file(text: str) -> None:
    with pytest.raises(ObserveError, match=r"^/sys/x/vendor: expected a hexadecimal PCI id"):
        parse_hex_id(text, source="/sys/x/vendor")


def test_counts() -> None:
    assert parse_int("16\n") == 16
    assert parse_int("0") == 0
    for bad in ("", "-1", "1.5", "0x10", "sixteen"):
        with pytest.raises(ObserveError, match="sriov_totalvfs: expected a non-negative decimal"):
            parse_int(bad, source="sriov_totalvfs")


def test_pci_attributes_of_captured_functions() -> None:
    a2 = grep_lines(FIXTURES / "pci" / "a2-pf.txt")
    assert parse_hex_id(a2["vendor"]) == "10de"
    assert parse_hex_id(a2["device"]) == "25b6"
    assert parse_class(a2["class"]) == 0x030200
    assert parse_int(a2["sriov_totalvfs"]) == 16
    assert parse_hex_id(a2["sriov_vf_device"]) == "25b6"  # printed without 0x
    assert parse_class(grep_lines(FIXTURES / "pci" / "ga102-audio.txt")["class"]) == 0x040300
    with pytest.raises(ObserveError, match="PCI class"):
        parse_class("VGA\n")


def pf_verdict(fixture: str) -> bool:
    text = (FIXTURES / "pci" / fixture).read_text()
    values = grep_lines(FIXTURES / "pci" / fixture)
    return is_nvidia_sriov_gpu(
        parse_hex_id(values["vendor"]),
        parse_class(values["class"]),
        "physfn -> " in text,
        parse_int(values["sriov_totalvfs"]) if "sriov_totalvfs" in values else None,
    )


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        ("a2-pf.txt", True),
        ("l40s-pf.txt", True),
        # totalvfs 16, sriov_vf_device 0: it never makes vGPU VFs, but it is listed, so that a
        # desired state naming it is told why nothing happens (not that it is missing).
        ("t4-pf.txt", True),
        ("a2-vf.txt", False),  # a VF (physfn)
        ("ga102-audio.txt", False),  # NVIDIA, but an audio function
        ("x710-pf.txt", False),  # SR-IOV, but Intel
        ("x710-vf.txt", False),
    ],
)
def test_which_functions_are_nvidia_sriov_gpus(fixture: str, expected: bool) -> None:
    assert pf_verdict(fixture) is expected


def test_sriov_gpu_rule_edges() -> None:
    assert is_nvidia_sriov_gpu("10de", 0x030000, False, 16)  # VGA class counts too
    assert not is_nvidia_sriov_gpu("10de", 0x030200, False, 0)
    assert not is_nvidia_sriov_gpu("10de", 0x030200, False, None)
    assert not is_nvidia_sriov_gpu("10de", 0x030200, True, 16)
    assert not is_nvidia_sriov_gpu("10de", 0x038000, False, 16)  # "other display"
    assert not is_nvidia_sriov_gpu("8086", 0x030000, False, 16)


# --- the vendor-specific VFIO interface -------------------------------------------------------

L40S_CREATABLE = (
    Path(__file__).resolve().parents[1]
    / "fixtures/hosts/harvester-l40s-vfio/nvidia/creatable_vgpu_types"
)


def test_creatable_types_of_a_real_l40s_vf() -> None:
    """Harvester's capture of an idle L40S VF: 23 types, ids 1145-1166 and 2164 (L40S-3B)."""
    entries, bad = parse_creatable_types(L40S_CREATABLE.read_text())
    assert bad == []
    assert len(entries) == 23
    assert entries[0] == ("1145", "NVIDIA L40S-1B")
    assert entries[2] == ("1147", "NVIDIA L40S-1Q")
    assert entries[11] == ("1156", "NVIDIA L40S-48Q")
    assert entries[-1] == ("2164", "NVIDIA L40S-3B")
    assert [int(i) for i, _ in entries[:-1]] == list(range(1145, 1167))


def test_creatable_types_header_only_means_nothing_creatable() -> None:
    assert parse_creatable_types("ID    : vGPU Name\n") == ([], [])
    assert parse_creatable_types("") == ([], [])


def test_creatable_types_keep_what_they_cannot_read() -> None:
    text = "ID    : vGPU Name\n1147  : NVIDIA L40S-1Q\ngarbage line\n: no id\n12a : x\n"
    entries, bad = parse_creatable_types(text)
    assert entries == [("1147", "NVIDIA L40S-1Q")]
    assert bad == ["garbage line", ": no id", "12a : x"]


def test_creatable_types_keep_names_of_several_words_and_refuse_non_resource_names() -> None:
    """Several words stay whole; a name that could not become a Kubernetes resource name (a
    colon, a control character, 64 characters and more) is a line vgpuctl cannot read."""
    long = "NVIDIA " + "A" * 57  # 64 characters
    text = (
        "ID    : vGPU Name\n1519  : NVIDIA RTX Pro 6000 Blackwell DC-3Q\n9 : Odd: name\n"
        f"10 : NVIDIA A2-4Q\x1b[2K\n11 : {long}\n12 : {long[:-1]}\n13 : -NVIDIA\n"
    )
    entries, bad = parse_creatable_types(text)
    assert entries == [("1519", "NVIDIA RTX Pro 6000 Blackwell DC-3Q"), ("12", long[:-1])]
    assert bad == ["9 : Odd: name", "10 : NVIDIA A2-4Q\x1b[2K", f"11 : {long}", "13 : -NVIDIA"]


def test_device_numbers() -> None:
    assert parse_device_number("238:0\n") == os.makedev(238, 0)
    assert parse_device_number("511:7") == os.makedev(511, 7)
    for bad in ("238", "a:b", "238:-1", ""):
        with pytest.raises(ObserveError, match="device number"):
            parse_device_number(bad, source="dev")


# --- virtfn links, type ids, uuids ----------------------------------------------------------


def test_virtfn_index() -> None:
    assert virtfn_index("virtfn12") == 12
    assert virtfn_index("virtfn0") == 0
    for other in ("virtfn", "virtfnx", "physfn", "sriov_numvfs", "xvirtfn1", "virtfn1a"):
        assert virtfn_index(other) is None


def test_virtfn_links_are_in_numeric_order() -> None:
    names = ["driver", *sorted(f"virtfn{i}" for i in range(16)), "sriov_numvfs"]
    assert names[1:5] == ["virtfn0", "virtfn1", "virtfn10", "virtfn11"]  # what a glob gives
    assert virtfn_links(names) == [(i, f"virtfn{i}") for i in range(16)]


def test_type_ids_sort_numerically() -> None:
    ids = list(type_files("grid-p40.txt", "name"))
    assert ids[:4] == ["nvidia-156", "nvidia-215", "nvidia-241", "nvidia-46"]  # text order
    assert sorted(ids, key=type_id_order) == [
        "nvidia-46",
        "nvidia-47",
        "nvidia-48",
        "nvidia-62",
        "nvidia-156",
        "nvidia-215",
        "nvidia-241",
    ]


def test_mdev_uuid() -> None:
    assert is_mdev_uuid("dd6772a8-7db8-4e96-9a73-f94c389d9bc3")
    for other in ("mdev_supported_types", "power", "DD6772A8-7DB8-4E96-9A73-F94C389D9BC3", ""):
        assert not is_mdev_uuid(other)


def test_link_basename() -> None:
    assert link_basename("../../../../bus/pci/drivers/nvidia") == "nvidia"
    assert link_basename("../../../../kernel/iommu_groups/45\n".strip()) == "45"


# --- type names and descriptions -----------------------------------------------------------


@pytest.mark.parametrize("fixture", ["a2-vf.txt", "l40s-vf.txt", "grid-p40.txt", "grid-t4.txt"])
def test_every_captured_type_parses(fixture: str) -> None:
    names = type_files(fixture, "name")
    descriptions = type_files(fixture, "description")
    assert names.keys() == descriptions.keys()
    for type_id, text in descriptions.items():
        d = parse_description(text, source=f"{type_id}/description")
        name = parse_type_name(names[type_id])
        profile = parse_profile_name(name)
        # The size in the name (…-4Q: 4 GB) is the framebuffer the description states.
        if profile is not None:
            assert d.framebuffer_mib == profile.size_gb * 1024, name
        assert d.max_instance >= 1
        assert d.num_heads >= 1
        assert d.extra == {}


@pytest.mark.parametrize(("fixture", "model"), [("a2-vf.txt", "A2"), ("l40s-vf.txt", "L40S")])
def test_descriptions_agree_with_the_catalogue(fixture: str, model: str) -> None:
    gpu = default_catalog().model(model)
    assert gpu is not None
    names = type_files(fixture, "name")
    for type_id, text in type_files(fixture, "description").items():
        profile = gpu.profile(parse_type_name(names[type_id]))
        assert profile is not None
        d = parse_description(text)
        assert (d.framebuffer_mib, d.max_instance) == (
            profile.framebuffer_mib,
            profile.max_instances,
        )


def test_description_fields() -> None:
    d = parse_description(
        "num_heads=4, frl_config=60, framebuffer=4096M, max_resolution=7680x4320, max_instance=4\n"
    )
    assert (d.num_heads, d.frl_config, d.framebuffer_mib) == (4, 60, 4096)
    assert (d.max_resolution, d.max_instance) == ("7680x4320", 4)


def test_description_with_gigabytes_and_unknown_keys() -> None:
    d = parse_description("framebuffer=16G, max_instance=1, gpu_instance_size=8, encoder=on\n")
    assert d.framebuffer_mib == 16384
    assert d.max_instance == 1
    assert (d.num_heads, d.frl_config, d.max_resolution) == (0, 0, "")
    assert dict(d.extra) == {"gpu_instance_size": "8", "encoder": "on"}


@pytest.mark.parametrize(("text", "mib"), [("4096M", 4096), ("2G", 2048), ("48GB", 49152)])
def test_framebuffer_sizes(text: str, mib: int) -> None:
    assert parse_framebuffer(text) == mib


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "missing framebuffer and max_instance"),
        ("num_heads=4, frl_config=60, max_instance=4", "missing framebuffer"),
        ("num_heads=4, framebuffer=4096M", "missing max_instance"),
        ("num_heads=4, frl_config, framebuffer=4096M, max_instance=4", "malformed entry"),
        ("=4, framebuffer=4096M, max_instance=4", "malformed entry"),
        ("framebuffer=4096K, max_instance=4", "framebuffer: expected a size"),
        ("framebuffer=4096, max_instance=4", "framebuffer: expected a size"),
        ("framebuffer=4096M, max_instance=four", "max_instance: expected a decimal"),
        ("framebuffer=4096M, max_instance=4, num_heads=-1", "num_heads: expected a decimal"),
    ],
)
def test_malformed_description_names_its_file(text: str, problem: str) -> None:
    source = "/sys/devices/pci0000:00/0000:08:00.4/mdev_supported_types/nvidia-745/description"
    with pytest.raises(ObserveError, match=problem) as caught:
        parse_description(text, source=source)
    assert caught.value.message.startswith(f"{source}: ")
    assert "\n" not in caught.value.message


def test_type_names_keep_their_spelling() -> None:
    assert parse_type_name("GRID T4-2Q\n") == "GRID T4-2Q"
    assert parse_type_name("NVIDIA A2-4Q\n") == "NVIDIA A2-4Q"
    assert type_files("grid-t4.txt", "name")["nvidia-231"] == "GRID T4-2Q\n"
    with pytest.raises(ObserveError, match="empty vGPU type name"):
        parse_type_name("\n", source="name")
    for hostile in ("NVIDIA A2-4Q\x1b[1A", "A2 'x'", "x" * 64, "NVIDIA A2-4Q.", "А2-4Q"):
        with pytest.raises(ObserveError, match=r"^name: not a vGPU type name"):
            parse_type_name(hostile + "\n", source="name")
    assert parse_type_name("x" * 63) == "x" * 63
