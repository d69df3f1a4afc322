"""A hostile or odd sysfs tree (issue 10, item 5), driven as a user drives vgpuctl: the CLI.

Whoever can plant links or special files in the tree vgpuctl reads (a simulated host, a tree
mounted from elsewhere, a bug in a driver) must not be able to make it read a file outside the
root, write any file but the one of the device an action names, or hang. The hosts are the
simulator's (``vgpuctl sim init``), in the kernel's layout; the attacks are planted in them by
hand, as a person with write access to the tree would.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from reconciler.sim.statefile import STATE_DIR
from tests.simnode import NODE, SEED, SimNode, make_sim, run_vgpuctl

#: The seed's vGPUs: VF → UUID (derived from the node and the VF, so known in advance).
VF5, UUID5 = "0000:08:00.5", "5ed3b3e8-ffe3-55db-be73-567bd703a205"
VF7, UUID7 = "0000:08:00.7", "f3bfb674-5828-5d43-bd4f-47222aae9d34"
#: A line of a shadow file: what must never reach an error, a log line or an Event.
SHADOW_LINE = "root:$6$Kx8.saltsalt$Q1w2E3r4T5y6U7i8O9p0AsDfGhJkLzXcVbNm1234567890qwertyuiopasdfghj"
#: What no output may contain: a piece of the secret's hash.
LEAK = "Q1w2E3r4T5y6U7i8O9p0"
#: Far beyond any honest run on a simulated host: only a hang gets near it.
PROMPT = 90.0


def seeded(tmp_path: Path) -> SimNode:
    node = make_sim(tmp_path / "host", ["A2@0000:08:00.0"])
    node.ok("apply", SEED, "--yes")
    return node


def vf_dir(node: SimNode, vf: str) -> Path:
    return (node.dir / "sys" / "bus/pci/devices" / vf).resolve()


def changed(tmp_path: Path) -> Path:
    """The seed with VF 0000:08:00.5 changed from A2-4Q to A2-4A: remove its vGPU, create one."""
    text = SEED.read_text()
    assert '"0000:08:00.5": NVIDIA A2-4Q' in text
    path = tmp_path / "changed.yaml"
    path.write_text(text.replace('"0000:08:00.5": NVIDIA A2-4Q', '"0000:08:00.5": NVIDIA A2-4A'))
    return path


def nic_dir(node: SimNode) -> Path:
    """The simulated host's Intel NIC (vendor 0x8086, class network), as sysfs shows it."""
    for link in sorted((node.dir / "sys/bus/pci/devices").iterdir()):
        device = link.resolve()
        vendor = (device / "vendor").read_text().strip()
        if vendor == "0x8086" and (device / "class").read_text().startswith("0x02"):
            return device
    raise AssertionError("the simulated host has no NIC")


def vgpus(node: SimNode) -> dict[str, str]:
    """VF → vGPU UUID, as ``status`` sees the host."""
    inventory = json.loads(node.ok("status", "-o", "json").stdout)
    return {v["address"]: v["vgpu"]["uuid"] for v in inventory["gpus"][0]["vfs"] if v["vgpu"]}


def outside_type(tmp_path: Path) -> Path:
    """A directory outside the root that looks like an mdev type, its description a secret."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "name").write_text("NVIDIA A2-4Q\n")
    (outside / "description").write_text(SHADOW_LINE + "\n")
    (outside / "available_instances").write_text("1\n")
    return outside


# --- reads stay inside the root ---------------------------------------------------------------


@pytest.mark.parametrize("command", ["status", "plan"])
def test_a_type_directory_linked_out_of_the_root_is_refused_and_not_quoted(
    tmp_path: Path, command: str
) -> None:
    """``mdev_supported_types/nvidia-745`` made a link to a directory elsewhere: its files
    were read as root and the description's content came back in the error."""
    node = seeded(tmp_path)
    types = vf_dir(node, "0000:08:00.4") / "mdev_supported_types"
    planted = types / "nvidia-745"
    shutil.rmtree(planted)
    planted.symlink_to(outside_type(tmp_path))
    args = [command] if command == "status" else [command, SEED]
    res = node.run(*args, timeout=PROMPT)
    assert res.returncode == 1, res.stdout + res.stderr
    assert LEAK not in res.stdout + res.stderr
    assert f"{planted} links to {tmp_path / 'outside'}: outside the sysfs root" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_class_link_out_of_the_root_is_refused_and_not_quoted(tmp_path: Path) -> None:
    """``class/vfio/<group>`` (a link on real hosts too) made to lead out of the root, to a
    directory whose ``dev`` holds a secret: read for the hold probe, quoted when unparsable."""
    node = seeded(tmp_path)
    group = os.readlink(vf_dir(node, VF5) / UUID5 / "iommu_group").rsplit("/", 1)[1]
    outside = tmp_path / "outside-group"
    outside.mkdir()
    (outside / "dev").write_text(SHADOW_LINE + "\n")
    link = node.dir / "sys/class/vfio" / group
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(outside)
    res = node.run("status", timeout=PROMPT)
    assert res.returncode == 1, res.stdout + res.stderr
    assert LEAK not in res.stdout + res.stderr
    assert f"{link} links to {outside}: outside the sysfs root" in res.stderr


