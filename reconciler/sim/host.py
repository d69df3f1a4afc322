"""Simulated hosts: create one (``init_host``, ``build_host``), find one, and act as its operator.

A simulated host is a directory ``DIR`` with ``DIR/sys`` (the sysfs tree, with the hidden state
in ``DIR/sys/.vgpuctl-sim/``), ``DIR/bin/sriov-manage`` and ``DIR/bin/nvidia-smi``.
:class:`SimHost` is the handle the CLI gets from ``SimHost.open(sysfs_root)``: it supplies the
kernel writer, the hold probe and counters. ``hold``/``release`` play a VM, ``fail`` injects
faults, ``reboot`` power-cycles.
"""

from __future__ import annotations

import shutil
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reconciler.catalog import Catalog, default_catalog, long_profile_name
from reconciler.model import PciAddress
from reconciler.model.mode import VgpuMode
from reconciler.model.record import record, replace
from reconciler.observe.holds import INIT_PID_NAMESPACE, current_pid_namespace, describe_holder
from reconciler.sim import driver, procfs
from reconciler.sim.holds import SimHoldProbe, is_simulated
from reconciler.sim.kernel import SimSysfsWriter
from reconciler.sim.nvidia_smi import install_script as install_nvidia_smi
from reconciler.sim.rules import (
    NIC_BUSES,
    GpuRequest,
    PlacedGpu,
    SimModel,
    occupied,
    place_gpus,
    root_port_address,
    vf_addresses,
)
from reconciler.sim.sriov_manage import install_script as install_sriov_manage
from reconciler.sim.state import (
    SRIOV_MANAGE_FAULTS,
    DeviceRecord,
    GpuRecord,
    SimState,
    load_state,
    locked,
    save_state,
)
from reconciler.sim.statefile import STATE_DIR, state_path
from reconciler.sim.tree import NVIDIA_DRIVER, PciFunction, SysfsTree, device_dir

INTERFACES = ("mdev", "vfio")
DEFAULT_HOLDER = "simulated VM"

# The distractors: an Intel 82599 10 GbE NIC with SR-IOV on (2 VFs), an NVIDIA HD-audio
# function beside a GPU, and the root ports every device hangs off.
_INTEL = 0x8086
_NIC = {"device": 0x10FB, "vf_device": 0x10ED, "subsystem": 0x000C, "class": 0x020000}
_NIC_TOTAL_VFS, _NIC_VFS, _NIC_VF_OFFSET, _NIC_VF_STRIDE = 63, 2, 128, 2
_ROOT_PORT = {"device": 0x347A, "class": 0x060400}
_AUDIO = {"device": 0x228B, "class": 0x040300}
_DRIVERS = (
    NVIDIA_DRIVER,
    "bus/pci/drivers/vfio-pci",
    "bus/pci/drivers/pcieport",
    "bus/pci/drivers/ixgbe",
    "bus/pci/drivers/ixgbevf",
    "bus/pci/drivers/snd_hda_intel",
)


@record(frozen=True, slots=True)
class SimGpu:
    """A simulated GPU as ``SimHost.gpus()`` lists it."""

    address: PciAddress
    model: str  # "NVIDIA A2"
    sriov_enabled: bool
    interface: str = "mdev"  # the vGPU host interface its VFs show: mdev | vfio
    vgpu_mode: VgpuMode = VgpuMode.EQUAL_SIZE


