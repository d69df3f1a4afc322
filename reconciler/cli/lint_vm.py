"""``vgpuctl lint-vm FILE…``: KubeVirt VirtualMachine / VirtualMachineInstance manifests checked
against the vGPU rules before they meet the cluster (docs/domain.md §4, §8).

Per VM (``spec.template.spec.domain.devices.gpus`` of a VirtualMachine,
``spec.domain.devices.gpus`` of a VirtualMachineInstance):

- every ``deviceName`` is a resource on offer: any node's allocatable (``--kubeconfig``), or
  offline the profiles of a desired state (``--desired FILE``);
- several vGPUs in one VM only with profiles whose series the catalogue says may be combined
  (``multiVgpuSeries``; a model where it is not known is a warning, not an error);
- at most one GPU with a display and a ramFB (``virtualGPUOptions.display`` and its ``ramFB``
  are enabled unless set false): a second ramFB is an error. ``--fix`` writes
  ``virtualGPUOptions.display.ramFB.enabled: false`` on every GPU but the first that has one,
  keeping the file's comments, order and quoting (ruamel.yaml's round trip), written
  atomically, one ``file:line:col: fixed: …`` line per change; ``--diff`` prints that change as
  a unified diff instead, writing nothing.

Findings as ``file:line:col: error|warning: …``, sorted by file and position; exit 1 when there
is an error (after ``--fix``, when one is left). A deviceName not on offer while nothing is
says why nothing is: no node, no node with a device plugin's ``nvidia.com/`` resource, or a
desired state naming no profile. Files are untrusted: read as the desired state's files are (a
regular file only, non-blocking, at most 4 MiB; ``cli/files.py``), their nesting bounded before
the recursive loader runs, loaded without any tag a document could use to build an object.
"""

from __future__ import annotations

import argparse
import difflib
import io
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from reconciler.catalog import Catalog, default_catalog, parse_profile_name
from reconciler.cli.options import GlobalOptions
from reconciler.cli.render import safe, safe_lines
from reconciler.model import DesiredGpu, GroupGpu, UsageError
from reconciler.model.cluster import resource_name
from reconciler.model.clusterapi import ClusterApi
from reconciler.model.record import record

EXIT_OK, EXIT_ERRORS = 0, 1
#: The largest manifest read (bytes); a VM manifest is a few kilobytes.
MAX_BYTES = 4 * 1024 * 1024
#: Levels of lists and mappings in a manifest: a VirtualMachine needs about 15 (a ``List`` of
#: them, a pod anti-affinity term's values).
MAX_DEPTH = 64
PREFIX = "nvidia.com/"


@record(frozen=True, slots=True)
class Finding:
    file: str
    line: int  # 1-based
    column: int  # 1-based
    severity: str  # "error" | "warning" | "fixed" (--fix made the change)
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.severity}: {self.message}"


@record(frozen=True, slots=True)
class Offer:
    """The resources on offer, and when there are none, why (said after "offered: nothing")."""

    names: frozenset[str]
    why_none: str = ""

    def __str__(self) -> str:
        if self.names:
            return ", ".join(sorted(self.names))
        return f"nothing: {self.why_none}" if self.why_none else "nothing"


def register(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "lint-vm",
        help="check KubeVirt VM manifests' vGPUs against what is offered and NVIDIA's rules",
        description="Check each VirtualMachine / VirtualMachineInstance: every GPU deviceName "
        "is on offer (the cluster's nodes with --kubeconfig, or a desired state with "
        "--desired), several vGPUs only with profiles that may be combined, at most one GPU "
        "with a display and ramFB. Findings as file:line:col; exit 1 on an error.",
    )
    p.add_argument("files", metavar="FILE", nargs="+", help="VM manifests (YAML, multi-document)")
    p.add_argument(
        "--desired",
        metavar="FILE",
        action="append",
        help="offline: the resources on offer are this desired state's profiles (repeatable)",
    )
    fixing = p.add_mutually_exclusive_group()
    fixing.add_argument(
        "--fix",
        action="store_true",
        help="disable ramFB on every GPU but the first that has one, in place, keeping "
        "comments, order and quoting; a 'fixed' line per change",
    )
    fixing.add_argument(
        "--diff",
        action="store_true",
        help="print what --fix would change as a unified diff on stdout, writing nothing",
    )
    p.set_defaults(handler=cmd_lint_vm)
    return p