# --- attributes that are not files ------------------------------------------------------------


@pytest.mark.parametrize("command", ["status", "apply"])
def test_a_fifo_as_a_types_name_neither_hangs_nor_is_read(tmp_path: Path, command: str) -> None:
    """A named pipe in place of a type's ``name``: opening it waited for a writer for ever."""
    node = seeded(tmp_path)
    name = vf_dir(node, "0000:08:00.4") / "mdev_supported_types/nvidia-745/name"
    text = name.read_text()
    name.unlink()
    os.mkfifo(name)
    args = ["status"] if command == "status" else ["apply", changed(tmp_path), "--yes"]
    res = node.run(*args, timeout=PROMPT)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"{name} is a FIFO, not a sysfs attribute: not read" in res.stderr
    assert "Traceback" not in res.stderr
    name.unlink()
    name.write_text(text)
    assert vgpus(node).get(VF5) == UUID5  # nothing was changed


def test_an_attribute_larger_than_a_page_is_refused(tmp_path: Path) -> None:
    node = seeded(tmp_path)
    description = vf_dir(node, "0000:08:00.4") / "mdev_supported_types/nvidia-745/description"
    description.write_text(SHADOW_LINE * 200 + "\n")
    res = node.run("status", timeout=PROMPT)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"{description} holds more than" in res.stderr
    assert LEAK not in res.stdout + res.stderr


def test_a_type_name_that_is_no_resource_name_is_refused_naming_the_file(tmp_path: Path) -> None:
    """A type's name becomes the kubelet resource and the KubeVirt allow-list entry
    (``nvidia.com/NVIDIA_A2-4Q``): one with control characters or quotes was published as it
    was. Now it is an error naming the file, escaped and cut to an excerpt."""
    node = seeded(tmp_path)
    name = vf_dir(node, "0000:08:00.4") / "mdev_supported_types/nvidia-745/name"
    name.write_text('NVIDIA A2-4Q\x1b[2K\x1b[1A"; rm -rf /\n')
    res = node.run("status", timeout=PROMPT)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"{name}: not a vGPU type name" in res.stderr
    assert "\x1b" not in res.stdout + res.stderr
    assert "\\x1b[2K" in res.stderr  # quoted escaped
    assert "Traceback" not in res.stderr


# --- writes go only to the file of the device the action names --------------------------------


def test_a_removal_redirected_to_another_vgpu_is_refused(tmp_path: Path) -> None:
    """The vGPU's ``remove`` made a link to another vGPU's: the plan removes 0000:08:00.5's
    vGPU, and the write would have removed 0000:08:00.7's instead (the kernel follows links)."""
    node = seeded(tmp_path)
    remove = vf_dir(node, VF5) / UUID5 / "remove"
    remove.unlink()
    remove.symlink_to(os.path.relpath(vf_dir(node, VF7) / UUID7 / "remove", remove.parent))
    res = node.run("apply", changed(tmp_path), "--yes", "--verify-timeout", "5", timeout=PROMPT)
    remove.unlink()
    remove.write_text("")
    assert vgpus(node) == {
        "0000:08:00.4": "5adb8e42-c29a-5705-8ae0-584ba08668af",
        VF5: UUID5,
        "0000:08:00.6": "ec1a8b91-526b-5a21-87ce-cae919e6adf0",
        VF7: UUID7,
    }
    assert res.returncode == 1, res.stdout + res.stderr
    assert (
        f"refusing sysfs write to bus/mdev/devices/{UUID5}/remove: {remove} is a link "
        f"(a write goes only to a file of vGPU {UUID5} on VF {VF5} of GPU 0000:08:00.0, "
        "never through a link)"
    ) in res.stderr


def test_a_removal_redirected_to_a_nic_is_refused(tmp_path: Path) -> None:
    """On a host vgpuctl writes for real (no simulator behind the tree: the confined writer
    writes the files), the vGPU's ``remove`` made a link to the NIC's: writing ``1`` there
    hot-unplugs the NIC. The NIC's ``remove`` (pci-sysfs gives every PCI function one) must
    stay untouched."""
    node = seeded(tmp_path)
    shutil.rmtree(node.dir / "sys" / STATE_DIR)  # now just a tree of files, as on a real host
    nic_remove = nic_dir(node) / "remove"
    nic_remove.write_text("")
    remove = vf_dir(node, VF5) / UUID5 / "remove"
    remove.unlink()
    remove.symlink_to(os.path.relpath(nic_remove, remove.parent))
    res = run_vgpuctl(
        "apply", changed(tmp_path), "--yes", "--verify-timeout", "2",
        "--sysfs-root", node.dir / "sys", "--sriov-manage", "/bin/false", "--node", NODE,
        "--state-dir", tmp_path / "state", "--unsafe-assume-no-hidden-holders",
        timeout=PROMPT,
    )  # fmt: skip
    assert nic_remove.read_text() == ""
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"refusing sysfs write to bus/mdev/devices/{UUID5}/remove: {remove} is a link" in (
        res.stderr
    )
