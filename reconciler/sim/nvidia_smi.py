"""The simulator's ``nvidia-smi``: only what vgpuctl needs of it, a GPU's vGPU mode (set, read)
and the names of its vGPU types.

``DIR/bin/nvidia-smi`` (written by :func:`install_script`, as ``sriov-manage`` is) runs
:func:`main` on ``DIR/sys``. It implements three commands. ``nvidia-smi vgpu -i <GPU> -shm 0|1``
(docs/domain.md §4): ``-shm 1`` puts the GPU in mixed-size mode, ``-shm 0`` back in equal-size
mode. ``<GPU>`` is its PCI address, as ``0000:08:00.0`` or as nvidia-smi prints bus ids
(``00000000:08:00.0``); a GPU index or UUID is not simulated. The driver's rules: the mode is
set after ``sriov-manage -e`` and before the first vGPU; a call while the GPU's SR-IOV is off or
while it hosts a vGPU is refused, the mode unchanged. ``sriov-manage -d`` and a reboot clear it.

``nvidia-smi -q [-i <GPU>]`` reads the mode: a report in the layout of real ``nvidia-smi -q``
captures (R550: a key indented 4 spaces a level, padded to column 42, then ``: value``; a blank
line before the ``NVSMI LOG`` banner and after each GPU), with a few of its keys only. The
header: the time of the call, the driver version ``module/nvidia/version`` shows (the
simulator's own if that file is gone), ``CUDA Version: Not Found`` (as on a vGPU host) and
``Attached GPUs``: every GPU of the host (with ``-i`` too). Then, in address order (with
``-i``: that GPU only), ``GPU 00000000:08:00.0`` (nvidia-smi's bus id: a 32-bit domain,
upper-case hex), its ``Product Name`` and its ``GPU Virtualization Mode`` block:
``Virtualization Mode: Host VGPU``, ``Host VGPU Mode: SR-IOV``, ``vGPU Heterogeneous Mode``:
``Enabled`` in mixed-size mode, ``Disabled`` in equal-size mode. The captures we have are of
hosts without vGPU, which show ``N/A`` there: that a vGPU host shows ``Enabled``/``Disabled``
(nvidia-smi's usual words for a boolean mode) is our assumption. Every GPU of the host is
listed with these lines, whatever its state (SR-IOV off; bound to ``vfio-pci``, which a real
nvidia-smi would not list at all). A query changes nothing but the state's
``nvidiaSmiQueries`` counter.

Not NVIDIA's: the wording of the messages (stdout on a successful ``-shm``, stderr on a refusal
or an error) is the simulator's own, and so are the exit codes' meanings beyond "non-zero is a
failure" (2: a bad argument, 3: the operation is not available now, after nvidia-smi's
documented return values; which one the real driver returns for each refusal is not documented
to us). Nothing may parse these messages; the ``-q`` report is what is meant to be parsed.

``nvidia-smi vgpu -s -v -i <GPU>`` lists the GPU's *supported* vGPU types (NVML's
``nvmlDeviceGetSupportedVgpus``: every type of its model the simulator offers, whatever is
hosted or creatable now) in the layout of a public capture of the real command
(bigstack-oss/cubecos, ``core/sdk_sh/tests/test_gpu_sriov_vgpu_count_limit.sh``, driver
580.105.06; see ``observe/vgputypes.py``): ``GPU 00000000:08:00.0``, then per type
``vGPU Type ID`` in **hexadecimal** (``0x47b``; sysfs prints the same id in decimal) at one
level and its ``Name``, ``GPU Instance Profile ID`` (``N/A``: time-sliced), ``Max Instances``
and ``FB Memory`` one level deeper, keys padded to column 42 as in ``-q``. The real command
prints more keys (``Class``, ``Max Instances Per VM``…); they are left out, as nothing reads
them. A call counts in the state's ``nvidiaSmiTypeQueries`` counter and changes nothing else;
``-s`` without ``-v``, or without ``-i``, is not simulated. In MIG mode it lists nothing (no
MIG-backed type is simulated).

MIG, as Harvester's pcidevices-controller drives it (pkg/util/gpuhelper/mig.go, bdd8025; docs/
domain.md §10), for models the catalogue lists with MIG-backed profiles:
``nvidia-smi -i <GPU> --query-gpu=mig.mode.current --format=csv,noheader`` prints ``Enabled`` or
``Disabled``, and ``[N/A]`` for a GPU without MIG (nvidia-smi's CSV query output; the words as
in pcidevices' capture, mig_test.go ``migStatusSupported``/``migStatusUnsupported``).
``nvidia-smi -i <GPU> -mig 0|1`` sets MIG mode at once (a real GPU may need a reset first: not
modelled): from then on its VFs offer no time-sliced type, and no MIG-backed one either, since
no GPU instance exists (none is ever made here). ``nvidia-smi mig -i <GPU> -lgip`` lists the
model's GPU instance profiles (``rules.GPU_INSTANCE_PROFILES``) in the table layout of
pcidevices' capture (mig_test.go ``availableProfiles``), every one free; ``nvidia-smi mig -i
<GPU> -lgi`` says ``No GPU instances found: Not Found`` and exits 6 (nvidia-smi's "a query to
find an object was unsuccessful"): there are none. Both refuse a GPU not in MIG mode. A call
counts in the state's ``nvidiaSmiMigCalls`` counter.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from reconciler.model import PciAddress
from reconciler.model.mode import VgpuMode
from reconciler.model.record import record
from reconciler.sim import driver
from reconciler.sim.rules import GPU_INSTANCE_PROFILES, GpuInstanceProfile
from reconciler.sim.scripts import install_program
from reconciler.sim.state import GpuRecord, SimState, load_state, locked, save_state
from reconciler.sim.tree import DRIVER_VERSION, SysfsTree

USAGE = (
    "usage: nvidia-smi vgpu -i <GPU PCI address> -shm <0|1>\n"
    "       nvidia-smi vgpu -s -v -i <GPU PCI address>\n"
    "       nvidia-smi -q [-i <GPU PCI address>]\n"
    "       nvidia-smi -i <GPU PCI address> --query-gpu=mig.mode.current --format=csv,noheader\n"
    "       nvidia-smi -i <GPU PCI address> -mig <0|1>\n"
    "       nvidia-smi mig -i <GPU PCI address> -lgip|-lgi"
)
#: What is simulated, for the message that refuses anything else.
SIMULATED = (
    "'vgpu -i <GPU> -shm 0|1', 'vgpu -s -v -i <GPU>', '-q [-i <GPU>]', "
    "'-i <GPU> --query-gpu=mig.mode.current --format=csv,noheader', '-i <GPU> -mig 0|1' and "
    "'mig -i <GPU> -lgip|-lgi'"
)

EXIT_OK = 0
#: A supplied argument or flag is invalid.
EXIT_INVALID_ARGUMENT = 2
#: The requested operation is not available on the target device (now).
EXIT_NOT_AVAILABLE = 3
#: A query to find an object was unsuccessful (``-lgi`` with no GPU instance).
EXIT_NOT_FOUND = 6
#: The state counter the MIG commands increment.
MIG_COUNTER = "nvidiaSmiMigCalls"

#: ``-shm`` values → the mode they set.
_MODES = {"0": VgpuMode.EQUAL_SIZE, "1": VgpuMode.MIXED_SIZE}

#: The state counter a query increments (``-shm`` calls count in ``nvidiaSmiCalls``).
QUERY_COUNTER = "nvidiaSmiQueries"
#: The state counter ``vgpu -s -v`` increments.
TYPES_COUNTER = "nvidiaSmiTypeQueries"
#: Where the kernel module tells its version (relative to the sysfs root).
_MODULE_VERSION = "module/nvidia/version"
#: In ``-q``'s report a key (with its indent) is padded to this width, then ``: value``.
_KEY_WIDTH = 42
_INDENT = "    "


@record(frozen=True, slots=True)
class SetMode:
    """``nvidia-smi vgpu -i <gpu> -shm <0|1>``, parsed."""

    gpu: PciAddress
    mode: VgpuMode


@record(frozen=True, slots=True)
class SupportedQuery:
    """``nvidia-smi vgpu -s -v -i <gpu>``, parsed."""

    gpu: PciAddress


@record(frozen=True, slots=True)
class Query:
    """``nvidia-smi -q [-i <gpu>]``, parsed: ``gpu`` None for every GPU."""

    gpu: PciAddress | None


@record(frozen=True, slots=True)
class MigCall:
    """A MIG command, parsed: ``query`` (``--query-gpu=mig.mode.current``), ``enable`` or
    ``disable`` (``-mig 1|0``), ``profiles`` (``mig -lgip``), ``instances`` (``mig -lgi``)."""

    gpu: PciAddress
    what: str


def main(
    argv: Sequence[str],
    *,
    sysfs_root: Path,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run one ``nvidia-smi`` call on the tree at ``sysfs_root``; return its exit status."""
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    parsed = parse(argv)
    if isinstance(parsed, str):
        if parsed == "help":
            print(USAGE, file=out)
            return EXIT_OK
        print(f"nvidia-smi: {parsed}", file=err)
        print(USAGE, file=err)
        return EXIT_INVALID_ARGUMENT
    try:
        if isinstance(parsed, Query):
            return _query(parsed, sysfs_root=sysfs_root, out=out, err=err)
        if isinstance(parsed, SupportedQuery):
            return _supported(parsed, sysfs_root=sysfs_root, out=out, err=err)
        if isinstance(parsed, MigCall):
            return _mig(parsed, sysfs_root=sysfs_root, out=out, err=err)
        return _set_mode(parsed, sysfs_root=sysfs_root, out=out, err=err)
    except OSError as exc:
        where = exc.filename or sysfs_root
        print(f"nvidia-smi: cannot read {where}: {exc.strerror or exc}", file=err)
        return EXIT_NOT_AVAILABLE


