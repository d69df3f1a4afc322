"""Load desired-state files into one :class:`Desired`, or report every problem in them.

The shell of ``desired``: read → schema → normalise → merge → offline checks, each stage adding
located problems instead of stopping at the first. ``vgpuctl validate`` prints them; ``plan``
and ``apply`` get a :class:`Desired` or a :class:`ValidationError` carrying all of them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from reconciler.catalog import Catalog
from reconciler.desired.checks import Unchecked, gpu_problems, unknown_profile
from reconciler.desired.groups import group_problems
from reconciler.desired.normalise import FileEntry, GpuEntry, normalise
from reconciler.desired.shape import MAX_SHAPE_PROBLEMS, shape_problems
from reconciler.desired.source import (
    MAX_BYTES,
    Document,
    directory_files,
    document_from_data,
    problem_at,
    read_document,
)
from reconciler.model import (
    Desired,
    DesiredGpu,
    DesiredNode,
    PciAddress,
    Problem,
    SourceLocation,
    ValidationError,
)
from reconciler.model.desired import Rollout

#: Problems reported per file: the first ones in file order, then how many more there are. A
#: broken file gives a few lines to act on, not a log line per key.
MAX_PROBLEMS_PER_FILE = 20
#: Files in one desired state (a directory's, or the arguments). A ConfigMap of a megabyte can
#: hold tens of thousands of tiny keys, each a file in its volume.
MAX_FILES = 1000


def load_desired(
    paths: Sequence[Path], *, catalog: Catalog, directories: bool = False, strict: bool = False
) -> Desired:
    """The desired state the files describe together (nodes merge across files).

    With ``directories``, a directory stands for its desired-state files (see
    :func:`directory_files`); without, a directory is reported as a problem. With ``strict``
    (``vgpuctl validate``: no host to ask), a profile name outside the whole list the
    catalogue has of its model is a problem (:func:`~reconciler.desired.checks.unknown_profile`),
    not a note. Raises :class:`ValidationError` whose ``problems`` are every problem found, in
    file order.
    """
    return _raise_if_invalid(*_load(paths, catalog=catalog, directories=directories, strict=strict))


def validate_files(
    paths: Sequence[Path], *, catalog: Catalog, directories: bool = False, strict: bool = False
) -> list[Problem]:
    """Every problem in the files (empty when they are valid): ``vgpuctl validate``."""
    return _load(paths, catalog=catalog, directories=directories, strict=strict)[1]


def load_document(document: Mapping[str, Any], *, source: str, catalog: Catalog) -> Desired:
    """A desired state given as data, such as the copy a saved plan carries.

    Checked exactly like a file; problems name ``source`` and no line (data has none), and the
    result carries no source locations.
    """
    parsed = document_from_data(document, file=source)
    return _raise_if_invalid(*_combine([(parsed, [])], files=(source,), catalog=catalog))


def _raise_if_invalid(desired: Desired | None, problems: list[Problem]) -> Desired:
    if problems or desired is None:
        count = len(problems)
        raise ValidationError(
            f"desired state is invalid: {count} problem{'s' if count != 1 else ''}", problems
        )
    return desired


def _load(
    paths: Sequence[Path], *, catalog: Catalog, directories: bool = False, strict: bool = False
) -> tuple[Desired | None, list[Problem]]:
    if not paths:
        return None, [Problem("no desired-state files given")]
    files: list[Path] = []
    listed_in: dict[Path, Path] = {}  # a directory's entry → that directory
    problems: list[Problem] = []
    for path in map(Path, paths):
        if not (directories and path.is_dir()):
            files.append(path)
            continue
        try:
            listed = directory_files(path)
        except OSError as exc:
            problems.append(Problem(f"cannot list: {exc.strerror or exc}", file=str(path)))
            continue
        if not listed:
            problems.append(Problem("no desired-state files (*.yaml, *.yml) here", file=str(path)))
        files.extend(listed)
        listed_in.update(dict.fromkeys(listed, path))
    too_many = _too_many(paths, files)
    if too_many is not None:
        return None, [*problems, too_many]
    # One file read at a time: only its normalised entries outlive the next file's parse.
    read = (read_document(path, directory=listed_in.get(path)) for path in files)
    desired, found = _combine(
        read, files=tuple(str(p) for p in files), catalog=catalog, strict=strict
    )
    if problems:
        return None, problems + found
    return desired, found


def _too_many(paths: Sequence[Path], files: Sequence[Path]) -> Problem | None:
    """Why the files are too many or too large together to be one desired state, if they are.

    Each file is bounded when it is read; this bounds what their normalised entries add up to
    (a ConfigMap holds 1 MiB in all, and may hold it as tens of thousands of tiny files).
    """
    if len(files) > MAX_FILES:
        message = f"{len(files):,} desired-state files: more than {MAX_FILES:,}"
        return Problem(message, file=str(paths[0]) if len(paths) == 1 else None)
    total = 0
    for file in files:
        try:
            size = file.stat().st_size
        except OSError:
            continue  # reported when it is read
        if size > MAX_BYTES:
            return None  # reported when it is read, as larger than a file may be
        total += size
        if total > MAX_BYTES:
            return Problem(
                f"with the files before it, the desired state is larger than "
                f"{MAX_BYTES // (1024 * 1024)} MiB (the most a ConfigMap holds)",
                file=str(file),
            )
    return None


def _combine(
    read: Iterable[tuple[Document | None, list[Problem]]],
    *,
    files: tuple[str, ...],
    catalog: Catalog,
    strict: bool = False,
) -> tuple[Desired | None, list[Problem]]:
    problems: list[Problem] = []
    entries: list[FileEntry] = []
    incomplete: set[str] = set()
    for document, found in read:
        problems.extend(found)
        if document is not None:
            entry = _file_entry(document, catalog=catalog, problems=problems)
            if entry is None:
                incomplete.add(document.file)
            else:
                entries.append(entry)
        # Only the normalised entries outlive a file's parse (its data and position index are
        # several times their size).
        del document

    nodes: dict[str, DesiredNode] = {}
    defined: dict[tuple[str, PciAddress], SourceLocation] = {}
    unchecked: list[Unchecked] = []
    # GPUs written alike (a fleet's nodes repeat their GPUs, at the same addresses): a layout
    # found clean once is clean again, wherever it is written.
    clean: set[object] = set()
    for file in entries:
        for node in file.nodes:
            gpus: list[DesiredGpu] = []
            for gpu_entry in node.gpus:
                gpu = gpu_entry.gpu
                if not isinstance(gpu, DesiredGpu):  # a node's GPUs are always
                    continue
                first = defined.get((node.name, gpu.address))
                if first is not None:
                    there = str(first) if first.line else first.file
                    message = f"GPU {gpu.address} on node {node.name} is already defined at {there}"
                    problems.append(problem_at(gpu_entry.location, message))
                    continue
                defined[(node.name, gpu.address)] = gpu_entry.location
                key = _content(gpu_entry, gpu)
                if key not in clean:
                    findings = gpu_problems(gpu_entry, catalog=catalog)
                    problems.extend(findings.problems)
                    unchecked.extend(findings.unchecked)
                    if not findings.problems and not findings.unchecked:
                        clean.add(key)
                gpus.append(gpu)
            known = nodes.get(node.name)
            if known is None:
                nodes[node.name] = DesiredNode(node.name, tuple(gpus), node.location)
            else:
                nodes[node.name] = DesiredNode(node.name, known.gpus + tuple(gpus), known.location)

    groups = [group for file in entries for group in file.groups]
    for group in groups:
        for gpu_entry in group.gpus:
            findings = gpu_problems(gpu_entry, catalog=catalog)
            problems.extend(findings.problems)
            unchecked.extend(findings.unchecked)
    problems.extend(group_problems(groups))
    if strict:
        # A name outside a model's whole list: a problem (a typo, most likely), not a note.
        kept: list[Unchecked] = []
        for u in unchecked:
            if u.listed_in_full is None:
                kept.append(u)
            else:
                problems.append(unknown_profile(u, u.listed_in_full))
        unchecked = kept
    rollout: Rollout | None = None
    for file in entries:
        if file.rollout is None:
            continue
        if rollout is not None:
            message = (
                f"spec.rollout is already given at {rollout.location}: a desired state paces "
                "its rollout in one file"
            )
            problems.append(Problem(message, file=file.file))
            continue
        rollout = file.rollout

    if problems:
        return None, _capped(problems, files=files, incomplete=incomplete)
    name = next((f.name for f in entries if f.name), "")
    notes = (unchecked_note(unchecked),) if unchecked else ()
    desired = Desired(
        name=name,
        nodes=MappingProxyType(nodes),
        files=files,
        notes=notes,
        groups=tuple(g.group for g in groups),
        rollout=rollout,
    )
    return desired, []


def _content(entry: GpuEntry, gpu: DesiredGpu) -> object:
    """All that :func:`gpu_problems` judges of a node's GPU but where it is written: equal for
    two GPUs whose verdicts are equal (their messages' places aside)."""
    return (
        gpu.address,
        gpu.sriov,
        gpu.model,
        gpu.mode,
        None if gpu.vgpus is None else tuple(gpu.vgpus.items()),
        None if gpu.profiles is None else tuple(gpu.profiles.items()),
        tuple(entry.fields),
        tuple(entry.written.items()),
    )


def _file_entry(
    document: Document, *, catalog: Catalog, problems: list[Problem]
) -> FileEntry | None:
    """The file normalised as far as it is well-formed, its problems added to ``problems``;
    None when checking stopped early (the file is broken throughout)."""
    shape = shape_problems(document)
    problems.extend(p for _, p in shape.problems)
    if not shape.complete:
        # Parts were never checked against the schema: nothing more to learn from them.
        return None
    entry = normalise(document, catalog=catalog, broken={where for where, _ in shape.problems})
    problems.extend(entry.problems)
    return entry


def _capped(
    problems: list[Problem], *, files: Sequence[str], incomplete: set[str]
) -> list[Problem]:
    """Problems in file order, at most :data:`MAX_PROBLEMS_PER_FILE` per file, each file's
    list ended by how many more it has."""
    order = {name: i for i, name in reversed(list(enumerate(files)))}
    problems.sort(key=lambda p: (order.get(p.file or "", -1), p.line or 0, p.column or 0))
    capped: list[Problem] = []
    for file, group in itertools.groupby(problems, key=lambda p: p.file):
        found = list(group)
        capped.extend(found[:MAX_PROBLEMS_PER_FILE])
        more = len(found) - MAX_PROBLEMS_PER_FILE
        if file in incomplete:
            message = (
                f"… and more problems: checking stopped after the first {MAX_SHAPE_PROBLEMS} "
                "(fix these first)"
            )
            capped.append(Problem(message, file=file))
        elif more > 0:
            capped.append(Problem(f"… and {more:,} more problem{'s' * (more != 1)}", file=file))
    return capped


#: Names a note lists, and places listed per name; the rest are counted.
NOTE_NAMES = 20
NOTE_PLACES = 5


def unchecked_note(unchecked: Sequence[Unchecked]) -> str:
    """One line for every name the catalogue could not vouch for (said once, not per entry),
    at most :data:`NOTE_NAMES` names of :data:`NOTE_PLACES` places each, then how many more."""
    seen: dict[tuple[str, str, str], tuple[Unchecked, list[str]]] = {}
    for u in sorted(unchecked, key=lambda u: (u.location.file, u.location.line, u.location.column)):
        where = str(u.location) if u.location.line else u.location.file
        # One line per name and kind of hint (a name under two models says two things).
        key = (u.what, *u.hint.key)
        seen.setdefault(key, (u, []))[1].append(where)
    count = len({what for what, _, _ in seen})
    lines = [
        f"the catalogue does not know {count} name{'s' * (count != 1)}, accepted as written: "
        f"plan checks {'them' if count != 1 else 'it'} against what the host offers"
    ]
    for first, places in list(seen.values())[:NOTE_NAMES]:
        hint = str(first.hint)
        shown = ", ".join(places[:NOTE_PLACES])
        if len(places) > NOTE_PLACES:
            shown += f" and {len(places) - NOTE_PLACES:,} more"
        lines.append(f"  {shown}: {first.what}" + (f" ({hint})" if hint else ""))
    if len(seen) > NOTE_NAMES:
        lines.append(f"  … and {len(seen) - NOTE_NAMES:,} more")
    return "\n".join(lines)
