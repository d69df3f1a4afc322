"""The executor against a fake kernel: no-ops, verification, refusals, stopping, journaling."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_apply_fakes import (
    GPU,
    UUID_A,
    UUID_B,
    UUID_C,
    FakeKernel,
    FakeSriovManage,
    FakeTime,
    FakeWriter,
    vf_address,
)

from reconciler.apply import (
    SKIPPED_NOT_HOST,
    ApplyResult,
    Journal,
    MdevDriver,
    OutcomeStatus,
    Phase,
    SysfsDevice,
    execute,
)
from reconciler.model import (
    Action,
    ApplyError,
    CrCreate,
    DevicePluginRefresh,
    Observation,
    PciAddress,
    Plan,
    SriovDisable,
    SriovEnable,
    VgpuCreate,
    VgpuRemove,
)
from reconciler.model.cluster import KubeObject

NODE = "n1"
VF0, VF1, VF2 = (vf_address(i) for i in range(3))


class Host:
    """Fake kernel + fake sriov-manage + the real MdevDriver + a journal + a fake clock."""

    def __init__(self, tmp_path: Path, *, sriov: str = "works", **kernel: Any) -> None:
        self.kernel = FakeKernel(tmp_path, **kernel)
        self.sriov = FakeSriovManage(self.kernel, behaviour=sriov)
        self.driver = MdevDriver(
            sysfs_root=self.kernel.root,
            writer=FakeWriter(self.kernel),
            runner=self.sriov,
            sriov_manage=["/usr/lib/nvidia/sriov-manage"],
        )
        self.journal = Journal(tmp_path / "state", NODE)
        self.time = FakeTime(on_sleep=self.sriov.tick)

    def apply(self, *actions: Action, verify_timeout: float = 5.0) -> ApplyResult:
        plan = Plan(node=NODE, interface="mdev", observed=Observation("sha256:x"), actions=actions)
        return execute(
            plan,
            driver=self.driver,
            journal=self.journal,
            verify_timeout=verify_timeout,
            poll_interval=0.5,
            clock=self.time.clock,
            sleep=self.time.sleep,
        )


def enable(seq: int = 1, num_vfs: int = 4) -> Action:
    return SriovEnable(seq=seq, target=str(GPU), reason=f"because {seq}", gpu=GPU, num_vfs=num_vfs)


def disable(seq: int = 1) -> Action:
    return SriovDisable(seq=seq, target=str(GPU), reason=f"because {seq}", gpu=GPU)


def create(
    seq: int, vf: PciAddress, index: int, uuid: str, type_name: str = "NVIDIA A2-4Q"
) -> VgpuCreate:
    return VgpuCreate(
        seq=seq, target=str(vf), reason=f"because {seq}", gpu=GPU, vf_index=index,
        type_name=type_name, uuid=uuid,
    )  # fmt: skip


def remove(
    seq: int, vf: PciAddress, index: int, uuid: str, type_name: str = "NVIDIA A2-4Q"
) -> Action:
    return VgpuRemove(
        seq=seq, target=str(vf), reason=f"because {seq}", gpu=GPU, vf_index=index,
        type_name=type_name, uuid=uuid,
    )  # fmt: skip


def refresh(seq: int) -> Action:
    return DevicePluginRefresh(
        seq=seq, target="nvidia.com/NVIDIA_A2-4Q", reason=f"because {seq}",
        resource="nvidia.com/NVIDIA_A2-4Q", type_name="NVIDIA A2-4Q",
    )  # fmt: skip


def statuses(result: ApplyResult) -> list[tuple[int, str, str]]:
    return [(o.action.seq, o.status.value, o.message) for o in result.outcomes]


def journal_lines(host: Host) -> list[tuple[int, str, str]]:
    return [(r.seq, r.kind, r.phase.value) for r in host.journal.last_run()]


# -- the happy path and idempotence ---------------------------------------------------------------


def test_enable_then_create_runs_in_order_and_verifies(tmp_path: Path) -> None:
    host = Host(tmp_path)
    result = host.apply(
        enable(1), create(2, VF0, 0, UUID_A), create(3, VF1, 1, UUID_B, "NVIDIA A2-4A")
    )
    assert statuses(result) == [
        (1, "done", "enabled 4 VFs"),
        (2, "done", f"created NVIDIA A2-4Q {UUID_A}"),
        (3, "done", f"created NVIDIA A2-4A {UUID_B}"),
    ]
    assert result.ok
    assert result.changed
    assert str(result.counts) == "3 done, 0 no-op, 0 failed, 0 skipped, 0 not run"
    assert host.driver.vgpu_on(VF1) == (UUID_B, "NVIDIA A2-4A")
    assert host.sriov.calls == [(["/usr/lib/nvidia/sriov-manage", "-e", str(GPU)], 300.0)]


def test_a_second_apply_of_the_same_plan_is_all_noops_and_touches_nothing(tmp_path: Path) -> None:
    host = Host(tmp_path)
    plan = (enable(1), create(2, VF0, 0, UUID_A), remove(3, VF2, 2, UUID_C))
    host.kernel.enable()
    host.kernel.make_mdev(VF2, "nvidia-745", UUID_C)
    assert host.apply(*plan).ok
    writes, calls = len(host.kernel.writes), len(host.sriov.calls)

    again = host.apply(*plan)
    assert statuses(again) == [
        (1, "noop", "already enabled (4 VFs)"),
        (2, "noop", f"already hosts that vGPU (NVIDIA A2-4Q {UUID_A})"),
        (3, "noop", "already gone"),
    ]
    assert not again.changed
    assert (len(host.kernel.writes), len(host.sriov.calls)) == (writes, calls)


def test_disable_of_a_gpu_without_vfs_is_a_noop(tmp_path: Path) -> None:
    host = Host(tmp_path)
    assert statuses(host.apply(disable())) == [(1, "noop", "already disabled")]
    assert host.sriov.calls == []


def test_remove_then_disable(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.kernel.enable()
    host.kernel.make_mdev(VF1, "nvidia-745", UUID_A)
    result = host.apply(remove(1, VF1, 1, UUID_A), disable(2))
    assert statuses(result) == [
        (1, "done", f"removed NVIDIA A2-4Q {UUID_A}"),
        (2, "done", "disabled SR-IOV"),
    ]
    assert host.kernel.num_vfs() == 0


def test_a_done_removal_is_journalled_with_its_vf_uuid_and_type_as_fields(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.kernel.enable()
    host.kernel.make_mdev(VF1, "nvidia-745", UUID_A)
    host.apply(remove(1, VF1, 1, UUID_A), remove(2, VF2, 2, UUID_B))  # B: already gone
    raw = [json.loads(text) for text in host.journal.path.read_text().splitlines()]
    assert [
        (r["seq"], r["phase"], r.get("removed")) for r in raw if r["kind"] == "vgpu-remove"
    ] == [
        (1, "intent", None),
        (1, "done", {"vf": str(VF1), "uuid": UUID_A, "type": "NVIDIA A2-4Q"}),
        (2, "intent", None),
        (2, "noop", None),
    ]


def test_slow_vf_creation_is_waited_for(tmp_path: Path) -> None:
    host = Host(tmp_path, sriov="later")
    result = host.apply(enable(1), create(2, VF0, 0, UUID_A))
    assert [o.status for o in result.outcomes] == [OutcomeStatus.DONE, OutcomeStatus.DONE]
    assert host.time.sleeps == 3


def test_create_waits_for_the_vf_to_become_an_mdev_parent(tmp_path: Path) -> None:
    host = Host(tmp_path, mdev_parents=False)
    host.kernel.enable()
    host.time = FakeTime(on_sleep=lambda: host.kernel.register(VF0))
    result = host.apply(create(1, VF0, 0, UUID_A))
    assert statuses(result) == [(1, "done", f"created NVIDIA A2-4Q {UUID_A}")]


def test_create_on_a_vf_that_never_becomes_an_mdev_parent_fails(tmp_path: Path) -> None:
    host = Host(tmp_path, mdev_parents=False)
    host.kernel.enable()
    result = host.apply(create(1, VF0, 0, UUID_A), verify_timeout=2)
    assert statuses(result) == [
        (
            1,
            "failed",
            "0000:08:00.4 never offered vGPU types within 2 s: is the NVIDIA vGPU manager running?",
        )
    ]
    assert host.kernel.writes == []


# -- verification ---------------------------------------------------------------------------------


def test_sriov_manage_exiting_0_having_done_nothing_is_a_failure(tmp_path: Path) -> None:
    host = Host(tmp_path, sriov="silent")
    result = host.apply(enable(1), create(2, VF0, 0, UUID_A), verify_timeout=2)
    failed = result.failed
    assert failed is not None
    assert failed.action.seq == 1
    assert failed.message == (
        "SR-IOV enable on 0000:08:00.0 reported success but the VF count never appeared: "
        "expected 4 VFs within 2 s, found sriov_numvfs 0 and 0 virtfn links"
    )
    assert [a.seq for a in result.not_run] == [2]
    # Bounded: it polled until the timeout, then stopped.
    assert 1000.0 + 2 <= host.time.now < 1000.0 + 3
    assert host.time.sleeps == 4


def test_sriov_manage_failing_reports_its_stderr(tmp_path: Path) -> None:
    host = Host(tmp_path, sriov="fails")
    result = host.apply(enable(1))
    assert statuses(result) == [
        (
            1,
            "failed",
            "sriov-manage -e 0000:08:00.0 failed (exit 1): "
            "Enabling VFs on 0000:08:00.0; Error: GPU is in use",
        )
    ]


def test_a_create_the_driver_accepts_but_never_shows_fails_verification(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.kernel.enable()

    class Swallow:
        def write(self, path: str, value: str, *, device: SysfsDevice) -> None:
            pass  # accepted, nothing happens

    host.driver = MdevDriver(
        sysfs_root=host.kernel.root,
        writer=Swallow(),
        runner=host.sriov,
        sriov_manage=["sriov-manage"],
    )
    result = host.apply(create(1, VF0, 0, UUID_A), verify_timeout=1)
    assert statuses(result) == [
        (
            1,
            "failed",
            f"created NVIDIA A2-4Q {UUID_A} on 0000:08:00.4, but it did not appear within 1 s "
            "(the VF shows no vGPU)",
        )
    ]


# -- refusals: the host is not what the plan was made from ----------------------------------------


def test_create_re_resolves_the_vf_and_refuses_a_mismatch(tmp_path: Path) -> None:
    # The plan predicted VF1 at .5 (A2 layout); this card puts VF0 at .2, so VF1 is .3.
    host = Host(tmp_path, first_function=2)
    result = host.apply(enable(1), create(2, PciAddress.parse("0000:08:00.5"), 1, UUID_A))
    assert statuses(result)[1] == (
        2,
        "failed",
        "VF index 1 of 0000:08:00.0 is 0000:08:00.3, but the plan targets 0000:08:00.5: "
        "refusing to guess; run plan again",
    )
    assert host.kernel.writes == []


def test_create_of_a_vf_index_beyond_the_vfs_fails(tmp_path: Path) -> None:
    host = Host(tmp_path)
    result = host.apply(create(1, VF1, 1, UUID_A))
    assert result.failed is not None
    assert result.failed.message == (
        "0000:08:00.0 has 0 VFs, so VF index 1 (0000:08:00.5) does not exist: is SR-IOV enabled?"
    )


def test_create_never_duplicates_a_uuid_living_on_another_vf(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.kernel.enable()
    host.kernel.make_mdev(VF0, "nvidia-745", UUID_A)
    result = host.apply(create(1, VF1, 1, UUID_A))
    assert statuses(result) == [
        (
            1,
            "failed",
            f"a vGPU with UUID {UUID_A} already exists on 0000:08:00.4: "
            "refusing to create a duplicate on 0000:08:00.5",
        )
    ]
    assert host.kernel.writes == []


def test_create_on_a_vf_hosting_another_vgpu_fails(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.kernel.enable()
    host.kernel.make_mdev(VF1, "nvidia-742", UUID_B)
    result = host.apply(create(1, VF1, 1, UUID_A))
    assert result.failed is not None
    assert result.failed.message == (
        f"0000:08:00.5 already hosts vGPU {UUID_B} (NVIDIA A2-4A), but the plan expects it "
        "empty for NVIDIA A2-4Q: run plan again"
    )


def test_remove_of_a_uuid_found_on_another_vf_fails(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.kernel.enable()
    host.kernel.make_mdev(VF2, "nvidia-745", UUID_A)
    result = host.apply(remove(1, VF1, 1, UUID_A))
    assert result.failed is not None
    assert result.failed.message == (
        f"vGPU {UUID_A} is on 0000:08:00.6, not on 0000:08:00.5 as planned: run plan again"
    )
    assert host.kernel.mdevs_on(VF2) == [UUID_A]


def test_remove_of_a_vgpu_of_another_type_fails(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.kernel.enable()
    host.kernel.make_mdev(VF1, "nvidia-810", UUID_A)
    result = host.apply(remove(1, VF1, 1, UUID_A))
    assert result.failed is not None
    assert "is NVIDIA A2-2Q, but the plan expects NVIDIA A2-4Q" in result.failed.message
    assert host.kernel.mdevs_on(VF1) == [UUID_A]


def test_disable_refuses_while_a_vgpu_remains(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.kernel.enable()
    host.kernel.make_mdev(VF2, "nvidia-745", UUID_C)
    result = host.apply(disable())
    assert result.failed is not None
    assert result.failed.message == (
        f"0000:08:00.0 still hosts vGPU {UUID_C} (NVIDIA A2-4Q) on 0000:08:00.6: "
        "not disabling SR-IOV under it; run plan again"
    )
    assert host.sriov.calls == []


def test_enable_with_another_vf_count_already_there_fails(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.kernel.enable()
    result = host.apply(enable(1, num_vfs=16))
    assert result.failed is not None
    assert result.failed.message.startswith(
        "0000:08:00.0 already has 4 VFs but the plan expects 16"
    )


# -- stopping, skipping, result -------------------------------------------------------------------


def test_the_run_stops_at_the_first_failure(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.kernel.enable()
    host.kernel.make_mdev(VF0, "nvidia-745", UUID_A)
    host.kernel.held.add(UUID_A)
    result = host.apply(remove(1, VF0, 0, UUID_A), create(2, VF1, 1, UUID_B), disable(3))
    assert statuses(result) == [
        (1, "failed", f"vGPU {UUID_A} on 0000:08:00.4 is in use (held by a VM): not removed")
    ]
    failed = result.failed
    assert failed is not None
    assert failed.transient
    assert [a.seq for a in result.not_run] == [2, 3]
    assert result.counts.to_json() == {
        "done": 0,
        "noop": 0,
        "failed": 1,
        "skipped": 0,
        "notRun": 2,
    }
    assert host.driver.vgpu_on(VF1) is None
    assert result.to_json()["failed"]["seq"] == 1


def test_non_host_actions_are_skipped_and_the_run_goes_on(tmp_path: Path) -> None:
    host = Host(tmp_path)
    cr = CrCreate(
        seq=2, target="n1-000008004", reason="r",
        object=KubeObject("VGPUDevice", "n1-000008004", spec={"address": "0000:08:00.4"}),
    )  # fmt: skip
    result = host.apply(enable(1), cr, create(3, VF0, 0, UUID_A))
    assert [(o.action.seq, o.status) for o in result.outcomes] == [
        (1, OutcomeStatus.DONE),
        (2, OutcomeStatus.SKIPPED),
        (3, OutcomeStatus.DONE),
    ]
    assert result.outcomes[1].message == SKIPPED_NOT_HOST
    assert result.ok


@pytest.mark.parametrize(
    ("fields", "target", "problem"),
    [
        ({"vf_index": -1}, str(VF0), "vfIndex must not be negative"),
        ({}, "08:00.4", "target: invalid PCI address '08:00.4'"),
        ({"type_name": ""}, str(VF0), "type must not be empty"),
        ({"uuid": ""}, str(VF0), "uuid must not be empty"),
    ],
)
def test_malformed_actions_fail_before_anything_runs(
    tmp_path: Path, fields: Mapping[str, Any], target: str, problem: str
) -> None:
    host = Host(tmp_path)
    bad = replace(create(2, VF0, 0, UUID_A), target=target, **fields)
    with pytest.raises(ApplyError) as info:
        host.apply(enable(1), bad)
    assert "nothing was applied" in info.value.message
    (only,) = info.value.problems
    assert only.message.startswith(f"action 2 (vgpu-create {target}): {problem}")
    assert host.sriov.calls == []
    assert host.journal.records() == []


def test_a_plan_for_another_node_is_a_programming_error(tmp_path: Path) -> None:
    host = Host(tmp_path)
    plan = Plan(node="other", interface="mdev", observed=Observation("x"), actions=(enable(),))
    with pytest.raises(ValueError, match="plan for node other given a journal for node n1"):
        execute(plan, driver=host.driver, journal=host.journal)


def test_a_plan_for_another_interface_is_a_programming_error(tmp_path: Path) -> None:
    host = Host(tmp_path)
    plan = Plan(node=NODE, interface="vfio", observed=Observation("x"), actions=(enable(),))
    with pytest.raises(ValueError, match="plan for the vfio interface given the mdev driver"):
        execute(plan, driver=host.driver, journal=host.journal)
    assert host.journal.records() == []


def test_a_bug_in_a_driver_is_journaled_then_raised(tmp_path: Path) -> None:
    host = Host(tmp_path)

    def broken(gpu: PciAddress) -> int:
        raise KeyError("bug")

    host.driver.num_vfs = broken  # type: ignore[method-assign]
    with pytest.raises(KeyError):
        host.apply(enable(1))
    last = host.journal.last_run()[-1]
    assert (last.seq, last.phase, last.message) == (
        1,
        Phase.FAILED,
        "internal error: KeyError('bug')",
    )


# -- the journal of a run -------------------------------------------------------------------------


def test_the_run_is_journaled_intent_then_outcome(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.kernel.enable()
    host.kernel.make_mdev(VF0, "nvidia-745", UUID_A)
    host.kernel.held.add(UUID_A)
    result = host.apply(
        enable(1),
        refresh(2),
        create(3, VF1, 1, UUID_B),
        remove(4, VF0, 0, UUID_A),
        create(5, VF2, 2, UUID_C),
    )
    assert journal_lines(host) == [
        (0, "run", "start"),
        (1, "sriov-enable", "intent"),
        (1, "sriov-enable", "noop"),
        (2, "device-plugin-refresh", "skipped"),
        (3, "vgpu-create", "intent"),
        (3, "vgpu-create", "done"),
        (4, "vgpu-remove", "intent"),
        (4, "vgpu-remove", "failed"),
        (0, "run", "end"),
    ]
    records = host.journal.last_run()
    assert {r.run for r in records} == {result.run_id}
    assert records[0].target == NODE
    assert records[1].message == "because 1"  # the intent carries the plan's reason
    assert records[4].target == str(VF1)
    assert records[-2].message.endswith("is in use (held by a VM): not removed")
    assert records[-1].message == "1 done, 1 no-op, 1 failed, 1 skipped, 1 not run"
    assert host.journal.interrupted() == []


def test_each_run_gets_its_own_id(tmp_path: Path) -> None:
    host = Host(tmp_path)
    first = host.apply(disable())
    second = host.apply(disable())
    assert first.run_id != second.run_id
    assert {r.run for r in host.journal.last_run()} == {second.run_id}
    assert len(host.journal.records()) == 2 * len(host.journal.last_run())


# --- guards against what a plan should never ask ------------------------------------------------


def test_sriov_manage_is_never_run_on_a_pf_bound_to_another_driver(tmp_path: Path) -> None:
    """sriov-manage -e unbinds a PF from whatever driver it has (docs/domain.md §2): on a GPU
    passed through whole (vfio-pci) that takes it from its VM. The planner never plans it;
    the executor refuses it anyway."""
    host = Host(tmp_path)
    driver_link = host.kernel.pf_dir / "driver"
    driver_link.unlink()
    (host.kernel.root / "bus/pci/drivers/vfio-pci").mkdir(parents=True)
    driver_link.symlink_to("../../../bus/pci/drivers/vfio-pci")
    for action in (enable(), disable()):
        result = host.apply(action)
        assert result.failed is not None
        assert result.failed.message == (
            f"{GPU} is bound to vfio-pci, not nvidia: it is passed through whole or reserved; "
            "sriov-manage is not run on it"
        )
    assert host.sriov.calls == []


def test_a_vf_on_the_vendor_specific_interface_fails_at_once(tmp_path: Path) -> None:
    """After an enable, a VF showing NVIDIA's vendor-specific files (no mdev types) will never
    become an mdev parent: the create fails at once instead of waiting out the timeout."""
    host = Host(tmp_path, mdev_parents=False)
    host.kernel.enable()
    (host.kernel.vf_dir(VF0) / "nvidia").mkdir()
    (host.kernel.vf_dir(VF0) / "nvidia/creatable_vgpu_types").write_text("ID    : vGPU Name\n")
    result = host.apply(create(1, VF0, 0, UUID_A), verify_timeout=600)
    assert result.failed is not None
    assert "exposes NVIDIA's vendor-specific VFIO interface" in result.failed.message
    assert host.time.sleeps == 0  # no waiting for mdev types that will never appear
    assert host.kernel.writes == []


def test_a_vf_whose_removal_is_under_way_gets_nothing_new(tmp_path: Path) -> None:
    """The kernel unlinks an mdev (bus link, type link, remove file) and waits for its VM: the
    directory under the VF stays, and nothing may be created there meanwhile."""
    host = Host(tmp_path)
    host.kernel.enable()
    host.kernel.make_mdev(VF0, "nvidia-746", UUID_A)
    (host.kernel.root / f"bus/mdev/devices/{UUID_A}").unlink()
    (host.kernel.vf_dir(VF0) / UUID_A / "mdev_type").unlink()
    (host.kernel.vf_dir(VF0) / UUID_A / "remove").unlink()
    result = host.apply(create(1, VF0, 0, UUID_B))
    assert result.failed is not None
    assert result.failed.message == (
        f"{VF0}: vGPU {UUID_A} is still being removed (the kernel waits for whatever holds it "
        "to let go): NVIDIA A2-4Q not created"
    )
    assert result.failed.transient
    again = host.apply(remove(1, VF0, 0, UUID_A))
    assert again.failed is not None
    assert again.failed.message.startswith(f"vGPU {UUID_A} on {VF0} is already being removed")
    assert host.kernel.writes == []


def test_a_guard_that_refuses_fails_the_action_before_it_acts_and_stops_the_run(
    tmp_path: Path,
) -> None:
    """A node agent's rollout slot is asked before each host action (``apply/slots.py``): once
    it could not be renewed, the next action fails untouched and nothing after it runs."""
    from reconciler.apply.slots import SlotLostError

    host = Host(tmp_path)
    asked: list[int] = []

    def guard() -> None:
        asked.append(len(asked))
        if len(asked) > 1:
            raise SlotLostError("the rollout slot could not be renewed")

    plan = Plan(
        node=NODE,
        interface="mdev",
        observed=Observation("sha256:x"),
        actions=(enable(1), create(2, VF0, 0, UUID_A), create(3, VF1, 1, UUID_B)),
    )
    result = execute(
        plan, driver=host.driver, journal=host.journal, verify_timeout=5.0, poll_interval=0.5,
        clock=host.time.clock, sleep=host.time.sleep, guard=guard,
    )  # fmt: skip
    assert statuses(result) == [
        (1, "done", "enabled 4 VFs"),
        (2, "failed", "the rollout slot could not be renewed"),
    ]
    assert result.outcomes[1].transient
    assert [a.seq for a in result.not_run] == [3]
    assert host.driver.vgpu_on(VF0) is None