@record(frozen=True, slots=True)
class SimHost:
    """A handle on a simulated host, by its sysfs root (``DIR/sys``). Holds no state itself."""

    sysfs_root: Path

    @classmethod
    def open(cls, sysfs_root: Path | str) -> SimHost | None:
        """The simulated host at ``sysfs_root``, or None if that is not a simulated tree."""
        root = Path(sysfs_root)
        return cls(root) if is_simulated(root) else None

    @property
    def directory(self) -> Path:
        return self.sysfs_root.parent

    @property
    def sriov_manage(self) -> Path:
        return self.directory / "bin" / "sriov-manage"

    @property
    def nvidia_smi(self) -> Path:
        """The simulated ``nvidia-smi`` (``vgpu -i <GPU> -shm 0|1`` and ``-q [-i <GPU>]``)."""
        return self.directory / "bin" / "nvidia-smi"

    @property
    def interface(self) -> str:
        """The interface every GPU shows (``mdev`` for a host without GPUs); ``mixed`` when
        GPUs differ (each one's is in :meth:`gpus`)."""
        kinds = {g.interface for g in load_state(self.sysfs_root).gpus}
        if len(kinds) > 1:
            return "mixed"
        return kinds.pop() if kinds else "mdev"

    def gpus(self) -> tuple[SimGpu, ...]:
        state = load_state(self.sysfs_root)
        return tuple(
            SimGpu(PciAddress.parse(g.address), g.model, bool(g.vfs), g.interface, g.vgpu_mode)
            for g in state.gpus
        )

    def writer(self) -> SimSysfsWriter:
        """The kernel emulation behind the sysfs-writer port."""
        return SimSysfsWriter(self.sysfs_root)

    def hold_probe(self) -> SimHoldProbe:
        return SimHoldProbe(self.sysfs_root)

    def stats(self) -> dict[str, int]:
        """Counters: ``writes`` (sysfs write calls, refused ones too), ``sriovManageCalls``,
        ``nvidiaSmiCalls``."""
        counters = load_state(self.sysfs_root).counters
        return {
            "writes": counters.get("writes", 0),
            "sriovManageCalls": counters.get("sriovManageCalls", 0),
            "nvidiaSmiCalls": counters.get("nvidiaSmiCalls", 0),
        }


# --- creating a host ------------------------------------------------------------------------


def init_host(
    directory: Path,
    gpus: Sequence[str],
    *,
    interface: str = "mdev",
    extra_devices: bool = True,
    passthrough: Sequence[str] = (),
    catalog: Catalog | None = None,
) -> SimHost:
    """Build ``DIR/sys``, ``DIR/bin/sriov-manage`` and ``DIR/bin/nvidia-smi`` for GPUs given as
    ``MODEL[@ADDRESS][:mdev|:vfio]``.

    ``interface`` is the vGPU host interface of every GPU given without a ``:mdev``/``:vfio``
    suffix (``A2@0000:08:00.0:vfio``; ``A2:vfio``). SR-IOV starts disabled. A multi-GPU board
    (A16) is several GPUs on consecutive buses, starting at the address given. The GPUs at the
    ``passthrough`` addresses (each given with ``@ADDRESS``) are bound to ``vfio-pci``, as for
    a VM that has one whole. Raises ValueError for an unknown model, a bad or duplicate
    address, an unknown interface; FileExistsError if ``DIR/sys`` exists.
    """
    cat = catalog or default_catalog()
    _check_interface(interface)
    requests = [_parse_gpu_arg(g, cat, interface=interface) for g in gpus]
    whole = set()
    for text in passthrough:
        try:
            whole.add(PciAddress.parse(text))
        except ValueError as exc:
            raise ValueError(f"passthrough address {text!r}: {exc}") from None
    unknown = whole - {r.address for r in requests}
    if unknown:
        missing = ", ".join(str(a) for a in sorted(unknown))
        raise ValueError(f"passthrough {missing}: no GPU given at that address (MODEL@ADDRESS)")
    requests = [replace(r, driver="vfio-pci") if r.address in whole else r for r in requests]
    directory = Path(directory)
    _create_host(directory, requests, interface=interface, extra_devices=extra_devices)
    return SimHost(directory / "sys")