def _set_mode(call: SetMode, *, sysfs_root: Path, out: TextIO, err: TextIO) -> int:
    address = str(call.gpu)
    with locked(sysfs_root):
        state = load_state(sysfs_root)
        state.counters["nvidiaSmiCalls"] = state.counters.get("nvidiaSmiCalls", 0) + 1
        gpu = state.gpu(address)
        if gpu is None:
            save_state(sysfs_root, state)
            print(f"No GPU with the PCI bus id {address} is found.", file=err)
            return EXIT_INVALID_ARGUMENT
        try:
            driver.set_vgpu_mode(state, SysfsTree(sysfs_root), gpu, call.mode)
        except OSError as exc:
            save_state(sysfs_root, state)
            print(
                f"Unable to set the vGPU mode of GPU {address} to {call.mode}: {_reason(exc)}",
                file=err,
            )
            return EXIT_NOT_AVAILABLE
        save_state(sysfs_root, state)
    print(f"vGPU mode of GPU {address} is {call.mode}.", file=out)
    return EXIT_OK


def _query(call: Query, *, sysfs_root: Path, out: TextIO, err: TextIO) -> int:
    """Report the GPUs' vGPU mode; nothing changes but the query counter."""
    with locked(sysfs_root):
        state = load_state(sysfs_root)
        state.counters[QUERY_COUNTER] = state.counters.get(QUERY_COUNTER, 0) + 1
        save_state(sysfs_root, state)
        gpus = sorted(state.gpus, key=lambda g: PciAddress.parse(g.address))
        if call.gpu is not None:
            address = str(call.gpu)
            gpus = [g for g in gpus if g.address == address]
            if not gpus:
                print(f"No GPU with the PCI bus id {address} is found.", file=err)
                return EXIT_INVALID_ARGUMENT
        report = _report(state, gpus, driver_version=_driver_version(sysfs_root))
    out.write(report)
    return EXIT_OK


