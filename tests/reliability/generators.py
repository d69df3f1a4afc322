"""Random hosts and valid desired states, drawn by hypothesis and reproducible from a seed.

Adapted from the property test (``tests/property/test_converge.py``): the per-GPU generator
they share, ``gpu_config`` in ``tests/strategies.py`` (one framebuffer size, at most the size's
maximum), is reused as is; the scenario around it covers every single-GPU catalogue model and
up to three GPUs. Multi-GPU boards (A16) are left out: one board entry is several PFs, which
the per-GPU invariants do not model.

``draw_examples`` runs a strategy outside any test to get a fixed list of examples: the suite
then runs them in parallel, and the same seed gives the same list.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, Verbosity, assume, given, seed, settings
from hypothesis import strategies as st

from reconciler.catalog import GpuModel, Profile, default_catalog
from reconciler.model import PciAddress
from reconciler.sim.rules import SimModel
from tests.strategies import gpu_config

CATALOG = default_catalog()
MODELS: tuple[GpuModel, ...] = tuple(m for m in CATALOG.models if m.gpus_per_board == 1)
ADDRESSES = ("0000:08:00.0", "0000:41:00.0", "0000:81:00.0")
API_VERSION = "vgpu.reconciler.dev/v1alpha1"
KIND = "VGPUDesiredState"

T = TypeVar("T")


def vf_address(pf: str, model: GpuModel, index: int) -> str:
    """The address of VF ``index`` of the GPU at ``pf`` (as the simulator places it)."""
    sim = SimModel.from_catalog(model)
    base = PciAddress.parse(pf)
    routing = base.routing_id + sim.vf_offset + index * sim.vf_stride
    return str(PciAddress.from_routing_id(base.domain, routing))


def document(node: str, gpus: list[dict[str, Any]], name: str = "reliability") -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {"nodes": {node: {"gpus": gpus}}},
    }


@st.composite
def host_and_desired(
    draw: st.DrawFn, node: str, max_gpus: int = 3
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A simulator spec (random SR-IOV states and starting vGPUs) and a valid desired state.

    As in the property test: about one GPU in ten is left unmanaged, one managed GPU in five is
    desired with SR-IOV off, and the rest use either form (per-VF with index or address keys,
    short or long profile names; or counts). Each GPU uses mdev or the vfio interface.
    """
    n = draw(st.integers(1, max_gpus))
    host_gpus: list[dict[str, Any]] = []
    desired_gpus: list[dict[str, Any]] = []
    for address in ADDRESSES[:n]:
        model = draw(st.sampled_from(MODELS))
        on = draw(st.booleans())
        _, start = draw(gpu_config(model))
        host_gpus.append(
            {
                "model": model.short,
                "address": address,
                "sriov": "enabled" if on else "disabled",
                "vgpus": dict(start) if on else {},
            }
        )
        entry = desired_gpu(draw, address, model)
        if entry is not None:
            desired_gpus.append(entry)
    # Each GPU's host interface: mdev, or NVIDIA's vendor-specific VFIO (docs/domain.md §3).
    # Drawn last, so that a seed's hosts and desired states are otherwise what they were.
    for gpu in host_gpus:
        gpu["interface"] = draw(st.sampled_from(("mdev", "vfio")))
    return {"gpus": host_gpus, "extraDevices": False}, document(node, desired_gpus)


def desired_gpu(draw: st.DrawFn, address: str, model: GpuModel) -> dict[str, Any] | None:
    """The desired-state entry of one GPU (``None``: left unmanaged), as ``host_and_desired``
    draws it, with the ``draw`` of the composite strategy calling it (a plain function, not a
    strategy of its own: the draws, so the examples of a seed, stay what they were). Also
    draws another desired state for the same host (``watch_crash.py``)."""
    if not draw(st.integers(0, 9)):
        return None  # unmanaged: must be left exactly as it is
    entry: dict[str, Any] = {"address": address}
    if draw(st.integers(0, 4)) == 0:
        entry["sriov"] = "disabled"
    else:
        entry["sriov"] = "enabled"
        _, want = draw(gpu_config(model))
        if draw(st.booleans()):
            counts: dict[str, int] = {}
            for _, profile in want:
                counts[profile] = counts.get(profile, 0) + 1
            entry["profiles"] = counts
        else:
            vgpus: dict[Any, str] = {}
            for index, profile in want:
                key: Any = index if draw(st.booleans()) else vf_address(address, model, index)
                short = draw(st.booleans())
                vgpus[key] = profile.split(" ", 1)[1] if short else profile
            entry["vgpus"] = vgpus
    return entry


