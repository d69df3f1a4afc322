"""The convergence oracle (``tests/oracle.py``) is itself checked, on sysfs trees built here by
hand in the kernel's layout (docs/domain.md §1, §3), for both vGPU interfaces, and on the
simulator's trees."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from reconciler.catalog import default_catalog
from reconciler.sim import build_host
from tests.oracle import (
    Snapshot,
    body,
    gpu_addresses,
    judge,
    read_gpu,
    size_gb,
    snapshot,
    vgpu_uuid,
)

NODE = "harvester-kgd9c"
GPU = "0000:08:00.0"
VF0, VF1, VF2, VF3 = "0000:08:00.4", "0000:08:00.5", "0000:08:00.6", "0000:08:00.7"
#: The A2's 4 GB types as its mdev branch numbers them (ids are the tree's business only).
TYPES = {
    "nvidia-745": ("NVIDIA A2-2Q", 2048, 8),
    "nvidia-746": ("NVIDIA A2-4Q", 4096, 4),
    "nvidia-751": ("NVIDIA A2-4A", 4096, 4),
}
VFIO_IDS = {"NVIDIA A2-2Q": 745, "NVIDIA A2-4Q": 746, "NVIDIA A2-4A": 751}


class Tree:
    """A sysfs tree written by hand: functions under ``devices/pci0000:00``, ``bus/pci/devices``
    links to them, ``virtfn<N>``/``physfn`` links, mdevs with their type link and bus link, or
    the VFIO interface's ``nvidia/`` files."""

    def __init__(self, root: Path, interface: str = "mdev") -> None:
        self.root = root
        self.interface = interface
        (root / "bus" / "pci" / "devices").mkdir(parents=True)
        (root / "bus" / "mdev" / "devices").mkdir(parents=True)
        (root / "devices" / "pci0000:00").mkdir(parents=True)

    def dir(self, address: str) -> Path:
        return self.root / "devices" / "pci0000:00" / address

    def function(self, address: str, files: dict[str, str]) -> Path:
        d = self.dir(address)
        d.mkdir()
        for name, text in files.items():
            (d / name).write_text(text + "\n")
        os.symlink(
            f"../../../devices/pci0000:00/{address}", self.root / "bus/pci/devices" / address
        )
        return d

    def gpu(self, address: str, vfs: list[str], *, total: int | None = None) -> None:
        total = len(vfs) if total is None else total
        files = {"vendor": "0x10de", "class": "0x030200", "sriov_totalvfs": str(total)}
        pf = self.function(address, {**files, "sriov_numvfs": str(len(vfs))})
        for index, vf in enumerate(vfs):
            d = self.function(vf, {"vendor": "0x10de", "class": "0x030200"})
            os.symlink(f"../{address}", d / "physfn")
            os.symlink(f"../{vf}", pf / f"virtfn{index}")
            if self.interface == "mdev":
                for type_id, (name, fb, most) in TYPES.items():
                    t = d / "mdev_supported_types" / type_id
                    t.mkdir(parents=True)
                    (t / "name").write_text(name + "\n")
                    (t / "description").write_text(
                        f"num_heads=4, frl_config=60, framebuffer={fb}M, "
                        f"max_resolution=7680x4320, max_instance={most}\n"
                    )
            else:
                (d / "nvidia").mkdir()
                (d / "nvidia" / "current_vgpu_type").write_text("0\n")
                self.listing(vf, list(VFIO_IDS))

    def listing(self, vf: str, names: list[str]) -> None:
        lines = ["ID    : vGPU Name"] + [f"{VFIO_IDS[n]:<5d} : {n}" for n in names]
        (self.dir(vf) / "nvidia" / "creatable_vgpu_types").write_text("\n".join(lines) + "\n")

    def vgpu(self, vf: str, profile: str, uuid: str = "", *, bus: bool = True) -> str:
        if self.interface != "mdev":
            (self.dir(vf) / "nvidia" / "current_vgpu_type").write_text(f"{VFIO_IDS[profile]}\n")
            return vf
        uuid = uuid or vgpu_uuid(NODE, vf)
        type_id = next(t for t, (name, _, _) in TYPES.items() if name == profile)
        d = self.dir(vf) / uuid
        d.mkdir()
        os.symlink(f"../mdev_supported_types/{type_id}", d / "mdev_type")
        (d / "remove").write_text("")
        if bus:
            link = self.root / "bus" / "mdev" / "devices" / uuid
            os.symlink(f"../../../devices/pci0000:00/{vf}/{uuid}", link)
        return uuid