def _supported(call: SupportedQuery, *, sysfs_root: Path, out: TextIO, err: TextIO) -> int:
    """List the GPU's supported vGPU types; nothing changes but the counter."""
    address = str(call.gpu)
    with locked(sysfs_root):
        state = load_state(sysfs_root)
        state.counters[TYPES_COUNTER] = state.counters.get(TYPES_COUNTER, 0) + 1
        save_state(sysfs_root, state)
        gpu = state.gpu(address)
        if gpu is None:
            print(f"No GPU with the PCI bus id {address} is found.", file=err)
            return EXIT_INVALID_ARGUMENT
        model = state.model_of(gpu)
        mig = gpu.mig_mode
    lines = [f"GPU {_smi_bus_id(call.gpu)}"]
    for t in () if mig else model.types:
        lines += [
            _field(1, "vGPU Type ID", f"{t.type_id:#x}"),
            _field(2, "Name", t.name),
            _field(2, "GPU Instance Profile ID", "N/A"),
            _field(2, "Max Instances", str(t.max_instance)),
            _field(2, "FB Memory", f"{t.framebuffer_mib} MiB"),
        ]
    out.write("".join(f"{line}\n" for line in lines))
    return EXIT_OK


def _mig(call: MigCall, *, sysfs_root: Path, out: TextIO, err: TextIO) -> int:
    """One MIG command (the module docstring); only ``-mig`` changes the state."""
    address = str(call.gpu)
    with locked(sysfs_root):
        state = load_state(sysfs_root)
        state.counters[MIG_COUNTER] = state.counters.get(MIG_COUNTER, 0) + 1
        save_state(sysfs_root, state)
        gpu = state.gpu(address)
        if gpu is None:
            print(f"No GPU with the PCI bus id {address} is found.", file=err)
            return EXIT_INVALID_ARGUMENT
        model = state.model_of(gpu)
        if call.what == "query":
            out.write(f"{('Enabled' if gpu.mig_mode else 'Disabled') if model.mig else '[N/A]'}\n")
            return EXIT_OK
        if call.what in ("enable", "disable"):
            on = call.what == "enable"
            try:
                driver.set_mig_mode(state, SysfsTree(sysfs_root), gpu, on)
            except OSError as exc:
                save_state(sysfs_root, state)
                print(f"Unable to {call.what} MIG Mode for GPU {address}: {_reason(exc)}", file=err)
                return EXIT_NOT_AVAILABLE
            save_state(sysfs_root, state)
            out.write(
                f"{'Enabled' if on else 'Disabled'} MIG Mode for GPU {_smi_bus_id(call.gpu)}\n"
                "All done.\n"
            )
            return EXIT_OK
        if not gpu.mig_mode:
            print(f"GPU {address} is not in MIG mode.", file=err)
            return EXIT_NOT_AVAILABLE
        if call.what == "instances":
            print("No GPU instances found: Not Found", file=err)
            return EXIT_NOT_FOUND
        out.write(_gpu_instance_profiles(GPU_INSTANCE_PROFILES.get(model.name, ())))
        return EXIT_OK