def build_host(
    directory: Path, spec: Mapping[str, Any], *, catalog: Catalog | None = None
) -> SimHost:
    """Build a host in a given state straight from a spec (golden tests, benchmarks).

    ``spec``: ``{gpus: [{model, address?, sriov?: enabled|disabled, vgpus?: {VF index or
    address: "NVIDIA A2-4Q" | {type, uuid?, held?, holder?, hidden?}}, driver?: vfio-pci,
    vgpuVfs?: false, interface?: mdev|vfio, vgpuMode?: equal-size|mixed-size}], interface?,
    extraDevices?}``. ``vgpuMode: mixed-size`` is set as ``nvidia-smi -shm 1`` would, after
    SR-IOV and before the vGPUs (so it needs SR-IOV enabled). ``driver`` binds the
    PF to another driver than nvidia (passed through whole); ``vgpuVfs: false`` makes its
    ``sriov_vf_device`` 0. A GPU's ``interface`` is the vGPU host interface its VFs show; the
    top-level one is the default for entries without one (default mdev), so one host may have
    GPUs of both kinds (on a vfio GPU the VF is the vGPU: no UUIDs).
    ``sriov`` defaults to enabled when ``vgpus`` is given. A multi-GPU board entry covers the
    whole board: ``sriov`` applies to each GPU, an index key means a VF of its first GPU, an
    address key any VF of the board. vGPU UUIDs default to ``uuid5(NAMESPACE_URL, "sim/<VF>")``.
    A spec the driver would not allow (sizes mixed, too many, unknown type) is a ValueError.
    """
    cat = catalog or default_catalog()
    if not isinstance(spec, Mapping):
        raise ValueError("simulator spec: expected a mapping with a 'gpus' list")
    unknown = set(spec) - {"gpus", "interface", "extraDevices", "node", "description"}
    if unknown:
        raise ValueError(f"simulator spec: unknown keys {sorted(unknown)}")
    interface = spec.get("interface", "mdev")
    if interface not in INTERFACES:
        raise ValueError(f"simulator spec interface: {_expected_interface(interface)}")
    extra = spec.get("extraDevices", True)
    if not isinstance(extra, bool):
        raise ValueError("simulator spec: extraDevices must be true or false")
    entries = spec.get("gpus") or []
    if not isinstance(entries, list):
        raise ValueError("simulator spec: 'gpus' must be a list")
    parsed = [_parse_gpu_entry(i, e, cat, interface=interface) for i, e in enumerate(entries)]

    directory = Path(directory)
    state, placed = _create_host(
        directory, [p.request for p in parsed], interface=interface, extra_devices=extra
    )
    root = directory / "sys"
    try:
        with locked(root):
            tree = SysfsTree(root)
            for i, entry in enumerate(parsed):
                board = [state.gpu(str(g.address)) for g in placed if g.board == i]
                gpus = [g for g in board if g is not None]
                if entry.sriov:
                    for gpu in gpus:
                        driver.enable_vfs(state, tree, gpu)
                        if entry.vgpu_mode is not VgpuMode.EQUAL_SIZE:
                            driver.set_vgpu_mode(state, tree, gpu, entry.vgpu_mode)
                for key, vgpu in entry.vgpus:
                    _build_vgpu(state, tree, i=i, gpus=gpus, key=key, spec=vgpu)
            save_state(root, state)
    except BaseException:
        _remove_host(directory)
        raise
    return SimHost(root)


@record(frozen=True, slots=True)
class _VgpuSpec:
    type_name: str
    uuid: str | None
    holder: str | None
    hidden: bool = False


@record(frozen=True, slots=True)
class _GpuEntry:
    request: GpuRequest
    sriov: bool
    vgpus: tuple[tuple[int | PciAddress, _VgpuSpec], ...]
    vgpu_mode: VgpuMode = VgpuMode.EQUAL_SIZE


