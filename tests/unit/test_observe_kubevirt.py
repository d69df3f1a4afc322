"""observe/kubevirt.py: KubeVirt's signs on a host (bounded reads of planted trees) and a
KubeVirt CR read as virt-handler reads it (pure). Expected values from KubeVirt's sources:
device_manager/common.go ``SocketPath`` (``kubevirt-<device>.sock``), the feature gate's name in
the CR (``DisableMDEVConfiguration``), ``removeSelectorSpaces`` (spaces → ``_``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from reconciler.observe import kubevirt
from reconciler.observe.kubevirt import (
    KubevirtSighting,
    is_virt_handler,
    kubevirt_sockets,
    mdev_handling,
    not_allow_listed,
    sight_kubevirt,
)


def test_kubevirt_sockets_are_told_by_name() -> None:
    names = [
        "kubelet_internal_checkpoint",
        "kubevirt-kvm.sock",
        "vgpuctl-nvidia.com_NVIDIA_A2-4Q.sock",  # vgpuctl's own plugin
        "kubevirt-.sock",  # no device
        "kubevirt-tun.sock.old",
        "kubevirt-nvidia.com-NVIDIA_A2-4Q.sock",  # KubeVirt's plugin for an allow-listed mdev
        "kubelet.sock",
    ]
    assert kubevirt_sockets(names) == ["kubevirt-kvm.sock", "kubevirt-nvidia.com-NVIDIA_A2-4Q.sock"]


@pytest.mark.parametrize(
    ("comm", "expected"),
    [
        (b"virt-handler\n", True),
        (b"virt-handler", True),
        (b"virt-launcher\n", False),
        (b"virt-handler2\n", False),
        (b"qemu-kvm\n", False),
        (b"", False),
    ],
)
def test_virt_handler_is_told_by_its_comm(comm: bytes, expected: bool) -> None:
    assert is_virt_handler(comm) is expected


def _proc(root: Path, pid: int, comm: str) -> None:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "comm").write_text(comm + "\n")


def test_nothing_seen_on_a_plain_host(tmp_path: Path) -> None:
    _proc(tmp_path / "proc", 1, "systemd")
    _proc(tmp_path / "proc", 950, "qemu-kvm")
    (tmp_path / "proc" / "self").mkdir()  # not a process number: skipped
    (tmp_path / "kubelet" / "device-plugins").mkdir(parents=True)
    assert sight_kubevirt(kubelet_dir=tmp_path / "kubelet", proc_root=tmp_path / "proc") is None
    # Neither a kubelet directory nor a proc tree: nothing to see.
    assert sight_kubevirt(kubelet_dir=tmp_path / "no", proc_root=tmp_path / "none") is None


def test_sockets_are_named_and_counted(tmp_path: Path) -> None:
    plugins = tmp_path / "kubelet" / "device-plugins"
    plugins.mkdir(parents=True)
    for name in (
        "kubevirt-kvm.sock",
        "kubevirt-tun.sock",
        "kubevirt-vhost-net.sock",
        "kubevirt-sev.sock",
    ):
        (plugins / name).touch()
    found = sight_kubevirt(kubelet_dir=tmp_path / "kubelet", proc_root=tmp_path / "proc")
    assert found == KubevirtSighting(
        f"{plugins} holds KubeVirt's device-plugin sockets kubevirt-kvm.sock, "
        "kubevirt-sev.sock, kubevirt-tun.sock and 1 more"
    )


def test_a_virt_handler_process_is_seen_and_exited_ones_are_skipped(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "17").mkdir(parents=True)  # exited between the listing and the read: no comm
    _proc(proc, 2024, "virt-handler")
    found = sight_kubevirt(kubelet_dir=tmp_path / "kubelet", proc_root=proc)
    assert found == KubevirtSighting("process 2024 is virt-handler")


def test_a_comm_that_is_no_regular_file_is_not_followed_nor_waited_on(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "5").mkdir(parents=True)
    os.mkfifo(proc / "5" / "comm")  # would block a plain open() for ever
    assert sight_kubevirt(kubelet_dir=tmp_path / "kubelet", proc_root=proc) is None
    (proc / "6").mkdir()
    (tmp_path / "elsewhere").write_text("virt-handler\n")
    (proc / "6" / "comm").symlink_to(tmp_path / "elsewhere")
    found = sight_kubevirt(kubelet_dir=tmp_path / "kubelet", proc_root=proc)
    assert found is not None
    assert not found.certain  # a link where a file must be: cannot tell, so fail closed
    assert found.signal.startswith(f"cannot read {proc}/6/comm: ")


def test_a_listing_past_its_bound_cannot_tell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubevirt, "LISTING_LIMIT", 3)
    plugins = tmp_path / "kubelet" / "device-plugins"
    plugins.mkdir(parents=True)
    for i in range(5):
        (plugins / f"other-{i}.sock").touch()
    found = sight_kubevirt(kubelet_dir=tmp_path / "kubelet", proc_root=tmp_path / "proc")
    assert found == KubevirtSighting(
        f"{plugins} has more than 3 entries, none of the first KubeVirt's: not read further",
        certain=False,
    )
    assert found.reason.startswith(
        f"waits for a cluster connection: vgpuctl cannot tell whether KubeVirt runs on this host "
        f"({plugins} has more than 3 entries"
    )


def test_a_proc_tree_past_its_bound_cannot_tell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubevirt, "PROCESS_LIMIT", 2)
    for pid in (1, 2, 3):
        _proc(tmp_path / "proc", pid, "sleep")
    found = sight_kubevirt(kubelet_dir=tmp_path / "kubelet", proc_root=tmp_path / "proc")
    assert found == KubevirtSighting(
        f"{tmp_path / 'proc'} lists more than 2 processes: not read further", certain=False
    )


def _cr(**configuration: Any) -> dict[str, Any]:
    return {"metadata": {"name": "kubevirt"}, "spec": {"configuration": configuration}}


def test_mdev_handling_is_on_unless_turned_off() -> None:
    assert mdev_handling({}) is None
    assert mdev_handling(_cr()) is None
    assert mdev_handling(_cr(mediatedDevicesConfiguration={"enabled": True})) is None
    assert mdev_handling(_cr(mediatedDevicesConfiguration={"mediatedDeviceTypes": []})) is None
    assert (
        mdev_handling(_cr(mediatedDevicesConfiguration={"enabled": False}))
        == "spec.configuration.mediatedDevicesConfiguration.enabled is false"
    )
    gates = {"featureGates": ["HostDevices", "DisableMDEVConfiguration"]}
    assert (
        mdev_handling(_cr(developerConfiguration=gates))
        == "the feature gate DisableMDEVConfiguration is on"
    )
    # The Go constant's name is not the gate's: KubeVirt ignores it.
    wrong = {"featureGates": ["DisableMediatedDevicesHandling"]}
    assert mdev_handling(_cr(developerConfiguration=wrong)) is None
    # Malformed parts are read as absent (as KubeVirt would refuse them): handling on.
    assert mdev_handling({"spec": {"configuration": "x"}}) is None
    assert mdev_handling(_cr(developerConfiguration={"featureGates": "x"})) is None


def test_not_allow_listed_compares_as_kubevirt_does() -> None:
    cr = _cr(
        permittedHostDevices={
            "mediatedDevices": [
                {"mdevNameSelector": "NVIDIA_A2-4A", "externalResourceProvider": True},
                {"mdevNameSelector": "NVIDIA A2-8Q", "externalResourceProvider": True},
                {"mdevNameSelector": "NVIDIA A2-4Q"},  # KubeVirt's own plugin: not external
                {"mdevNameSelector": "NVIDIA A2-2Q", "externalResourceProvider": "true"},
                "not an entry",
            ]
        }
    )
    types = ["NVIDIA A2-4A", "NVIDIA A2-8Q", "NVIDIA A2-4Q", "NVIDIA A2-2Q", "NVIDIA A2-4Q"]
    assert not_allow_listed(cr, types) == ["NVIDIA A2-2Q", "NVIDIA A2-4Q"]
    assert not_allow_listed(_cr(), ["NVIDIA A2-4A"]) == ["NVIDIA A2-4A"]
    assert not_allow_listed(cr, []) == []