def _gpu_instance_profiles(profiles: Sequence[GpuInstanceProfile]) -> str:
    """``nvidia-smi mig -lgip``'s table (GPU 0: a one-GPU call), every instance free."""
    rule = "+" + "-" * 77 + "+"
    lines = [
        rule,
        f"| {'GPU instance profiles:':<76}|",
        "| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |",
        "|                              Free/Total   GiB              CE    JPEG  OFA  |",
        "|" + "=" * 77 + "|",
    ]
    for i, p in enumerate(profiles):
        if i:
            lines.append(rule)
        sm, dec, enc, ce, jpeg, ofa = p.engines
        count = f"{p.instances}/{p.instances}"
        first = (
            f"|   0  MIG {p.name:<12}{p.profile_id:>4}     {count:<11}{p.memory_gib:<11}No"
            f"     {sm:<7}{dec:<6}{enc:<4}|"
        )
        lines.append(first)
        lines.append(f"|{'':<61}{ce:<6}{jpeg:<6}{ofa:<4}|")
    lines.append(rule)
    return "".join(f"{line}\n" for line in lines)


def _driver_version(sysfs_root: Path) -> str:
    """What the loaded module says, as nvidia-smi reports; the simulator's if it says nothing."""
    try:
        text = (sysfs_root / _MODULE_VERSION).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return DRIVER_VERSION
    return text or DRIVER_VERSION


