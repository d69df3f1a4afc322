"""Rendering for people: the plan as Terraform-style text, the status table, apply progress.

Pure functions from values to strings; colour is decided by the caller (TTY and NO_COLOR).
Every value interpolated here may carry text from outside (sysfs names, a holder's process name,
API objects, the desired state): each goes through :func:`safe` (control characters escaped)
before any styling, so an escape sequence in a reason cannot move the cursor or erase the line
the operator is reviewing, and only the colour codes added here reach the terminal as codes.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

from reconciler.model import (
    UNKNOWN_HOLDER,
    VGPU,
    Action,
    Blocked,
    CrCreate,
    CrDelete,
    CrUpdate,
    DelegateAction,
    DevicePluginRefresh,
    Gpu,
    HostAction,
    Interface,
    Inventory,
    KubevirtAllow,
    KubevirtUpdate,
    PciAddress,
    Plan,
    SriovDisable,
    SriovEnable,
    SriovGpuDeviceDisable,
    SriovGpuDeviceEnable,
    VgpuCreate,
    VgpuDeviceDisable,
    VgpuDeviceEnable,
    VgpuMode,
    VgpuModeSet,
    VgpuRemove,
)
from reconciler.model.cluster import object_name
from reconciler.model.errors import printable
from reconciler.model.plan import FieldChange
from reconciler.model.record import record


@record(frozen=True, slots=True)
class Style:
    """ANSI styling, or none at all."""

    enabled: bool

    def _wrap(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.enabled else text

    def green(self, text: str) -> str:
        return self._wrap("32", text)

    def red(self, text: str) -> str:
        return self._wrap("31", text)

    def yellow(self, text: str) -> str:
        return self._wrap("33", text)

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def dim(self, text: str) -> str:
        return self._wrap("2", text)


PLAIN = Style(False)


def safe(value: object) -> str:
    """``value`` as text for a terminal: control characters (ESC, CR, …) escaped."""
    return printable(str(value))


def safe_lines(text: str) -> str:
    """A text of several lines made :func:`safe` line by line (its own line breaks kept)."""
    return "\n".join(safe(line) for line in text.split("\n"))


def _gpu_of(action: HostAction | DelegateAction) -> str:
    return safe(action.gpu)


def _sort_key(target: str) -> tuple[int, ...]:
    try:
        a = PciAddress.parse(target)
    except ValueError:
        return (1 << 30,)
    return (a.domain, a.bus, a.slot, a.function)


@record(frozen=True, slots=True)
class Line:
    """One change of a GPU as a plan shows it: ``+``/``-``/``-/+``/``~``/``!``, what, why (each
    already through :func:`safe`)."""

    symbol: str
    title: str
    reason: str
    order: int

    @property
    def blocked(self) -> bool:
        return self.order == _BLOCKED


_BLOCKED = 3


@record(frozen=True, slots=True)
class GpuSection:
    """A GPU's changes, host and blocked, in the order they are shown."""

    heading: str  # "0000:08:00.0 (NVIDIA A2)"
    lines: tuple[Line, ...]


def gpu_sections(
    plan: Plan, *, inventory: Inventory | None = None, style: Style | None = None
) -> list[GpuSection]:
    """The plan's host (or delegate) changes and blocked steps, per GPU in address order."""
    style = style or PLAIN
    models = {str(g.address): safe(g.model) for g in inventory.gpus} if inventory else {}
    actions = _action_lines(plan.actions, style)
    blocked = _blocked_lines(plan.blocked, style)
    sections = []
    for gpu in sorted(set(actions) | set(blocked), key=_sort_key):
        model = models.get(gpu)
        lines = sorted(
            actions.get(gpu, []) + blocked.get(gpu, []),
            key=lambda ln: (ln.order, _sort_key(ln.title.split()[1])),
        )
        sections.append(GpuSection(gpu + (f" ({model})" if model else ""), tuple(lines)))
    return sections


def cluster_lines(plan: Plan, *, describe: Callable[[FieldChange], str] | None = None) -> list[str]:
    """The plan's cluster writes, plain (one per object, its field changes and reason);
    ``describe`` says a field change (default: ``path: old → new``, values as JSON)."""
    return _cluster_lines(plan.actions, PLAIN, describe)


def plugin_lines(plan: Plan) -> list[str]:
    """The plan's device-plugin refreshes, plain."""
    return _plugin_lines(plan.actions, PLAIN)


def _named(uuid: str, target: str) -> str:
    """How a vGPU is named in a plan's line: its mdev UUID; on NVIDIA's vendor-specific VFIO
    interface the VF is the vGPU, and has no UUID."""
    return "(vfio: the VF itself)" if uuid == target else f"(uuid {safe(uuid)})"