def desired(*gpus: dict[str, Any], node: str = NODE) -> dict[str, Any]:
    return {"spec": {"nodes": {node: {"gpus": list(gpus)}}}}


def a2(vgpus: dict[Any, str] | None = None, **more: Any) -> dict[str, Any]:
    return {"address": GPU, "sriov": "enabled", "vgpus": vgpus or {}, **more}


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return Tree(tmp_path / "sys")


@pytest.fixture
def vfio(tmp_path: Path) -> Tree:
    return Tree(tmp_path / "sys", "vfio")


EMPTY = Snapshot({})


def test_the_uuid_rule_gives_the_readme_example() -> None:
    # README: the seed's VF 0000:08:00.4 on harvester-kgd9c gets 5adb8e42-….
    assert vgpu_uuid(NODE, VF0) == "5adb8e42-c29a-5705-8ae0-584ba08668af"
    assert vgpu_uuid(NODE, VF1) == "5ed3b3e8-ffe3-55db-be73-567bd703a205"


def test_names_and_sizes() -> None:
    assert body("GRID A100-4C") == body("NVIDIA A100-4C") == body("A100-4C") == "A100-4C"
    assert (size_gb("NVIDIA A2-4Q"), size_gb("GRID A100-1-5CME"), size_gb("odd")) == (4, 5, None)


def test_converged_per_vf_host(tree: Tree) -> None:
    tree.gpu(GPU, [VF0, VF1, VF2, VF3])
    tree.vgpu(VF0, "NVIDIA A2-4A")
    tree.vgpu(VF1, "NVIDIA A2-4Q")
    want = desired(a2({VF0: "A2-4A", 1: "NVIDIA A2-4Q"}))  # an address key and an index key
    assert judge(tree.root, want, NODE, before=EMPTY) == []
    # The UUIDs are this node's: on another node the same vGPUs are not vgpuctl's.
    there = desired(a2({VF0: "A2-4A", 1: "NVIDIA A2-4Q"}), node="other-node")
    assert len(judge(tree.root, there, "other-node", before=EMPTY)) == 2


def test_a_missing_wrong_or_extra_vgpu_is_found(tree: Tree) -> None:
    tree.gpu(GPU, [VF0, VF1, VF2, VF3])
    tree.vgpu(VF0, "NVIDIA A2-4Q")  # desired A2-4A
    tree.vgpu(VF2, "NVIDIA A2-4A")  # desired nothing
    found = judge(tree.root, desired(a2({0: "A2-4A", 1: "A2-4A"})), NODE, before=EMPTY)
    assert any(VF0 in p and "desired A2-4A" in p for p in found), found
    assert any(VF1 in p and "missing" in p for p in found), found
    assert any(VF2 in p and "desired nothing" in p for p in found), found
    assert len(found) == 4  # and VF0's A2-4A is missing


def test_the_prefix_is_not_part_of_a_profile(tree: Tree) -> None:
    tree.gpu(GPU, [VF0])
    tree.vgpu(VF0, "NVIDIA A2-4Q")
    assert judge(tree.root, desired(a2({0: "GRID A2-4Q"})), NODE, before=EMPTY) == []


def test_a_foreign_uuid_is_wrong_unless_the_vgpu_was_there_before(tree: Tree) -> None:
    tree.gpu(GPU, [VF0])
    foreign = "11111111-2222-5333-8444-555555555555"
    tree.vgpu(VF0, "NVIDIA A2-4Q", foreign)
    want = desired(a2({0: "A2-4Q"}))
    found = judge(tree.root, want, NODE, before=EMPTY)
    assert found == [f"GPU {GPU}: NVIDIA A2-4Q on {VF0} has UUID {foreign}, "
                     f"not {vgpu_uuid(NODE, VF0)}"]  # fmt: skip
    # Kept from before, as it was: vgpuctl never touches a VF that hosts its profile.
    assert judge(tree.root, want, NODE, before=snapshot(tree.root)) == []