def _report(state: SimState, gpus: Sequence[GpuRecord], *, driver_version: str) -> str:
    """``nvidia-smi -q``'s layout, with the keys that say a GPU's vGPU mode."""
    lines = [
        "",
        "==============NVSMI LOG==============",
        "",
        _field(0, "Timestamp", time.ctime()),
        _field(0, "Driver Version", driver_version),
        _field(0, "CUDA Version", "Not Found"),
        "",
        _field(0, "Attached GPUs", str(len(state.gpus))),
    ]
    for gpu in gpus:
        model = state.models.get(gpu.model)
        mixed = gpu.vgpu_mode is VgpuMode.MIXED_SIZE
        lines += [
            f"GPU {_smi_bus_id(PciAddress.parse(gpu.address))}",
            _field(1, "Product Name", model.name if model is not None else "NVIDIA GPU"),
            _field(1, "GPU Virtualization Mode"),
            _field(2, "Virtualization Mode", "Host VGPU"),
            _field(2, "Host VGPU Mode", "SR-IOV"),
            _field(2, "vGPU Heterogeneous Mode", "Enabled" if mixed else "Disabled"),
            "",
        ]
    return "".join(f"{line}\n" for line in lines)


def _field(level: int, key: str, value: str | None = None) -> str:
    """A report line: ``key`` at ``level``; with a value, padded to the value column."""
    head = f"{_INDENT * level}{key}"
    return head if value is None else f"{head.ljust(_KEY_WIDTH)}: {value}"


def _smi_bus_id(address: PciAddress) -> str:
    """How nvidia-smi prints a bus id: ``00000000:AF:00.0`` (a 32-bit domain, upper-case)."""
    return f"{address.domain:08X}:{address.bus:02X}:{address.slot:02X}.{address.function:X}"


def _reason(exc: OSError) -> str:
    text = str(exc.strerror or exc)
    return text.split(": ", 1)[1] if ": " in text else text


def parse(argv: Sequence[str]) -> SetMode | SupportedQuery | Query | MigCall | str:
    """The call, or an error message ("help" for -h)."""
    args = list(argv)
    if any(a in ("-h", "--help") for a in args):
        return "help"
    if args[:1] == ["mig"] or "-mig" in args or any(a.startswith("--query-gpu") for a in args):
        return _parse_mig(args)
    if "-q" in args:
        if "vgpu" in args or "-shm" in args:
            return "-q does not combine with 'vgpu' or -shm: a query sets nothing"
        return _parse_query(args)
    if not args or args[0] != "vgpu":
        first = args[0] if args else "nothing"
        return f"only {SIMULATED} are simulated, not {first!r}"
    options = _options(args[1:], flags=("-s", "-v"), valued=("-i", "-shm"))
    if isinstance(options, str):
        return options
    gpu = options.get("-i")
    shm = options.get("-shm")
    if gpu is None:
        return "-i <GPU PCI address> is required"
    if "-s" in options or "-v" in options:
        return _parse_supported(options, gpu)
    if shm is None:
        return "-shm 0|1 is required (no other vgpu command is simulated)"
    mode = _MODES.get(shm)
    if mode is None:
        return f"-shm takes 0 or 1, not {shm!r}"
    address = _bus_id(gpu)
    if address is None:
        return _invalid_gpu(gpu)
    return SetMode(address, mode)


