"""A way in from NVIDIA's vgpu-device-manager: its named vGPU configs as vgpuctl node groups.

``vgpuctl import vgpu-device-manager CONFIG.yaml`` reads the file the GPU Operator's
vgpu-device-manager applies (github.com/NVIDIA/vgpu-device-manager, read at commit acb7270)
and writes a desired state. What that file means, from its Go source:

- ``api/spec/v1/spec.go`` ``Spec.UnmarshalJSON``: the document has ``version: v1`` and a
  non-empty map ``vgpu-configs`` of named configs; any other field is an error.
  ``VGPUConfigSpec.UnmarshalJSON``: each config is a non-empty list of entries with the
  required ``devices`` (the string ``all`` or a list of integers) and ``vgpu-devices`` (vGPU
  type → count), and an optional ``device-filter`` (a string or a list of strings).
- ``pkg/types/vgpu_config.go`` ``VGPUConfig.AssertValid``: every type name parses
  (``pkg/types/vgpu_type.go`` ``ParseVGPUType``: ``A2-4Q``, MIG-backed ``A100-1-5CME``),
  every count is at least 1, time-sliced and MIG-backed types are not mixed; an empty map
  is valid (the GPU keeps no vGPU: ``pkg/vgpu/config.go`` ``SetVGPUConfig`` clears it first).
- ``pkg/types/device.go`` ``NewDeviceIDFromString``: a filter is ``0x<device><vendor>``
  (``0x25B610DE``: device 25b6 of vendor 10de), optionally ``:0x<subdevice><subvendor>``;
  ``DeviceID.Matches``: with a subsystem part all four ids must be equal.
- ``api/spec/v1/helpers.go`` ``MatchesDeviceFilter`` (any filter of the list, none: every
  GPU), ``MatchesDevices`` (``all``, or the GPU's index in the list).
- ``cmd/nvidia-vgpu-dm/assert/assert.go`` ``WalkSelectedVGPUConfigForEachGPU``: each entry in
  order is applied to every GPU both match; a GPU's index is its place among the node's
  NVIDIA GPU physical functions in PCI address order (go-nvlib ``nvpci.GetGPUs``, sorted by
  ``GetAllDevices``). So the last entry that matches a GPU wins.
- ``cmd/nvidia-k8s-vgpu-dm/main.go``: a node gets the config its label
  ``nvidia.com/vgpu.config`` names, and ``DEFAULT_VGPU_CONFIG`` (``default`` in the examples)
  when it has no such label.
- go-nvlib ``pkg/nvmdev/nvmdev.go`` ``parseMdevTypeName``: a type's name there is the last
  word of the driver's name (``NVIDIA A2-4Q`` → ``A2-4Q``).

What each becomes (:func:`convert`):

- a config → a node group selecting the label ``nvidia.com/vgpu.config: <config name>``,
  named as the config where that is a valid group name, else lower-cased with other
  characters made ``-`` (and ``-2``, ``-3`` … where two would meet); each rename is reported.
  A config name no label value can be is refused (no node could select it).
- an entry → a GPU entry with ``sriov: enabled`` and the counts as ``profiles`` (long names:
  the catalogue's spelling, else ``NVIDIA <name>``); ``devices: all`` without a filter →
  ``match: {all: true}``; a filter ``0xDDDD10DE`` → ``match: {deviceId: dddd}``, or
  ``match: {model: …}`` where the catalogue knows several models of that device ID (A2 and
  A16 share 25b6) and the entry's profiles name one of them; with a subsystem part, the model
  the catalogue names for all four ids. GPU indices become addresses where the command line
  maps them (``--gpu-address 0=0000:08:00.0``): vgpuctl matches GPUs by model, device ID or
  address, and the address of "GPU 0" is the node's to say.
- what cannot be said is refused, entry by entry, with the reason; an entry that a later
  entry of its config replaces on the same GPUs (the last one wins there) is dropped and said.

Untrusted input: the file is read as a desired-state file is (``desired/source.py``: at most
1 MiB, bounded YAML, positions kept), and every problem names ``file:line:col``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from reconciler.catalog import Catalog, long_profile_name, parse_profile_name
from reconciler.desired.source import Document, JsonPath, problem_at, quoted
from reconciler.model import PciAddress, Problem, ValidationError
from reconciler.model.record import record

#: The node label vgpu-device-manager reads (cmd/nvidia-k8s-vgpu-dm/main.go vGPUConfigLabel).
CONFIG_LABEL = "nvidia.com/vgpu.config"
#: The config the examples' DaemonSet applies to a node without the label (DEFAULT_VGPU_CONFIG).
DEFAULT_CONFIG = "default"
#: At most this many groups in one desired-state file (schemas/desired-state.schema.json).
GROUPS_PER_FILE = 256
#: More configs than any real file has (the example has 711): a bound on the work.
MAX_CONFIGS = 10_000
MAX_ENTRIES = 1_000
MAX_PROFILES = 256
MAX_FILTERS = 64
#: At most this many GPU entries in one node group (the schema's ``gpus`` maxItems).
GPUS_PER_GROUP = 256

NAME_PATTERN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
#: ``ParseVGPUType``'s two shapes (pkg/types/vgpu_type.go timeSlicedRegex, migBackedRegex).
_TIME_SLICED = re.compile(r"^[A-Z0-9]+(-([a-zA-Z]+))*-(0|[1-9][0-9]*)[ABCQ]$")
_MIG_BACKED = re.compile(r"^[A-Z0-9]+-[1-9]-(0|[1-9][0-9]*)[ABCQ](ME|NOME|MEALL|GFX)?$")
#: A filter's part as ``NewDeviceIDFromString`` reads it (``strconv.ParseUint(s, 0, 32)``): the
#: hexadecimal form every example writes; a decimal one is refused as unclear.
_HEX = re.compile(r"^0[xX][0-9a-fA-F]{1,8}$")
NVIDIA = "10de"


@record(frozen=True, slots=True)
class Conversion:
    """What :func:`convert` made: the node groups (as desired-state data, in the source's
    order) and the report: each rename, each refusal with its reason, each note."""

    groups: tuple[dict[str, Any], ...]
    renames: tuple[str, ...]
    refusals: tuple[str, ...]
    notes: tuple[str, ...]

    def documents(self, name: str) -> list[dict[str, Any]]:
        """The desired-state documents: one per :data:`GROUPS_PER_FILE` groups."""
        chunks = [
            list(self.groups[i : i + GROUPS_PER_FILE])
            for i in range(0, len(self.groups), GROUPS_PER_FILE)
        ] or [[]]
        return [
            {
                "apiVersion": "vgpu.reconciler.dev/v1alpha1",
                "kind": "VGPUDesiredState",
                "metadata": {"name": name},
                "spec": {"nodeGroups": chunk},
            }
            for chunk in chunks
        ]


def convert(
    document: Document,
    *,
    catalog: Catalog,
    gpu_addresses: Mapping[int, PciAddress] | None = None,
    only: Sequence[str] = (),
) -> Conversion:
    """``document`` (a vgpu-device-manager config file, parsed) as node groups.

    ``gpu_addresses``: GPU index → the PF address the labelled nodes have there;
    ``only``: the configs to convert (all when empty). Raises :class:`ValidationError`
    naming ``file:line:col`` for anything the file itself gets wrong (vgpu-device-manager
    would refuse it too)."""
    configs = _configs(document)
    missing = [name for name in only if name not in configs]
    if missing:
        raise ValidationError(
            f"{document.file}: no config named {', '.join(quoted(m) for m in missing)}",
            [Problem(f"no config named {quoted(m)}", file=document.file) for m in missing],
        )
    converter = _Converter(document, catalog, dict(gpu_addresses or {}))
    for name, entries in configs.items():
        if not only or name in only:
            converter.config(name, entries)
    if converter.problems:
        raise ValidationError(
            f"{document.file} is not a valid vgpu-device-manager config", converter.problems
        )
    return Conversion(
        groups=tuple(converter.groups),
        renames=tuple(converter.renames),
        refusals=tuple(converter.refusals),
        notes=tuple(converter.notes()),
    )


def _configs(document: Document) -> dict[str, list[Any]]:
    data = document.data

    def fail(path: JsonPath, message: str, *, key: bool = False) -> ValidationError:
        return ValidationError(message, [problem_at(document.location(path, key=key), message)])

    if not isinstance(data, dict):
        raise fail((), "expected a mapping with 'version: v1' and 'vgpu-configs'")
    if data.get("kind") == "ConfigMap":
        raise fail(
            ("kind",),
            "a ConfigMap, not the config it holds: take its config.yaml out first, as "
            "kubectl get configmap NAME -o jsonpath='{.data.config\\.yaml}' > config.yaml",
        )
    for key in data:
        if key not in ("version", "vgpu-configs"):
            raise fail((key,), f"unexpected field {quoted(key)} (spec.go Spec)", key=True)
    if data.get("version") != "v1":
        raise fail(
            ("version",), "'version' must be v1 (the only version vgpu-device-manager reads)"
        )
    configs = data.get("vgpu-configs")
    if not isinstance(configs, dict) or not configs:
        raise fail(("vgpu-configs",), "'vgpu-configs' must be a mapping of at least one config")
    if len(configs) > MAX_CONFIGS:
        raise fail(("vgpu-configs",), f"more than {MAX_CONFIGS:,} configs")
    for name, entries in configs.items():
        if not isinstance(entries, list) or not entries:
            raise fail(
                ("vgpu-configs", name), f"config {quoted(name)}: a list of entries is required"
            )
        if len(entries) > MAX_ENTRIES:
            raise fail(
                ("vgpu-configs", name), f"config {quoted(name)}: more than {MAX_ENTRIES} entries"
            )
    return configs


@record(frozen=True, slots=True)
class _Entry:
    """One converted entry: its match, its layout and where it was written."""

    match: tuple[tuple[str, object], ...]
    profiles: tuple[tuple[str, int], ...]
    models: frozenset[str]  # the GPU part of its profile names (A2-8Q → A2)
    line: int


def _shown(match: tuple[tuple[str, object], ...]) -> str:
    return ", ".join(f"{key} {value}" for key, value in match)


class _Converter:
    def __init__(
        self, document: Document, catalog: Catalog, addresses: dict[int, PciAddress]
    ) -> None:
        self.document = document
        self.catalog = catalog
        self.addresses = addresses
        self.groups: list[dict[str, Any]] = []
        self.renames: list[str] = []
        self.refusals: list[str] = []
        self.problems: list[Problem] = []
        self.uncatalogued: dict[str, None] = {}
        self.used: set[str] = set()
        self.had_default = False
        self.dropped: list[str] = []

    def at(self, path: JsonPath, *, key: bool = False) -> str:
        location = self.document.location(path, key=key)
        return (
            f"{location.file}:{location.line}:{location.column}" if location.line else location.file
        )

    def refuse(self, path: JsonPath, message: str) -> None:
        self.refusals.append(f"{self.at(path)}: refused: {message}")

    def config(self, name: str, entries: list[Any]) -> None:
        path: JsonPath = ("vgpu-configs", name)
        # An empty value is the same to vgpu-device-manager as no label (its default config).
        if not name or not _LABEL_VALUE.match(name):
            self.refuse(
                path,
                f"config {quoted(name)}: no node can select it, as the label {CONFIG_LABEL}'s "
                "value must be at most 63 letters, digits, '-', '_' and '.', beginning and "
                "ending with a letter or digit",
            )
            return
        converted: list[_Entry] = []
        for index, raw in enumerate(entries):
            converted.extend(self.entry((*path, index), raw))
        if len(converted) > GPUS_PER_GROUP:
            self.refuse(
                path,
                f"config {quoted(name)}: {len(converted)} GPU entries (one per entry, device "
                f"filter and GPU index) are more than a node group holds ({GPUS_PER_GROUP})",
            )
            return
        kept = self.overlapping(path, self.last_wins(path, converted))
        if not kept:
            self.refuse(path, f"config {quoted(name)}: no entry of it could be converted")
            return
        group = self.group_name(name)
        if group != name:
            self.renames.append(
                f"{self.at(path, key=True)}: config {quoted(name)} is node group "
                f"{quoted(group)} (group names are lower-case letters, digits, '-' and '.')"
            )
        if name == DEFAULT_CONFIG:
            self.had_default = True
        self.groups.append(
            {
                "name": group,
                "selector": {"labels": {CONFIG_LABEL: name}},
                "gpus": [
                    {"match": dict(e.match), "sriov": "enabled"}
                    | ({"profiles": dict(e.profiles)} if e.profiles else {})
                    for e in kept
                ],
            }
        )

    def group_name(self, name: str) -> str:
        candidate = name
        if not NAME_PATTERN.match(candidate):
            candidate = re.sub(r"[^a-z0-9.-]+", "-", name.lower())
            candidate = re.sub(r"-{2,}", "-", candidate).strip("-.") or "config"
        base, n = candidate, 1
        while candidate in self.used:
            n += 1
            candidate = f"{base}-{n}"
        self.used.add(candidate)
        return candidate

    def entry(self, path: JsonPath, raw: object) -> list[_Entry]:
        """The entry as one GPU entry per device filter (none: refused or a problem)."""
        if not isinstance(raw, dict):
            self.problem(path, "an entry is a mapping with 'devices' and 'vgpu-devices'")
            return []
        for key in raw:
            if key not in ("device-filter", "devices", "vgpu-devices"):
                self.problem(
                    (*path, key),
                    f"unexpected field {quoted(key)} (spec.go VGPUConfigSpec)",
                    key=True,
                )
                return []
        for required in ("devices", "vgpu-devices"):
            if required not in raw:
                self.problem(path, f"missing required field {quoted(required)}")
                return []
        profiles = self.profiles((*path, "vgpu-devices"), raw["vgpu-devices"])
        if profiles is None:
            return []
        models = frozenset(
            parsed.gpu
            for parsed in (parse_profile_name(long_profile_name(p)) for p in raw["vgpu-devices"])
            if parsed is not None
        )
        devices = raw["devices"]
        indices: list[int] | None = None
        if devices == "all":
            pass
        elif isinstance(devices, list) and all(
            isinstance(i, int) and not isinstance(i, bool) for i in devices
        ):
            indices = list(dict.fromkeys(devices))
        else:
            self.problem((*path, "devices"), "'devices' is 'all' or a list of GPU indices")
            return []
        filters = self.filters((*path, "device-filter"), raw.get("device-filter"))
        if filters is None:
            return []
        matches: list[dict[str, object]] = []
        for filter_path, text in filters:
            match = self.filter_match(filter_path, text, models)
            if match is None:
                return []
            matches.append(match)
        if not filters:
            matches = [{}]
        if indices is not None:
            if not indices:
                self.refuse((*path, "devices"), "'devices: []' selects no GPU: nothing to convert")
                return []
            unmapped = [i for i in indices if i not in self.addresses]
            if unmapped:
                self.refuse(
                    (*path, "devices"),
                    f"GPU index{'es' * (len(unmapped) > 1)} {', '.join(map(str, unmapped))}: "
                    "vgpu-device-manager counts a node's NVIDIA GPUs in PCI address order, and "
                    "vgpuctl matches a GPU by model, device ID or address; give "
                    "--gpu-address INDEX=ADDRESS when the nodes with this config have their "
                    "GPUs at the same addresses",
                )
                return []
            matches = [m | {"address": str(self.addresses[i])} for m in matches for i in indices]
        line = self.document.location(path).line
        return [
            _Entry(
                match=tuple((m or {"all": True}).items()),
                profiles=profiles,
                models=models,
                line=line,
            )
            for m in matches
        ]

    def profiles(self, path: JsonPath, raw: object) -> tuple[tuple[str, int], ...] | None:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            self.problem(path, "'vgpu-devices' is a mapping of vGPU type to count")
            return None
        if len(raw) > MAX_PROFILES:
            self.problem(path, f"more than {MAX_PROFILES} vGPU types")
            return None
        out: list[tuple[str, int]] = []
        mig: set[bool] = set()
        for name, count in raw.items():
            where = (*path, name)
            mig_backed = bool(_MIG_BACKED.match(name))
            if not (mig_backed or _TIME_SLICED.match(name)):
                self.problem(
                    where,
                    f"invalid vGPU type {quoted(name)} (vgpu_type.go ParseVGPUType)",
                    key=True,
                )
                return None
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                self.problem(
                    where, f"{quoted(name)}: the count must be a whole number of at least 1"
                )
                return None
            mig.add(mig_backed)
            long = self.catalog.spelled(name)
            if long is None:
                long = long_profile_name(name)
                self.uncatalogued[name] = None
            out.append((long, count))
        if len(mig) > 1:
            self.problem(path, "time-sliced and MIG-backed vGPU types cannot be mixed on one GPU")
            return None
        return tuple(out)

    def filters(self, path: JsonPath, raw: object) -> list[tuple[JsonPath, str]] | None:
        if raw is None or raw in ("", []):  # MatchesDeviceFilter: none, every GPU
            return []
        if isinstance(raw, str):
            return [(path, raw)]
        if isinstance(raw, list) and raw and all(isinstance(f, str) for f in raw):
            if len(raw) > MAX_FILTERS:
                self.problem(path, f"more than {MAX_FILTERS} device filters")
                return None
            return [((*path, i), f) for i, f in enumerate(raw)]
        self.problem(path, "'device-filter' is a device ID or a list of them")
        return None

    def filter_match(
        self, path: JsonPath, text: str, models: frozenset[str]
    ) -> dict[str, object] | None:
        """What a filter becomes; None: refused (said) or a problem (said)."""
        parts = text.split(":")
        if len(parts) > 2 or not all(_HEX.match(p) for p in parts):
            self.problem(
                path,
                f"device filter {quoted(text)} is not 0x<device><vendor> or "
                "0x<device><vendor>:0x<subdevice><subvendor> (device.go NewDeviceIDFromString)",
            )
            return None
        raw_id = int(parts[0], 16)
        device, vendor = f"{raw_id >> 16:04x}", f"{raw_id & 0xFFFF:04x}"
        if vendor != NVIDIA:
            self.refuse(
                path, f"device filter {quoted(text)} names vendor {vendor}, not NVIDIA (10de)"
            )
            return None
        sharing = {m.name: m for m in self.catalog.models for i in m.pci_ids if i.device == device}
        if len(parts) == 2:
            sub = int(parts[1], 16)
            sub_device, sub_vendor = f"{sub >> 16:04x}", f"{sub & 0xFFFF:04x}"
            named = [
                m
                for m in sharing.values()
                for i in m.pci_ids
                if (i.subsystem_vendor, i.subsystem_device) == (sub_vendor, sub_device)
            ]
            if not named:
                self.refuse(
                    path,
                    f"device filter {quoted(text)}: vgpuctl matches a GPU by model, device ID "
                    f"or address, not by subsystem ID, and the catalogue names no model for "
                    f"{NVIDIA}:{device} subsystem {sub_vendor}:{sub_device}",
                )
                return None
            return {"model": named[0].name}
        if len(sharing) > 1:
            meant = [m for m in sharing.values() if m.short in models]
            if len(meant) != 1:
                self.refuse(
                    path,
                    f"device ID {device} is shared by {' and '.join(sorted(sharing))}, and the "
                    "entry's vGPU types do not say which one it means",
                )
                return None
            return {"model": meant[0].name}
        return {"deviceId": device}

    def last_wins(self, path: JsonPath, entries: list[_Entry]) -> list[_Entry]:
        """``entries`` without those a later entry with the same match replaces (the last
        applied wins in vgpu-device-manager); entries of one match whose types name two GPU
        models the match cannot tell apart are refused (each would fail on the other's GPU)."""
        by_match: dict[tuple[tuple[str, object], ...], list[_Entry]] = {}
        for e in entries:
            by_match.setdefault(e.match, []).append(e)
        kept: list[_Entry] = []
        for e in entries:
            same = by_match[e.match]
            if len({frozenset(s.models) for s in same}) > 1:
                if e is same[0]:
                    lines = " and ".join(
                        f"line {s.line} ({'/'.join(sorted(s.models))})" for s in same
                    )
                    self.refuse(
                        path,
                        f"the entries at {lines} match the same GPUs ({_shown(e.match)}) and "
                        "name different GPU models (the same device ID, told apart by subsystem "
                        "IDs vgpuctl's catalogue does not know): a vgpuctl match cannot tell "
                        "them apart; map them by address with --gpu-address",
                    )
                continue
            if e is not same[-1]:
                self.dropped.append(
                    f"{self.at(path)}: the entry at line {e.line} is dropped: the entry at "
                    f"line {same[-1].line} matches the same GPUs and, applied after it, wins"
                )
                continue
            kept.append(e)
        return kept

    def overlapping(self, path: JsonPath, entries: list[_Entry]) -> list[_Entry]:
        """``entries`` without the pairs that may both match one GPU (``devices: all`` and
        ``devices: [1]``; a device ID and a model of it) and give it different layouts:
        vgpu-device-manager gives that GPU the later one and the others the earlier, and a
        node group cannot say "all but": both are refused, and their GPUs left alone."""
        refused: set[int] = set()
        for i, first in enumerate(entries):
            for later in entries[i + 1 :]:
                if first.profiles == later.profiles or not self.may_meet(first, later):
                    continue
                refused.update((id(first), id(later)))
                self.refuse(
                    path,
                    f"the entries at line {first.line} and line {later.line} may both match "
                    "one GPU and give it different layouts: vgpu-device-manager gives it the "
                    "later one, and a node group cannot match 'all GPUs but these'; split "
                    "them by device ID or GPU index (--gpu-address)",
                )
        return [e for e in entries if id(e) not in refused]

    def may_meet(self, a: _Entry, b: _Entry) -> bool:
        """Whether some GPU may satisfy both matches."""
        first, second = dict(a.match), dict(b.match)
        for key in ("address", "deviceId", "model"):
            if key in first and key in second and first[key] != second[key]:
                return False
        for one, other in ((first, second), (second, first)):
            if "model" in one and "deviceId" in other:
                model = self.catalog.model(str(one["model"]))
                if model is None or all(i.device != other["deviceId"] for i in model.pci_ids):
                    return False
        return True

    def problem(self, path: JsonPath, message: str, *, key: bool = False) -> None:
        self.problems.append(problem_at(self.document.location(path, key=key), message))

    def notes(self) -> list[str]:
        out = list(self.dropped)
        if self.had_default:
            out.append(
                f"vgpu-device-manager gives the config '{DEFAULT_CONFIG}' to nodes without the "
                f"label {CONFIG_LABEL} (its DEFAULT_VGPU_CONFIG); a node group selects by the "
                f"label's value only: label those nodes {CONFIG_LABEL}={DEFAULT_CONFIG}"
            )
        if self.uncatalogued:
            names = list(self.uncatalogued)
            shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
            out.append(
                f"{len(names)} vGPU type{'s' * (len(names) != 1)} the catalogue does not know "
                f"{'are' if len(names) != 1 else 'is'} written 'NVIDIA <type>' ({shown}); "
                "vgpu-device-manager names a type by the last word of the driver's name, so "
                "where the driver's name has more words (NVIDIA RTX Pro 6000 Blackwell DC-48C) "
                "write it whole"
            )
        return out