def _parse_gpu_entry(i: int, raw: Any, cat: Catalog, *, interface: str) -> _GpuEntry:
    where = f"simulator spec gpus[{i}]"
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected a mapping with 'model'")
    unknown = set(raw) - {
        "model",
        "address",
        "sriov",
        "vgpus",
        "driver",
        "vgpuVfs",
        "interface",
        "vgpuMode",
    }
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    if "model" not in raw:
        raise ValueError(f"{where}: 'model' is required")
    model = _model(str(raw["model"]), cat)
    address = None
    if raw.get("address") is not None:
        try:
            address = PciAddress.parse(str(raw["address"]))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    vgpus_raw = raw.get("vgpus") or {}
    if not isinstance(vgpus_raw, Mapping):
        raise ValueError(f"{where}.vgpus: expected a mapping VF → profile")
    sriov_raw = raw.get("sriov", "enabled" if vgpus_raw else "disabled")
    if sriov_raw in (True, "enabled"):
        sriov = True
    elif sriov_raw in (False, "disabled"):
        sriov = False
    else:
        raise ValueError(f"{where}.sriov: expected enabled or disabled, got {sriov_raw!r}")
    if vgpus_raw and not sriov:
        raise ValueError(f"{where}: vGPUs need SR-IOV enabled")
    vgpus: list[tuple[int | PciAddress, _VgpuSpec]] = []
    for key, value in vgpus_raw.items():
        vgpus.append((_vf_key(f"{where}.vgpus", key), _vgpu_spec(f"{where}.vgpus[{key}]", value)))
    driver = raw.get("driver", "nvidia")
    if not isinstance(driver, str) or not driver.replace("-", "_").isidentifier():
        raise ValueError(f"{where}.driver: expected a driver name such as vfio-pci")
    vgpu_vfs = raw.get("vgpuVfs", True)
    if not isinstance(vgpu_vfs, bool):
        raise ValueError(f"{where}.vgpuVfs: expected true or false")
    if (vgpus or sriov) and (driver != "nvidia" or not vgpu_vfs):
        raise ValueError(f"{where}: only a GPU bound to nvidia with vGPU VFs can have them on")
    own = raw.get("interface", interface)
    if own not in INTERFACES:
        raise ValueError(f"{where}.interface: {_expected_interface(own)}")
    mode = raw.get("vgpuMode", VgpuMode.EQUAL_SIZE)
    if mode not in (VgpuMode.EQUAL_SIZE, VgpuMode.MIXED_SIZE):
        raise ValueError(f"{where}.vgpuMode: expected equal-size or mixed-size, got {mode!r}")
    if mode == VgpuMode.MIXED_SIZE and not sriov:
        raise ValueError(f"{where}: vgpuMode mixed-size needs SR-IOV enabled (it is set after it)")
    return _GpuEntry(
        GpuRequest(model, address, driver, vgpu_vfs, interface=own),
        sriov,
        tuple(vgpus),
        VgpuMode(mode),
    )


def _expected_interface(value: Any) -> str:
    return f"expected one of {', '.join(INTERFACES)}, got {value!r}"


def _check_interface(interface: str) -> None:
    if interface not in INTERFACES:
        raise ValueError(
            f"unknown interface {interface!r}: expected one of {', '.join(INTERFACES)}"
        )


def _vf_key(where: str, key: Any) -> int | PciAddress:
    if isinstance(key, bool):
        raise ValueError(f"{where}: VF key {key!r} is neither an index nor an address")
    if isinstance(key, int):
        return key
    text = str(key).strip()
    if text.isdigit():
        return int(text)
    try:
        return PciAddress.parse(text)
    except ValueError:
        raise ValueError(f"{where}: VF key {key!r} is neither an index nor an address") from None


def _vgpu_spec(where: str, value: Any) -> _VgpuSpec:
    if isinstance(value, str):
        return _VgpuSpec(long_profile_name(value), None, None)
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected a profile name or {{type, uuid?, held?}}")
    unknown = set(value) - {"type", "uuid", "held", "holder", "hidden"}
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    if not isinstance(value.get("type"), str):
        raise ValueError(f"{where}: 'type' (a profile name) is required")
    uuid = value.get("uuid")
    if uuid is not None:
        try:
            uuid = str(uuidlib.UUID(str(uuid)))
        except ValueError:
            raise ValueError(f"{where}: {uuid!r} is not a UUID") from None
    held = value.get("held", False)
    if not isinstance(held, bool):
        raise ValueError(f"{where}.held: expected true or false")
    holder = value.get("holder")
    hidden = value.get("hidden", False)
    if not isinstance(hidden, bool):
        raise ValueError(f"{where}.hidden: expected true or false")
    if (holder is not None or hidden) and not held:
        held = True
    return _VgpuSpec(
        long_profile_name(value["type"]),
        uuid,
        (str(holder) if holder is not None else DEFAULT_HOLDER) if held else None,
        hidden,
    )


def _build_vgpu(
    state: SimState,
    tree: SysfsTree,
    *,
    i: int,
    gpus: list[GpuRecord],
    key: int | PciAddress,
    spec: _VgpuSpec,
) -> None:
    where = f"simulator spec gpus[{i}].vgpus[{key}]"
    if isinstance(key, int):
        vfs = gpus[0].vfs
        if not 0 <= key < len(vfs):
            raise ValueError(f"{where}: VF index out of range 0..{len(vfs) - 1}")
        vf = vfs[key].address
    else:
        vf = str(key)
        if not any(v.address == vf for g in gpus for v in g.vfs):
            raise ValueError(f"{where}: {vf} is not a VF of this GPU")
    if state.interface_of_vf(vf) == "vfio":
        if spec.uuid is not None:
            raise ValueError(f"{where}: the vfio interface has no UUIDs (the VF is the vGPU)")
        vgpu_id = vf
    else:
        vgpu_id = spec.uuid or str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"sim/{vf}"))
    try:
        driver.create_vgpu(state, tree, vf=vf, type_name=spec.type_name, vgpu_id=vgpu_id)
    except OSError as exc:
        raise ValueError(f"{where}: {spec.type_name}: {_reason(exc)}") from None
    if spec.holder is not None:
        state.held[vgpu_id] = spec.holder
        if spec.hidden:
            state.hidden.add(vgpu_id)