def cmd_lint_vm(ns: argparse.Namespace, options: GlobalOptions) -> int:
    from reconciler.cli.host import Host

    catalog = default_catalog()
    offered: Offer | None
    if ns.desired:
        from reconciler.desired import load_desired

        desired = load_desired([Path(p) for p in ns.desired], catalog=catalog)
        layouts: list[DesiredGpu | GroupGpu] = [
            *(gpu for node in desired.nodes.values() for gpu in node.gpus),
            *(gpu for group in desired.groups for gpu in group.gpus),
        ]
        offered = Offer(
            frozenset(
                resource_name(profile)
                for gpu in layouts
                for profile in (*(gpu.vgpus or {}).values(), *(gpu.profiles or {}))
            ),
            f"{', '.join(ns.desired)} names no vGPU profile on any node or node group",
        )
    else:
        api = Host(options).cluster_api
        offered = None if api is None else _offered_by_cluster(api)
        if offered is None:
            raise UsageError(
                "lint-vm needs what is on offer: --kubeconfig (the cluster's nodes) or "
                "--desired FILE"
            )
    findings: list[Finding] = []
    for name in ns.files:
        linted = lint_file(Path(name), offered=offered, catalog=catalog, fix=ns.fix)
        findings += linted.findings
        if ns.fix and linted.fixed is not None:
            _replace(Path(name), linted.fixed)
        if ns.diff:
            # The findings are the file's as it stays (nothing is written); the diff is what
            # --fix would write.
            would = lint_file(Path(name), offered=offered, catalog=catalog, fix=True)
            if would.fixed is not None:
                sys.stdout.write(safe_lines(_diff(name, would.original, would.fixed)))
    # By file and position (stable: two findings at one place keep the order they were found).
    findings.sort(key=lambda f: (f.file, f.line, f.column))
    for f in findings:
        print(safe(str(f)), file=sys.stderr)
    return EXIT_ERRORS if any(f.severity == "error" for f in findings) else EXIT_OK


def _diff(name: str, before: str, after: str) -> str:
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile=name,
        tofile=name,
    )
    # A last line without its newline is marked as diff(1) marks it.
    return "".join(
        line if line.endswith("\n") else f"{line}\n\\ No newline at end of file\n" for line in lines
    )


def _offered_by_cluster(api: ClusterApi) -> Offer:
    names = set()
    nodes = 0
    for node in api.list_objects(group="", version="v1", plural="nodes"):
        nodes += 1
        status = node.get("status") if isinstance(node, Mapping) else None
        for field in ("allocatable", "capacity"):
            values = status.get(field) if isinstance(status, Mapping) else None
            if isinstance(values, Mapping):
                names |= {k for k in values if isinstance(k, str) and k.startswith(PREFIX)}
    if nodes == 0:
        why = "the cluster has no node"
    else:
        why = (
            f"no node of the cluster's {nodes} has an {PREFIX} resource in its allocatable or "
            "capacity (no device plugin registered one: is vgpuctl watch running there, with "
            "vGPUs made?)"
        )
    return Offer(frozenset(names), why)


def _yaml() -> Any:
    from ruamel.yaml import YAML

    y = YAML(typ="rt")
    y.preserve_quotes = True
    # Kubernetes manifests' usual layout (a list's dash two spaces in, its items four), and
    # no line folded: what is not edited is written back as it was.
    y.indent(mapping=2, sequence=4, offset=2)
    y.width = 1 << 16
    return y


