"""Write the golden cases' ``observed.json`` files from short host descriptions.

The committed ``observed.json`` files are the test data; this script only saves typing them.
Run ``python tests/cases/_make_observed.py`` after changing a description below, then read the
diff. Hosts follow what the NVIDIA driver reports (docs/domain.md §3a, §4): every time-sliced
type of the model on each VF, and a VF lists a type as creatable only if it has no vGPU, the
type's framebuffer size matches what the GPU already hosts, and that size is below its maximum.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from reconciler.catalog import GpuModel, default_catalog, long_profile_name
from reconciler.model import VGPU, Gpu, Interface, Inventory, PciAddress, Vf, VGPUType
from reconciler.sim.rules import DEFAULT_TYPE_ID_BASE, DEFAULT_VF_OFFSET, TYPE_ID_BASES

CASES = Path(__file__).parent
NODE = "harvester-kgd9c"
#: Who holds an in-use vGPU in these hosts (the simulator's wording).
HOLDER = "simulated VM"


@dataclass(frozen=True)
class Card:
    """One GPU as a case needs it: model, address, SR-IOV state, vGPUs by VF index."""

    model: str  # catalogue short name, or "L20" (not in the catalogue)
    address: str
    sriov: bool = True
    vgpus: Mapping[int, str] = field(default_factory=dict)  # index → profile (short or long)
    in_use: frozenset[int] = frozenset()  # indexes whose vGPU a VM holds


#: A GPU the catalogue does not know: an L40-class card (48 GB, 32 VFs) with PCI id 10de:26ba.
L20_TYPES = tuple(
    VGPUType(f"NVIDIA L20-{gb}Q", f"nvidia-{1300 + i}", gb * 1024, count, 4, "7680x4320", 60)
    for i, (gb, count) in enumerate(
        [(1, 32), (2, 24), (3, 16), (4, 12), (6, 8), (8, 6), (12, 4), (16, 3), (24, 2), (48, 1)]
    )
)


def _types(model: GpuModel) -> tuple[VGPUType, ...]:
    return tuple(
        VGPUType(
            name=p.name,
            type_id=f"nvidia-{TYPE_ID_BASES.get(model.name, DEFAULT_TYPE_ID_BASE) + i}",
            framebuffer_mib=p.framebuffer_mib,
            max_instance=p.max_instances,
            num_heads=p.num_heads,
            max_resolution=p.max_resolution,
            frl_config=p.frl_config,
        )
        for i, p in enumerate(model.time_sliced_profiles)
    )


def _uuid(vf: PciAddress) -> str:
    # Not the planner's namespace: these vGPUs were made by someone else (Harvester, a person).
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"https://example.invalid/{NODE}/{vf}"))


def gpu(card: Card) -> Gpu:
    address = PciAddress.parse(card.address)
    if card.model == "L20":
        ids = ("10de", "26ba", "10de", "1870")
        model_name, types, total, offset = None, L20_TYPES, 32, 2
    else:
        entry = default_catalog().model(card.model)
        assert entry is not None, card.model
        pci = entry.pci_ids[0]
        ids = (pci.vendor, pci.device, pci.subsystem_vendor, pci.subsystem_device)
        offset = entry.vf_offset if entry.vf_offset is not None else DEFAULT_VF_OFFSET
        model_name, types, total = entry.name, _types(entry), entry.vfs
    base = Gpu(
        address=address,
        vendor_id=ids[0],
        device_id=ids[1],
        subsystem_vendor_id=ids[2],
        subsystem_device_id=ids[3],
        model=model_name,
        total_vfs=total,
        vf_offset=offset,
        vf_stride=1,
        driver="nvidia",
    )
    if not card.sriov:
        assert not card.vgpus
        return base
    hosted = {i: long_profile_name(name) for i, name in card.vgpus.items()}
    # A type the driver does not list (a left-over of another driver branch) has no size here.
    sizes = [t.framebuffer_mib for n in hosted.values() for t in types if t.name == n]
    vfs = []
    for index in range(total):
        vf_address = base.predicted_vf_address(index)
        vgpu = None
        creatable: frozenset[str] = frozenset()
        if index in hosted:
            vgpu = VGPU(
                uuid=_uuid(vf_address),
                type_name=hosted[index],
                in_use=index in card.in_use,
                holder=HOLDER if index in card.in_use else "",
            )
        else:
            creatable = frozenset(
                t.name
                for t in types
                if (not sizes or t.framebuffer_mib == sizes[0])
                and sizes.count(t.framebuffer_mib) < t.max_instance
            )
        vfs.append(Vf(vf_address, index, vgpu, creatable))
    return replace(base, interface=Interface.MDEV, num_vfs=total, vfs=tuple(vfs), types=types)


A2 = "0000:08:00.0"
#: The seed's node: 4 of 16 VFs configured, .4/.6 A2-4A and .5/.7 A2-4Q.
SEED = {0: "A2-4A", 1: "A2-4Q", 2: "A2-4A", 3: "A2-4Q"}
FULL_4Q = {0: "A2-4Q", 1: "A2-4Q", 2: "A2-4Q", 3: "A2-4Q"}

HOSTS: dict[str, list[Card]] = {
    "seed-fresh-enable-and-create": [Card("A2", A2, sriov=False)],
    "seed-already-applied": [Card("A2", A2, vgpus=SEED)],
    "one-vf-changed": [Card("A2", A2, vgpus=SEED)],
    "count-form-keeps-existing": [Card("A2", A2, vgpus=SEED)],
    "count-form-shrinking": [Card("A2", A2, vgpus=FULL_4Q, in_use=frozenset({3}))],
    "count-form-fresh-l40s": [Card("L40S", "0000:41:00.0", sriov=False)],
    "change-at-the-maximum": [Card("A2", A2, vgpus=FULL_4Q)],
    "equal-size-violation": [Card("A2", A2, vgpus=SEED)],
    "over-the-maximum": [Card("A2", A2, vgpus=SEED)],
    "over-the-maximum-unknown-model": [Card("L20", "0000:81:00.0")],
    "unknown-profile": [Card("A2", A2)],
    "profile-of-another-model": [Card("L4", A2)],
    "model-mismatch": [Card("A2", A2)],
    "in-use-blocks-replacement": [Card("A2", A2, vgpus=SEED, in_use=frozenset({1}))],
    "in-use-blocks-incompatible-creates": [Card("A2", A2, vgpus=SEED, in_use=frozenset({1}))],
    "in-use-blocks-other-size": [Card("A2", A2, vgpus=SEED, in_use=frozenset({1}))],
    "sriov-disable-with-vgpus": [Card("A2", A2, vgpus=SEED)],
    "sriov-disable-blocked": [Card("A2", A2, vgpus=SEED, in_use=frozenset({1}))],
    "sriov-disabled-already": [Card("A2", A2, sriov=False)],
    "unmanaged-gpu-untouched": [
        Card("A2", A2, sriov=False),
        Card("L4", "0000:09:00.0", vgpus={0: "L4-6Q", 1: "L4-6Q"}),
    ],
    "node-not-in-desired-state": [
        Card("A2", A2, vgpus=SEED),
        Card("L4", "0000:09:00.0", sriov=False),
    ],
    "vf-index-keys": [Card("A2", A2, vgpus={0: "A2-4A"})],
    "short-names": [Card("A2", A2, sriov=False)],
    "two-models-a2-and-l4": [
        Card("A2", A2, vgpus={0: "A2-2Q"}),
        Card("L4", "0000:09:00.0", sriov=False),
    ],
    "a16-four-gpus": [
        Card("A16", "0000:0d:00.0", sriov=False),
        Card("A16", "0000:0e:00.0", vgpus={0: "A16-2B", 1: "A16-2B"}),
        Card("A16", "0000:0f:00.0", vgpus={0: "A16-4Q"}),
        Card("A16", "0000:10:00.0", sriov=False),
    ],
    "gpu-not-on-host": [Card("A2", A2), Card("L4", "0000:09:00.0")],
    "vf-of-another-gpu": [Card("A2", A2), Card("A2", "0000:09:00.0")],
    "vf-not-of-this-gpu-sriov-off": [Card("A2", A2, sriov=False)],
    "vf-index-out-of-range-unknown-model": [Card("L20", "0000:81:00.0")],
    "unknown-gpu-model-sriov-on": [
        Card("L20", "0000:81:00.0", vgpus={0: "L20-8Q", 1: "L20-8Q", 5: "L20-8Q"})
    ],
    "unknown-gpu-model-sriov-off": [Card("L20", "0000:81:00.0", sriov=False)],
    "unknown-type-on-managed-gpu": [Card("A2", A2, vgpus={0: "A2-4Q", 1: "GRID A2-4Q"})],
    # Cases with a cluster.json (written by _make_cluster.py).
    "cluster-seed-fresh": [Card("A2", A2, sriov=False)],
    "cluster-seed-in-sync": [Card("A2", A2, vgpus=SEED)],
    "cluster-drift-hand-edit": [Card("A2", A2, vgpus=SEED)],
    "cluster-profile-change": [Card("A2", A2, vgpus=SEED)],
    "cluster-foreign-controller": [Card("A2", A2, vgpus=SEED)],
    "cluster-foreign-adopt": [Card("A2", A2, vgpus=SEED)],
    "cluster-in-use-checkpoint": [Card("A2", A2, vgpus=SEED)],
    "cluster-in-use-vmi-unknown": [Card("A2", A2, vgpus=SEED)],
    "cluster-kubevirt-profile-gone": [Card("A2", A2, vgpus=SEED)],
    "cluster-kubevirt-missing": [Card("A2", A2, vgpus=SEED)],
    "cluster-gpu-dropped": [
        Card("A2", A2, vgpus=SEED),
        Card("L4", "0000:09:00.0", vgpus={0: "L4-6Q", 1: "L4-6Q"}),
    ],
    "cluster-sriov-disabled": [Card("A2", A2, vgpus=SEED)],
    "cluster-count-form-fresh-l40s": [Card("L40S", "0000:41:00.0", sriov=False)],
    "cluster-first-vgpu-narrows": [Card("A2", A2)],
}


def _write(name: str, inventory: Inventory) -> None:
    directory = CASES / name
    directory.mkdir(exist_ok=True)
    text = json.dumps(inventory.to_json(), indent=2) + "\n"
    (directory / "observed.json").write_text(text, encoding="utf-8")


def main() -> None:
    for name, cards in HOSTS.items():
        _write(name, Inventory(node=NODE, gpus=tuple(gpu(c) for c in cards)))


if __name__ == "__main__":
    main()
