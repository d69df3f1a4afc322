"""Load desired-state files into one :class:`Desired`, or report every problem in them.

The shell of ``desired``: read → schema → normalise → merge → offline checks, each stage adding
located problems instead of stopping at the first. ``vgpuctl validate`` prints them; ``plan``
and ``apply`` get a :class:`Desired` or a :class:`ValidationError` carrying all of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from reconciler.catalog import Catalog
from reconciler.desired.checks import Unchecked, gpu_problems
from reconciler.desired.normalise import FileEntry, normalise
from reconciler.desired.shape import shape_problems
from reconciler.desired.source import (
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


def load_desired(paths: Sequence[Path], *, catalog: Catalog, directories: bool = False) -> Desired:
    """The desired state the files describe together (nodes merge across files).

    With ``directories``, a directory stands for its desired-state files (see
    :func:`directory_files`); without, a directory is reported as a problem.
    Raises :class:`ValidationError` whose ``problems`` are every problem found, in file order.
    """
    return _raise_if_invalid(*_load(paths, catalog=catalog, directories=directories))


def validate_files(
    paths: Sequence[Path], *, catalog: Catalog, directories: bool = False
) -> list[Problem]:
    """Every problem in the files (empty when they are valid): ``vgpuctl validate``."""
    return _load(paths, catalog=catalog, directories=directories)[1]


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
    paths: Sequence[Path], *, catalog: Catalog, directories: bool = False
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
    read = [read_document(path, directory=listed_in.get(path)) for path in files]
    desired, found = _combine(read, files=tuple(str(p) for p in files), catalog=catalog)
    if problems:
        return None, problems + found
    return desired, found


def _combine(
    read: Sequence[tuple[Document | None, list[Problem]]],
    *,
    files: tuple[str, ...],
    catalog: Catalog,
) -> tuple[Desired | None, list[Problem]]:
    problems: list[Problem] = []
    entries: list[FileEntry] = []
    for document, found in read:
        problems.extend(found)
        if document is None:
            continue
        shape = shape_problems(document)
        problems.extend(p for _, p in shape)
        entry = normalise(document, catalog=catalog, broken={where for where, _ in shape})
        problems.extend(entry.problems)
        entries.append(entry)

    nodes: dict[str, DesiredNode] = {}
    defined: dict[tuple[str, PciAddress], SourceLocation] = {}
    unchecked: list[Unchecked] = []
    for file in entries:
        for node in file.nodes:
            gpus: list[DesiredGpu] = []
            for gpu_entry in node.gpus:
                gpu = gpu_entry.gpu
                first = defined.get((node.name, gpu.address))
                if first is not None:
                    there = str(first) if first.line else first.file
                    message = f"GPU {gpu.address} on node {node.name} is already defined at {there}"
                    problems.append(problem_at(gpu_entry.location, message))
                    continue
                defined[(node.name, gpu.address)] = gpu_entry.location
                findings = gpu_problems(gpu_entry, catalog=catalog)
                problems.extend(findings.problems)
                unchecked.extend(findings.unchecked)
                gpus.append(gpu)
            known = nodes.get(node.name)
            if known is None:
                nodes[node.name] = DesiredNode(node.name, tuple(gpus), node.location)
            else:
                nodes[node.name] = DesiredNode(node.name, known.gpus + tuple(gpus), known.location)

    order = {name: i for i, name in reversed(list(enumerate(files)))}
    problems.sort(key=lambda p: (order.get(p.file or "", -1), p.line or 0, p.column or 0))
    if problems:
        return None, problems
    name = next((f.name for f in entries if f.name), "")
    notes = (unchecked_note(unchecked),) if unchecked else ()
    return Desired(name=name, nodes=MappingProxyType(nodes), files=files, notes=notes), []


def unchecked_note(unchecked: Sequence[Unchecked]) -> str:
    """One line for every name the catalogue could not vouch for (said once, not per entry)."""
    seen: dict[str, list[str]] = {}
    for u in sorted(unchecked, key=lambda u: (u.location.file, u.location.line, u.location.column)):
        where = str(u.location) if u.location.line else u.location.file
        hint = f" ({u.hint})" if u.hint else ""
        seen.setdefault(f"{u.what}{hint}", []).append(where)
    count = len(seen)
    lines = [
        f"the catalogue does not know {count} name{'s' * (count != 1)}, accepted as written: "
        f"plan checks {'them' if count != 1 else 'it'} against what the host offers"
    ]
    lines += [f"  {', '.join(places)}: {what}" for what, places in seen.items()]
    return "\n".join(lines)