def _action_lines(actions: Sequence[Action], style: Style) -> dict[str, list[Line]]:
    """Group host actions per GPU; merge a replacement's remove and create into one ``-/+``."""
    per_gpu: dict[str, list[Line]] = defaultdict(list)
    creates = {a.target for a in actions if isinstance(a, VgpuCreate | VgpuDeviceEnable)}
    for a in actions:
        target, reason = safe(a.target), safe(a.reason)
        match a:
            case VgpuDeviceDisable() if a.is_replacement and a.target in creates:
                continue  # shown with its enable
            case VgpuDeviceEnable() | VgpuDeviceDisable():
                line = _delegate_vf_line(a, style)
            case SriovGpuDeviceEnable():
                line = Line(
                    style.green("+"),
                    f"sriov {safe(a.gpu)}  enable  (SRIOVGPUDevice {target})",
                    reason,
                    0,
                )
            case SriovGpuDeviceDisable():
                line = Line(
                    style.red("-"),
                    f"sriov {safe(a.gpu)}  disable  (SRIOVGPUDevice {target})",
                    reason,
                    0,
                )
            case VgpuRemove() if a.is_replacement and a.target in creates:
                continue  # shown with its create
            case VgpuCreate() if a.replaces is not None:
                line = Line(
                    style.yellow("-/+"),
                    f"vgpu {target}  {safe(a.replaces)} → {safe(a.type_name)}"
                    f"  {_named(a.uuid, a.target)}",
                    reason,
                    1,
                )
            case VgpuCreate():
                line = Line(
                    style.green("+"),
                    f"vgpu {target}  {safe(a.type_name)}  {_named(a.uuid, a.target)}",
                    reason,
                    1,
                )
            case VgpuRemove():
                line = Line(
                    style.red("-"),
                    f"vgpu {target}  {safe(a.type_name)}  {_named(a.uuid, a.target)}",
                    reason,
                    1,
                )
            case SriovEnable():
                line = Line(style.green("+"), f"sriov {target}  enable {a.num_vfs} VFs", reason, 0)
            case SriovDisable():
                line = Line(style.red("-"), f"sriov {target}  disable", reason, 0)
            case VgpuModeSet():
                line = Line(style.yellow("~"), f"mode {target}  {a.mode.value}", reason, 0)
            case _:
                continue
        per_gpu[_gpu_of(a)].append(line)
    return per_gpu


#: How a step on a VGPUDevice that pcidevices-controller makes only after its GPU's enable is
#: marked (``objectExists: false`` in JSON).
NOT_MADE_YET = "(after the enable; VGPUDevice not made yet)"


def _delegate_vf_line(a: VgpuDeviceEnable | VgpuDeviceDisable, style: Style) -> Line:
    """A VGPUDevice spec write, as its host counterpart is shown: ``+``/``-``/``-/+`` and the
    VF, then the object written."""
    where = f"(VGPUDevice {safe(a.target)})"
    if isinstance(a, VgpuDeviceEnable) and a.replaces is not None:
        symbol, what = style.yellow("-/+"), f"{safe(a.replaces)} → {safe(a.type_name)}"
    elif isinstance(a, VgpuDeviceEnable):
        symbol, what = style.green("+"), safe(a.type_name)
    else:
        symbol, what = style.red("-"), safe(a.type_name)
    order = 1 if isinstance(a, VgpuDeviceEnable) else 0
    if a.pending:  # written already: the controller's work is what is left
        where += "  pending"
    if isinstance(a, VgpuDeviceEnable) and not a.object_exists:  # planned ahead
        where += f"  {NOT_MADE_YET}"
    return Line(symbol, f"vgpu {safe(a.vf)}  {what}  {where}", safe(a.reason), order)


def _value(v: object) -> str:
    return safe(json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else f'"{v}"')


def _change_text(c: FieldChange) -> str:
    return f"{safe(c.path)}: {_value(c.old)} → {_value(c.new)}"


def _change_lines(
    changes: Iterable[FieldChange],
    style: Style,
    indent: str,
    describe: Callable[[FieldChange], str] | None = None,
) -> list[str]:
    describe = describe or _change_text
    return [style.yellow(f"{indent}~ {describe(c)}") for c in changes]


