"""The vgpu-device-manager import (``desired/vgpu_device_manager.py``) and ``match: {all: true}``.

Expected node groups are written by hand from vgpu-device-manager's Go source (commit acb7270):
a config is selected by the node label ``nvidia.com/vgpu.config`` (cmd/nvidia-k8s-vgpu-dm);
``devices: all`` is every GPU, ``devices: [i]`` the i-th NVIDIA GPU in PCI address order
(cmd/nvidia-vgpu-dm/assert WalkSelectedVGPUConfigForEachGPU, go-nvlib nvpci.GetGPUs); a device
filter ``0x25B610DE`` is device 25b6 of vendor 10de (pkg/types/device.go). Model facts from
docs/domain.md §4: A2 and A16 share 10de:25b6 (subsystem 157e = A2, 14a9 = A16).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.desired import load_desired
from reconciler.desired.source import parse_text, read_document
from reconciler.desired.vgpu_device_manager import convert
from reconciler.model import PciAddress, ValidationError
from reconciler.plan import resolve_groups
from tests.gpus import CATALOG, card

FIXTURES = Path(__file__).parents[1] / "fixtures" / "vgpu-device-manager"
T4 = FIXTURES / "config-t4.yaml"
EXAMPLE = FIXTURES / "config-example.yaml"


def _convert(path: Path, **kwargs: object):  # type: ignore[no-untyped-def]
    document, problems = read_document(path)
    assert document is not None and problems == []
    return convert(document, catalog=CATALOG, **kwargs)  # type: ignore[arg-type]


def _all(profile: str, count: int) -> dict[str, object]:
    return {"match": {"all": True}, "sriov": "enabled", "profiles": {profile: count}}


def _group(name: str, label: str, *gpus: dict[str, object]) -> dict[str, object]:
    return {
        "name": name,
        "selector": {"labels": {"nvidia.com/vgpu.config": label}},
        "gpus": list(gpus),
    }


def test_the_t4_example_converts_devices_all_and_refuses_indices_without_addresses() -> None:
    conversion = _convert(T4)
    assert list(conversion.groups) == [
        _group("t4-1q", "T4-1Q", _all("NVIDIA T4-1Q", 16)),
        _group("t4-2q", "T4-2Q", _all("NVIDIA T4-2Q", 8)),
        _group("t4-4q", "T4-4Q", _all("NVIDIA T4-4Q", 4)),
        _group("t4-8q", "T4-8Q", _all("NVIDIA T4-8Q", 2)),
        _group("t4-16q", "T4-16Q", _all("NVIDIA T4-16Q", 1)),
    ]
    # Each rename names where the config is and both names.
    assert conversion.renames[0] == (
        f"{T4}:4:3: config 'T4-1Q' is node group 't4-1q' (group names are lower-case letters, "
        "digits, '-' and '.')"
    )
    assert len(conversion.renames) == 5
    # T4-small, T4-medium, T4-large: each entry's index refused (two each), then the config.
    assert len(conversion.refusals) == 9
    assert conversion.refusals[0].startswith(f"{T4}:31:16: refused: GPU index 0: ")
    assert "--gpu-address INDEX=ADDRESS" in conversion.refusals[0]
    assert conversion.refusals[2] == (
        f"{T4}:31:5: refused: config 'T4-small': no entry of it could be converted"
    )


def test_gpu_indices_become_the_addresses_given() -> None:
    first, second = PciAddress.parse("0000:08:00.0"), PciAddress.parse("0000:09:00.0")
    conversion = _convert(T4, gpu_addresses={0: first, 1: second}, only=["T4-large"])
    assert list(conversion.groups) == [
        _group(
            "t4-large",
            "T4-large",
            {
                "match": {"address": "0000:08:00.0"},
                "sriov": "enabled",
                "profiles": {"NVIDIA T4-8Q": 2},
            },
            {
                "match": {"address": "0000:09:00.0"},
                "sriov": "enabled",
                "profiles": {"NVIDIA T4-16Q": 1},
            },
        )
    ]
    assert conversion.refusals == ()


def test_the_example_default_config_matches_by_device_id_and_by_model_where_ids_are_shared() -> (
    None
):
    conversion = _convert(EXAMPLE)
    assert len(conversion.groups) == 711  # every config of the file
    by_name = {g["name"]: g for g in conversion.groups}
    assert by_name["a2-4q"] == _group("a2-4q", "A2-4Q", _all("NVIDIA A2-4Q", 4))
    # The catalogue spells the A100 80GB's profiles with GRID.
    assert by_name["a100d-40c"] == _group("a100d-40c", "A100D-40C", _all("GRID A100D-40C", 2))
    assert by_name["rtx6000-ada-24q"]["gpus"] == [_all("NVIDIA RTX6000-Ada-24Q", 2)]
    default = by_name["default"]
    assert default["selector"] == {"labels": {"nvidia.com/vgpu.config": "default"}}
    gpus = default["gpus"]
    # 56 filters; the two 0x1E7810DE entries (RTX8000P, RTX6000P) refused.
    assert len(gpus) == 54
    entry = {str(sorted(g["match"].items())): g["profiles"] for g in gpus}
    assert entry["[('deviceId', '2236')]"] == {"NVIDIA A10-12Q": 2}  # 0x223610DE
    assert entry["[('deviceId', '26b9')]"] == {"NVIDIA L40S-24Q": 2}  # 0x26B910DE
    assert entry["[('deviceId', '20b5')]"] == {"GRID A100D-40C": 2}  # 0x20B510DE
    assert entry["[('deviceId', '1eb8')]"] == {"NVIDIA T4-8Q": 2}  # 0x1EB810DE
    # 0x25B610DE twice: the A16's entry and the A2's, told apart by the model each names.
    assert entry["[('model', 'NVIDIA A16')]"] == {"NVIDIA A16-8Q": 2}
    assert entry["[('model', 'NVIDIA A2')]"] == {"NVIDIA A2-8Q": 2}
    assert not any("25b6" in key or "1e78" in key for key in entry)
    (refusal,) = conversion.refusals
    assert refusal.startswith(
        f"{EXAMPLE}:2844:9: refused: the entries at line 2868 (RTX8000P) and line 2872 "
        "(RTX6000P) match the same GPUs (deviceId 1e78)"
    )
    assert any("DEFAULT_VGPU_CONFIG" in note for note in conversion.notes)


def test_the_converted_example_loads_and_picks_each_gpus_entry(tmp_path: Path) -> None:
    """Round trip: the documents load as a desired state, and a node labelled 'default'
    with an A2, an A16 and an A10 gets the A2's, the A16's and the A10's entries."""
    import yaml

    conversion = _convert(EXAMPLE)
    paths = []
    for n, doc in enumerate(conversion.documents("vdm")):
        assert len(doc["spec"]["nodeGroups"]) <= 256
        path = tmp_path / f"{n}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        paths.append(path)
    assert len(paths) == 3  # 711 groups: 256 + 256 + 199
    desired = load_desired(paths, catalog=CATALOG)
    node = desired.node("n1", {"nvidia.com/vgpu.config": "default"})
    assert node is not None
    a2 = card("A2", PciAddress.parse("0000:08:00.0"), enabled=False)
    a16 = card("A16", PciAddress.parse("0000:09:00.0"), enabled=False)
    a10 = card("A10", PciAddress.parse("0000:41:00.0"), enabled=False)
    from reconciler.model import Inventory

    resolved = resolve_groups(node, Inventory("n1", (a2, a16, a10)))
    assert {str(g.address): dict(g.profiles or {}) for g in resolved.gpus} == {
        "0000:08:00.0": {"NVIDIA A2-8Q": 2},
        "0000:09:00.0": {"NVIDIA A16-8Q": 2},
        "0000:41:00.0": {"NVIDIA A10-12Q": 2},
    }


