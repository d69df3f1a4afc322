"""What a GPU offers: its vGPU types with sizes and limits, from the driver or the catalogue.

The driver's list (``Gpu.types``) is the truth once SR-IOV is on. Before that no VF lists
anything, so the catalogue's time-sliced profiles for the GPU's model stand in; a GPU the
catalogue does not know offers nothing checkable until SR-IOV is enabled.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from reconciler.catalog import Catalog, GpuModel, resolve_profile_name
from reconciler.model import DesiredGpu, Gpu, VGPUType
from reconciler.model.record import record, replace
from reconciler.rules import Offer as RulesOffer
from reconciler.rules import OfferedType

#: What the constraints need to know about one vGPU type (the rules' own description).
TypeFacts = OfferedType


@record(frozen=True, slots=True)
class Offer(RulesOffer):
    """The types one GPU offers, as the rules read them (:class:`reconciler.rules.Offer`:
    ``complete`` False when nothing says what the GPU offers, an unknown model with SR-IOV off),
    and how messages name the GPU."""

    label: str  # "GPU 0000:08:00.0 (NVIDIA A2)"


def gpu_label(gpu: Gpu, catalog: Catalog) -> str:
    """``GPU 0000:08:00.0 (NVIDIA A2)``, or the PCI ids when the model is unknown."""
    return _label(gpu, model_name(gpu, catalog))


def _label(gpu: Gpu, model: str | None) -> str:
    return f"GPU {gpu.address} ({model or f'{gpu.vendor_id}:{gpu.device_id}'})"


def model_name(gpu: Gpu, catalog: Catalog) -> str | None:
    """The GPU's model as the host names it, else as the catalogue does from its PCI ids."""
    if gpu.model:
        return gpu.model
    entry = catalog_model(gpu, catalog)
    return entry.name if entry is not None else None


def catalog_model(gpu: Gpu, catalog: Catalog) -> GpuModel | None:
    """The catalogue's entry for ``gpu``: by the observed model name, else by its PCI ids."""
    if gpu.model:
        found = catalog.model(gpu.model)
        if found is not None:
            return found
    return catalog.model_for_ids(
        gpu.vendor_id, gpu.device_id, gpu.subsystem_vendor_id, gpu.subsystem_device_id
    )


def offer_for(gpu: Gpu, catalog: Catalog) -> Offer:
    entry = catalog_model(gpu, catalog)
    model = gpu.model or (entry.name if entry is not None else None)
    types: Mapping[str, TypeFacts]
    if gpu.types:
        types = _driver_facts(gpu.types)
    elif entry is not None:
        types = {
            p.name: TypeFacts(p.name, p.framebuffer_mib, p.max_instances, p.mig)
            for p in entry.time_sliced_profiles
        }
    else:
        types = {}
    return Offer(
        model=model,
        types=types,
        complete=bool(types),
        # The VFs it has, or will have once SR-IOV is on (:func:`reconciler.plan.check.vf_slots`).
        vfs=len(gpu.vfs) if gpu.sriov_enabled else gpu.total_vfs,
        catalog=catalog,
        label=_label(gpu, model),
    )


#: The facts of recent driver type lists, by identity: a node's GPUs of one model (and a fleet's
#: nodes) share one parsed list. An entry holds its list, so the id is not reused meanwhile.
_facts_of: dict[int, tuple[tuple[VGPUType, ...], Mapping[str, TypeFacts]]] = {}


def _driver_facts(types: tuple[VGPUType, ...]) -> Mapping[str, TypeFacts]:
    entry = _facts_of.get(id(types))
    if entry is not None and entry[0] is types:
        return entry[1]
    facts = MappingProxyType(
        {t.name: TypeFacts(t.name, t.framebuffer_mib, t.max_instance) for t in types}
    )
    if len(_facts_of) >= 64:
        _facts_of.clear()
    _facts_of[id(types)] = (types, facts)
    return facts


def host_spelling(desired: DesiredGpu, gpu: Gpu, offer: Offer) -> DesiredGpu:
    """``desired`` with each profile spelt as this GPU's driver spells it.

    A driver prints a profile's prefix by branch (``GRID A100-4C`` on one, ``NVIDIA A100-4C`` on
    another): the body names the profile. A name the GPU offers or hosts under another prefix is
    rewritten to the GPU's spelling; one it does not know is left for the checks to report.
    """
    known = set(offer.types) | {vf.vgpu.type_name for vf in gpu.vfs if vf.vgpu is not None}

    def spelt(name: str) -> str:
        if name in known and " ".join(name.split()) == name:
            return name  # already spelt so: what resolve_profile_name says, without the search
        return resolve_profile_name(name, known) or name

    if desired.vgpus:
        vgpus = {key: spelt(name) for key, name in desired.vgpus.items()}
        if vgpus == dict(desired.vgpus):
            return desired
        return replace(desired, vgpus=MappingProxyType(vgpus))
    if desired.profiles:
        profiles: dict[str, int] = {}
        locations = dict(desired.entry_locations)
        for name, count in desired.profiles.items():
            host = spelt(name)
            if host in profiles:  # two spellings of one profile: leave them for the checks
                return desired
            profiles[host] = count
            if host != name and name in locations:
                locations[host] = locations.pop(name)
        if list(profiles) == list(desired.profiles):
            return desired
        return replace(
            desired,
            profiles=MappingProxyType(profiles),
            entry_locations=MappingProxyType(locations),
        )
    return desired