def _reason(exc: OSError) -> str:
    text = str(exc.strerror or exc)
    return text.split(": ", 1)[1] if ": " in text else text


def _model(name: str, cat: Catalog) -> SimModel:
    model = cat.model(name)
    if model is None:
        known = ", ".join(m.short for m in cat.models)
        raise ValueError(f"unknown GPU model {name!r}; known models: {known}")
    return SimModel.from_catalog(model)


def _parse_gpu_arg(text: str, cat: Catalog, *, interface: str) -> GpuRequest:
    """``A2``, ``L40S@0000:41:00.0``, either with ``:mdev`` or ``:vfio`` after it (else the
    GPU shows ``interface``). An address has colons of its own: only a last ``:``-separated
    part that is exactly ``mdev`` or ``vfio`` is an interface."""
    head, sep, last = text.rpartition(":")
    if sep and last in INTERFACES:
        text, interface = head, last
    name, sep, addr = text.partition("@")
    model = _model(name.strip(), cat)
    if not sep:
        return GpuRequest(model, interface=interface)
    try:
        address = PciAddress.parse(addr.strip())
    except ValueError as exc:
        raise ValueError(f"{exc} (a GPU is MODEL[@ADDRESS][:mdev|:vfio])") from None
    return GpuRequest(model, address, interface=interface)


def _create_host(
    directory: Path, requests: Sequence[GpuRequest], *, interface: str, extra_devices: bool
) -> tuple[SimState, list[PlacedGpu]]:
    """``interface``: the host's default; it decides only whether a host without GPUs has the
    mdev bus (each GPU's own is in its request)."""
    _check_interface(interface)
    for r in requests:
        _check_interface(r.interface)
    placed = place_gpus(requests)
    state = _layout(placed, extra_devices=extra_devices)
    root = directory / "sys"
    if root.exists():
        raise FileExistsError(f"{root} already exists: remove it to build a new simulated host")
    directory.mkdir(parents=True, exist_ok=True)
    try:
        root.mkdir()
        (root / STATE_DIR).mkdir()
        _render(SysfsTree(root), state, mdev=_mdev_core(state, default=interface))
        save_state(root, state)
        install_sriov_manage(directory)
        install_nvidia_smi(directory)
    except BaseException:
        _remove_host(directory)
        raise
    return state, placed


def _remove_host(directory: Path) -> None:
    shutil.rmtree(directory / "sys", ignore_errors=True)
    for program in ("sriov-manage", "nvidia-smi"):
        (directory / "bin" / program).unlink(missing_ok=True)