def _text(text: str, **kwargs: object):  # type: ignore[no-untyped-def]
    document, problems = parse_text(text, file="c.yaml")
    assert document is not None and problems == []
    return convert(document, catalog=CATALOG, **kwargs)  # type: ignore[arg-type]


ONE = "version: v1\nvgpu-configs: {a: [{devices: all, vgpu-devices: {}}]}\n"
HEAD = "version: v1\nvgpu-configs:\n  a:\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (ONE.replace("v1", "v2"), "c.yaml:1:10: 'version' must be v1"),
        ("version: v1\nvgpu-configs: {}\n", "c.yaml:2:15: 'vgpu-configs' must be a mapping"),
        (ONE.replace("\n", "\nextra: 1\n", 1), "c.yaml:2:1: unexpected field 'extra'"),
        (
            HEAD + "    - vgpu-devices: {A2-4Q: 4}\n",
            "c.yaml:4:7: missing required field 'devices'",
        ),
        (
            HEAD + "    - devices: some\n      vgpu-devices: {A2-4Q: 4}\n",
            "c.yaml:4:16: 'devices' is 'all' or a list",
        ),
        (
            HEAD + "    - devices: all\n      vgpu-devices: {A2-4Q: 0}\n",
            "c.yaml:5:29: 'A2-4Q': the count must be",
        ),
        (
            HEAD + "    - devices: all\n      vgpu-devices: {A2 4Q: 1}\n",
            "c.yaml:5:22: invalid vGPU type 'A2 4Q'",
        ),
        (
            HEAD + "    - devices: all\n      vgpu-devices: {A30-4C: 1, A30-1-6C: 1}\n",
            "c.yaml:5:21: time-sliced and MIG-backed",
        ),
        (
            "apiVersion: v1\nkind: ConfigMap\ndata:\n  config.yaml: |\n    version: v1\n",
            "c.yaml:2:7: a ConfigMap, not the config it holds: take its config.yaml out first",
        ),
        (
            HEAD + "    - device-filter: 25B610DE\n      devices: all\n"
            "      vgpu-devices: {A2-4Q: 4}\n",
            "c.yaml:4:22: device filter '25B610DE' is not",
        ),
    ],
)
def test_a_file_vgpu_device_manager_would_refuse_is_a_located_error(
    text: str, expected: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        _text(text)
    assert any(line.startswith(expected) for line in caught.value.lines()), caught.value.lines()


def test_what_vgpuctl_cannot_say_is_refused_with_the_reason() -> None:
    conversion = _text(
        """version: v1
vgpu-configs:
  overlap:
    - devices: all
      vgpu-devices: {A2-4Q: 4}
    - devices: [1]
      vgpu-devices: {A2-8Q: 2}
  unsaid:
    - device-filter: "0x25B610DE"
      devices: all
      vgpu-devices: {}
  amd:
    - device-filter: "0x740F1002"
      devices: all
      vgpu-devices: {A2-4Q: 4}
  with-subsystem:
    - device-filter: "0x25B610DE:0x14A910DE"
      devices: all
      vgpu-devices: {A16-4Q: 4}
  "has space":
    - devices: all
      vgpu-devices: {A2-4Q: 4}
""",
        gpu_addresses={1: PciAddress.parse("0000:09:00.0")},
    )
    assert conversion.refusals[0] == (
        "c.yaml:4:5: refused: the entries at line 4 and line 6 may both match one GPU and give "
        "it different layouts: vgpu-device-manager gives it the later one, and a node group "
        "cannot match 'all GPUs but these'; split them by device ID or GPU index "
        "(--gpu-address)"
    )
    assert conversion.refusals[2] == (
        "c.yaml:9:22: refused: device ID 25b6 is shared by NVIDIA A16 and NVIDIA A2, and the "
        "entry's vGPU types do not say which one it means"
    )
    assert conversion.refusals[4] == (
        "c.yaml:13:22: refused: device filter '0x740F1002' names vendor 1002, not NVIDIA (10de)"
    )
    assert conversion.refusals[6] == (
        "c.yaml:21:5: refused: config 'has space': no node can select it, as the label "
        "nvidia.com/vgpu.config's value must be at most 63 letters, digits, '-', '_' and '.', "
        "beginning and ending with a letter or digit"
    )
    assert len(conversion.refusals) == 7
    # A subsystem part names the model exactly: the A16 (subsystem 14a9).
    (group,) = conversion.groups
    assert group == _group(
        "with-subsystem",
        "with-subsystem",
        {"match": {"model": "NVIDIA A16"}, "sriov": "enabled", "profiles": {"NVIDIA A16-4Q": 4}},
    )


def test_a_later_entry_for_the_same_gpus_wins_and_the_earlier_is_dropped_and_said() -> None:
    conversion = _text(
        """version: v1
vgpu-configs:
  twice:
    - device-filter: ["0x223610DE"]
      devices: all
      vgpu-devices: {A10-4Q: 6}
    - device-filter: "0x223610DE"
      devices: all
      vgpu-devices: {A10-8Q: 3}
  no-filter:
    - device-filter: []
      devices: all
      vgpu-devices: {A10-8Q: 3}
"""
    )
    # An empty filter list filters nothing (helpers.go MatchesDeviceFilter): every GPU.
    assert conversion.groups[1]["gpus"] == [
        {"match": {"all": True}, "sriov": "enabled", "profiles": {"NVIDIA A10-8Q": 3}}
    ]
    (group,) = conversion.groups[:1]
    assert group["gpus"] == [
        {"match": {"deviceId": "2236"}, "sriov": "enabled", "profiles": {"NVIDIA A10-8Q": 3}}
    ]
    assert conversion.notes[0] == (
        "c.yaml:4:5: the entry at line 4 is dropped: the entry at line 7 matches the same GPUs "
        "and, applied after it, wins"
    )


def test_match_all_configures_every_gpu_of_the_node(tmp_path: Path) -> None:
    path = tmp_path / "all.yaml"
    path.write_text(
        "apiVersion: vgpu.reconciler.dev/v1alpha1\nkind: VGPUDesiredState\nmetadata: {name: t}\n"
        "spec:\n  nodeGroups:\n    - name: every\n      selector: {names: ['*']}\n"
        "      gpus:\n        - match: {all: true}\n          sriov: enabled\n"
        "          profiles: {A2-4Q: 4}\n"
    )
    desired = load_desired([path], catalog=CATALOG)
    node = desired.node("n1", {})
    assert node is not None
    from reconciler.model import Inventory

    gpus = (
        card("A2", PciAddress.parse("0000:08:00.0"), enabled=False),
        card("A2", PciAddress.parse("0000:09:00.0"), enabled=False),
    )
    resolved = resolve_groups(node, Inventory("n1", gpus))
    assert [str(g.address) for g in resolved.gpus] == ["0000:08:00.0", "0000:09:00.0"]
    assert str(resolved.gpus[0].group) == "every"
    # all: false is no criterion the schema accepts.
    path.write_text(path.read_text().replace("all: true", "all: false"))
    with pytest.raises(ValidationError):
        load_desired([path], catalog=CATALOG)
