"""Fingerprints the watch loop compares at each rescan: the host's and the cluster's.

A fingerprint must change whenever something a plan depends on changed, and stay the same
otherwise (an unchanged node must cost a fingerprint, not a reconcile). Hosts are simulated;
the cluster is the in-memory ClusterApi (tests/doubles/cluster.py).
"""

from __future__ import annotations

import os
import uuid as uuidlib
from pathlib import Path

import pytest

from reconciler.sim import SimHost, build_host, hold, reboot, release
from reconciler.watch import signature as signature_module
from reconciler.watch.signature import HostSignature

SEED_SPEC = {
    "gpus": [
        {
            "model": "A2",
            "address": "0000:08:00.0",
            "vgpus": {"0000:08:00.4": "NVIDIA A2-4A", "0000:08:00.5": "NVIDIA A2-4Q"},
        }
    ]
}
NVIDIA_A2_4C_TYPE = "nvidia-754"


def sim_uuid(vf: str) -> str:
    """The UUID the simulator gives a vGPU it builds on ``vf`` (build_host's default)."""
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"sim/{vf}"))


U4 = sim_uuid("0000:08:00.4")


@pytest.fixture
def host(tmp_path: Path) -> SimHost:
    return build_host(tmp_path / "host", SEED_SPEC)


def test_an_unchanged_host_keeps_its_fingerprint(host: SimHost) -> None:
    signature = HostSignature(host.sysfs_root)
    assert signature.compute() == signature.compute()
    # A fresh reader of the same host agrees: nothing depends on what was read before.
    assert HostSignature(host.sysfs_root).compute() == signature.compute()


def test_an_unchanged_host_does_not_search_the_pci_bus_again(
    host: SimHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    real = signature_module.find_vgpu_pfs
    monkeypatch.setattr(
        signature_module, "find_vgpu_pfs", lambda tree: calls.append(1) or real(tree)
    )
    signature = HostSignature(host.sysfs_root)
    for _ in range(5):
        signature.compute()
    assert len(calls) == 1


def test_a_vgpu_removed_by_hand_changes_it(host: SimHost) -> None:
    signature = HostSignature(host.sysfs_root)
    before = signature.compute()
    host.writer().write(f"bus/mdev/devices/{U4}/remove", "1")
    assert signature.compute() != before


def test_a_vgpu_recreated_with_the_same_uuid_but_another_type_changes_it(host: SimHost) -> None:
    signature = HostSignature(host.sysfs_root)
    before = signature.compute()
    host.writer().write(f"bus/mdev/devices/{U4}/remove", "1")
    # Another type of the same size on the same VF, the same UUID: the listing alone is equal.
    host.writer().write(
        f"bus/pci/devices/0000:08:00.4/mdev_supported_types/{NVIDIA_A2_4C_TYPE}/create", U4
    )
    assert sorted(os.listdir(host.sysfs_root / "bus/mdev/devices")) == sorted(
        [U4, sim_uuid("0000:08:00.5")]
    )
    assert signature.compute() != before


def test_a_reboot_changes_it_and_recreating_everything_restores_it(
    host: SimHost, tmp_path: Path
) -> None:
    signature = HostSignature(host.sysfs_root)
    converged = signature.compute()
    reboot(host.directory)
    assert signature.compute() != converged
    # The same state built again has the same fingerprint: it is the state, not a history.
    again = build_host(tmp_path / "again", SEED_SPEC)
    assert HostSignature(again.sysfs_root).compute() == converged


def test_holds_count_only_when_a_probe_is_given(host: SimHost) -> None:
    with_probe = HostSignature(host.sysfs_root, hold_probe=host.hold_probe())
    without = HostSignature(host.sysfs_root)
    before = (with_probe.compute(), without.compute())
    hold(host.directory, U4)
    assert with_probe.compute() != before[0]
    assert without.compute() == before[1]
    release(host.directory, U4)
    assert with_probe.compute() == before[0]


def test_extra_files_count_by_identity_size_and_time(host: SimHost, tmp_path: Path) -> None:
    checkpoint = tmp_path / "kubelet_internal_checkpoint"
    signature = HostSignature(host.sysfs_root, extra_files=[checkpoint])
    absent = signature.compute()
    checkpoint.write_text("{}")
    present = signature.compute()
    assert present != absent
    os.utime(checkpoint, ns=(1, 1))
    assert signature.compute() != present


def test_an_unreadable_tree_gives_a_fingerprint_of_the_error(tmp_path: Path) -> None:
    signature = HostSignature(tmp_path / "missing")
    first = signature.compute()
    assert first == signature.compute()  # stable while the error is the same
    (tmp_path / "missing" / "bus" / "pci" / "devices").mkdir(parents=True)
    assert signature.compute() != first
