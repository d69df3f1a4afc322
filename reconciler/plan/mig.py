"""Delegate mode and MIG: which profiles a GPU can take through pcidevices-controller. Pure.

Harvester's pcidevices-controller (bdd8025) registers ``gpu-mig-reconcillation`` on every
``SRIOVGPUDevice`` change (pkg/controller/gpudevice/gpu_controller.go ``Register``,
``reconcileMIGConfiguration``): with ``spec.enabled`` true, ``setupMigConfiguration`` asks
``nvidia-smi -i <PF> --query-gpu=mig.mode.current``, and on any answer but ``[N/A]``
(pkg/util/gpuhelper/mig.go ``IsMigConfigurationNeeded``) runs ``nvidia-smi -i <PF> -mig 1`` and
creates a ``MigConfiguration`` named as the ``SRIOVGPUDevice``. A GPU in MIG mode offers only
MIG-backed vGPU types, and those only for GPU instances that exist (docs/domain.md §10). So in
delegate mode:

- a **time-sliced** profile on a MIG-capable GPU is refused: the enable of SR-IOV turns MIG mode
  on, after which no VF offers it (every ``vgpudevice-enable`` would wait its timeout);
- a **MIG-backed** profile is refused on any GPU: its GPU instances are made through Harvester's
  ``MigConfiguration`` (``OnMIGChange``), which vgpuctl does not write, and which VF the driver
  then offers which type on is not modelled here (docs/delegate.md, "MIG").

A GPU is MIG-capable when Harvester shows a ``MigConfiguration`` for it (pcidevices found it so),
else when its catalogue model has a MIG-backed profile (the A100 and H100 families). ``plan``
judges with the objects (``plan/delegate.py``), ``validate --delegate harvester`` offline, from
the desired ``model`` (or a group's device ID, or the profile names).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from reconciler.catalog import Catalog, GpuModel, parse_profile_name
from reconciler.model import (
    Desired,
    DesiredGpu,
    GpuRef,
    GroupGpu,
    Problem,
    SourceLocation,
    VfKey,
)
from reconciler.plan.check import located

#: Why a time-sliced profile cannot be had on a MIG-capable GPU in delegate mode.
TIME_SLICED_REASON = (
    "pcidevices-controller turns MIG mode on when it enables SR-IOV on a MIG-capable GPU "
    "(gpu_controller.go reconcileMIGConfiguration), after which the driver offers only "
    "MIG-backed vGPU types; time-sliced vGPUs on this GPU are made only in node-local mode, "
    "on a node where pcidevices-controller does not run (vgpuctl never acts on a host beside it)"
)
#: Why a MIG-backed profile is not made in delegate mode.
MIG_BACKED_REASON = (
    "delegate mode does not make MIG-backed vGPUs: their GPU instances are set up through "
    "Harvester's MigConfiguration, which vgpuctl does not write, and which VF the driver then "
    "offers them on is not modelled here; configure MIG in Harvester's UI, or use node-local mode "
    "on a node where pcidevices-controller does not run"
)


def mig_capable(model: GpuModel | None) -> bool:
    """Whether the catalogue lists ``model`` with a MIG-backed profile (the A100 and H100
    families); False for None (not known)."""
    return model is not None and any(p.mig for p in model.profiles)


def is_mig_backed(profile: str, catalog: Catalog) -> bool:
    """A MIG-backed profile: the catalogue says so, else its name's slice count
    (``A100-1-5C``)."""
    spelled = catalog.spelled(profile)
    known = catalog.profile(spelled) if spelled is not None else None
    if known is not None:
        return known[1].mig
    parsed = parse_profile_name(profile)
    return parsed is not None and parsed.mig_slices > 0


def model_of_names(names: Iterable[str], catalog: Catalog) -> GpuModel | None:
    """The catalogue model the first known profile among ``names`` belongs to."""
    for name in names:
        spelled = catalog.spelled(name)
        known = catalog.profile(spelled) if spelled is not None else None
        if known is not None:
            return known[0]
    return None


def mig_problems(
    gpu: DesiredGpu | GroupGpu,
    ref: GpuRef | str,
    *,
    capable: str | None,
    catalog: Catalog,
) -> list[Problem]:
    """The profiles ``gpu`` asks for that delegate mode refuses, one problem per profile name
    at its first entry: MIG-backed ones always, time-sliced ones when ``capable`` says why
    the GPU is MIG-capable (None: it is not known to be)."""
    if not gpu.sriov:
        return []
    problems: list[Problem] = []
    seen: set[str] = set()
    for key, profile in _entries(gpu):
        if profile in seen:
            continue
        seen.add(profile)
        where = gpu.entry_locations.get(key, gpu.location)
        if is_mig_backed(profile, catalog):
            problems.append(_at(f"GPU {ref}: {profile} is MIG-backed: {MIG_BACKED_REASON}", where))
        elif capable is not None:
            problems.append(
                _at(
                    f"GPU {ref}: {profile} is a time-sliced profile, and {capable}: "
                    f"{TIME_SLICED_REASON}",
                    where,
                )
            )
    return problems


def offline_problems(desired: Desired, catalog: Catalog) -> list[Problem]:
    """``validate --delegate harvester``: :func:`mig_problems` of every node's GPUs and every
    node group's GPU entries, the GPU's model from the desired ``model`` (a group's: its
    ``match``, or its device ID), else from its profile names."""
    problems: list[Problem] = []
    for node in desired.nodes.values():
        for gpu in node.gpus:
            model = _desired_model(gpu.model, None, gpu, catalog)
            problems += mig_problems(
                gpu, f"{gpu.address} of node {node.name}", capable=_why(model), catalog=catalog
            )
    for group in desired.groups:
        for entry in group.gpus:
            model = _desired_model(entry.model, entry.match.device_id, entry, catalog)
            ref = f"{entry.match} of node group '{entry.group}'"
            problems += mig_problems(entry, ref, capable=_why(model), catalog=catalog)
    return problems


def catalogue_reason(model: GpuModel) -> str:
    """How a GPU is known to be MIG-capable from the catalogue."""
    return f"it is an {model.name}, a MIG-capable GPU (the catalogue lists MIG-backed profiles)"


def _why(model: GpuModel | None) -> str | None:
    return catalogue_reason(model) if model is not None and mig_capable(model) else None


def _desired_model(
    model: str | None, device_id: str | None, gpu: DesiredGpu | GroupGpu, catalog: Catalog
) -> GpuModel | None:
    if model is not None:
        found = catalog.model(model)
        if found is not None:
            return found
    if device_id is not None:
        found = catalog.model_for_ids("10de", device_id)
        if found is not None:
            return found
    return model_of_names((p for _, p in _entries(gpu)), catalog)


def _entries(gpu: DesiredGpu | GroupGpu) -> list[tuple[VfKey | str, str]]:
    vgpus: Mapping[VfKey, str] = gpu.vgpus or {}
    counted: Mapping[str, int] = gpu.profiles or {}
    return [*vgpus.items(), *((name, name) for name in counted)]


def _at(message: str, where: SourceLocation | None) -> Problem:
    return located(message, where)
