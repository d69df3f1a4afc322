"""The host as it will be once a plan's host actions have run: what CR statuses are rendered from.

Pure. SR-IOV enabled → the GPU's VFs at the addresses the kernel will give them, offering the
types the driver listed (or, while SR-IOV was off, the catalogue's for the model); vGPUs created
and removed; and each touched GPU's ``creatable`` recomputed by the driver's rules: a VF with no
vGPU can take a type whose framebuffer size equals what the GPU hosts (any size while it hosts
none), while that size is below the type's ``max_instance``; in mixed-size mode (after a
vgpu-mode), while the sizes together fit the GPU's framebuffer, under the mixed-size maxima.
GPUs no action touches keep exactly
what was observed. After a real apply the host is observed again, so a wrong guess here lasts
one plan.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from operator import attrgetter

from reconciler.catalog import Catalog, default_catalog
from reconciler.model import (
    VGPU,
    Action,
    Gpu,
    Interface,
    Inventory,
    PciAddress,
    SriovDisable,
    SriovEnable,
    Vf,
    VgpuCreate,
    VgpuMode,
    VgpuModeSet,
    VgpuRemove,
    VGPUType,
)
from reconciler.model.record import fields, replace
from reconciler.plan.offer import catalog_model


def predict_inventory(
    inventory: Inventory,
    actions: Sequence[Action],
    *,
    catalog: Catalog | None = None,
    vgpus_only: bool = False,
) -> Inventory:
    """``inventory`` after ``actions`` (host kinds; others are ignored), in the given order.

    ``vgpus_only``: the VFs and the vGPUs they will host, each VF's ``creatable`` left as
    observed (not recounted): for a caller that reads only the vGPUs.
    """
    catalog = catalog if catalog is not None else default_catalog()
    gpus = {g.address: g for g in inventory.gpus}
    touched: set[PciAddress] = set()
    # Per GPU, the vGPU each VF will host, by VF index: applied in one pass per GPU (before the
    # GPU's next SR-IOV change, and at the end), not one rebuild of every VF per action.
    pending: dict[PciAddress, dict[int, VGPU | None]] = {}
    for action in actions:
        if not isinstance(
            action, VgpuRemove | SriovDisable | SriovEnable | VgpuModeSet | VgpuCreate
        ):
            continue
        address = action.gpu
        gpu = gpus.get(address)
        if gpu is None:
            continue  # a plan for another host: nothing to predict
        touched.add(address)
        if isinstance(action, VgpuModeSet):
            # Taken only while the GPU hosts no vGPU: its VFs' lists are recounted at the end.
            gpus[address] = replace(
                _with_vgpus(gpu, pending.pop(address, {})), vgpu_mode=action.mode
            )
            continue
        if isinstance(action, SriovEnable | SriovDisable):
            gpu = _with_vgpus(gpu, pending.pop(address, {}))
            if isinstance(action, SriovEnable):
                gpus[address] = _enabled(gpu, inventory, catalog)
            else:
                # The driver lists types on VFs only: none while SR-IOV is off.
                # sriov-manage -d clears the vGPU mode too (docs/domain.md §4).
                gpus[address] = replace(
                    gpu,
                    num_vfs=0,
                    vfs=(),
                    types=(),
                    interface=Interface.NONE,
                    vgpu_mode=VgpuMode.EQUAL_SIZE,
                )
            continue
        index = action.vf_index
        vgpu = None
        if isinstance(action, VgpuCreate):
            # The action names the vGPU as the host will: an mdev UUID, or on the vfio
            # interface the VF's address (diff.py).
            vgpu = VGPU(uuid=action.uuid, type_name=action.type_name)
        pending.setdefault(address, {})[index] = vgpu
    if not touched:
        return inventory
    return replace(
        inventory,
        gpus=tuple(
            (
                _with_vgpus(gpus[g.address], pending.get(g.address, {}))
                if vgpus_only
                else _recount(gpus[g.address], pending.get(g.address, {}), catalog)
            )
            if g.address in touched
            else g
            for g in inventory.gpus
        ),
    )


def _with_vgpus(gpu: Gpu, vgpus: dict[int, VGPU | None]) -> Gpu:
    """``gpu`` with the VFs of the indexes in ``vgpus`` hosting those vGPUs (None: none)."""
    if not vgpus:
        return gpu
    # Vf(...) rather than dataclasses.replace: this runs for every changed VF of a fleet.
    return _with_vfs(
        gpu,
        tuple(
            Vf(v.address, v.index, vgpus[v.index], v.creatable) if v.index in vgpus else v
            for v in gpu.vfs
        ),
    )


#: A GPU's constructor arguments in order, read at once (``dataclasses.replace`` reads the
#: fields anew each call: a fleet's prediction rebuilds every GPU).
_GPU_FIELDS = tuple(f.name for f in fields(Gpu) if f.init)
_gpu_values = attrgetter(*_GPU_FIELDS)
_VFS = _GPU_FIELDS.index("vfs")


def _with_vfs(gpu: Gpu, vfs: tuple[Vf, ...]) -> Gpu:
    """``replace(gpu, vfs=vfs)``, faster."""
    values = list(_gpu_values(gpu))
    values[_VFS] = vfs
    return Gpu(*values)


def _enabled(gpu: Gpu, inventory: Inventory, catalog: Catalog) -> Gpu:
    if gpu.sriov_enabled:
        return gpu  # sriov-manage -e leaves a GPU that has VFs alone
    interface = likely_interface(inventory)
    types = gpu.types or _sibling_types(gpu, inventory) or _catalogue_types(gpu, catalog)
    vfs = tuple(Vf(gpu.predicted_vf_address(i), i) for i in range(gpu.total_vfs))
    return replace(
        gpu,
        num_vfs=gpu.total_vfs,
        vfs=vfs,
        types=types,
        interface=interface,
        vgpu_mode=VgpuMode.EQUAL_SIZE,  # the driver's default after sriov-manage -e
    )


def likely_interface(inventory: Inventory) -> Interface:
    """The interface a GPU's VFs will show once SR-IOV is on: one driver serves a node, so the
    one a GPU whose VFs are up shows; else, on a host without the mdev bus, NVIDIA's
    vendor-specific VFIO (mdev cannot be); else mdev. Where the guess is wrong (the mdev core
    loaded for something else on a vfio host), the first create stops the run before it writes
    (plan again) and nothing is lost."""
    for g in sorted(inventory.gpus, key=lambda g: g.address):
        if g.interface is not Interface.NONE:
            return g.interface
    return Interface.MDEV if inventory.mdev_bus else Interface.VFIO


def _sibling_types(gpu: Gpu, inventory: Inventory) -> tuple[VGPUType, ...]:
    """The types another GPU of the same PCI ids on this node offers: one driver serves the
    node, so they are the same types under the same ids."""
    for other in inventory.gpus:
        same = (other.device_id, other.subsystem_device_id) == (
            gpu.device_id,
            gpu.subsystem_device_id,
        )
        if other.address != gpu.address and same and other.types:
            return other.types
    return ()


def _catalogue_types(gpu: Gpu, catalog: Catalog) -> tuple[VGPUType, ...]:
    """The catalogue's time-sliced profiles, with no type id: ids belong to the driver branch,
    and show once SR-IOV is on (the plan's CR preview leaves them empty until then)."""
    entry = catalog_model(gpu, catalog)
    if entry is None:
        return ()
    return tuple(p.vgpu_type() for p in entry.time_sliced_profiles)


def _recount(gpu: Gpu, vgpus: dict[int, VGPU | None], catalog: Catalog) -> Gpu:
    """``gpu`` with the VFs of the indexes in ``vgpus`` hosting those vGPUs (None: none), and
    ``creatable`` per VF by the driver's equal-size rules (docs/domain.md §3a, §4)."""
    if not gpu.vfs:
        return gpu
    if gpu.vgpu_mode is VgpuMode.MIXED_SIZE:
        return _recount_mixed(gpu, vgpus, catalog)
    hosts = [vgpus.get(vf.index, vf.vgpu) for vf in gpu.vfs]
    sizes: Counter[int] = Counter()
    offered, opened = _sizes_of(gpu.types)
    for vgpu in hosts:
        if vgpu is not None:
            name = vgpu.type_name
            size = offered[name] if name in offered else _size(gpu, name, catalog)
            if size is not None:
                sizes[size] += 1
    # One set stands for its equals (a fleet's GPUs compute the same few): a free VF predicted
    # to change is made once per set and shared (immutable), node after node.
    key = tuple(sizes.items())
    open_types = opened.get(key)
    if open_types is None:
        hosted = next(iter(sizes), None) if len(sizes) == 1 else None
        open_types = frozenset(
            t.name
            for t in gpu.types
            if (not sizes or t.framebuffer_mib == hosted)
            and sizes[t.framebuffer_mib] < t.max_instance
        )
        if all(type(name) is str for name in open_types):  # what equals it is the same
            open_types = _open_sets.setdefault(open_types, open_types)
            if len(_open_sets) > _SHARED_LIMIT:
                _open_sets.clear()
            if len(opened) < _SHARED_LIMIT:
                opened[key] = open_types
    none: frozenset[str] = frozenset()
    vfs = []
    freed = _freed_vfs
    for vf, vgpu in zip(gpu.vfs, hosts, strict=True):
        if vgpu is not None:
            if vgpu is vf.vgpu and not vf.creatable:
                vfs.append(vf)
            else:
                vfs.append(Vf(vf.address, vf.index, vgpu, none))
        elif vf.vgpu is not None:  # its vGPU goes
            vfs.append(Vf(vf.address, vf.index, None, open_types))
        elif vf.creatable is open_types or vf.creatable == open_types:
            vfs.append(vf)
        elif (entry := freed.get(id(vf))) is not None and entry[0] is vf and entry[1] is open_types:
            vfs.append(entry[2])
        else:
            vfs.append(_freed(vf, open_types))
    return _with_vfs(gpu, tuple(vfs))


def _recount_mixed(gpu: Gpu, vgpus: dict[int, VGPU | None], catalog: Catalog) -> Gpu:
    """:func:`_recount` in mixed-size mode: a type is creatable on a free VF while the hosted
    vGPUs' framebuffer and its own fit the GPU's, and fewer vGPUs of its size exist than its
    mixed-size maximum (the catalogue's, else its own). Rare (only GPUs put in that mode), so
    nothing is shared between GPUs here."""
    hosts = [vgpus.get(vf.index, vf.vgpu) for vf in gpu.vfs]
    entry = catalog_model(gpu, catalog)
    sizes: Counter[int] = Counter()
    for vgpu in hosts:
        if vgpu is not None:
            size = _size(gpu, vgpu.type_name, catalog)
            sizes[size if size is not None else -1] += 1
    open_types: frozenset[str] = frozenset()
    if entry is not None and -1 not in sizes:  # else nothing can be judged: none predicted
        used = sum(size * n for size, n in sizes.items())
        open_types = frozenset(
            t.name
            for t in gpu.types
            if used + t.framebuffer_mib <= entry.framebuffer_mib
            and sizes[t.framebuffer_mib] < _mixed_maximum(t, catalog)
        )
    none: frozenset[str] = frozenset()
    return _with_vfs(
        gpu,
        tuple(
            Vf(vf.address, vf.index, vgpu, none if vgpu is not None else open_types)
            for vf, vgpu in zip(gpu.vfs, hosts, strict=True)
        ),
    )


def _mixed_maximum(t: VGPUType, catalog: Catalog) -> int:
    known = catalog.profile(t.name)
    mixed = known[1].mixed_size_max_instances if known is not None else None
    return mixed if mixed is not None else t.max_instance


_SHARED_LIMIT = 1 << 14
_open_sets: dict[frozenset[str], frozenset[str]] = {}
#: By a VF with no vGPU (held: its id is not reused): the VF with that creatable set.
_freed_vfs: dict[int, tuple[Vf, frozenset[str], Vf]] = {}


#: By a type list (held: its id is not reused; parsing shares equal lists): each type's size
#: (the first of a name), and the creatable set by hosted sizes (size → count, in found order).
_type_sizes: dict[
    int,
    tuple[tuple[VGPUType, ...], dict[str, int], dict[tuple[tuple[int, int], ...], frozenset[str]]],
] = {}


def _sizes_of(
    types: tuple[VGPUType, ...],
) -> tuple[dict[str, int], dict[tuple[tuple[int, int], ...], frozenset[str]]]:
    entry = _type_sizes.get(id(types))
    if entry is not None and entry[0] is types:
        return entry[1], entry[2]
    offered = {t.name: t.framebuffer_mib for t in reversed(types)}  # the first of a name
    opened: dict[tuple[tuple[int, int], ...], frozenset[str]] = {}
    if len(_type_sizes) >= 64:
        _type_sizes.clear()
    _type_sizes[id(types)] = (types, offered, opened)
    return offered, opened


def _freed(vf: Vf, creatable: frozenset[str]) -> Vf:
    made = Vf(vf.address, vf.index, None, creatable)
    if len(_freed_vfs) >= _SHARED_LIMIT:
        _freed_vfs.clear()
    _freed_vfs[id(vf)] = (vf, creatable, made)
    return made


def _size(gpu: Gpu, type_name: str, catalog: Catalog) -> int | None:
    offered = gpu.type_named(type_name)
    if offered is not None:
        return offered.framebuffer_mib
    known = catalog.profile(type_name)
    return known[1].framebuffer_mib if known is not None else None
