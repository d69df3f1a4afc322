"""The inventory's fingerprint and JSON reading, judged against their definitions.

The fingerprint is defined as the SHA-256 of the inventory JSON without ``sysfsRoot``, keys
sorted, no spaces; the model writes it piece by piece for speed, so these tests hold it to the
definition (computed here with the standard library's encoder), over the golden cases' hosts and
over generated ones with awkward text. Saved plans carry the fingerprint: it must not change
value, and must change whenever the host does.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.model import VGPU, Gpu, Interface, Inventory, PciAddress, Vf, VgpuMode, VGPUType

CASES = Path(__file__).resolve().parents[1] / "cases"


def by_definition(inventory: Inventory) -> str:
    doc = inventory.to_json()
    del doc["sysfsRoot"]
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


@pytest.mark.parametrize(
    "observed", sorted(CASES.glob("*/observed.json")), ids=lambda p: p.parent.name
)
def test_fingerprint_of_each_golden_host_is_its_definition(observed: Path) -> None:
    inventory = Inventory.from_json(json.loads(observed.read_text(encoding="utf-8")))
    assert inventory.fingerprint() == by_definition(inventory)


def test_fingerprint_value_is_the_one_saved_plans_carry() -> None:
    # A plan saved before the fingerprint was written piece by piece names this value for the
    # golden case's host (tests/cases/one-vf-changed/expected-plan.json).
    raw = json.loads((CASES / "one-vf-changed" / "observed.json").read_text(encoding="utf-8"))
    assert Inventory.from_json(raw).fingerprint() == (
        "sha256:d07d89c950b61ac602a6bd1bac532ba13abb41372721667289ee0cc016f3918f"
    )


text = st.text(st.characters(codec="utf-8"), max_size=12)
names = st.sampled_from(["NVIDIA A2-4Q", "NVIDIA A2-2B", "GRID A100-4C", 'x"\\\n\x00é☃'])


@st.composite
def inventories(draw: st.DrawFn) -> Inventory:
    gpus = []
    for bus in draw(st.lists(st.integers(1, 0xFE), unique=True, max_size=3)):
        types = tuple(
            VGPUType(
                name=draw(names | text),
                type_id=draw(text),
                framebuffer_mib=draw(st.integers(0, 1 << 20)),
                max_instance=draw(st.integers(0, 64)),
                num_heads=draw(st.integers(0, 4)),
                max_resolution=draw(text),
                frl_config=draw(st.integers(0, 60)),
            )
            for _ in range(draw(st.integers(0, 3)))
        )
        vfs = []
        for index in range(draw(st.integers(0, 4))):
            vgpu = draw(
                st.none()
                | st.builds(
                    VGPU,
                    uuid=text,
                    type_name=names | text,
                    in_use=st.booleans(),
                    holder=text,
                    iommu_group=st.sampled_from(["", "61"]) | text,
                    removing=st.booleans(),
                )
            )
            creatable = draw(st.frozensets(names | text, max_size=3))
            vfs.append(Vf(PciAddress(0, bus, 1 + index // 8, index % 8), index, vgpu, creatable))
        gpus.append(
            Gpu(
                address=PciAddress(draw(st.integers(0, 0xFFFF)), bus, 0, 0),
                vendor_id="10de",
                device_id=draw(st.sampled_from(["25b6", ""]) | text),
                subsystem_vendor_id=draw(text),
                subsystem_device_id=draw(text),
                model=draw(st.none() | names | text),
                interface=draw(st.sampled_from(Interface)),
                total_vfs=draw(st.integers(0, 32)),
                num_vfs=len(vfs),
                vf_offset=draw(st.integers(0, 8)),
                vf_stride=draw(st.integers(1, 4)),
                vfs=tuple(vfs),
                types=types,
                driver=draw(st.sampled_from(["nvidia", "", "vfio-pci"]) | text),
                vf_device=draw(st.sampled_from(["", "0000", "25b6"]) | text),
            )
        )
    return Inventory(
        node=draw(text),
        gpus=tuple(gpus),
        sysfs_root=draw(text),
        mdev_bus=draw(st.booleans()),
        vf_availability=draw(st.booleans()),
    )


@settings(max_examples=300, deadline=None)
@given(inventories())
def test_fingerprint_is_its_definition_for_any_host(inventory: Inventory) -> None:
    assert inventory.fingerprint() == by_definition(inventory)
    # What is read back from the JSON is the same host, with the same fingerprint.
    again = Inventory.from_json(json.loads(json.dumps(inventory.to_json())))
    assert again.fingerprint() == inventory.fingerprint()


def test_fingerprint_changes_with_the_host_and_not_with_its_root() -> None:
    raw = json.loads((CASES / "one-vf-changed" / "observed.json").read_text(encoding="utf-8"))
    base = Inventory.from_json(raw)
    gpu = base.gpus[0]
    vf = gpu.vfs[0]
    t = gpu.types[0]
    held = VGPU(uuid="u", type_name=t.name, in_use=True, holder="vm-1")
    other = frozenset({"NVIDIA A2-1Q"})
    changed = [
        replace(base, node="other"),
        replace(base, gpus=(replace(gpu, vfs=(replace(vf, creatable=other), *gpu.vfs[1:])),)),
        replace(base, gpus=(replace(gpu, vfs=(replace(vf, vgpu=held), *gpu.vfs[1:])),)),
        replace(base, gpus=(replace(gpu, vfs=(replace(vf, vgpu=replace(held, holder="vm-2")),
                                              *gpu.vfs[1:])),)),
        replace(base, gpus=(replace(gpu, types=(replace(t, max_instance=t.max_instance + 1),
                                                *gpu.types[1:])),)),
        replace(base, gpus=(replace(gpu, driver="vfio-pci"),)),
        replace(base, gpus=()),
        replace(base, mdev_bus=False),
        # The same host scanned without each VF's availability is not the same observation.
        replace(base, vf_availability=False),
    ]  # fmt: skip
    prints = [c.fingerprint() for c in changed]
    assert len(set(prints)) == len(prints)
    assert base.fingerprint() not in prints
    same = replace(base, sysfs_root="/elsewhere", notes=("a note",))
    assert same.fingerprint() == base.fingerprint()


def _doc(types: list[dict[str, Any]], creatable: list[Any]) -> dict[str, Any]:
    return {
        "node": "n",
        "gpus": [
            {
                "address": "0000:08:00.0",
                "sriov": {"totalVFs": 1, "numVFs": 1},
                "vgpuTypes": types,
                "vfs": [{"address": "0000:08:00.4", "index": 0, "creatableTypes": creatable}],
            }
        ],
    }


def _type(**fields: Any) -> dict[str, Any]:
    return {"name": "NVIDIA A2-4Q", "id": "nvidia-746", "framebufferMiB": 4096,
            "maxInstances": 4, **fields}  # fmt: skip


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        # Equal in Python, read differently: each input gets what it says, whatever came before.
        (_type(name=1), _type(name=1.0), "1.0"),
        (_type(name=1.0), _type(name=1), "1"),
        (_type(id=True), _type(id=1), "1"),
    ],
)
def test_a_type_list_read_after_an_equal_one_is_read_as_written(
    first: dict[str, Any], second: dict[str, Any], expected: str
) -> None:
    Inventory.from_json(_doc([first], []))
    (gpu,) = Inventory.from_json(_doc([second], [])).gpus
    (t,) = gpu.types
    assert expected in (t.name, t.type_id)


def test_reading_the_same_document_twice_gives_equal_inventories() -> None:
    raw = _doc([_type(), _type(name="NVIDIA A2-2B", framebufferMiB=2048)], ["NVIDIA A2-4Q"])
    first, second = Inventory.from_json(raw), Inventory.from_json(raw)
    assert first == second
    assert first.gpus[0].vfs[0].creatable == frozenset({"NVIDIA A2-4Q"})
    assert [t.name for t in second.gpus[0].types] == ["NVIDIA A2-4Q", "NVIDIA A2-2B"]


def test_a_document_changed_after_reading_is_read_as_it_now_is() -> None:
    # What parsing remembers of a document (to share equal values) is its own copy: the caller's
    # document may change afterwards, and then it reads as it now says.
    raw = _doc([_type()], ["NVIDIA A2-4Q"])
    Inventory.from_json(raw)
    gpu_doc = raw["gpus"][0]
    gpu_doc["vgpuTypes"][0]["framebufferMiB"] = 2048
    gpu_doc["vfs"][0]["creatableTypes"].append("NVIDIA A2-2Q")
    (gpu,) = Inventory.from_json(raw).gpus
    assert gpu.types[0].framebuffer_mib == 2048
    assert gpu.vfs[0].creatable == frozenset({"NVIDIA A2-4Q", "NVIDIA A2-2Q"})


def test_vgpu_mode_is_written_only_when_not_equal_size() -> None:
    gpu = Gpu(PciAddress.parse("0000:08:00.0"), "10de", "26b9", model="NVIDIA L40S")
    plain = Inventory(node="n", sysfs_root="/sys", gpus=(gpu,))
    assert "vgpuMode" not in plain.to_json()["gpus"][0]
    for mode, text in ((VgpuMode.MIXED_SIZE, "mixed-size"), (VgpuMode.UNKNOWN, "unknown")):
        inv = replace(plain, gpus=(replace(gpu, vgpu_mode=mode),))
        doc = inv.to_json()
        assert doc["gpus"][0]["vgpuMode"] == text
        assert Inventory.from_json(doc) == inv
        # The hand-written canonical encoding still is the fingerprint's definition.
        del doc["sysfsRoot"]
        canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        assert inv.fingerprint() == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
        assert inv.fingerprint() != plain.fingerprint()
