"""Offline semantic checks of one desired GPU: what can be known without a host.

Fourth stage of ``desired`` (``vgpuctl validate`` runs it in CI). What the file says of itself
is checked here (``vgpus`` xor ``profiles``, one GPU model per GPU, names a driver could print);
the NVIDIA driver's placement rules are :mod:`reconciler.rules`', judged against the catalogue's
offer for the GPU's model (from ``model:`` or from the profile names), with the sentences the
planner uses against the driver's own offer. A GPU the catalogue does not know is judged by its
profile names alone (equal size, MIG-backed next to time-sliced): the planner checks the rest
against what the host reports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import cache, lru_cache, partial

from reconciler.catalog import Catalog, GpuModel, ParsedProfileName, parse_profile_name
from reconciler.desired.ascii_names import non_ascii
from reconciler.desired.normalise import GpuEntry
from reconciler.desired.shape import did_you_mean
from reconciler.desired.source import line_ref, problem_at, quoted
from reconciler.model import (
    DesiredGpu,
    GpuRef,
    GroupGpu,
    PciAddress,
    Problem,
    SourceLocation,
    VfKey,
    VgpuMode,
)
from reconciler.model.record import record
from reconciler.rules import (
    Offer,
    OfferedType,
    Request,
    index_out_of_range,
    named_twice,
    violations,
)

#: Why a name with a character outside ASCII is refused (see ``ascii_names``).
_NOT_ASCII = "has a character NVIDIA's names never have (they are printable ASCII)"

#: ``report(location, message)``: records one problem (at the GPU when the location is unknown).
_Report = Callable[[SourceLocation | None, str], None]
#: ``accept(location, what, hint)``: records a name the catalogue cannot vouch for, with what
#: can be said about it (computed only if a note shows it).
_Accept = Callable[[SourceLocation | None, str, "Hint"], None]


@record(frozen=True, slots=True)
class _Entry:
    """One ``vgpus`` entry (count 1) or ``profiles`` entry, in the order written."""

    key: VfKey | str
    profile: str
    count: int
    location: SourceLocation


@record(frozen=True, slots=True)
class _Named:
    """An entry whose profile name parses: what the name alone says."""

    entry: _Entry
    name: ParsedProfileName

    @property
    def location(self) -> SourceLocation:
        return self.entry.location

    @property
    def profile(self) -> str:
        return self.entry.profile


@record(frozen=True, slots=True)
class Hint:
    """What can be said about a name the catalogue does not know, worked out only when shown:
    a "did you mean" searches the whole catalogue, and a file can hold tens of thousands of
    such names."""

    #: The name as written, to look for a close one among ``candidates``.
    word: str = ""
    candidates: Callable[[], list[str]] | None = None
    #: The model the name was checked against: its profiles are listed instead.
    model: GpuModel | None = None

    @property
    def key(self) -> tuple[str, str]:
        """What the hint depends on: equal keys say the same thing."""
        return (self.word, self.model.name if self.model else "")

    def __str__(self) -> str:
        if self.model is not None:
            return f"{self.model.name} is listed with {_offer(self.model)}"
        if self.candidates is None:
            return ""
        suggestion = did_you_mean(self.word, self.candidates())
        return f"did you mean '{suggestion}'?" if suggestion else ""


@record(frozen=True, slots=True)
class Unchecked:
    """A name the catalogue does not know, accepted as written: the host decides at plan time
    (a note), unless it is written for a model whose every profile the catalogue lists and the
    check is strict (:func:`unknown_profile`)."""

    what: str  # "'NVIDIA RTX 5880 Ada-48C'", "model 'NVIDIA RTX 5880 Ada'"
    location: SourceLocation
    hint: Hint = Hint()  # "did you mean 'NVIDIA A2-4Q'?"
    #: The model the name is written for when the catalogue lists all of its profiles
    #: (``GpuModel.profiles_complete``): the name is none of them.
    listed_in_full: GpuModel | None = None
    #: The name as read (vendor prefix added), to suggest a close one of that model's.
    name: str = ""


def unknown_profile(u: Unchecked, model: GpuModel) -> Problem:
    """The problem a strict check (``vgpuctl validate`` without ``--lenient``) makes of a name
    outside a model's whole list: a typo, most likely, which the host would refuse at plan
    time; a driver newer than the catalogue may still add names, hence ``--lenient``.
    ``model``: ``u.listed_in_full``."""
    parsed = parse_profile_name(u.name) if u.name else None
    sizes = sorted(
        {
            p.framebuffer_mib // 1024
            for p in model.time_sliced_profiles
            if parsed and p.series == parsed.series
        }
    )
    if parsed is not None and not parsed.suffix and not parsed.mig_slices and sizes:
        # A well-formed name of a size the model does not have (``A2-3Q``): no near miss to
        # suggest, the sizes it has are the answer.
        listed = ", ".join(f"{size}" for size in sizes[:-1]) + f" and {sizes[-1]}"
        listed = listed if len(sizes) > 1 else f"{sizes[0]}"
        tail = f"its {parsed.series} profiles are of {listed} GB"
    else:
        suggestion = did_you_mean(u.name, [p.name for p in model.profiles]) if u.name else None
        tail = f"did you mean '{suggestion}'?" if suggestion else f"its profiles: {_offer(model)}"
    return problem_at(
        u.location,
        f"unknown profile {u.what}: not one of {model.name}'s, which the catalogue lists in "
        f"full; {tail} (--lenient accepts a name a newer driver adds)",
    )


@record(frozen=True, slots=True)
class GpuFindings:
    problems: list[Problem]
    unchecked: list[Unchecked]


def gpu_problems(entry: GpuEntry, *, catalog: Catalog) -> GpuFindings:
    """Every offline problem of one GPU, each at the line it concerns, and the names the
    catalogue cannot vouch for (accepted: a driver may offer names no catalogue lists yet)."""
    gpu = entry.gpu
    # How messages name the GPU (its address, or what a group's entry matches), and its
    # address where one GPU is meant (a group's entry matched by model names many).
    ref: GpuRef
    address: PciAddress | None
    if isinstance(gpu, DesiredGpu):
        ref = address = gpu.address
    else:
        ref, address = gpu.match, gpu.match.address
    problems: list[Problem] = []
    unchecked: list[Unchecked] = []

    def report(location: SourceLocation | None, message: str) -> None:
        problems.append(problem_at(location or entry.location, message))

    def accept(
        location: SourceLocation | None,
        what: str,
        hint: Hint = Hint(),
        whole: GpuModel | None = None,
        name: str = "",
    ) -> None:
        unchecked.append(Unchecked(what, location or entry.location, hint, whole, name))

    entries = [
        _Entry(key, profile, 1, entry.locations[key]) for key, profile in (gpu.vgpus or {}).items()
    ] + [
        _Entry(name, name, count, entry.locations[name])
        for name, count in (gpu.profiles or {}).items()
    ]

    if "vgpus" in entry.fields and "profiles" in entry.fields:
        later = max(entry.fields["vgpus"], entry.fields["profiles"], key=_order)
        report(
            later,
            f"'vgpus' and 'profiles' are exclusive on GPU {ref}: name the VFs in "
            "vgpus or give counts in profiles, not both",
        )
    if not gpu.sriov:
        for field_name, given in (("vgpus", gpu.vgpus), ("profiles", gpu.profiles)):
            if given:
                report(
                    entry.fields.get(field_name),
                    f"GPU {ref} has sriov: disabled but lists {field_name}: vGPUs live "
                    "on SR-IOV VFs; set sriov: enabled or remove the entries",
                )

    if not gpu.sriov and gpu.mode is VgpuMode.MIXED_SIZE:
        report(
            entry.fields.get("mode"),
            f"GPU {ref} has sriov: disabled but mode: mixed-size: the mode is set on "
            "a GPU whose SR-IOV is on; set sriov: enabled or remove mode",
        )

    named: list[_Named] = []
    unparsed: list[_Entry] = []
    for e in entries:
        if isinstance(e.key, PciAddress) and e.key == address:
            report(e.location, f"{address} is the GPU itself (its physical function), not a VF")
        written = entry.written.get(e.key, e.profile)
        foreign = non_ascii(written)
        if foreign is not None:
            report(e.location, f"profile {quoted(written)} {_NOT_ASCII}: {foreign}")
            continue
        if _misspelt_case(e, catalog=catalog, report=report):
            continue
        parsed = parse_profile_name(e.profile)
        if parsed is not None:
            named.append(_Named(e, parsed))
            continue
        # A shape this parser does not know: carried as it is, the host has the last word
        # (accepted below, once the model is known).
        unparsed.append(e)

    model = _model(entry, catalog=catalog, accept=accept, report=report)
    if model is None and isinstance(gpu, GroupGpu) and gpu.match.device_id is not None:
        # The catalogue knows a device ID's model unless two models share the ID (A2 and A16
        # differ by subsystem ID only): then the profile names say it, as below.
        model = catalog.model_for_ids("10de", gpu.match.device_id)
    if model is None:
        # No usable ``model:``: the profile names say which model this is, if they agree.
        groups = _by_gpu(named, catalog=catalog)
        if len(groups) > 1:
            first, other = (members[0] for members in list(groups.values())[:2])
            report(
                other.location,
                f"profiles of two GPU models on GPU {ref}: {quoted(other.profile)} "
                f"({other.name.gpu}) and {quoted(first.profile)} ({first.name.gpu}, "
                f"{line_ref(first.location)}); a GPU hosts profiles of its own model only",
            )
            # Sizes and maxima of a mix of models would only repeat this.
            return GpuFindings(problems, unchecked)
        if groups:
            model = catalog.model(named[0].name.gpu)

    # A model whose whole list the catalogue has: a name outside it is most likely a typo.
    whole = model if model is not None and model.profiles_complete else None
    for e in unparsed:
        written = quoted(entry.written.get(e.key, e.profile))
        hint = Hint(e.profile, partial(_all_profile_names, catalog))
        accept(e.location, written, hint, whole, e.profile)
    if model is not None:
        _check_vfs(ref, address, model, entries, report=report)
        for n in named:
            # A profile of another model is the rules' to refuse (``model:`` names the GPU).
            if catalog.model(n.name.gpu) is model and model.profile(n.profile) is None:
                # Catalogues lag drivers (L40S-3B came with vGPU 16): the host's list decides.
                accept(n.location, quoted(n.profile), Hint(model=model), whole, n.profile)
    elif named and catalog.model(named[0].name.gpu) is None:
        for n in named:
            accept(n.location, quoted(n.profile))
    # The driver's rules, judged against the catalogue's offer for the model (its name alone
    # when the catalogue does not know it): the same rules and sentences as at plan time.
    judged = sorted([n.entry for n in named] + unparsed, key=lambda e: _order(e.location))
    requests = [
        Request(e.profile, e.count, _vf_text(address, model, e.key), e.location) for e in judged
    ]
    mixed = gpu.mode is VgpuMode.MIXED_SIZE
    for v in violations(ref, _catalog_offer(model, catalog), requests, mixed_size=mixed):
        report(v.location, str(v))
    return GpuFindings(problems, unchecked)


def _misspelt_case(e: _Entry, *, catalog: Catalog, report: _Report) -> bool:
    """A catalogue name written in other letter case (``NVIDIA a2-4Q``): no driver prints one
    of its names so, so this one is a slip of the keyboard, reported with the right spelling."""
    if catalog.spelled(e.profile) is not None:
        return False
    name = _by_folded_body(catalog).get(_folded_body(e.profile))
    if name is None:
        return False
    report(e.location, f"unknown profile {quoted(e.profile)}; did you mean '{name}'?")
    return True


@cache
def _by_folded_body(catalog: Catalog) -> dict[str, str]:
    """Every catalogue profile name by its folded body (the first of a body wins)."""
    found: dict[str, str] = {}
    for name in _all_profile_names(catalog):
        found.setdefault(_folded_body(name), name)
    return found


def _folded_body(name: str) -> str:
    """A name without any vendor prefix, in any case, for comparing spellings only."""
    body = " ".join(name.split()).casefold()
    for prefix in ("nvidia ", "grid "):
        body = body.removeprefix(prefix)
    return body


def _model(
    entry: GpuEntry, *, catalog: Catalog, accept: _Accept, report: _Report
) -> GpuModel | None:
    """The model ``model:`` names; a name the catalogue does not know is accepted as such."""
    written = entry.gpu.model
    if written is None:
        return None
    foreign = non_ascii(written)
    if foreign is not None:
        report(entry.fields.get("model"), f"model {quoted(written)} {_NOT_ASCII}: {foreign}")
        return None
    model = catalog.model(written)
    if model is None:
        accept(
            entry.fields.get("model"),
            f"model {quoted(written)}",
            Hint(written, partial(_model_names, catalog)),
        )
    return model


def _model_names(catalog: Catalog) -> list[str]:
    return [n for m in catalog.models for n in (m.name, m.short, *m.aliases)]


def _check_vfs(
    ref: GpuRef,
    address: PciAddress | None,
    model: GpuModel,
    entries: list[_Entry],
    *,
    report: _Report,
) -> None:
    """VF indexes and VF identities (where the GPU is one GPU: ``address``), from the
    catalogue."""
    by_index: dict[PciAddress, tuple[int, _Entry]] = {}
    for e in entries:
        if not isinstance(e.key, int):
            continue
        if e.key >= model.vfs:
            report(e.location, str(index_out_of_range(ref, model.name, e.key, model.vfs, None)))
            continue
        if model.vf_offset is None or address is None:
            continue  # where its VFs sit is not known offline: the host says at plan time
        try:
            by_index[_vf_address(address, model.vf_offset, model.vf_stride, e.key)] = (e.key, e)
        except ValueError:  # beyond bus 0xff: no such VF, nothing to compare
            continue
    for e in entries:
        if isinstance(e.key, PciAddress) and e.key in by_index:
            index, other = by_index[e.key]
            twice = named_twice(ref, e.key, index, other.location, e.location)
            report(twice.location, str(twice))


def _catalog_offer(model: GpuModel | None, catalog: Catalog) -> Offer:
    """What the catalogue says ``model`` offers: every profile it lists, and its VF count. A
    catalogue lags drivers, so its list is never complete: a name outside it is accepted."""
    if model is None:
        return Offer(None, {}, complete=False, vfs=None, catalog=catalog)
    for index, listed in enumerate(catalog.models):
        if listed is model:
            return _listed_offer(index, catalog)
    return _offer_of(model, catalog)


@lru_cache(maxsize=64)  # a fleet's file names the same few models thousands of times
def _listed_offer(index: int, catalog: Catalog) -> Offer:
    """:func:`_offer_of` of the catalogue's ``index``-th model, made once per model and catalogue
    (keyed so, not by the model: hashing a model hashes all its profiles)."""
    return _offer_of(catalog.models[index], catalog)


def _offer_of(model: GpuModel, catalog: Catalog) -> Offer:
    """An offer is a frozen value (its type table is read, never changed): one is shared."""
    types = {
        p.name: OfferedType(
            p.name, p.framebuffer_mib, p.max_instances, p.mig, p.mixed_size_max_instances
        )
        for p in model.profiles
    }
    return Offer(model.name, types, complete=False, vfs=model.vfs, catalog=catalog)


def _vf_text(
    address: PciAddress | None, model: GpuModel | None, key: VfKey | str
) -> PciAddress | str | None:
    """The VF an entry names, as the planner names it: its address, when the catalogue says
    where the model's VFs sit; else as written."""
    if isinstance(key, str):
        return None  # a count: the planner picks the VFs
    if isinstance(key, PciAddress):
        return key
    if address is not None and model is not None and model.vf_offset is not None:
        try:
            return _vf_address(address, model.vf_offset, model.vf_stride, key)
        except ValueError:
            pass
    return f"index {key}"


