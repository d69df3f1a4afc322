"""Is the host after the host actions the one the cluster actions were planned for? Pure.

The cluster actions of a plan are rendered from the host as its host actions were predicted to
leave it (``plan/predict.py``). After the host phase the engine observes the host again and
compares what the cluster actions depend on, GPU by managed GPU: its SR-IOV state (the VF
count), its VFs (address and index) and each VF's vGPU (type and UUID). Anything else a status
mirrors (type ids the driver lists only once SR-IOV is on, which types are still creatable,
who holds a vGPU) is the host's to say and is not a promise of the plan. GPUs the desired state
does not name have no cluster object and are not compared.
"""

from __future__ import annotations

from collections.abc import Iterable

from reconciler.model import Gpu, Inventory, PciAddress, Vf
from reconciler.model.errors import excerpt


def host_differences(
    predicted: Inventory, observed: Inventory, *, managed: Iterable[PciAddress]
) -> tuple[str, ...]:
    """What differs between ``predicted`` and ``observed`` on the ``managed`` GPUs, in address
    order, one phrase each; empty when the host is as predicted."""
    expected = {g.address: g for g in predicted.gpus}
    found = {g.address: g for g in observed.gpus}
    out: list[str] = []
    for address in sorted(set(managed)):
        want, have = expected.get(address), found.get(address)
        if want is None:
            continue  # not on the host when planned: the planner refused or reported it
        if have is None:
            out.append(f"GPU {address} is gone")
            continue
        out.extend(_gpu_differences(want, have))
    return tuple(out)


def _gpu_differences(want: Gpu, have: Gpu) -> list[str]:
    if want.num_vfs != have.num_vfs:
        return [
            f"GPU {want.address} has {_vfs(have.num_vfs)}, the plan predicted {_vfs(want.num_vfs)}"
        ]
    out: list[str] = []
    have_vfs = {vf.index: vf for vf in have.vfs}
    want_vfs = {vf.index: vf for vf in want.vfs}
    for index in sorted(want_vfs.keys() | have_vfs.keys()):
        w, h = want_vfs.get(index), have_vfs.get(index)
        if w is None or h is None or w.address != h.address:
            out.append(
                f"GPU {want.address} VF {index} is {_address(h)}, the plan predicted {_address(w)}"
            )
            continue
        if _vgpu(w) != _vgpu(h):
            out.append(
                f"VF {w.address} hosts {_vgpu_words(h)}, the plan predicted {_vgpu_words(w)}"
            )
    return out


def _vfs(n: int) -> str:
    return "SR-IOV off" if n == 0 else f"{n} VF{'s' * (n != 1)}"


def _address(vf: Vf | None) -> str:
    return "missing" if vf is None else str(vf.address)


def _vgpu(vf: Vf) -> tuple[str, str] | None:
    return None if vf.vgpu is None else (vf.vgpu.type_name, vf.vgpu.uuid.lower())


def _vgpu_words(vf: Vf) -> str:
    if vf.vgpu is None:
        return "no vGPU"
    return f"{excerpt(vf.vgpu.type_name, 40)} {excerpt(vf.vgpu.uuid, 40)}"