def _cluster_lines(
    actions: Sequence[Action],
    style: Style,
    describe: Callable[[FieldChange], str] | None = None,
) -> list[str]:
    """Cluster writes: one line per object, with its field-level changes under it."""
    out: list[str] = []
    for a in actions:
        target = safe(a.target)
        match a:
            case CrCreate():
                out.append(f"    {style.green('+')} {safe(a.object.kind)} {target}")
            case CrDelete():
                out.append(f"    {style.red('-')} {safe(a.object_kind)} {target}")
            case KubevirtUpdate():
                out.append(
                    f"    {style.yellow('~')} KubeVirt {safe(a.target.removeprefix('kubevirt/'))}"
                )
                out.extend(_mediated_lines(a, style))
                for pci in a.add_pci:
                    out.append(
                        style.green(
                            f"        + pciHostDevices: {safe(pci.resource_name)} "
                            f"({safe(pci.selector)})"
                        )
                    )
                for name in a.remove_pci:
                    out.append(style.red(f"        - pciHostDevices: {safe(name)}"))
            case CrUpdate():
                reset = " (reset: changed outside vgpuctl)" if a.drift else ""
                out.append(f"    {style.yellow('~')} {safe(a.object.kind)} {target}{reset}")
                out.extend(_change_lines(a.changes, style, "        ", describe))
            case _:
                continue
        out.append(style.dim(f"        {safe(a.reason)}"))
    return out


def _mediated_lines(a: KubevirtUpdate, style: Style) -> list[str]:
    """The mediatedDevices side of a KubeVirt write: entries added (or, for a type the run
    creates, made sure of: added if gone, its retiring mark cleared), marked retiring,
    unmarked, removed (reconciler/model/retiring.py)."""
    out = []
    if isinstance(a, KubevirtAllow) and a.intent is not None:
        wanted = ", ".join(f"{safe(p.name)} (wanted {p.wanted})" for p in a.intent.profiles)
        out.append(
            style.yellow(
                f"        ~ VGPUNodeState {safe(a.intent.node)}: intent published first: {wanted}"
            )
        )
    ensured = set(a.unmark) if isinstance(a, KubevirtAllow) else set()
    for entry in a.add:
        sure = " (made sure of: added if gone, not retiring)" if entry.selector in ensured else ""
        out.append(style.green(f"        + mediatedDevices: {safe(entry.selector)}{sure}"))
    for selector in a.retire:
        out.append(style.yellow(f"        ~ mediatedDevices: {safe(selector)} marked retiring"))
    for selector in a.unmark if not ensured else ():
        out.append(
            style.yellow(f"        ~ mediatedDevices: {safe(selector)} retiring mark cleared")
        )
    for selector in a.remove:
        out.append(style.red(f"        - mediatedDevices: {safe(selector)}"))
    return out


def _plugin_lines(actions: Sequence[Action], style: Style) -> list[str]:
    """Device-plugin refreshes: which advertised resources change, and to how many devices."""
    out = []
    for a in actions:
        if isinstance(a, DevicePluginRefresh):
            out.append(f"    {style.yellow('~')} {safe(a.target)}: {len(a.devices)} device(s)")
            out.append(style.dim(f"        {safe(a.reason)}"))
    return out


def _drift_lines(plan: Plan, style: Style) -> list[str]:
    out: list[str] = []
    for d in plan.drift:
        out.append(f"    {style.yellow('!')} {safe(d.kind)} {safe(d.target)}")
        out.extend(_change_lines(d.changes, style, "        "))
    return out


def _blocked_lines(blocked: Iterable[Blocked], style: Style) -> dict[str, list[Line]]:
    per_gpu: dict[str, list[Line]] = defaultdict(list)
    for b in blocked:
        a = b.action
        detail = (
            f"  {safe(a.type_name)}"
            if isinstance(a, VgpuRemove | VgpuCreate | VgpuDeviceEnable | VgpuDeviceDisable)
            else f"  {a.mode.value}"
            if isinstance(a, VgpuModeSet)
            else ""
        )
        per_gpu[_gpu_of(a)].append(
            Line(
                style.red("!"), f"{b.kind.value} {safe(b.target)}{detail}", safe(b.reason), _BLOCKED
            )
        )
    return per_gpu