def test_sriov_must_be_as_desired(tree: Tree, tmp_path: Path) -> None:
    tree.gpu(GPU, [], total=4)
    assert judge(tree.root, desired(a2()), NODE, before=EMPTY) == [
        f"GPU {GPU}: 0 VFs (0 links), desired all 4 (SR-IOV enabled)"
    ]
    off = {"address": GPU, "sriov": "disabled"}
    assert judge(tree.root, desired(off), NODE, before=EMPTY) == []
    partial = Tree(tmp_path / "partial")
    partial.gpu(GPU, [VF0, VF1], total=4)
    assert judge(partial.root, desired(a2()), NODE, before=EMPTY)
    on = Tree(tmp_path / "on")
    on.gpu(GPU, [VF0, VF1])
    assert judge(on.root, desired(off), NODE, before=EMPTY) == [
        f"GPU {GPU}: SR-IOV on (2 VFs), desired disabled"
    ]


def test_a_held_vgpu_excuses_what_it_blocks_and_nothing_else(tree: Tree) -> None:
    tree.gpu(GPU, [VF0, VF1, VF2, VF3])
    held = tree.vgpu(VF1, "NVIDIA A2-4Q", "11111111-2222-5333-8444-555555555555")
    tree.vgpu(VF2, "NVIDIA A2-4A")
    before = snapshot(tree.root)
    # .5 should become A2-4A: its own VF is blocked; .6 is fine; .7 missing is not excused
    # (same size, 2 of 4 used).
    want = desired(a2({VF1: "A2-4A", VF2: "A2-4A", VF3: "A2-4A"}))
    assert judge(tree.root, want, NODE, before=before, held=[held]) == [
        f"GPU {GPU}: A2-4A missing on {VF3} (VF 3)"
    ]
    assert len(judge(tree.root, want, NODE, before=before)) == 3  # not held: nothing excused
    # Every VF to 2 GB: the held 4 GB vGPU blocks every create, so .6's A2-4A, which would
    # only make room for them, may stay (a change that cannot finish breaks nothing) ...
    small = desired(a2({0: "A2-2Q", 1: "A2-2Q"}))
    assert judge(tree.root, small, NODE, before=before, held=[held]) == []
    # ... but not once a 2 GB vGPU could be made (nothing held), nor beside a missing vGPU
    # that does not wait for the held one (.4 to A2-4Q: same size, room for it).
    assert judge(tree.root, small, NODE, before=before) != []
    same = desired(a2({0: "A2-4Q", 1: "A2-2Q"}))
    assert judge(tree.root, same, NODE, before=before, held=[held]) == [
        f"GPU {GPU}: NVIDIA A2-4A on {VF2} ({vgpu_uuid(NODE, VF2)}): desired nothing there",
        f"GPU {GPU}: A2-4Q missing on {VF0} (VF 0)",
    ]
    # SR-IOV desired off: it stays on for the held vGPU, but the free one must go.
    off = desired({"address": GPU, "sriov": "disabled"})
    assert judge(tree.root, off, NODE, before=before, held=[held]) == [
        f"GPU {GPU}: NVIDIA A2-4A on {VF2} left (SR-IOV desired disabled)"
    ]


def test_at_the_maximum_a_held_vgpu_excuses_a_missing_one(tree: Tree) -> None:
    vfs = [VF0, VF1, VF2, VF3, "0000:08:01.0"]
    tree.gpu(GPU, vfs)
    for vf in vfs[:4]:
        tree.vgpu(vf, "NVIDIA A2-4Q")  # the A2's maximum of 4 GB vGPUs: 4
    want = desired(a2({0: "A2-4Q", 1: "A2-4Q", 2: "A2-4Q", 4: "A2-4Q"}))
    assert judge(tree.root, want, NODE, before=EMPTY, held=[vgpu_uuid(NODE, VF3)]) == []
    assert judge(tree.root, want, NODE, before=EMPTY) != []


