"""The kubelet device-plugin checkpoint parser, on captured-format fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.model import ObserveError
from reconciler.observe.checkpoint import (
    CheckpointEntry,
    checkpoint_file,
    parse_checkpoint,
    read_checkpoint,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoint"
SRC = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"


def parse(name: str) -> list[CheckpointEntry]:
    return parse_checkpoint((FIXTURES / name).read_text(), source=name)


def test_current_format_maps_numa_nodes_to_ids() -> None:
    entries = parse("kubelet-1.29-numa-map.json")
    assert [e.resource_name for e in entries] == [
        "devices.kubevirt.io/kvm",
        "devices.kubevirt.io/tun",
        "nvidia.com/NVIDIA_A2-4Q",
        "nvidia.com/NVIDIA_A2-4A",
    ]
    vgpu = entries[2]
    assert vgpu == CheckpointEntry(
        pod_uid="6f1c2a9e-4b1d-4f3e-9a51-2d0c7e8b1a11",
        container="compute",
        resource_name="nvidia.com/NVIDIA_A2-4Q",
        device_ids=("9b4a6c1e-2f0d-5e3a-8c7b-1d2e3f4a5b6c",),
    )
    # A NUMA node whose list is null contributes nothing.
    assert entries[3].device_ids == ("3c2b1a09-8f7e-5d6c-b5a4-39281706f5e4",)


def test_old_format_plain_list() -> None:
    (entry,) = parse("kubelet-1.19-plain-list.json")
    assert entry.resource_name == "nvidia.com/GRID_T4-2Q"
    assert entry.device_ids == (
        "5e6f7a8b-1c2d-4e3f-9a0b-1c2d3e4f5a6b",
        "6f7a8b9c-2d3e-4f5a-8b1c-2d3e4f5a6b7c",
    )


def test_no_allocations_is_an_empty_list() -> None:
    assert parse("no-allocations.json") == []


def test_numa_nodes_in_numeric_order_and_ids_once() -> None:
    text = (
        '{"Data":{"PodDeviceEntries":[{"PodUID":"p","ContainerName":"c","ResourceName":"r",'
        '"DeviceIDs":{"10":["c"],"2":["b","a"],"-1":["z"],"3":["b"]}}]},"Checksum":1}'
    )
    (entry,) = parse_checkpoint(text, source=SRC)
    assert entry.device_ids == ("z", "b", "a", "c")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "invalid JSON at line 1 column 1"),
        ("[]", "the top level is a list, not an object"),
        ('{"Checksum": 1}', 'no "Data" object'),
        ('{"Data": "x"}', '"Data" is a string'),
        ('{"Data": {"PodDeviceEntries": {}}}', '"PodDeviceEntries" is an object, not a list'),
        ('{"Data": {"PodDeviceEntries": [1]}}', "PodDeviceEntries[0] is a number, not an object"),
        (
            '{"Data": {"PodDeviceEntries": [{"PodUID": "", "ContainerName": "c"}]}}',
            "PodDeviceEntries[0].PodUID is a string, not a non-empty string",
        ),
        (
            '{"Data": {"PodDeviceEntries": [{"PodUID": "p", "ContainerName": "c",'
            ' "ResourceName": "r", "DeviceIDs": "abc"}]}}',
            "PodDeviceEntries[0].DeviceIDs is a string, not a list or a map",
        ),
    ],
)
def test_malformed_names_the_file_and_the_problem(text: str, why: str) -> None:
    with pytest.raises(ObserveError) as err:
        parse_checkpoint(text, source=SRC)
    assert err.value.message.startswith(f"{SRC}: not a kubelet device-plugin checkpoint: ")
    assert why in err.value.message
    assert "\n" not in err.value.message


@pytest.mark.parametrize("name", ["truncated.json", "wrong-shape.json"])
def test_malformed_fixtures(name: str) -> None:
    with pytest.raises(ObserveError, match=f"^{name}: not a kubelet device-plugin checkpoint"):
        parse(name)


def install(kubelet: Path, fixture: str) -> Path:
    path = checkpoint_file(kubelet)
    path.parent.mkdir(parents=True)
    path.write_bytes((FIXTURES / fixture).read_bytes())
    return path


def test_read_checkpoint_reads_the_kubelet_file(tmp_path: Path) -> None:
    install(tmp_path, "kubelet-1.29-numa-map.json")
    entries = read_checkpoint(tmp_path)
    assert entries is not None
    assert len(entries) == 4


def test_missing_checkpoint_is_none_not_an_error(tmp_path: Path) -> None:
    assert read_checkpoint(tmp_path) is None
    assert read_checkpoint(tmp_path / "no-such-kubelet-dir") is None


def test_malformed_checkpoint_names_the_real_path(tmp_path: Path) -> None:
    path = install(tmp_path, "truncated.json")
    with pytest.raises(ObserveError, match=f"^{path}: not a kubelet device-plugin checkpoint"):
        read_checkpoint(tmp_path)


def test_binary_garbage_is_not_a_traceback(tmp_path: Path) -> None:
    path = checkpoint_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ObserveError, match="not UTF-8 text"):
        read_checkpoint(tmp_path)


def test_unreadable_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = install(tmp_path, "no-allocations.json")
    real_open = Path.open

    def refuse(self: Path, *args: object, **kw: object) -> object:
        if self == path:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(self, *args, **kw)  # type: ignore[call-overload]

    # Root reads files whatever their mode: make the kernel's answer explicit instead.
    monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(ObserveError, match=f"^cannot read {path}: permission denied"):
        read_checkpoint(tmp_path)


def test_checkpoint_that_is_a_directory(tmp_path: Path) -> None:
    checkpoint_file(tmp_path).mkdir(parents=True)
    with pytest.raises(ObserveError, match="cannot read"):
        read_checkpoint(tmp_path)