def _vf_address(address: PciAddress, offset: int, stride: int, index: int) -> PciAddress:
    return PciAddress.from_routing_id(address.domain, address.routing_id + offset + index * stride)


def _offer(model: GpuModel) -> str:
    """``A2-1A 2A 4A 8A 16A 1B 2B …``: a model's profiles, compactly."""
    suffixes = []
    for p in sorted(
        model.profiles,
        key=lambda p: (p.mig, p.series, p.gpu_instance_slices, p.framebuffer_mib),
    ):
        parsed = parse_profile_name(p.name)
        if parsed is None:
            suffixes.append(p.name)
            continue
        slices = f"{parsed.mig_slices}-" if parsed.mig_slices else ""
        suffixes.append(f"{slices}{parsed.size_gb}{parsed.series}")
    return f"{model.short}-{' '.join(suffixes)}" if suffixes else "no profiles"


def _by_gpu(named: Iterable[_Named], *, catalog: Catalog) -> dict[str, list[_Named]]:
    """Entries grouped by the GPU model their names are for (the catalogue's, else the name's)."""
    groups: dict[str, list[_Named]] = {}
    for n in named:
        model = catalog.model(n.name.gpu)
        groups.setdefault(model.name if model else n.name.gpu.casefold(), []).append(n)
    return groups


def _all_profile_names(catalog: Catalog) -> list[str]:
    return [p.name for m in catalog.models for p in m.profiles]


def _order(location: SourceLocation) -> tuple[int, int]:
    return (location.line, location.column)