def test_count_form(tree: Tree) -> None:
    tree.gpu(GPU, [VF0, VF1, VF2, VF3])
    tree.vgpu(VF1, "NVIDIA A2-4Q")
    tree.vgpu(VF3, "NVIDIA A2-4Q")

    def counts(n: int) -> dict[str, Any]:
        return desired({"address": GPU, "sriov": "enabled", "profiles": {"NVIDIA A2-4Q": n}})

    assert judge(tree.root, counts(2), NODE, before=EMPTY) == []
    assert judge(tree.root, counts(3), NODE, before=EMPTY) == [f"GPU {GPU}: 1 of 3 A2-4Q missing"]
    found = judge(tree.root, counts(1), NODE, before=EMPTY)
    assert found == [
        f"GPU {GPU}: NVIDIA A2-4Q on {VF3} ({vgpu_uuid(NODE, VF3)}) beyond the desired 1"
    ]
    # A held one counts first, so the free one is the one beyond; held ones beyond may stay.
    held = [vgpu_uuid(NODE, VF3)]
    assert judge(tree.root, counts(1), NODE, before=EMPTY, held=held) == [
        f"GPU {GPU}: NVIDIA A2-4Q on {VF1} ({vgpu_uuid(NODE, VF1)}) beyond the desired 1"
    ]
    held.append(vgpu_uuid(NODE, VF1))
    assert judge(tree.root, counts(1), NODE, before=EMPTY, held=held) == []


def test_count_form_a_change_that_cannot_finish_may_keep_what_it_would_replace(
    tree: Tree,
) -> None:
    """Four A2-4Q (VF 0's held) to two A2-8Q: no 8 GB vGPU can be made beside the held one,
    so the three free A2-4Q may stay; fewer A2-4Q (a profile still wanted) must still go."""
    tree.gpu(GPU, [VF0, VF1, VF2, VF3])
    for vf in (VF0, VF1, VF2, VF3):
        tree.vgpu(vf, "NVIDIA A2-4Q")
    held = [vgpu_uuid(NODE, VF0)]

    def counts(**n: int) -> dict[str, Any]:
        profiles = {f"NVIDIA {k.replace('_', '-')}": v for k, v in n.items()}
        return desired({"address": GPU, "sriov": "enabled", "profiles": profiles})

    assert judge(tree.root, counts(A2_8Q=2), NODE, before=EMPTY, held=held) == []
    assert len(judge(tree.root, counts(A2_8Q=2), NODE, before=EMPTY)) == 5  # 4 extra, 2 missing
    assert judge(tree.root, counts(A2_4Q=2), NODE, before=EMPTY, held=held) == [
        f"GPU {GPU}: NVIDIA A2-4Q on {VF2} ({vgpu_uuid(NODE, VF2)}) beyond the desired 2",
        f"GPU {GPU}: NVIDIA A2-4Q on {VF3} ({vgpu_uuid(NODE, VF3)}) beyond the desired 2",
    ]


def test_a_half_made_or_departing_mdev_is_not_converged(tree: Tree) -> None:
    tree.gpu(GPU, [VF0])
    tree.vgpu(VF0, "NVIDIA A2-4Q", bus=False)  # the kernel unlinked it: a removal under way
    found = judge(tree.root, desired(a2({0: "A2-4Q"})), NODE, before=EMPTY)
    assert found == [f"GPU {GPU}: vGPU {vgpu_uuid(NODE, VF0)} on {VF0} is half made or being "
                     "removed"]  # fmt: skip


def test_unmanaged_gpus_must_be_untouched(tree: Tree) -> None:
    other, other_vf = "0000:09:00.0", "0000:09:00.4"
    tree.gpu(GPU, [VF0])
    tree.gpu(other, [other_vf])
    before = snapshot(tree.root)
    want = desired(a2())
    assert judge(tree.root, want, NODE, before=before) == []
    tree.vgpu(other_vf, "NVIDIA A2-4Q")
    assert judge(tree.root, want, NODE, before=before) == [
        f"GPU {other} is not managed, and it changed"
    ]
    # A node the desired state does not name: every GPU is unmanaged.
    assert judge(tree.root, desired(a2(), node="elsewhere"), NODE, before=before) == [
        f"GPU {other} is not managed, and it changed"
    ]


def test_only_nvidia_sriov_physical_functions_are_gpus(tree: Tree) -> None:
    tree.gpu(GPU, [VF0])
    tree.function("0000:08:00.1", {"vendor": "0x10de", "class": "0x040300"})  # HDMI audio
    tree.function("0000:03:00.0", {"vendor": "0x8086", "sriov_totalvfs": "8"})  # a NIC
    assert gpu_addresses(tree.root) == [GPU]