def _layout(placed: Sequence[PlacedGpu], *, extra_devices: bool) -> SimState:
    """Decide every function's place, root port and IOMMU group (deterministically)."""
    taken = occupied(placed)
    nic: PciAddress | None = None
    audio: tuple[PciAddress, PlacedGpu] | None = None
    if extra_devices:
        gpu_buses = {(a.domain, a.bus) for a in taken}
        bus = next(b for b in NIC_BUSES if (0, b) not in gpu_buses)
        nic = PciAddress(0, bus, 0, 0)
        for g in sorted(placed, key=lambda g: g.address):
            a = PciAddress(g.address.domain, g.address.bus, g.address.slot, 1)
            # Function 1 of the GPU's slot, unless a VF (offset 1) or another GPU sits there.
            if g.address.function == 0 and a not in taken:
                audio = (a, g)
                break

    # Endpoints that get their own root port, numbered per domain in address order.
    endpoints = sorted([g.address for g in placed] + ([nic] if nic else []))
    per_domain: dict[int, int] = {}
    root_ports: dict[PciAddress, PciAddress] = {}
    for a in endpoints:
        k = per_domain.get(a.domain, 0)
        per_domain[a.domain] = k + 1
        root_ports[a] = root_port_address(a.domain, k)

    state = SimState(
        models={g.model.name: g.model for g in placed},
        gpus=[],
        devices=[],
        pid_namespace=current_pid_namespace() or INIT_PID_NAMESPACE,
    )
    functions: list[tuple[PciAddress, str, str]] = [  # address, role, root port
        (rp, "root-port", "") for rp in root_ports.values()
    ]
    functions += [(g.address, "gpu", str(root_ports[g.address])) for g in placed]
    if nic is not None:
        functions.append((nic, "nic", str(root_ports[nic])))
        for vf in vf_addresses(nic, total=_NIC_VFS, offset=_NIC_VF_OFFSET, stride=_NIC_VF_STRIDE):
            functions.append((vf, "nic-vf", str(root_ports[nic])))
    if audio is not None:
        functions.append((audio[0], "audio", str(root_ports[audio[1].address])))

    models = {g.address: g.model for g in placed}
    by_address = {g.address: g for g in placed}
    groups: dict[PciAddress, int] = {}
    for address, role, rp in sorted(functions, key=lambda f: f[0]):
        if role == "audio" and audio is not None:
            # A GPU and its audio function share the slot, hence the IOMMU group (the GPU,
            # function 0, sorts first and has it already).
            group = groups[audio[1].address]
        else:
            group = state.allocate_group(str(address))
        groups[address] = group
        if role == "gpu":
            g = by_address[address]
            state.gpus.append(
                GpuRecord(
                    str(address),
                    models[address].name,
                    rp,
                    group,
                    driver=g.driver,
                    vgpu_vfs=g.vgpu_vfs,
                    interface=g.interface,
                )
            )
        else:
            state.devices.append(DeviceRecord(str(address), role, rp, group))
    return state


def _mdev_core(state: SimState, *, default: str) -> bool:
    """Whether the kernel's mdev core is loaded, so its bus and class exist: when a GPU shows
    the mdev interface (a host without GPUs: when its default interface is mdev)."""
    if state.gpus:
        return any(g.interface == "mdev" for g in state.gpus)
    return default == "mdev"


def _render(tree: SysfsTree, state: SimState, *, mdev: bool) -> None:
    tree.skeleton(_DRIVERS, mdev=mdev)
    for d in state.devices:
        if d.role == "root-port":
            tree.function(_root_port(d))
    for g in state.gpus:
        tree.gpu_pf(
            g.address,
            g.root_port,
            state.model_of(g),
            g.iommu_group,
            driver=g.driver,
            vgpu_vfs=g.vgpu_vfs,
        )
    nic = next((d for d in state.devices if d.role == "nic"), None)
    nic_vfs = [d for d in state.devices if d.role == "nic-vf"]
    if nic is not None:
        tree.function(_nic(nic, nic_vfs))
        for d in nic_vfs:
            tree.function(_nic_vf(d, nic))
    for d in state.devices:
        if d.role == "audio":
            tree.function(_audio(d, state))


def _root_port(d: DeviceRecord) -> PciFunction:
    return PciFunction(
        address=d.address,
        root_port="",
        vendor=_INTEL,
        device=_ROOT_PORT["device"],
        class_code=_ROOT_PORT["class"],
        subsystem_vendor=_INTEL,
        subsystem_device=0,
        revision=0x04,
        driver="bus/pci/drivers/pcieport",
        iommu_group=d.iommu_group,
    )


def _nic(d: DeviceRecord, vfs: Sequence[DeviceRecord]) -> PciFunction:
    return PciFunction(
        address=d.address,
        root_port=d.root_port,
        vendor=_INTEL,
        device=_NIC["device"],
        class_code=_NIC["class"],
        subsystem_vendor=_INTEL,
        subsystem_device=_NIC["subsystem"],
        revision=0x01,
        driver="bus/pci/drivers/ixgbe",
        iommu_group=d.iommu_group,
        files={
            "sriov_totalvfs": (f"{_NIC_TOTAL_VFS}\n", 0o444),
            "sriov_numvfs": (f"{len(vfs)}\n", 0o644),
            "sriov_offset": (f"{_NIC_VF_OFFSET}\n", 0o444),
            "sriov_stride": (f"{_NIC_VF_STRIDE}\n", 0o444),
            "sriov_vf_device": (f"{_NIC['vf_device']:x}\n", 0o444),
        },
        links={f"virtfn{i}": device_dir(v.address, v.root_port) for i, v in enumerate(vfs)},
    )