def has_work(case: tuple[dict[str, Any], dict[str, Any]]) -> bool:
    """Whether the desired state plausibly asks for a change (an all-idle case tests little)."""
    host, desired = case
    on_host = {g["address"]: g for g in host["gpus"]}
    for node in desired["spec"]["nodes"].values():
        for entry in node["gpus"]:
            have = on_host[entry["address"]]
            if entry["sriov"] != have["sriov"]:
                return True
            if entry["sriov"] == "enabled" and (
                entry.get("vgpus") or entry.get("profiles") or have["vgpus"]
            ):
                return True
    return False


# --- hosts vgpuctl has no record of (issue 31) ---------------------------------------------------
#
# Every host is built by the simulator directly, so vgpuctl has no record of the vGPUs it starts
# with. These make sure some hosts start with such vGPUs on both interfaces: vfio vGPUs whose
# type no VF lists any more (only the driver names it: ``nvidia-smi vgpu -s -v``), and mdev
# vGPUs. Drawn from a run's own ``random.Random`` after its other choices, so the rest of a
# seed's runs stay what they were.


def at_a_maximum(host: dict[str, Any], rng: random.Random) -> dict[str, Any] | None:
    """``host`` with one GPU (a random one) on NVIDIA's vendor-specific VFIO interface, SR-IOV
    on, filled with one time-sliced profile to its maximum: as pcidevices-controller or a hand
    would leave it, no VF lists that type any more (None: no model offers such a profile)."""
    gpus = [dict(g) for g in host["gpus"]]
    return {**host, "gpus": gpus} if _fill_vfio(gpus, rng) is not None else None


def unrecorded_on_both(host: dict[str, Any], rng: random.Random) -> dict[str, Any] | None:
    """``host`` with vGPUs vgpuctl has no record of on both interfaces: one GPU made a vfio
    GPU at a type's maximum (as :func:`at_a_maximum`) and, unless another GPU has mdev vGPUs
    already, another GPU (a random one that can) made an mdev GPU with SR-IOV on and one to
    its maximum of a time-sliced profile's vGPUs on random VFs. A host of one GPU gets the vfio
    one only. None: no GPU can be made a full vfio GPU."""
    gpus = [dict(g) for g in host["gpus"]]
    full = _fill_vfio(gpus, rng)
    if full is None:
        return None
    rest = [i for i in range(len(gpus)) if i != full]
    if any(gpus[i].get("interface", "mdev") == "mdev" and gpus[i]["vgpus"] for i in rest):
        return {**host, "gpus": gpus}
    for i in rng.sample(rest, len(rest)):
        found = _one_profile(gpus[i], rng)
        if found is None:
            continue
        model, profile = found
        vfs = sorted(rng.sample(range(model.vfs), rng.randint(1, profile.max_instances)))
        gpus[i].update(interface="mdev", sriov="enabled", vgpus=dict.fromkeys(vfs, profile.name))
        break
    return {**host, "gpus": gpus}


def _fill_vfio(gpus: list[dict[str, Any]], rng: random.Random) -> int | None:
    """Make one of ``gpus`` (in place) a vfio GPU at a type's maximum; its index (None: none
    can be)."""
    for i in rng.sample(range(len(gpus)), len(gpus)):
        found = _one_profile(gpus[i], rng)
        if found is None:
            continue
        _, profile = found
        gpus[i].update(
            interface="vfio",
            sriov="enabled",
            vgpus=dict.fromkeys(range(profile.max_instances), profile.name),
        )
        return i
    return None


def _one_profile(gpu: dict[str, Any], rng: random.Random) -> tuple[GpuModel, Profile] | None:
    """``gpu``'s model and a random time-sliced profile of it whose maximum its VFs hold (at
    most 8 vGPUs); None when it has none."""
    model = CATALOG.model(gpu["model"])
    if model is None:
        return None
    fits = [p for p in model.time_sliced_profiles if p.max_instances <= min(model.vfs, 8)]
    return (model, rng.choice(fits)) if fits else None


class StopDrawing(Exception):
    """Raised by a ``keep`` callback to end ``draw_examples`` early (a time budget ran out)."""


def draw_examples(
    strategy: st.SearchStrategy[T],
    *,
    count: int,
    seed_value: int,
    keep: Callable[[T], bool] | None = None,
) -> list[T]:
    """``count`` examples of ``strategy`` (fewer if hypothesis runs dry or ``keep`` raises
    ``StopDrawing``); the same seed gives the same list.

    ``keep`` may also consume each example as it comes (and say False to not count it).
    Generation only: no shrinking, no example database, no health checks, no output.
    """
    found: list[T] = []

    @seed(seed_value)
    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        report_multiple_bugs=False,
    )
    @given(strategy)
    def collect(example: T) -> None:
        if keep is not None:
            assume(keep(example))
        found.append(example)

    with contextlib.suppress(StopDrawing):
        collect()
    return found[:count]
