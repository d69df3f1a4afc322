"""The engine's check of the host after the host actions against the plan's prediction: what
counts (SR-IOV state, VFs, each VF's vGPU type and UUID on a managed GPU) and what does not (type
ids, creatable types, holders, GPUs the desired state does not name). Inventories by hand."""

from __future__ import annotations

from dataclasses import replace

from reconciler.engine.predicted import host_differences
from reconciler.model import VGPU, Gpu, Inventory, PciAddress, Vf

GPU = PciAddress.parse("0000:08:00.0")
OTHER = PciAddress.parse("0000:41:00.0")
U4 = "5adb8e42-c29a-5705-8ae0-584ba08668af"


def gpu(address: PciAddress, vgpus: dict[int, VGPU | None], *, num_vfs: int = 4) -> Gpu:
    vfs = tuple(
        Vf(PciAddress.parse(f"{str(address)[:-1]}{i + 4}"), i, vgpus.get(i)) for i in range(num_vfs)
    )
    return Gpu(address, "10de", "25b6", num_vfs=num_vfs, total_vfs=16, vfs=vfs)


def node(*gpus: Gpu) -> Inventory:
    return Inventory(node="n", gpus=gpus)


def test_the_host_as_predicted_has_no_difference_whatever_its_statuses_say() -> None:
    predicted = node(gpu(GPU, {0: VGPU(U4, "NVIDIA A2-4A")}))
    held = VGPU(U4.upper(), "NVIDIA A2-4A", in_use=True, holder="vm db")
    observed = node(replace(gpu(GPU, {0: held}), vfs=tuple(
        replace(vf, creatable=frozenset({"NVIDIA A2-4Q"})) for vf in gpu(GPU, {0: held}).vfs
    )))  # fmt: skip
    assert host_differences(predicted, observed, managed={GPU}) == ()


def test_a_vgpu_of_another_type_or_uuid_or_none_is_named() -> None:
    predicted = node(gpu(GPU, {0: VGPU(U4, "NVIDIA A2-4A"), 1: None}))
    vf4, vf5 = (str(v.address) for v in predicted.gpus[0].vfs[:2])
    observed = node(gpu(GPU, {0: VGPU(U4, "NVIDIA A2-4Q"), 1: VGPU("u-5", "NVIDIA A2-4Q")}))
    assert host_differences(predicted, observed, managed={GPU}) == (
        f"VF {vf4} hosts NVIDIA A2-4Q {U4}, the plan predicted NVIDIA A2-4A {U4}",
        f"VF {vf5} hosts NVIDIA A2-4Q u-5, the plan predicted no vGPU",
    )
    gone = node(gpu(GPU, {}))
    assert host_differences(predicted, gone, managed={GPU}) == (
        f"VF {vf4} hosts no vGPU, the plan predicted NVIDIA A2-4A {U4}",
    )


def test_sriov_state_and_vfs_are_compared_first() -> None:
    predicted = node(gpu(GPU, {}, num_vfs=4))
    assert host_differences(predicted, node(gpu(GPU, {}, num_vfs=0)), managed={GPU}) == (
        "GPU 0000:08:00.0 has SR-IOV off, the plan predicted 4 VFs",
    )
    assert host_differences(predicted, node(), managed={GPU}) == ("GPU 0000:08:00.0 is gone",)


def test_only_the_managed_gpus_count() -> None:
    predicted = node(gpu(GPU, {}), gpu(OTHER, {}))
    observed = node(gpu(GPU, {}), gpu(OTHER, {0: VGPU(U4, "NVIDIA L40S-8Q")}))
    assert host_differences(predicted, observed, managed={GPU}) == ()
    assert len(host_differences(predicted, observed, managed={GPU, OTHER})) == 1


def test_text_from_the_host_is_escaped() -> None:
    predicted = node(gpu(GPU, {}))
    observed = node(gpu(GPU, {0: VGPU(U4, "NVIDIA A2-4A\x1b[2J")}))
    (line,) = host_differences(predicted, observed, managed={GPU})
    assert "\x1b" not in line