def _parse_supported(options: dict[str, str], gpu: str) -> SupportedQuery | str:
    if "-shm" in options:
        return "-s does not combine with -shm"
    if "-s" not in options or "-v" not in options:
        return "only 'vgpu -s -v -i <GPU>' is simulated of the type listings"
    address = _bus_id(gpu)
    return SupportedQuery(address) if address is not None else _invalid_gpu(gpu)


def _parse_mig(args: Sequence[str]) -> MigCall | str:
    """The MIG commands pcidevices runs (mig.go's ``generate…Command``), exactly so."""
    sub = args[:1] == ["mig"]
    rest = [a for a in (args[1:] if sub else args) if not a.startswith("--")]
    long = [a for a in args if a.startswith("--")]
    flags = ("-lgip", "-lgi") if sub else ()
    options = _options(rest, flags=flags, valued=("-i",) if sub else ("-i", "-mig"))
    if isinstance(options, str):
        return options
    gpu = options.get("-i")
    if gpu is None:
        return "-i <GPU PCI address> is required"
    address = _bus_id(gpu)
    if address is None:
        return _invalid_gpu(gpu)
    if sub:
        listed = [f for f in flags if f in options]
        if len(listed) != 1 or long:
            return "only 'mig -i <GPU> -lgip' and 'mig -i <GPU> -lgi' are simulated"
        return MigCall(address, "profiles" if listed[0] == "-lgip" else "instances")
    if "-mig" in options:
        if long:
            return "-mig does not combine with a query"
        value = options["-mig"]
        if value not in ("0", "1"):
            return f"-mig takes 0 or 1, not {value!r}"
        return MigCall(address, "enable" if value == "1" else "disable")
    if sorted(long) != ["--format=csv,noheader", "--query-gpu=mig.mode.current"]:
        return (
            "only '--query-gpu=mig.mode.current --format=csv,noheader' is simulated of the queries"
        )
    return MigCall(address, "query")


def _parse_query(args: Sequence[str]) -> Query | str:
    options = _options(args, flags=("-q",), valued=("-i",))
    if isinstance(options, str):
        return options
    gpu = options.get("-i")
    if gpu is None:
        return Query(None)
    address = _bus_id(gpu)
    return Query(address) if address is not None else _invalid_gpu(gpu)


def _options(
    args: Sequence[str], *, flags: Sequence[str], valued: Sequence[str]
) -> dict[str, str] | str:
    """Each option given → its value ("" for a flag), or an error message. Each at most once."""
    found: dict[str, str] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a in flags:
            if a in found:
                return f"give {a} once"
            found[a] = ""
            i += 1
            continue
        if a in valued:
            if i + 1 >= len(args):
                return f"{a} needs a value"
            if a in found:
                return f"give {a} once"
            found[a] = args[i + 1]
            i += 2
            continue
        return f"unknown option {a}" if a.startswith("-") else f"unexpected argument {a}"
    return found


def _invalid_gpu(text: str) -> str:
    return f"invalid GPU {text!r}: expected a PCI address such as 0000:08:00.0"


def _bus_id(text: str) -> PciAddress | None:
    """``0000:08:00.0``, or nvidia-smi's own ``00000000:08:00.0`` (a 32-bit domain)."""
    head, sep, rest = text.partition(":")
    if sep and len(head) == 8 and head[:4] == "0000":
        text = f"{head[4:]}:{rest}"
    try:
        return PciAddress.parse(text)
    except ValueError:
        return None


def install_script(directory: Path) -> Path:
    """Write ``DIR/bin/nvidia-smi``: runs :func:`main` on ``DIR/sys`` with this interpreter."""
    return install_program(
        directory,
        "nvidia-smi",
        module=__name__,
        summary=(f"Simulated nvidia-smi (vgpuctl sim): only {SIMULATED}."),
    )
