"""Turn a schema-checked document into the model's desired-state values.

Third stage of ``desired``: addresses parsed (and so lower-cased), short profile names made long
as the catalogue spells them (``A2-4Q`` → ``NVIDIA A2-4Q``, ``A100-4C`` → ``GRID A100-4C``; a name
it does not know gets ``NVIDIA``), VF keys made a :class:`PciAddress` or an ``int`` index, ``sriov``
a bool, a known ``model:`` spelled as the catalogue names it (``A2`` → ``NVIDIA A2``, the name
observed GPUs carry). Every GPU and entry keeps where it was written. Node groups are normalised
the same way: a group's GPU entry has the fields of a node's GPU, with ``match`` for ``address``
(a model spelled as the catalogue names it, a device ID as four lower-case hex digits).

Parts with schema problems are skipped, not guessed at: their problems are already reported,
and checking a half-understood GPU would only add noise.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import Any

from reconciler.catalog import Catalog, long_profile_name
from reconciler.desired.source import Document, JsonPath, known, line_ref, problem_at, quoted
from reconciler.model import (
    DesiredGpu,
    GpuMatch,
    GroupGpu,
    NodeGroup,
    NodeSelector,
    PciAddress,
    Problem,
    SourceLocation,
    VfKey,
    VgpuMode,
)
from reconciler.model.desired import Rollout
from reconciler.model.record import field, record


@record(frozen=True, slots=True)
class GpuEntry:
    """A normalised GPU (a node's, or a group's GPU entry), with where its fields were written
    (for located semantic problems)."""

    gpu: DesiredGpu | GroupGpu
    #: Where the GPU was written (line 0 in a data document, where ``gpu.location`` is None).
    location: SourceLocation
    #: Where each field's key was written: ``address``, ``model``, ``sriov``, ``vgpus``, …
    fields: Mapping[str, SourceLocation]
    #: Where each ``vgpus``/``profiles`` entry was written (line 0 in a data document, where
    #: ``gpu.entry_locations`` leaves it out).
    locations: Mapping[VfKey | str, SourceLocation]
    #: Each entry's profile name as written (``A2-4Q``), for messages about the name itself.
    written: Mapping[VfKey | str, str]


@record(frozen=True, slots=True)
class NodeEntry:
    name: str
    location: SourceLocation | None
    gpus: tuple[GpuEntry, ...] = ()


@record(frozen=True, slots=True)
class GroupEntry:
    group: NodeGroup
    #: Where the group's name was written.
    location: SourceLocation
    gpus: tuple[GpuEntry, ...] = ()


@record(frozen=True, slots=True)
class FileEntry:
    """What one file says, normalised as far as it is well-formed."""

    file: str
    name: str | None
    nodes: tuple[NodeEntry, ...] = ()
    problems: tuple[Problem, ...] = field(default=())
    groups: tuple[GroupEntry, ...] = ()
    #: ``spec.rollout`` (None: not given), its location where it was written.
    rollout: Rollout | None = None


def normalise(
    document: Document, *, catalog: Catalog, broken: Collection[JsonPath] = ()
) -> FileEntry:
    """Normalise ``document``, skipping nodes and GPUs under a path in ``broken``."""
    problems: list[Problem] = []
    data = document.data if isinstance(document.data, dict) else {}
    metadata = data.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    spec = data.get("spec")
    raw_nodes = spec.get("nodes") if isinstance(spec, dict) else None
    nodes: list[NodeEntry] = []
    for node_name, raw_node in (raw_nodes if isinstance(raw_nodes, dict) else {}).items():
        node_path: JsonPath = ("spec", "nodes", node_name)
        if node_path in broken or not isinstance(raw_node, dict):
            continue
        raw_gpus = raw_node.get("gpus")
        gpus: list[GpuEntry] = []
        for index, raw_gpu in enumerate(raw_gpus if isinstance(raw_gpus, list) else []):
            gpu_path: JsonPath = (*node_path, "gpus", index)
            if not isinstance(raw_gpu, dict) or _touches(gpu_path, broken):
                continue
            entry = _gpu(document, gpu_path, raw_gpu, catalog=catalog, problems=problems)
            if entry is not None:
                gpus.append(entry)
        nodes.append(
            NodeEntry(node_name, known(document.location(node_path, key=True)), tuple(gpus))
        )
    raw_groups = spec.get("nodeGroups") if isinstance(spec, dict) else None
    groups: list[GroupEntry] = []
    for index, raw_group in enumerate(raw_groups if isinstance(raw_groups, list) else []):
        group_path: JsonPath = ("spec", "nodeGroups", index)
        if not isinstance(raw_group, dict) or _touches(group_path, broken):
            continue
        group = _group(document, group_path, raw_group, catalog=catalog, problems=problems)
        if group is not None:
            groups.append(group)
    return FileEntry(
        file=document.file,
        name=name if isinstance(name, str) else None,
        nodes=tuple(nodes),
        problems=tuple(problems),
        groups=tuple(groups),
        rollout=_rollout(document, spec, broken),
    )


def _rollout(document: Document, spec: object, broken: Collection[JsonPath]) -> Rollout | None:
    """``spec.rollout``, as the schema checked it (a field it rejected is not read)."""
    raw = spec.get("rollout") if isinstance(spec, dict) else None
    path: JsonPath = ("spec", "rollout")
    if not isinstance(raw, dict) or _touches(path, broken):
        return None

    def count(key: str) -> int | None:
        value = raw.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    return Rollout(
        max_parallel=count("maxParallel"),
        canary=count("canary"),
        max_failed_nodes=count("maxFailedNodes"),
        location=_where(document.location(path, key=True)),
    )


def _where(location: SourceLocation) -> str:
    return str(location) if location.line else location.file


def _group(
    document: Document,
    path: JsonPath,
    raw: Mapping[str, Any],
    *,
    catalog: Catalog,
    problems: list[Problem],
) -> GroupEntry | None:
    """A schema-checked group (its parts with schema problems were skipped: see ``broken``)."""
    name = str(raw["name"])
    selector = raw["selector"]
    labels = selector.get("labels", {})
    chosen = NodeSelector(
        names=tuple(str(glob) for glob in selector.get("names", ())),
        labels=MappingProxyType({str(k): str(v) for k, v in labels.items()}),
    )
    entries: list[GpuEntry] = []
    for index, raw_gpu in enumerate(raw["gpus"]):
        gpu_path: JsonPath = (*path, "gpus", index)
        entry = _group_gpu(document, gpu_path, raw_gpu, group=name, catalog=catalog)
        if isinstance(entry, Problem):
            problems.append(entry)
        else:
            problems.extend(entry[1])
            entries.append(entry[0])
    location = document.location(path)
    group = NodeGroup(
        name=name,
        selector=chosen,
        gpus=tuple(e.gpu for e in entries if isinstance(e.gpu, GroupGpu)),
        location=known(location),
    )
    return GroupEntry(group, location=location, gpus=tuple(entries))


def _group_gpu(
    document: Document,
    path: JsonPath,
    raw: Mapping[str, Any],
    *,
    group: str,
    catalog: Catalog,
) -> tuple[GpuEntry, list[Problem]] | Problem:
    raw_match = raw["match"]
    match_path = (*path, "match")
    fields = {k: document.location((*path, k), key=True) for k in raw}
    address: PciAddress | None = None
    if "address" in raw_match:
        try:
            address = PciAddress.parse(str(raw_match["address"]))
        except ValueError as exc:
            return problem_at(document.location((*match_path, "address"), key=True), str(exc))
    model: str | None = None
    if "model" in raw_match:
        fields["model"] = document.location((*match_path, "model"), key=True)
        model = _model_name(raw_match["model"], catalog)
    device_id = None
    if "deviceId" in raw_match:
        device_id = str(raw_match["deviceId"]).lower().removeprefix("0x")
    problems: list[Problem] = []
    layout = _layout(document, path, raw, catalog=catalog, problems=problems)
    match = GpuMatch(
        model=model, device_id=device_id, address=address, all=raw_match.get("all") is True
    )
    if address is None:
        # Each GPU a model or device ID matches has VFs of its own addresses: only an index
        # names "the same VF" on all of them.
        for key in layout.vgpus or {}:
            if isinstance(key, PciAddress):
                problems.append(
                    problem_at(
                        layout.locations[key],
                        f"VF {key} is named by its address, but this entry configures every "
                        f"GPU {match}: name its VFs by index (0 for the first VF), or match "
                        "one GPU by its address",
                    )
                )
    gpu = GroupGpu(
        group=group,
        match=match,
        sriov=layout.sriov,
        vgpus=layout.vgpus,
        profiles=layout.profiles,
        mode=layout.mode,
        location=known(document.location(path)),
        entry_locations=layout.known_locations,
    )
    entry = GpuEntry(
        gpu,
        location=document.location(path),
        fields=MappingProxyType(fields),
        locations=MappingProxyType(layout.locations),
        written=MappingProxyType(layout.written),
    )
    return entry, problems


def _model_name(written: object, catalog: Catalog) -> str:
    """A ``model:`` as the catalogue spells it, else as written (spaces made single)."""
    text = " ".join(str(written).split())
    catalogued = catalog.model(text)
    return catalogued.name if catalogued is not None else text


def _touches(path: JsonPath, broken: Collection[JsonPath]) -> bool:
    return any(b[: len(path)] == path for b in broken)


def _gpu(
    document: Document,
    path: JsonPath,
    raw: Mapping[str, Any],
    *,
    catalog: Catalog,
    problems: list[Problem],
) -> GpuEntry | None:
    fields = {k: document.location((*path, k), key=True) for k in raw}
    try:
        address = PciAddress.parse(str(raw["address"]))
    except ValueError as exc:
        # The schema pattern catches malformed addresses first; this keeps the model's own
        # rule (slot ≤ 0x1f) authoritative should the two ever differ.
        problems.append(problem_at(document.location((*path, "address"), key=True), str(exc)))
        return None
    model = _model_name(raw["model"], catalog) if "model" in raw else None
    layout = _layout(document, path, raw, catalog=catalog, problems=problems)
    gpu = DesiredGpu(
        address=address,
        sriov=layout.sriov,
        model=model,
        vgpus=layout.vgpus,
        profiles=layout.profiles,
        location=known(document.location(path)),
        entry_locations=layout.known_locations,
        mode=layout.mode,
    )
    return GpuEntry(
        gpu,
        location=document.location(path),
        fields=MappingProxyType(fields),
        locations=MappingProxyType(layout.locations),
        written=MappingProxyType(layout.written),
    )


@record(frozen=True, slots=True)
class _Layout:
    """What a GPU entry (a node's or a group's) makes of its GPU, with where each part was
    written."""

    sriov: bool
    mode: VgpuMode
    vgpus: Mapping[VfKey, str] | None
    profiles: Mapping[str, int] | None
    #: Where each ``vgpus``/``profiles`` entry was written (line 0 in a data document).
    locations: dict[VfKey | str, SourceLocation]
    written: dict[VfKey | str, str]

    @property
    def known_locations(self) -> Mapping[VfKey | str, SourceLocation]:
        return MappingProxyType({k: v for k, v in self.locations.items() if v.line})


def _layout(
    document: Document,
    path: JsonPath,
    raw: Mapping[str, Any],
    *,
    catalog: Catalog,
    problems: list[Problem],
) -> _Layout:
    sriov = raw["sriov"] == "enabled"
    # The schema admits only the two modes; anything else was reported there.
    mode = VgpuMode.MIXED_SIZE if raw.get("mode") == "mixed-size" else VgpuMode.EQUAL_SIZE
    entry_locations: dict[VfKey | str, SourceLocation] = {}
    written: dict[VfKey | str, str] = {}
    vgpus: dict[VfKey, str] | None = None
    if "vgpus" in raw:
        vgpus = {}
        for key_text, profile in raw["vgpus"].items():
            entry_path = (*path, "vgpus", key_text)
            where = document.location(entry_path, key=True)
            vf: VfKey
            try:
                vf = (
                    int(key_text)
                    if key_text.isascii() and key_text.isdigit()
                    else PciAddress.parse(key_text)
                )
            except ValueError as exc:
                problems.append(problem_at(where, str(exc)))
                continue
            if vf in vgpus:
                # Two spellings of one address (``0000:0A:…`` and ``0000:0a:…``): YAML saw two
                # keys, the host has one VF.
                first = line_ref(entry_locations[vf])
                problems.append(problem_at(where, f"VF {vf} is given twice (first at {first})"))
                continue
            vgpus[vf] = catalog.spelled(profile) or long_profile_name(profile)
            written[vf] = profile
            entry_locations[vf] = where
    profiles: dict[str, int] | None = None
    if "profiles" in raw:
        profiles = {}
        for written_name, count in raw["profiles"].items():
            entry_path = (*path, "profiles", written_name)
            where = document.location(entry_path, key=True)
            long = catalog.spelled(written_name) or long_profile_name(written_name)
            if long in profiles:
                first = line_ref(entry_locations[long])
                problems.append(
                    problem_at(where, f"profile {quoted(long)} is given twice (first at {first})")
                )
                continue
            profiles[long] = int(count)
            written[long] = written_name
            entry_locations[long] = where
    if sriov and vgpus is None and profiles is None:
        # SR-IOV on and nothing named: VFs without vGPUs (the model wants one of the two set).
        vgpus = {}
    return _Layout(
        sriov=sriov,
        mode=mode,
        vgpus=None if vgpus is None else MappingProxyType(vgpus),
        profiles=None if profiles is None else MappingProxyType(profiles),
        locations=entry_locations,
        written=written,
    )
