"""The record of the vfio types vgpuctl configured (``<state_dir>/<node>.vfio-types.json``):
the running driver's entries only, untrusted input read with bounds, never a link followed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from reconciler.apply.typerecord import MAX_BYTES, TypeRecord, driver_version
from reconciler.model import ApplyError, PciAddress

GPU = PciAddress.parse("0000:08:00.0")
OTHER = PciAddress.parse("0000:41:00.0")
NODE = "node-a"


def record(tmp_path: Path, driver: str = "550.127.06") -> TypeRecord:
    return TypeRecord(tmp_path / "state", NODE, driver=driver)


def test_what_is_added_is_read_back_for_the_same_driver(tmp_path: Path) -> None:
    r = record(tmp_path)
    assert r.read().names == {}
    r.add(GPU, "1156", "NVIDIA L40S-48Q")
    r.add(OTHER, "745", "NVIDIA A2-4Q")
    path = tmp_path / "state" / f"{NODE}.vfio-types.json"
    written = os.stat(path)
    r.add(GPU, "1156", "NVIDIA L40S-48Q")  # once only: the file is not even rewritten
    assert os.stat(path).st_ino == written.st_ino
    assert record(tmp_path).read().names == {
        (GPU, "1156"): "NVIDIA L40S-48Q",
        (OTHER, "745"): "NVIDIA A2-4Q",
    }
    doc = json.loads((tmp_path / "state" / f"{NODE}.vfio-types.json").read_text())
    assert doc == {
        "formatVersion": 1,
        "types": [
            {
                "driver": "550.127.06",
                "gpu": "0000:08:00.0",
                "id": "1156",
                "name": "NVIDIA L40S-48Q",
            },
            {"driver": "550.127.06", "gpu": "0000:41:00.0", "id": "745", "name": "NVIDIA A2-4Q"},
        ],
    }
    assert os.stat(tmp_path / "state" / f"{NODE}.vfio-types.json").st_mode & 0o777 == 0o600


def test_another_drivers_ids_name_nothing(tmp_path: Path) -> None:
    """Type ids are a driver branch's (docs/domain.md §4): after an update, the old ids mean
    nothing, and must not name a type in use."""
    record(tmp_path, "535.54.06").add(GPU, "1156", "NVIDIA L40S-48Q")
    assert record(tmp_path, "550.127.06").read().names == {}
    assert record(tmp_path, "535.54.06").read().names == {(GPU, "1156"): "NVIDIA L40S-48Q"}


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b'{"formatVersion": 2, "types": []}',
        b'{"formatVersion": 1, "types": {}}',
        b'{"formatVersion": 1, "types": [{"driver": "1", "gpu": "08:00.0", "id": "1", '
        b'"name": "NVIDIA A2-4Q"}]}',
        b'{"formatVersion": 1, "types": [{"driver": "1", "gpu": "0000:08:00.0", "id": "-1", '
        b'"name": "NVIDIA A2-4Q"}]}',
        b'{"formatVersion": 1, "types": [{"driver": "1", "gpu": "0000:08:00.0", "id": "1", '
        b'"name": "\\u001b[31mred"}]}',
        b'{"formatVersion": 1, "types": [{"driver": 1, "gpu": "0000:08:00.0", "id": "1", '
        b'"name": "NVIDIA A2-4Q"}]}',
    ],
)
def test_a_malformed_record_names_nothing_and_says_so(tmp_path: Path, body: bytes) -> None:
    r = record(tmp_path, "1")
    r.add(OTHER, "7", "NVIDIA A2-4Q")  # makes the directory as vgpuctl would
    r.path.write_bytes(body)
    read = r.read()
    assert read.names == {}
    assert read.note is not None and str(r.path) in read.note and "malformed" in read.note
    # A later add replaces it whole.
    r.add(GPU, "1", "NVIDIA A2-4Q")
    assert r.read().names == {(GPU, "1"): "NVIDIA A2-4Q"}


def test_a_record_too_large_is_not_read(tmp_path: Path) -> None:
    r = record(tmp_path)
    r.add(GPU, "1", "NVIDIA A2-4Q")
    r.path.write_bytes(b" " * (MAX_BYTES + 1))
    read = r.read()
    assert read.names == {}
    assert read.note is not None and "larger than" in read.note


def test_a_link_in_its_place_is_never_followed(tmp_path: Path) -> None:
    r = record(tmp_path)
    r.add(GPU, "1", "NVIDIA A2-4Q")
    target = tmp_path / "elsewhere.json"
    target.write_text("precious\n")
    r.path.unlink()
    r.path.symlink_to(target)
    read = r.read()
    assert read.names == {}
    assert read.note is not None and "symbolic link" in read.note
    with pytest.raises(ApplyError, match="symbolic link"):
        r.add(GPU, "2", "NVIDIA A2-8Q")
    assert target.read_text() == "precious\n"


def test_the_driver_version_is_read_from_sysfs(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    (root / "module" / "nvidia").mkdir(parents=True)
    assert driver_version(root) == ""
    (root / "module" / "nvidia" / "version").write_text("550.127.06\n")
    assert driver_version(root) == "550.127.06"
    (root / "module" / "nvidia" / "version").write_text("550\x1b[31m\n")
    assert driver_version(root) == ""