def test_vfio_interface(vfio: Tree) -> None:
    vfio.gpu(GPU, [VF0, VF1, VF2])
    vfio.vgpu(VF0, "NVIDIA A2-4Q")
    vfio.listing(VF0, [])  # a configured VF lists nothing; VF1 and VF2 still name the types
    want = desired(a2({0: "A2-4Q"}))
    assert judge(vfio.root, want, NODE, before=EMPTY) == []  # no UUID: the VF is the identity
    assert judge(vfio.root, desired(a2({0: "A2-4A"})), NODE, before=EMPTY) == [
        f"GPU {GPU}: NVIDIA A2-4Q on {VF0} (None): desired A2-4A there",
        f"GPU {GPU}: A2-4A missing on {VF0} (VF 0)",
    ]
    # At the maximum no list names the type: the oracle cannot name it, so it fails closed.
    for vf in (VF1, VF2):
        vfio.listing(vf, ["NVIDIA A2-2Q"])
    found = judge(vfio.root, want, NODE, before=EMPTY)
    assert any("type 746" in p for p in found), found
    # A held VF (by address) stays.
    assert judge(vfio.root, desired(a2()), NODE, before=EMPTY, held=[VF0]) == []


@pytest.mark.parametrize("interface", ["mdev", "vfio"])
def test_the_simulators_tree_reads_as_built(tmp_path: Path, interface: str) -> None:
    vgpus = {0: "NVIDIA A2-4Q", 2: "NVIDIA A2-4A"}
    spec = {
        "gpus": [
            {"model": "A2", "address": GPU, "sriov": "enabled", "vgpus": vgpus},
            {"model": "L4", "address": "0000:41:00.0", "sriov": "disabled", "vgpus": {}},
        ],
        "extraDevices": True,
        "interface": interface,
    }
    build_host(tmp_path / "h", spec, catalog=default_catalog())
    root = tmp_path / "h" / "sys"
    before = snapshot(root)
    assert sorted(before.gpus) == [GPU, "0000:41:00.0"]
    assert [(v.index, v.profile) for v in before.gpus[GPU].vgpus] == sorted(vgpus.items())
    want = desired(a2({0: "A2-4Q", 2: "A2-4A"}))
    assert judge(root, want, NODE, before=before) == []
    # The simulator's own UUIDs are not vgpuctl's: only a snapshot from before accepts them.
    assert bool(judge(root, want, NODE, before=EMPTY)) == (interface == "mdev")
    assert judge(root, desired(a2({0: "A2-4Q"})), NODE, before=before) != []


def test_the_oracle_imports_nothing_of_the_code_it_judges() -> None:
    import ast

    import tests.oracle

    tree = ast.parse(Path(tests.oracle.__file__).read_text(encoding="utf-8"))
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in modules if m.split(".")[0] in ("reconciler", "tests")}, modules


def test_a_vfio_type_no_list_names_is_named_by_the_simulated_driver(tmp_path: Path) -> None:
    """At a profile's maximum every list is a header only (docs/domain.md §3b): the oracle asks
    the simulated driver (its state file) what the id is, per GPU model. An A40 and an L4 share
    the simulator's id range, so an id means a different type on each."""
    spec = {
        "gpus": [
            {"model": "A40", "address": "0000:08:00.0", "vgpus": {0: "NVIDIA A40-48Q"}},
            {"model": "L4", "address": "0000:41:00.0", "vgpus": {0: "NVIDIA L4-24Q"}},
        ],
        "interface": "vfio",
        "extraDevices": False,
    }
    build_host(tmp_path / "h", spec)
    root = tmp_path / "h" / "sys"
    for address, name in (("0000:08:00.0", "NVIDIA A40-48Q"), ("0000:41:00.0", "NVIDIA L4-24Q")):
        listings = sorted(root.glob(f"devices/**/{address[:-1]}*/nvidia/creatable_vgpu_types"))
        assert listings and all(p.read_text().splitlines()[1:] == [] for p in listings)
        (vgpu,) = read_gpu(root, address).vgpus
        assert vgpu.profile == name