def plan_text(
    plan: Plan,
    *,
    inventory: Inventory | None = None,
    style: Style = PLAIN,
    verbose: bool = False,
) -> str:
    """The plan as a person reads it: per GPU, one line per change with its reason."""
    out: list[str] = []
    sections = gpu_sections(plan, inventory=inventory, style=style)
    cluster = _cluster_lines(plan.actions, style)
    plugins = _plugin_lines(plan.actions, style)
    if sections or cluster or plugins:
        node = style.bold(safe(plan.node))
        out.append(f"vgpuctl will perform the following actions on node {node}:")
    for section in sections:
        out.append("")
        out.append(style.bold(f"  # GPU {section.heading}"))
        for ln in section.lines:
            out.append(f"  {ln.symbol:>3} {ln.title}")
            out.append(style.dim(f"        {ln.reason}"))
    if cluster:
        out.append("")
        out.append(style.bold("  # Cluster objects"))
        out.extend(cluster)
    if plugins:
        out.append("")
        out.append(style.bold("  # Device plugins"))
        out.extend(plugins)
    drift = _drift_lines(plan, style)
    if drift:
        out.append("")
        out.append(style.bold("Changed outside vgpuctl (reset by this plan):"))
        out.extend(drift)
    if verbose and plan.noops:
        out.append("")
        out.append("Unchanged:")
        for n in plan.noops:
            out.append(style.dim(f"    = {safe(n.target)}  {safe(n.reason)}"))
    if plan.notes and out:
        out.append("")
    out.extend(f"Note: {safe_lines(note)}" for note in plan.notes)
    if out:
        out.append("")
    out.append(summary_line(plan))
    return "\n".join(out) + "\n"


def summary_line(plan: Plan) -> str:
    if not plan.has_changes:
        return "No changes. The node matches the desired state."
    s = plan.summary
    return (
        f"Plan: {s.create} to create, {s.change} to change, {s.remove} to remove, "
        f"{s.blocked} blocked."
    )


STATUS_COLUMNS = (
    "NAME",
    "ADDRESS",
    "NODE NAME",
    "ENABLED",
    "UUID",
    "VGPUTYPE",
    "PARENTGPUDEVICE",
    "IN USE BY",
)


def _holder_cell(vgpu: VGPU | None) -> str:
    if vgpu is None or not vgpu.in_use:
        return ""
    if vgpu.removing:
        return "(being removed)"
    if vgpu.holder.startswith(f"{UNKNOWN_HOLDER}:"):
        return "unknown (see note)"
    return vgpu.holder or "unknown"


def status_rows(inventory: Inventory) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for gpu in inventory.gpus:
        for vf in gpu.vfs:
            rows.append(
                (
                    object_name(inventory.node, str(vf.address)),
                    str(vf.address),
                    inventory.node,
                    "true" if vf.vgpu else "false",
                    vf.vgpu.uuid if vf.vgpu else "",
                    vf.vgpu.type_name if vf.vgpu else "",
                    str(gpu.address),
                    _holder_cell(vf.vgpu),
                )
            )
    rows.sort(key=lambda r: r[0])
    return rows