@record(frozen=True, slots=True)
class Linted:
    """One file's findings; with ``fix``, its text as read and as fixed (None: no change)."""

    findings: list[Finding]
    original: str = ""
    fixed: str | None = None


def lint_file(path: Path, *, offered: Offer, catalog: Catalog, fix: bool = False) -> Linted:
    """The findings of one file (``fix``: ramFB disabled where it is an error, each change a
    ``fixed`` finding, and the fixed text returned, not written)."""
    from ruamel.yaml.error import YAMLError

    from reconciler.desired.source import read_file

    try:  # a regular file only, never waited on, at most the bound read (cli/files.py)
        data = read_file(path, limit=MAX_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise UsageError(f"{path}: larger than {MAX_BYTES} bytes: not a VM manifest")
    y = _yaml()
    try:
        text = data.decode("utf-8")
        deep = _too_deep(y, text)
        if deep is not None:
            return Linted(
                [Finding(str(path), *deep, "error", f"nested deeper than {MAX_DEPTH} levels")]
            )
        docs = list(y.load_all(text))
    except (YAMLError, UnicodeDecodeError) as exc:
        return Linted([Finding(str(path), 1, 1, "error", f"not YAML: {exc}".splitlines()[0])])
    findings: list[Finding] = []
    changed = False
    for doc in docs:
        for gpus in _vm_gpus(doc):
            found, fixed = _check_vm(path, gpus, offered, catalog, fix=fix)
            findings += found
            changed |= fixed
    if fix and changed:
        out = io.StringIO()
        y.dump_all(docs, out)
        return Linted(findings, text, out.getvalue())
    return Linted(findings, text)


def _too_deep(y: Any, text: str) -> tuple[int, int] | None:
    """Where (line, column) ``text`` first nests a list or mapping deeper than
    :data:`MAX_DEPTH` levels: ruamel.yaml's composer and representer recurse once per level,
    so the bound is checked on the parser's events before they run (libyaml's, fast; where it
    refuses the text, ruamel.yaml's own, which may read it)."""
    import yaml

    from reconciler.desired.compose import events, too_deep

    try:
        return too_deep(events(text), MAX_DEPTH)
    except yaml.YAMLError:
        return too_deep(y.parse(text), MAX_DEPTH)


def _replace(path: Path, text: str) -> None:
    """Write ``text`` over ``path`` atomically (:func:`files.replace_file`: a new file beside
    it, renamed over it; a link at ``path`` is replaced, not followed)."""
    from reconciler.cli.files import replace_file

    try:
        replace_file(path, text)
    except OSError as exc:
        raise UsageError(f"{path}: cannot write the fix: {exc.strerror or exc}") from None


def _vm_gpus(doc: Any) -> Iterator[list[Any]]:
    api_version = doc.get("apiVersion") if isinstance(doc, Mapping) else None
    if not isinstance(api_version, str) or api_version.split("/")[0] != "kubevirt.io":
        return
    spec = doc.get("spec")
    if doc.get("kind") == "VirtualMachine" and isinstance(spec, Mapping):
        template = spec.get("template")
        spec = template.get("spec") if isinstance(template, Mapping) else None
    elif doc.get("kind") != "VirtualMachineInstance":
        return
    domain = spec.get("domain") if isinstance(spec, Mapping) else None
    devices = domain.get("devices") if isinstance(domain, Mapping) else None
    gpus = devices.get("gpus") if isinstance(devices, Mapping) else None
    if isinstance(gpus, list) and gpus:
        yield gpus


def _at(node: Any, key: str | None = None) -> tuple[int, int]:
    """1-based line and column of ``node`` (or of ``key``'s value in it) in its file."""
    lc = getattr(node, "lc", None)
    if lc is None:
        return 1, 1
    if key is not None and isinstance(node, Mapping) and key in node:
        line, col = lc.value(key)
        return line + 1, col + 1
    return lc.line + 1, lc.col + 1


def _enabled(options: Any, *path: str) -> bool:
    """Whether ``enabled`` at ``path`` under ``options`` is not set false (the default: on)."""
    node = options
    for key in path:
        if not isinstance(node, Mapping):
            return True
        node = node.get(key)
    if not isinstance(node, Mapping):
        return True
    return node.get("enabled") is not False


def _check_vm(
    path: Path, gpus: list[Any], offered: Offer, catalog: Catalog, *, fix: bool
) -> tuple[list[Finding], bool]:
    findings: list[Finding] = []
    file = str(path)
    profiles = []
    with_ramfb = 0
    fixed = False
    for gpu in gpus:
        if not isinstance(gpu, Mapping):
            continue
        device = gpu.get("deviceName")
        line, col = _at(gpu, "deviceName")
        if not isinstance(device, str) or not device:
            findings.append(Finding(file, line, col, "error", "a GPU without a deviceName"))
            continue
        if device not in offered.names:
            findings.append(Finding(file, line, col, "error",
                                    f"{device} is not on offer (offered: {offered})"))  # fmt: skip
        profiles.append((device, line, col))
        options = gpu.get("virtualGPUOptions")
        if _enabled(options, "display") and _enabled(options, "display", "ramFB"):
            with_ramfb += 1
            if with_ramfb > 1:
                gl, gc = _at(gpu)
                if fix:
                    _disable_ramfb(gpu)
                    fixed = True
                    findings.append(Finding(
                        file, gl, gc, "fixed",
                        f"GPU {gpu.get('name', '?')!s}: set virtualGPUOptions.display.ramFB"
                        ".enabled: false (an earlier GPU of this VM has a display with ramFB)",
                    ))  # fmt: skip
                else:
                    findings.append(Finding(
                        file, gl, gc, "error",
                        f"GPU {gpu.get('name', '?')!s} has a display with ramFB, as an earlier "
                        "GPU of this VM has: only one may (set virtualGPUOptions.display.ramFB"
                        ".enabled: false, or run with --fix)",
                    ))  # fmt: skip
    if len(profiles) > 1:
        for device, line, col in profiles:
            why = _multi_vgpu(device, catalog)
            if why is not None:
                severity, message = why
                findings.append(Finding(file, line, col, severity, message))
    return findings, fixed


def _multi_vgpu(device: str, catalog: Catalog) -> tuple[str, str] | None:
    """Why ``device`` may not be one of several vGPUs of a VM (None: it may)."""
    profile = device.removeprefix(PREFIX).replace("_", " ")
    parsed = parse_profile_name(profile)
    model = catalog.model(parsed.gpu) if parsed else None
    if parsed is None or model is None:
        return ("warning", f"{device}: not a profile of the catalogue: whether several may "
                           "share a VM is not known")  # fmt: skip
    if model.multi_vgpu_series is None:
        return ("warning", f"{device}: whether {model.name} allows several vGPUs per VM is "
                           "not known to the catalogue")  # fmt: skip
    if parsed.series not in model.multi_vgpu_series:
        allowed = "/".join(model.multi_vgpu_series) or "none"
        return ("error", f"{device}: {model.name} allows several vGPUs in one VM only for "
                         f"series {allowed}, not {parsed.series}")  # fmt: skip
    return None


def _disable_ramfb(gpu: Any) -> None:
    from ruamel.yaml.comments import CommentedMap

    options = gpu.get("virtualGPUOptions")
    if not isinstance(options, Mapping):
        options = gpu["virtualGPUOptions"] = CommentedMap()
    display = options.get("display")
    if not isinstance(display, Mapping):
        display = options["display"] = CommentedMap()
    ramfb = display.get("ramFB")
    if not isinstance(ramfb, Mapping):
        ramfb = display["ramFB"] = CommentedMap()
    ramfb["enabled"] = False