def _nic_vf(d: DeviceRecord, pf: DeviceRecord) -> PciFunction:
    return PciFunction(
        address=d.address,
        root_port=d.root_port,
        vendor=_INTEL,
        device=_NIC["vf_device"],
        class_code=_NIC["class"],
        subsystem_vendor=_INTEL,
        subsystem_device=_NIC["subsystem"],
        revision=0x01,
        driver="bus/pci/drivers/ixgbevf",
        iommu_group=d.iommu_group,
        links={"physfn": device_dir(pf.address, pf.root_port)},
    )


def _audio(d: DeviceRecord, state: SimState) -> PciFunction:
    pf = PciAddress.parse(d.address)
    gpu = state.gpu(str(PciAddress(pf.domain, pf.bus, pf.slot, 0)))
    model = state.model_of(gpu) if gpu is not None else None
    return PciFunction(
        address=d.address,
        root_port=d.root_port,
        vendor=0x10DE,
        device=_AUDIO["device"],
        class_code=_AUDIO["class"],
        subsystem_vendor=model.subsystem_vendor if model else 0x10DE,
        subsystem_device=model.subsystem_device if model else 0,
        revision=0xA1,
        driver="bus/pci/drivers/snd_hda_intel",
        iommu_group=d.iommu_group,
    )


# --- operating a host -----------------------------------------------------------------------


def _root_of(directory: Path) -> Path:
    """``DIR/sys`` of a simulated host (``DIR/sys`` itself is accepted too)."""
    directory = Path(directory)
    for root in (directory / "sys", directory):
        if state_path(root).is_file():
            return root
    raise ValueError(
        f"{directory} is not a simulated host (no sys/{STATE_DIR}/state.json): "
        "create one with 'vgpuctl sim init'"
    )


def _vgpu_key(state: SimState, vgpu: str) -> str:
    key = vgpu.strip().lower()
    if key not in state.vgpus:
        known = ", ".join(sorted(state.vgpus)[:8]) or "none"
        raise ValueError(f"no vGPU {vgpu!r} on this simulated host (vGPUs: {known})")
    return key


def hold(
    directory: Path,
    uuid: str,
    *,
    holder: str = DEFAULT_HOLDER,
    hidden: bool = False,
    device_fd: str | None = None,
) -> None:
    """A VM opens the vGPU: a write removing it now blocks until it is released (disabling its
    GPU's VFs fails with EBUSY). ``hidden``: no hold probe can see this VM (its removal then
    reaches the kernel, and blocks).

    ``device_fd``: the holder is a process that kept only the vGPU's VFIO device fd, in the
    simulated ``/proc`` (``procfs.py``), named ``holder`` (its ``comm``): its fdinfo names the
    device (:data:`~reconciler.sim.procfs.NEW_KERNEL`, Linux 6.18+) or not
    (:data:`~reconciler.sim.procfs.OLD_KERNEL`). The probe finds it only by scanning that tree.
    """
    if device_fd is not None and device_fd not in procfs.FDINFO_STYLES:
        raise ValueError(
            f"unknown fdinfo style {device_fd!r}: expected one of {', '.join(procfs.FDINFO_STYLES)}"
        )
    if device_fd is not None and hidden:
        raise ValueError("a device-fd holder is a process the probe can see: not hidden")
    root = _root_of(directory)
    with locked(root):
        state = load_state(root)
        key = _vgpu_key(state, uuid)
        _end_process(root, state, key)
        if device_fd is not None:
            pid = _free_pid(state)
            rec = state.vgpus[key]
            gpu = state.vf_owner(rec.vf)
            device = (
                f"bus/pci/devices/{rec.vf}"
                if gpu is not None and gpu.interface != "mdev"
                else f"bus/mdev/devices/{key}"
            )
            syspath = (
                procfs.device_syspath(root, device) if device_fd == procfs.NEW_KERNEL else None
            )
            comm = holder if holder != DEFAULT_HOLDER else "qemu-kvm"
            procfs.add_device_fd_holder(root, pid, comm, syspath)
            state.by_process[key] = pid
            holder = describe_holder(pid, comm)
        state.held[key] = holder
        if hidden:
            state.hidden.add(key)
        else:
            state.hidden.discard(key)
        save_state(root, state)