def table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    rows = [[safe(c) for c in r] for r in rows]
    widths = [len(c) for c in columns]
    for r in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, r, strict=True)]
    lines = []
    for r in [tuple(columns), *rows]:
        lines.append("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines) + "\n"


def status_table(inventory: Inventory) -> str:
    """The seed's ``kubectl get vgpudevices`` table, one row per VF, and who holds each vGPU."""
    return table(STATUS_COLUMNS, status_rows(inventory))


def gpu_summary(inventory: Inventory) -> str:
    """One line per GPU, for stderr under the table: its state, and why vgpuctl would leave it
    alone or could not drive it."""
    return "\n".join(gpu_line(g) for g in inventory.gpus)


def gpu_line(g: Gpu) -> str:
    name = safe(g.model or f"{g.vendor_id}:{g.device_id} (not in the catalogue)")
    if g.driver != "nvidia":
        bound = f"bound to {safe(g.driver)}" if g.driver else "bound to no driver"
        return f"GPU {g.address} {name}: {bound}: passed through whole or reserved; left alone"
    if not g.vgpu_vfs:
        return f"GPU {g.address} {name}: SR-IOV without vGPU VFs (sriov_vf_device 0); left alone"
    if not g.sriov_enabled:
        return f"GPU {g.address} {name}: SR-IOV off"
    used = sum(1 for v in g.vfs if v.vgpu)
    held = sum(1 for v in g.vfs if v.vgpu and v.vgpu.in_use)
    interface = {
        Interface.MDEV: "mdev",
        Interface.VFIO: "NVIDIA vendor-specific VFIO",
        Interface.NONE: "no vGPU interface on its VFs",
    }[g.interface]
    in_use = f", {held} in use" if held else ""
    mode = _MODE_WORDS[g.vgpu_mode]
    return (
        f"GPU {g.address} {name}: SR-IOV on, {g.num_vfs} VFs, {interface}, {used} vGPUs"
        f"{in_use}{mode}"
    )


#: What the status line adds for a GPU's vGPU mode (nothing for the default).
_MODE_WORDS = {
    VgpuMode.EQUAL_SIZE: "",
    VgpuMode.MIXED_SIZE: ", mixed-size mode",
    VgpuMode.UNKNOWN: ", vGPU mode unknown",
}


# ---------------------------------------------------------------- a picture of each GPU

#: The bar's width bounds: narrower than the least, no bar (the counts alone); never wider
#: than the most, however wide the terminal.
BAR_MIN, BAR_MAX = 16, 60
HELD = "*"


def _size(mib: int) -> str:
    return f"{mib // 1024} GB" if mib % 1024 == 0 else f"{mib} MiB"


def _label(type_name: str, model_short: str) -> str:
    """``NVIDIA A2-4Q`` → ``4Q`` (what follows the model's part), else the name's last part."""
    tail = type_name.rsplit("-", 1)[-1] if "-" in type_name else type_name
    head = f"{model_short}-"
    return type_name.split(head, 1)[1] if model_short and head in type_name else tail


def size_counts(gpu: Gpu, total_mib: int | None) -> list[tuple[int, int, int]]:
    """(size MiB, vGPUs of that size, how many more of it the GPU can take now) for each size
    the driver offers; "now": equal-size mode takes only the size already there, and never more
    than the framebuffer left, the per-size maximum or the free VFs allow."""
    by_name = {t.name: t for t in gpu.types}
    used: dict[int, int] = {}
    used_mib = 0
    for vf in gpu.vfs:
        if vf.vgpu is None:
            continue
        t = by_name.get(vf.vgpu.type_name)
        if t is None:
            continue  # a type the driver no longer lists: counted nowhere
        used[t.framebuffer_mib] = used.get(t.framebuffer_mib, 0) + 1
        used_mib += t.framebuffer_mib
    free_vfs = sum(1 for vf in gpu.vfs if vf.vgpu is None)
    out = []
    for size in sorted({t.framebuffer_mib for t in gpu.types if t.framebuffer_mib > 0}):
        maximum = max(t.max_instance for t in gpu.types if t.framebuffer_mib == size)
        here = used.get(size, 0)
        if gpu.vgpu_mode is VgpuMode.EQUAL_SIZE and any(s != size for s in used):
            free = 0
        else:
            total = total_mib if total_mib else maximum * size
            free = min((total - used_mib) // size, maximum - here, free_vfs)
        out.append((size, here, max(free, 0)))
    return out


def gpu_picture(
    gpu: Gpu, *, total_mib: int | None, model_short: str, columns: int, style: Style = PLAIN
) -> str:
    """One line: the GPU, its framebuffer as a bar split by vGPU (``4Q`` labels, ``*`` when a
    VM holds it, ``.`` free), and per size the vGPUs there and how many more fit. The bar
    narrows to the terminal's ``columns`` and is left out below :data:`BAR_MIN` characters."""
    name = safe(gpu.model or f"{gpu.vendor_id}:{gpu.device_id}")
    head = f"GPU {gpu.address}  {name}"
    if not gpu.sriov_enabled:
        return f"{head}  SR-IOV off"
    counts = size_counts(gpu, total_mib)
    shown = [c for c in counts if c[1] or c[2]]
    tail = (
        "  ".join(f"{_size(s)}: {n} used, {f} free" for s, n, f in shown)
        if shown
        else "no vGPU can be created"
    )
    total = total_mib or max((t.max_instance * t.framebuffer_mib for t in gpu.types), default=0)
    width = min(BAR_MAX, columns - len(head) - len(tail) - 6)
    if total <= 0 or width < BAR_MIN:
        return f"{head}  {tail}"
    return f"{head}  [{_bar(gpu, total, width, model_short, style)}]  {tail}"


def _bar(gpu: Gpu, total: int, width: int, model_short: str, style: Style) -> str:
    by_name = {t.name: t for t in gpu.types}
    parts: list[str] = []
    used_mib = 0
    start = 0
    for vf in gpu.vfs:
        if vf.vgpu is None or (t := by_name.get(vf.vgpu.type_name)) is None:
            continue
        used_mib += t.framebuffer_mib
        end = min(width, round(width * used_mib / total))
        cells = end - start
        start = end
        if cells <= 0:
            continue
        label = safe(_label(t.name, model_short)) + (HELD if vf.vgpu.in_use else "")
        text = (label[: cells - 1].ljust(cells - 1, "=") + "|") if cells > 1 else label[:1]
        parts.append(style.yellow(text) if vf.vgpu.in_use else style.green(text))
    if start < width:
        parts.append(style.dim("." * (width - start)))
    return "".join(parts)
