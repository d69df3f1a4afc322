"""An independent judge of convergence: the sysfs tree against the desired-state file.

The property test and the reliability suite decide "converged" here, not with ``vgpuctl plan``:
the code under test must not grade itself. So this module imports nothing of ``reconciler``.
It reads the tree the way the kernel lays it out (docs/domain.md §1, §3; docs/host.md) and the
desired-state YAML as a user writes it, and knows the few domain facts it needs:

- the GPUs: PCI functions with vendor ``0x10de``, an ``sriov_totalvfs`` and no ``physfn``; their
  VFs are the ``virtfn<N>`` links, N the VF index (never computed from an offset);
- SR-IOV is all or nothing (``sriov-manage -e`` writes ``sriov_totalvfs`` into
  ``sriov_numvfs``): enabled means every VF is there;
- two vGPU interfaces. mdev: a vGPU is a UUID directory under its VF whose ``mdev_type`` link
  names a ``mdev_supported_types/<id>`` directory with a ``name``, listed on the mdev bus
  (``bus/mdev/devices/<uuid>``) and with its ``remove`` file (without them it is half made, or
  being removed). NVIDIA's vendor-specific VFIO: ``<VF>/nvidia/current_vgpu_type`` is ``0`` or a
  type id, named by the ``creatable_vgpu_types`` lists (``ID : name`` lines) of any VF; the VF is
  the vGPU's identity (no UUID);
- a profile's ``NVIDIA``/``GRID`` prefix is not part of its identity (it changes with the driver
  branch), so ``A2-4Q``, ``NVIDIA A2-4Q`` and ``GRID A2-4Q`` are one profile; its framebuffer
  size is the number before its series letters (``A2-4Q``: 4 GB), and all time-sliced vGPUs of a
  GPU share one size, at most ``max_instance`` of them (the mdev type's ``description``);
- the vGPU UUID vgpuctl creates on a VF: RFC 4122 version 5 of ``"<node>/<VF address>"`` in the
  namespace that is itself the version-5 UUID of the DNS name ``vgpu.reconciler.dev`` (README,
  "Crash-safe"; the UUIDs in README's examples follow it). A vGPU that was already on its VF
  with the wanted profile before (``snapshot``) is kept with its own UUID.

``judge`` returns the ways the host differs from the desired state (empty: converged). A vGPU a
VM holds (``held``: UUIDs, or VF addresses on the VFIO interface) may stay where the desired
state does not want it; what it prevents (its own VF, other sizes, the size's maximum, SR-IOV
off) is excused, nothing else. And a change that cannot finish breaks nothing (README, "How
apply stays safe"): when every vGPU a GPU still lacks waits for a held one, the vGPUs that
would only make room for them may stay too (one whose VF is wanted with another profile, or
whose profile the GPU no longer wants); fewer of a profile the GPU still wants is not excused.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

NVIDIA_VENDOR = "0x10de"
#: uuid5(NAMESPACE_DNS, "vgpu.reconciler.dev"): the namespace of vgpuctl's vGPU UUIDs.
NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "vgpu.reconciler.dev")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_CREATABLE_LINE = re.compile(r"^\s*(\d+)\s*:\s*(.+?)\s*$")
_SIZE = re.compile(r"-(\d+)[A-Za-z]+$")


def vgpu_uuid(node: str, vf: str) -> str:
    """The UUID vgpuctl gives the vGPU it creates on ``vf`` of ``node``."""
    return str(uuid.uuid5(NAMESPACE, f"{node}/{vf}"))


def body(profile: str) -> str:
    """A profile's identity: its name without the driver branch's prefix."""
    for prefix in ("NVIDIA ", "GRID "):
        if profile.startswith(prefix):
            return profile[len(prefix) :]
    return profile


def size_gb(profile: str) -> int | None:
    """Framebuffer GB from the name (``A2-4Q`` → 4, ``A100-1-5CME`` → 5); None if not shaped so."""
    m = _SIZE.search(body(profile))
    return int(m.group(1)) if m else None


# --- the tree ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HostVgpu:
    vf: str
    index: int
    #: The profile's name as the host gives it; ``type <id>`` when no list names it.
    profile: str
    #: mdev: the device's UUID; VFIO interface: None (the VF is the vGPU).
    uuid: str | None
    #: False when the mdev is half made or being removed (no bus link or no ``remove``).
    complete: bool = True


@dataclass(frozen=True, slots=True)
class GpuView:
    address: str
    total_vfs: int
    num_vfs: int
    vfs: tuple[str, ...]  # VF addresses by index (the virtfn<N> links)
    vgpus: tuple[HostVgpu, ...]
    #: max_instance per profile body, from the mdev types' descriptions (empty on VFIO).
    maxima: tuple[tuple[str, int], ...] = ()

    def held_by(self, held: frozenset[str]) -> list[HostVgpu]:
        return [v for v in self.vgpus if (v.uuid or v.vf) in held]

    def state(self) -> tuple[object, ...]:
        """What must not change on a GPU nobody manages."""
        vgpus = sorted((v.vf, v.uuid or "", v.profile) for v in self.vgpus)
        return (self.num_vfs, self.vfs, tuple(vgpus))


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace").strip()


def _link_name(path: Path) -> str:
    return os.path.basename(os.readlink(path))


def _driver_type_names(root: Path, gpu: str) -> dict[str, str]:
    """Type id → name as the (simulated) driver itself knows them for the GPU at ``gpu``: the
    simulator's state file, ``<root>/.vgpuctl-sim/state.json``, lists each GPU's model and each
    model's types with their ids. This is the hardware's word, as ``nvidia-smi`` would be on a
    real host, and what names a vfio type in use once no VF lists it any more (a GPU at a
    profile's maximum). Empty for a tree that is not the simulator's."""
    path = root / ".vgpuctl-sim" / "state.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        model = next(g["model"] for g in doc["gpus"] if g["address"] == gpu)
        types = doc["models"][model]["types"]
        return {str(t["id"]): str(t["name"]) for t in types}
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        return {}


def vfio_type_names(root: Path, gpu: str, vf_dirs: Iterable[Path]) -> dict[str, str]:
    """Type id → name for the GPU at ``gpu``: what its VFs' ``nvidia/creatable_vgpu_types``
    list (``ID : name`` lines after a header), then what the driver itself says for ids no
    list names (:func:`_driver_type_names`). Ids are a driver's, per GPU model: never taken
    from another GPU's lists."""
    names: dict[str, str] = {}
    for vf_dir in vf_dirs:
        listing = vf_dir / "nvidia" / "creatable_vgpu_types"
        if not listing.is_file():
            continue
        for line in _read(listing).splitlines()[1:]:  # the header: "ID    : vGPU Name"
            m = _CREATABLE_LINE.match(line)
            if m:
                names.setdefault(m.group(1), m.group(2))
    for type_id, name in _driver_type_names(root, gpu).items():
        names.setdefault(type_id, name)
    return names


def _mdev_vgpus(root: Path, vf_dir: Path, vf: str, index: int) -> list[HostVgpu]:
    found = []
    bus = root / "bus" / "mdev" / "devices"
    for entry in sorted(os.listdir(vf_dir)):
        if not _UUID.match(entry) or not (vf_dir / entry).is_dir():
            continue
        mdev = vf_dir / entry
        try:
            type_dir = vf_dir / "mdev_supported_types" / _link_name(mdev / "mdev_type")
            profile = _read(type_dir / "name")
        except OSError:
            profile = "type ?"  # the type link is gone: being removed
        on_bus = (bus / entry).is_symlink() and _link_name(bus / entry) == entry
        complete = on_bus and (mdev / "remove").exists() and profile != "type ?"
        found.append(HostVgpu(vf, index, profile, entry, complete))
    return found


def _maxima(vf_dir: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    types = vf_dir / "mdev_supported_types"
    if not types.is_dir():
        return out
    for entry in sorted(os.listdir(types)):
        try:
            name = _read(types / entry / "name")
            fields = dict(
                part.strip().split("=", 1)
                for part in _read(types / entry / "description").split(",")
                if "=" in part
            )
            out[body(name)] = int(fields["max_instance"])
        except (OSError, KeyError, ValueError):
            continue
    return out


def read_gpu(root: Path, address: str) -> GpuView:
    """One GPU as the tree under ``root`` (a sysfs root) shows it."""
    devices = root / "bus" / "pci" / "devices"
    pf = devices / address
    links = {
        int(entry.removeprefix("virtfn")): _link_name(pf / entry)
        for entry in os.listdir(pf)
        if entry.startswith("virtfn") and entry.removeprefix("virtfn").isdigit()
    }
    vfs = tuple(links[i] for i in sorted(links))
    names = vfio_type_names(root, address, (devices / vf for vf in vfs))
    vgpus: list[HostVgpu] = []
    maxima: dict[str, int] = {}
    for index in sorted(links):
        vf = links[index]
        vf_dir = devices / vf
        current = vf_dir / "nvidia" / "current_vgpu_type"
        if current.is_file():
            type_id = _read(current)
            if type_id != "0":
                vgpus.append(HostVgpu(vf, index, names.get(type_id, f"type {type_id}"), None))
        else:
            vgpus += _mdev_vgpus(root, vf_dir, vf, index)
            if not maxima:
                maxima = _maxima(vf_dir)
    return GpuView(
        address=address,
        total_vfs=int(_read(pf / "sriov_totalvfs")),
        num_vfs=int(_read(pf / "sriov_numvfs")),
        vfs=vfs,
        vgpus=tuple(vgpus),
        maxima=tuple(sorted(maxima.items())),
    )


def gpu_addresses(root: Path) -> list[str]:
    """Every NVIDIA GPU physical function with SR-IOV in the tree."""
    devices = root / "bus" / "pci" / "devices"
    found = []
    for entry in sorted(os.listdir(devices)):
        fn = devices / entry
        if (
            (fn / "vendor").is_file()
            and _read(fn / "vendor") == NVIDIA_VENDOR
            and (fn / "sriov_totalvfs").is_file()
            and not (fn / "physfn").exists()
        ):
            found.append(entry)
    return found


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every GPU of a host at one moment (to compare unmanaged GPUs, and to know which vGPUs
    were there before vgpuctl ran)."""

    gpus: Mapping[str, GpuView]

    def had(self, gpu: str, vgpu: HostVgpu) -> bool:
        view = self.gpus.get(gpu)
        return view is not None and any(
            (v.vf, v.uuid, body(v.profile)) == (vgpu.vf, vgpu.uuid, body(vgpu.profile))
            for v in view.vgpus
        )


def snapshot(root: Path) -> Snapshot:
    return Snapshot({a: read_gpu(root, a) for a in gpu_addresses(root)})


# --- the desired state ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Want:
    address: str
    sriov: bool
    per_vf: Mapping[int | str, str] | None  # VF index or address → profile
    counts: Mapping[str, int] | None  # profile → count


def desired_gpus(desired: Path | Mapping[str, Any], node: str) -> list[Want]:
    """The GPUs ``desired`` (a file, a directory of ``*.yaml``/``*.yml``, or a parsed document)
    wants on ``node``."""
    if isinstance(desired, Mapping):
        documents: list[Any] = [desired]
    elif desired.is_dir():
        files = sorted(p for p in desired.iterdir() if p.suffix in (".yaml", ".yml"))
        documents = [yaml.safe_load(p.read_text(encoding="utf-8")) for p in files]
    else:
        documents = [yaml.safe_load(desired.read_text(encoding="utf-8"))]
    wants = []
    for doc in documents:
        entry = ((doc or {}).get("spec") or {}).get("nodes", {}).get(node) or {}
        for gpu in entry.get("gpus") or []:
            counts = gpu.get("profiles")
            wants.append(
                Want(
                    address=str(gpu["address"]),
                    sriov=gpu.get("sriov") == "enabled",
                    per_vf=None if counts is not None else dict(gpu.get("vgpus") or {}),
                    counts=None if counts is None else {str(k): int(v) for k, v in counts.items()},
                )
            )
    return wants


# --- the verdict ---------------------------------------------------------------------------------


def _is_ours(node: str, gpu: str, v: HostVgpu, before: Snapshot) -> bool:
    """The vGPU carries vgpuctl's UUID for its VF, or was there, as it is, before."""
    return v.uuid is None or v.uuid == vgpu_uuid(node, v.vf) or before.had(gpu, v)


def _excused(missing: str, view: GpuView, stuck: list[HostVgpu], vf: str | None) -> bool:
    """Whether a held vGPU the desired state does not want is what keeps ``missing`` (a profile,
    on ``vf`` if the form names one) from being created."""
    if not stuck:
        return False
    if vf is not None and any(s.vf == vf for s in stuck):
        return True
    want = size_gb(missing)
    if any(size_gb(s.profile) != want for s in stuck):
        return True  # one framebuffer size per GPU
    limit = dict(view.maxima).get(body(missing))
    same = sum(1 for v in view.vgpus if size_gb(v.profile) == want)
    return limit is None or same >= limit  # at the size's maximum (unknown on VFIO: excused)


def _judge_gpu(
    node: str, want: Want, view: GpuView, before: Snapshot, held: frozenset[str]
) -> list[str]:
    gpu = view.address
    problems: list[str] = []
    holding = view.held_by(held)
    for v in view.vgpus:
        if not v.complete:
            problems.append(f"GPU {gpu}: vGPU {v.uuid} on {v.vf} is half made or being removed")
    if not want.sriov:
        free = [v for v in view.vgpus if v not in holding]
        problems += [
            f"GPU {gpu}: {v.profile} on {v.vf} left (SR-IOV desired disabled)" for v in free
        ]
        if (view.num_vfs or view.vfs) and not holding:
            problems.append(f"GPU {gpu}: SR-IOV on ({view.num_vfs} VFs), desired disabled")
        return problems
    if view.num_vfs != view.total_vfs or len(view.vfs) != view.total_vfs:
        problems.append(
            f"GPU {gpu}: {view.num_vfs} VFs ({len(view.vfs)} links), desired all "
            f"{view.total_vfs} (SR-IOV enabled)"
        )
        if not view.vfs:
            return problems
    if want.per_vf is not None:
        wanted: dict[int, str] = {}
        for key, profile in want.per_vf.items():
            index = (
                key if isinstance(key, int) else (view.vfs.index(key) if key in view.vfs else None)
            )
            if index is None or not 0 <= index < len(view.vfs):
                problems.append(f"GPU {gpu}: desired VF {key} is not one of its VFs")
                continue
            wanted[index] = str(profile)
        good: set[int] = set()
        stuck = []
        extra: list[tuple[HostVgpu, str | None]] = []  # vGPUs to go: (vGPU, profile wanted there)
        for v in view.vgpus:
            want_here = wanted.get(v.index)
            if want_here is not None and body(want_here) == body(v.profile):
                if _is_ours(node, gpu, v, before):
                    good.add(v.index)
                    continue
                problems.append(
                    f"GPU {gpu}: {v.profile} on {v.vf} has UUID {v.uuid}, "
                    f"not {vgpu_uuid(node, v.vf)}"
                )
                good.add(v.index)  # there, with the wrong UUID: said once
            elif v in holding:
                stuck.append(v)
            else:
                extra.append((v, want_here))
        missing = [(i, p) for i, p in sorted(wanted.items()) if i not in good]
        waiting = [(i, p) for i, p in missing if _excused(p, view, stuck, view.vfs[i])]
        bodies = {body(p) for p in wanted.values()}
        for v, want_here in extra:
            room = want_here is not None or body(v.profile) not in bodies
            if not (room and missing and waiting == missing):
                problems.append(
                    f"GPU {gpu}: {v.profile} on {v.vf} ({v.uuid}): desired "
                    f"{want_here or 'nothing'} there"
                )
        for index, profile in missing:
            if (index, profile) not in waiting:
                problems.append(f"GPU {gpu}: {profile} missing on {view.vfs[index]} (VF {index})")
        return problems
    counts = {body(p): n for p, n in (want.counts or {}).items() if n > 0}
    present: Counter[str] = Counter()
    stuck = []
    extra: list[HostVgpu] = []
    for v in sorted(view.vgpus, key=lambda v: (v not in holding, v.index)):  # held ones first
        b = body(v.profile)
        if present[b] < counts.get(b, 0):
            present[b] += 1
            if not _is_ours(node, gpu, v, before):
                problems.append(
                    f"GPU {gpu}: {v.profile} on {v.vf} has UUID {v.uuid}, "
                    f"not {vgpu_uuid(node, v.vf)}"
                )
        elif v in holding:
            stuck.append(v)
        else:
            extra.append(v)
    short = {b: n - present[b] for b, n in sorted(counts.items()) if n > present[b]}
    waits = all(_excused(b, view, stuck, None) for b in short)
    for b, lacking in short.items():
        if not _excused(b, view, stuck, None):
            problems.append(f"GPU {gpu}: {lacking} of {counts[b]} {b} missing")
    for v in extra:
        # It would only make room for what waits: a profile the GPU no longer wants.
        if not (short and waits and body(v.profile) not in counts):
            b = body(v.profile)
            problems.append(
                f"GPU {gpu}: {v.profile} on {v.vf} ({v.uuid}) beyond the desired {counts.get(b, 0)}"
            )
    return problems


def judge(
    root: Path,
    desired: Path | Mapping[str, Any],
    node: str,
    *,
    before: Snapshot,
    held: Iterable[str] = (),
) -> list[str]:
    """How the host at ``root`` (a sysfs root) differs from what ``desired`` wants on ``node``:
    empty when it is converged (held vGPUs excepted, as the module says). ``before`` is the
    host's ``snapshot`` from before vgpuctl ran."""
    held_set = frozenset(held)
    now = snapshot(root)
    problems: list[str] = []
    managed = set()
    for want in desired_gpus(desired, node):
        managed.add(want.address)
        view = now.gpus.get(want.address)
        if view is None:
            problems.append(f"GPU {want.address} is not on the host")
            continue
        problems += _judge_gpu(node, want, view, before, held_set)
    for address, was in sorted(before.gpus.items()):
        if address in managed:
            continue
        view = now.gpus.get(address)
        if view is None or view.state() != was.state():
            problems.append(f"GPU {address} is not managed, and it changed")
    return problems