def release(directory: Path, uuid: str) -> None:
    """The VM lets go of the vGPU (nothing happens if it was not held); a blocked removal of
    it then completes. A holder in the simulated ``/proc`` exits."""
    root = _root_of(directory)
    with locked(root):
        state = load_state(root)
        key = _vgpu_key(state, uuid)
        _end_process(root, state, key)
        state.held.pop(key, None)
        state.hidden.discard(key)
        save_state(root, state)


def remove(directory: Path, vgpu: str) -> tuple[str, str, str]:
    """Remove a vGPU by hand, behind vgpuctl's back (drift): the one on the VF at address
    ``vgpu``, or the one whose id (mdev UUID) it is. What the kernel does for an mdev's
    ``remove`` or a vfio VF's ``current_vgpu_type`` set 0 (:func:`driver.remove_vgpu`),
    without counting as a write of vgpuctl's nor taking a fault armed for them
    (:func:`fail`). A vGPU a simulated VM holds is refused: the kernel would block the write
    until the VM lets go (``kernel.py``), and a command waiting for ever helps nobody.
    Returns (vGPU id, VF address, type name)."""
    root = _root_of(directory)
    with locked(root):
        state = load_state(root)
        wanted = vgpu.strip().lower()
        key = next((k for k, rec in state.vgpus.items() if rec.vf == wanted), None)
        if key is None:
            if state.vf_owner(wanted) is not None:
                raise ValueError(f"VF {wanted} hosts no vGPU")
            key = _vgpu_key(state, vgpu)
        rec = state.vgpus[key]
        if key in state.held or key in state.removing:
            raise ValueError(
                f"vGPU {key} on VF {rec.vf} is held by {state.held.get(key, 'a VM')}: the "
                "kernel would block this removal until it lets go ('vgpuctl sim release' first)"
            )
        driver.remove_vgpu(state, SysfsTree(root), key)
        save_state(root, state)
    return key, rec.vf, rec.type


def _end_process(root: Path, state: SimState, key: str) -> None:
    pid = state.by_process.pop(key, None)
    if pid is not None:
        procfs.remove_process(root, pid)


def _free_pid(state: SimState) -> int:
    taken = set(state.by_process.values())
    pid = procfs.FIRST_PID
    while pid in taken:
        pid += 1
    return pid


def fail(
    directory: Path,
    *,
    writes: int = 0,
    sriov_manage: str | None = None,
    crash_after: int | None = None,
) -> None:
    """Arm one-shot faults; only the ones given are changed (``reboot`` clears them all).

    ``writes=N``: the next N sysfs writes fail with EIO. ``sriov_manage``: the next call fails
    ("error", exit 1), does nothing but exits 0 ("silent"), or sleeps an hour ("hang").
    ``crash_after=N``: after the Nth further successful change (a sysfs write or an
    sriov-manage call that changed something) the process that asked for it is SIGKILLed.
    """
    if writes < 0:
        raise ValueError(f"writes must be 0 or more, not {writes}")
    if sriov_manage is not None and sriov_manage not in SRIOV_MANAGE_FAULTS:
        raise ValueError(
            f"unknown sriov-manage fault {sriov_manage!r}: "
            f"expected one of {', '.join(SRIOV_MANAGE_FAULTS)}"
        )
    if crash_after is not None and crash_after < 1:
        raise ValueError(f"crash_after must be 1 or more, not {crash_after}")
    root = _root_of(directory)
    with locked(root):
        state = load_state(root)
        if writes:
            state.faults.writes = writes
        if sriov_manage is not None:
            state.faults.sriov_manage = sriov_manage
        if crash_after is not None:
            state.faults.crash_after = crash_after
        save_state(root, state)


def reboot(directory: Path) -> None:
    """Power-cycle: every VF and vGPU gone, every GPU equal-size and out of MIG mode, holds and
    faults cleared; PFs and the rest stay."""
    root = _root_of(directory)
    with locked(root):
        state = load_state(root)
        driver.power_cycle(state, SysfsTree(root))
        procfs.remove_all(root)
        save_state(root, state)
