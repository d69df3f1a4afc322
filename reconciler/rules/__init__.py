"""The NVIDIA driver's placement rules for one GPU, each stated once (docs/domain.md §3, §4).

Both judges of a desired GPU ask this module: ``vgpuctl validate`` against the catalogue's
offer for the GPU's model (``desired/checks.py``), ``vgpuctl plan`` against the driver's offer
read from sysfs (``plan/check.py``). Each describes what the GPU offers as an :class:`Offer` and
the desired entries as :class:`Request` s, in the order written; :func:`violations` returns
every rule broken, with the same sentence whichever command asks. A sentence names the GPU by
its PCI address (and by the model the offer names, where the rule depends on it) and quotes
profile names escaped, so the catalogue and the driver word it alike; what depends on the
offer's own list (what else it offers) is a separate :attr:`Violation.hint`.

The rules, as the driver applies them when a vGPU is created:

- a profile must be one the GPU offers: one its driver lists, or one it hosts already; an offer
  that is not a full list (the catalogue's) refuses only profiles of another GPU model;
- a GPU in MIG mode hosts MIG-backed vGPUs only, so the two kinds never share a GPU;
- equal-size mode: the time-sliced vGPUs on one GPU share one framebuffer size (the series may
  differ: 4A next to 4Q);
- mixed-size mode (``violations(..., mixed_size=True)``): sizes may differ, but the time-sliced
  vGPUs' framebuffer together fits the GPU's (its model's, where the catalogue knows it);
- the per-size maximum: a type's ``max_instance`` counts the GPU's vGPUs of its framebuffer size
  (4A and 4Q share the limit); a MIG-backed type's counts its own vGPUs. In mixed-size mode a
  type's mixed-size maximum replaces it where NVIDIA published one (L40S-4C: 8, not 12); where
  none is known the equal-size maximum still bounds it (the mixed-size one is never higher),
  and the driver's refusal at create time has the last word;
- one vGPU per VF: no more vGPUs than the GPU has VFs, and no VF named twice (by its index and
  by its address: :func:`named_twice`); a VF index is below the GPU's VF count
  (:func:`index_out_of_range`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from functools import lru_cache
from itertools import accumulate

from reconciler.catalog import Catalog, parse_profile_name
from reconciler.model import GpuRef, PciAddress, SourceLocation
from reconciler.model.errors import excerpt
from reconciler.model.record import record


class Rule(StrEnum):
    NOT_OFFERED = "not-offered"
    MIG_ONLY = "mig-only"
    EQUAL_SIZE = "equal-size"
    MAXIMUM = "maximum"
    FRAMEBUFFER = "framebuffer"
    ONE_PER_VF = "one-per-vf"
    VF_INDEX = "vf-index"


@record(frozen=True, slots=True)
class OfferedType:
    """What the rules need to know about one vGPU type."""

    name: str
    framebuffer_mib: int
    max_instance: int | None  # per physical GPU; None when only the name was parsed
    #: MIG-backed: counted per type, never next to a time-sliced vGPU. None: not said (sysfs
    #: does not), and :attr:`is_mig` reads it from the type's name (``A100-1-5C``).
    mig: bool | None = None
    #: The maximum in mixed-size mode, where NVIDIA published it; None: see the catalogue
    #: (:func:`mixed_limit`), else not known.
    mixed_max_instance: int | None = None

    @property
    def is_mig(self) -> bool:
        return self.mig if self.mig is not None else _named_mig(self.name)


@lru_cache(maxsize=4096)  # a driver's type names: a few dozen per GPU model
def _named_mig(name: str) -> bool:
    parsed = parse_profile_name(name)
    return parsed is not None and parsed.mig_slices > 0


def type_facts(name: str, catalog: Catalog) -> OfferedType | None:
    """What the catalogue says of ``name``, else what the name itself says (no maximum), else
    None (a shape no parser knows: nothing to reason about)."""
    known = catalog.profile(name)
    if known is not None:
        _, p = known
        return OfferedType(
            name, p.framebuffer_mib, p.max_instances, p.mig, p.mixed_size_max_instances
        )
    parsed = parse_profile_name(name)
    if parsed is None:
        return None
    return OfferedType(name, parsed.size_gb * 1024, None, parsed.mig_slices > 0)


@record(frozen=True, slots=True)
class Offer:
    """What one GPU offers: the catalogue's profiles for its model, or the driver's types."""

    model: str | None  # "NVIDIA A2"; None when nothing names it
    types: Mapping[str, OfferedType]  # in the driver's (or catalogue's) order
    #: True when ``types`` is the whole list: a name outside it is not offered. A catalogue
    #: lags drivers (L40S-3B came with vGPU 16), so its list refuses only another model's names.
    complete: bool
    vfs: int | None  # how many VFs the GPU has (or will have); None when not known
    catalog: Catalog

    def facts(self, name: str) -> OfferedType | None:
        """Sizes of ``name``: offered here, else from the catalogue, else from the name itself.

        The fall-backs matter for vGPUs that exist but the driver no longer lists, and for GPUs
        the catalogue does not know while SR-IOV is off.
        """
        offered = self.types.get(name)
        return offered if offered is not None else type_facts(name, self.catalog)

    def listing(self) -> str:
        """The offered names, compactly: ``NVIDIA A2-1B, -2B, -1Q``."""
        return compact_names(list(self.types)) or "none"


@record(frozen=True, slots=True)
class Request:
    """One desired entry: a profile on a VF (count 1), or a count of a profile."""

    profile: str
    count: int
    #: The VF, by its address where known (else as the file names it: ``index 3``); None in the
    #: count form.
    vf: PciAddress | str | None
    location: SourceLocation | None


@record(frozen=True, slots=True)
class Violation:
    rule: Rule
    #: The rule's sentence: the same whichever command finds it.
    message: str
    #: Where it is reported: the entry that breaks the rule (None: not known).
    location: SourceLocation | None
    #: What the offer suggests instead ("profiles that allow 5: …"); may be empty.
    hint: str = ""

    def __str__(self) -> str:
        return f"{self.message}; {self.hint}" if self.hint else self.message


def violations(
    gpu: GpuRef,
    offer: Offer,
    requests: Sequence[Request],
    *,
    hosted: Iterable[str] = (),
    mixed_size: bool = False,
) -> list[Violation]:
    """Every rule ``requests`` break on the GPU at ``gpu``; ``hosted`` names the types its VFs
    host now (offered even when the driver stopped listing them, as vfio's list does: read only
    for a name the offer does not list). ``mixed_size``: the GPU is (or will be) in mixed-size
    mode, so sizes may differ up to its total framebuffer, under the mixed-size maxima."""
    found: list[Violation] = []
    kept: set[str] | None = None
    typed: list[tuple[Request, OfferedType]] = []
    for r in requests:
        facts = offer.types.get(r.profile)
        if facts is None:
            if kept is None:
                kept = set(hosted)
            if not _offered(offer, r.profile, kept):
                found.append(_not_offered(gpu, offer, r))
                continue
            facts = type_facts(r.profile, offer.catalog)
            if facts is None:
                continue
        typed.append((r, facts))
    time_sliced = [(r, t) for r, t in typed if not t.is_mig]
    if len(time_sliced) < len(typed) and time_sliced:
        first_mig = next(r for r, t in typed if t.is_mig)
        found.append(_mig_mixed(gpu, time_sliced[0][0], first_mig))
    if mixed_size:
        too_big = _over_framebuffer(gpu, offer, time_sliced)
        if too_big is not None:
            found.append(too_big)
    else:
        size_clash = _size_clash(gpu, time_sliced)
        if size_clash is not None:
            found.append(size_clash)
    over = _over_maximum(gpu, offer, typed, mixed_size=mixed_size)
    found.extend(over)
    if not over:  # a maximum is never above the VF count: that sentence says it all
        too_many = _over_vfs(gpu, offer, requests)
        if too_many is not None:
            found.append(too_many)
    return found


def _quoted(name: str) -> str:
    return f"'{excerpt(name)}'"


def _size(mib: int) -> str:
    return f"{mib // 1024} GB" if mib % 1024 == 0 else f"{mib} MiB"


def _order(r: Request) -> tuple[int, int]:
    return (r.location.line, r.location.column) if r.location is not None else (0, 0)


def _line(r: Request) -> str | None:
    """``line 12``: where the earlier entry of a pair is (``line ?`` in data without lines)."""
    if r.location is None:
        return None  # built in code (the planner's API), not read from a file
    return f"line {r.location.line}" if r.location.line else "line ?"


def _offered(offer: Offer, name: str, hosted: set[str]) -> bool:
    """Whether ``name`` may be created on the GPU, as far as ``offer`` can tell."""
    if name in offer.types or name in hosted:
        return True
    if offer.complete:
        return False
    # A list that is not complete still never holds a profile of another GPU model: the name's
    # GPU part says whose it is (``NVIDIA L4-4Q`` is an L4's, ``GRID T4-4Q`` a T4's).
    mine = offer.catalog.model(offer.model) if offer.model is not None else None
    parsed = parse_profile_name(name)
    if mine is None or parsed is None:
        return True
    return offer.catalog.model(parsed.gpu) is mine


def _not_offered(gpu: GpuRef, offer: Offer, r: Request) -> Violation:
    where = f"VF {r.vf}: " if r.vf is not None else ""
    model = f" ({offer.model})" if offer.model else ""
    known = offer.catalog.profile(r.profile)
    other = ""
    if known is not None and known[0].name != offer.model:
        other = f" (a profile of {known[0].name})"
    return Violation(
        Rule.NOT_OFFERED,
        f"{where}GPU {gpu}{model} does not offer {_quoted(r.profile)}{other}",
        r.location,
        f"offered: {offer.listing()}",
    )


def _mig_mixed(gpu: GpuRef, time_sliced: Request, mig: Request) -> Violation:
    earlier, later = sorted((time_sliced, mig), key=_order)
    line = _line(earlier)
    return Violation(
        Rule.MIG_ONLY,
        f"MIG-backed and time-sliced profiles on GPU {gpu}: {_quoted(later.profile)} and "
        f"{_quoted(earlier.profile)}{f' ({line})' if line else ''}; "
        "a GPU in MIG mode hosts MIG-backed vGPUs only",
        later.location,
    )


def _size_clash(gpu: GpuRef, typed: list[tuple[Request, OfferedType]]) -> Violation | None:
    if not typed:
        return None
    first, size = typed[0]
    line = _line(first)
    for r, t in typed[1:]:
        if t.framebuffer_mib != size.framebuffer_mib:
            return Violation(
                Rule.EQUAL_SIZE,
                f"mixed framebuffer sizes on GPU {gpu}: {_quoted(r.profile)} "
                f"({_size(t.framebuffer_mib)}) and {_quoted(first.profile)} "
                f"({_size(size.framebuffer_mib)}{f', {line}' if line else ''}); "
                "time-sliced vGPUs on one GPU share one size (equal-size mode)",
                r.location,
            )
    return None


def mixed_limit(t: OfferedType, catalog: Catalog) -> int | None:
    """``t``'s maximum in mixed-size mode: its own, else the catalogue's, else None (not
    published: the equal-size maximum bounds it, the driver decides the rest)."""
    if t.mixed_max_instance is not None:
        return t.mixed_max_instance
    known = catalog.profile(t.name)
    return known[1].mixed_size_max_instances if known is not None else None


def gpu_framebuffer(offer: Offer) -> int | None:
    """The GPU's total framebuffer in MiB, from the catalogue's entry for its model (None: a
    model it does not know; the driver's refusal at create time decides then)."""
    model = offer.catalog.model(offer.model) if offer.model is not None else None
    return model.framebuffer_mib if model is not None else None


def _over_framebuffer(
    gpu: GpuRef, offer: Offer, typed: list[tuple[Request, OfferedType]]
) -> Violation | None:
    """Mixed-size mode: the time-sliced vGPUs' framebuffer together must fit the GPU's."""
    total_mib = gpu_framebuffer(offer)
    if total_mib is None:
        return None
    running = 0
    for r, t in typed:
        running += r.count * t.framebuffer_mib
        if running > total_mib:
            asked = sum(x.count * u.framebuffer_mib for x, u in typed)
            where = f"; first over it: VF {r.vf}" if r.vf is not None else ""
            return Violation(
                Rule.FRAMEBUFFER,
                f"{_size(asked)} of vGPUs on GPU {gpu}, but {offer.model or 'it'} has "
                f"{_size(total_mib)} of framebuffer (mixed-size mode: the sizes together must "
                f"fit){where}",
                r.location,
            )
    return None


def _over_maximum(
    gpu: GpuRef,
    offer: Offer,
    typed: list[tuple[Request, OfferedType]],
    *,
    mixed_size: bool = False,
) -> list[Violation]:
    """A time-sliced type's ``max_instance`` counts every vGPU of its size on the GPU; a
    MIG-backed type's, its own. The lowest limit of a group is the one that stops a create.
    In mixed-size mode a type's published mixed-size maximum replaces its ``max_instance``."""
    if mixed_size:
        typed = [(r, t if t.is_mig else _mixed_facts(t, offer.catalog)) for r, t in typed]
    groups: dict[tuple[bool, str | int], list[tuple[Request, OfferedType]]] = {}
    for r, t in typed:
        key: tuple[bool, str | int] = (True, t.name) if t.is_mig else (False, t.framebuffer_mib)
        groups.setdefault(key, []).append((r, t))
    found: list[Violation] = []
    for members in groups.values():
        total = sum(r.count for r, _ in members)
        limit = min(
            (t.max_instance for _, t in members if t.max_instance is not None), default=None
        )
        if limit is None or total <= limit:
            continue
        limiter = next(t for _, t in members if t.max_instance == limit)
        running = accumulate(r.count for r, _ in members)
        culprit, own = next(m for m, n in zip(members, running, strict=True) if n > limit)
        if own.max_instance == limit:  # the type whose create the driver refuses
            limiter = own
        if limiter.is_mig:
            what, who = _quoted(limiter.name), "it allows"
        else:
            what, who = _size(limiter.framebuffer_mib), f"{_quoted(limiter.name)} allows"
        where = f"; first over the limit: VF {culprit.vf}" if culprit.vf is not None else ""
        offered: Iterable[OfferedType] = offer.types.values()
        if mixed_size:
            offered = [_mixed_facts(t, offer.catalog) for t in offered]
        fitting = [
            t.name.removeprefix("NVIDIA ")
            for t in offered
            if not t.is_mig and t.max_instance is not None and t.max_instance >= total
        ]
        mode = " in mixed-size mode" if mixed_size and limiter.mixed_max_instance == limit else ""
        found.append(
            Violation(
                Rule.MAXIMUM,
                f"{total} vGPUs of {what} on GPU {gpu}, but {who} at most {limit} "
                f"per {offer.model or 'GPU'}{mode}{where}",
                culprit.location,
                f"profiles that allow {total}: {' '.join(fitting)}" if fitting else "",
            )
        )
    return found


def _mixed_facts(t: OfferedType, catalog: Catalog) -> OfferedType:
    limit = mixed_limit(t, catalog)
    if limit is None or (t.max_instance is not None and t.max_instance <= limit):
        return t
    return OfferedType(t.name, t.framebuffer_mib, limit, t.mig, limit)


def _over_vfs(gpu: GpuRef, offer: Offer, requests: Sequence[Request]) -> Violation | None:
    if offer.vfs is None or sum(r.count for r in requests) <= offer.vfs:
        return None
    for r, n in zip(requests, accumulate(r.count for r in requests), strict=True):
        if n > offer.vfs:
            total = sum(x.count for x in requests)
            return Violation(
                Rule.ONE_PER_VF,
                f"{total} vGPUs requested on GPU {gpu}, but {offer.model or 'it'} has "
                f"{offer.vfs} VFs "
                "(one vGPU per VF)",
                r.location,
            )
    return None


def index_out_of_range(
    gpu: GpuRef, model: str | None, index: int, vfs: int, location: SourceLocation | None
) -> Violation:
    """A VF index the GPU does not have: VF ``i`` exists for ``i`` below its VF count."""
    return Violation(
        Rule.VF_INDEX,
        f"VF index {index} is out of range for GPU {gpu}: {model or 'it'} has {vfs} VFs "
        f"(indexes 0..{vfs - 1})",
        location,
    )


def named_twice(
    gpu: GpuRef,
    vf: PciAddress,
    index: int,
    by_index: SourceLocation | None,
    by_address: SourceLocation | None,
) -> Violation:
    """One VF named by its index and by its address: two vGPUs on one VF. Reported where the
    later of the two is written."""
    where = [by_index, by_address]
    lines = [f" (line {w.line})" if w is not None and w.line else "" for w in where]
    later = max(where, key=lambda w: (w.line, w.column) if w is not None else (0, 0))
    return Violation(
        Rule.ONE_PER_VF,
        f"VF {vf} of GPU {gpu} is named twice: as index {index}{lines[0]} and by its address"
        f"{lines[1]} (one vGPU per VF)",
        later,
    )


def compact_names(names: list[str]) -> str:
    """Join profile names, dropping the GPU part a name shares with the one before it."""
    out: list[str] = []
    previous: str | None = None
    for name in names:
        head, dash, tail = name.rpartition("-")
        if dash and head == previous:
            out.append(f"-{tail}")
        else:
            out.append(name)
            previous = head if dash else None
    return ", ".join(out)
