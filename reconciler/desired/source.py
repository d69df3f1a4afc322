"""Read one desired-state file into plain data plus where every value was written.

First stage of ``desired``: bytes → text → YAML node graph (``compose``: bounded, with the
position of every node) → plain ``dict``/``list``/scalars and a position index keyed by the
JSON path of each value. The later stages (schema, normalisation, semantic checks) locate their
problems through that index. Anything wrong with the file itself (unreadable, binary, YAML
syntax, duplicate keys) becomes a located :class:`Problem`, never an exception.

Mapping keys are kept as the text written in the file: every key in this format is a name
(node, field, VF, profile), and YAML would turn ``0:`` into an int and ``0000:08:00.4:`` into a
number. Values follow the YAML 1.2 core schema, not PyYAML's YAML 1.1 default: only
``true``/``false`` are booleans and only plain numerals are numbers, so ``sriov: on`` stays the
text ``on`` and an unquoted ``address: 0000:08:00.0`` stays an address instead of the
sexagesimal number 480.0.
"""

from __future__ import annotations

import codecs
import errno
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reconciler.desired.compose import (
    MAP,
    MERGE,
    SEQ,
    STR,
    ComposeError,
    Node,
    UnsupportedValue,
    YamlList,
    YamlMapping,
    YamlScalar,
    compose,
    scalar_value,
    unsupported_tag,
)
from reconciler.model import Problem, SourceLocation
from reconciler.model.errors import excerpt
from reconciler.model.links import LeavesRootError, TooManyLinksError, resolve_beneath
from reconciler.model.record import record

#: A JSON path: mapping keys (str) and list indexes (int) from the document root.
JsonPath = tuple[str | int, ...]

#: The largest desired-state file: what a ConfigMap holds at most (1 MiB, all keys together),
#: room for 500 to 1,200 nodes of eight GPUs each (one line per VF, or a GPU per line).
MAX_BYTES = 1024 * 1024

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


@record(frozen=True, slots=True)
class Document:
    """One parsed file: its data and the 1-based (line, column) of every value and key."""

    file: str
    data: Any
    values: Mapping[JsonPath, tuple[int, int]]
    keys: Mapping[JsonPath, tuple[int, int]]
    #: The source text of scalar values, to quote the user's own spelling in messages
    #: (``sriov: on`` is the boolean ``True`` to YAML but ``'on'`` to the person who wrote it).
    texts: Mapping[JsonPath, str]

    def location(self, path: JsonPath, *, key: bool = False) -> SourceLocation:
        """Where ``path`` was written: its key when ``key`` and it has one, else its value.

        A path with no recorded position (a missing field) falls back to its nearest ancestor;
        a document made from data has none at all, and every location is line 0 ("unknown"),
        which :func:`problem_at` and the normaliser turn into no position.
        """
        probe = path
        while True:
            if key and probe in self.keys:
                line, column = self.keys[probe]
                break
            if probe in self.values:
                line, column = self.values[probe]
                break
            if not probe:
                line, column = 0, 0
                break
            probe = probe[:-1]
        return SourceLocation(self.file, line, column)

    def shown(self, path: JsonPath, value: object) -> object:
        """The value as the user wrote it, for quoting in a message."""
        return self.texts.get(path, value)


def dotted(path: JsonPath) -> str:
    """``spec.nodes.n1.gpus[0].vgpus["0000:08:00.4"]``: a path as messages show it (each key
    at most an excerpt: keys are the file's content)."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.match(part):
            out += f".{excerpt(part)}" if out else excerpt(part)
        else:
            out += '["' + excerpt(part.replace("\\", "\\\\").replace('"', '\\"')) + '"]'
    return out or "document"


def quoted(value: object) -> str:
    """``'…'``: a value the file gives, as a message may quote it: escaped, and no more than
    an excerpt (a link to a secret must not leak it into a log line or an Event)."""
    return f"'{excerpt(str(value))}'"


def problem_at(location: SourceLocation, message: str) -> Problem:
    if not location.line:
        return Problem(message, file=location.file)
    return Problem(message, file=location.file, line=location.line, column=location.column)


def known(location: SourceLocation) -> SourceLocation | None:
    """``location`` if it is a real place in a file (not a data document's line 0)."""
    return location if location.line else None


def line_ref(location: SourceLocation) -> str:
    """``line 12`` for cross-references in messages (``line ?`` where data has no lines)."""
    return f"line {location.line}" if location.line else "line ?"


def document_from_data(data: object, *, file: str) -> Document:
    """A document given as data (JSON-like), checked like a file but without positions.

    Keys become text as in a parsed file, so ``{0: "A2-4Q"}`` and ``{"0": "A2-4Q"}`` agree.
    """
    return Document(file=file, data=_plain(data), values={}, keys={}, texts={})


def _plain(value: object) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def read_document(
    path: Path, *, directory: Path | None = None
) -> tuple[Document | None, list[Problem]]:
    """Read and parse ``path``: the document (None if unusable) and every problem found.

    ``directory``: ``path`` is an entry of that desired-state directory (see
    :func:`directory_files`), read as :func:`read_within` says: links followed only to files
    inside it. A file named on its own is read wherever it (or a link to it) is.

    A document can come back together with problems (a duplicate key, a bad merge): the rest of
    it is still checked, so one run reports everything.
    """
    file = str(path)
    try:
        if directory is not None:
            raw = read_within(directory, path.name, limit=MAX_BYTES + 1)
        else:
            if path.is_dir():
                return None, [Problem("is a directory, not a desired-state file", file=file)]
            raw = read_file(path, limit=MAX_BYTES + 1)
    except LeavesDirectoryError as exc:
        return None, [Problem(exc.message, file=file)]
    except OSError as exc:
        return None, [Problem(f"cannot read: {exc.strerror or exc}", file=file)]
    if len(raw) > MAX_BYTES:
        return None, [Problem(f"larger than {MAX_BYTES // (1024 * 1024)} MiB", file=file)]
    body = raw.removeprefix(codecs.BOM_UTF8)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, column = _line_column_bytes(body, exc.start)
        message = (
            f"not UTF-8 text: byte {body[exc.start]:#04x} cannot be decoded "
            "(is this a binary file?)"
        )
        return None, [Problem(message, file=file, line=line, column=column)]
    return parse_text(text, file=file)


# -- desired-state directories -------------------------------------------------------------------
#
# A directory's files are written by whoever feeds it (a ConfigMap's editors, a git repository's
# committers) and read by vgpuctl as root: a link committed to a repository must not make vgpuctl
# read ``/etc/shadow`` and quote it in an Event. So links in a directory are followed only to
# files inside it, resolved by vgpuctl, never by the OS: the kubelet's ConfigMap layout
# (``name.yaml -> ..data/name.yaml``, ``..data -> ..2026_01_14_09_30_12.123456789``: atomic
# writer, pkg/volume/util/atomic_writer.go) and links a repository keeps between its own files
# work; git-sync's own link (``<root>/current -> .worktrees/<hash>``, publishSymlink in its
# main.go) is above the directory, in the path the operator gives, which is followed as given.

_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
#: More links than any layout above has on one path (two, in a ConfigMap volume).
_MAX_LINKS = 8
#: Entries listed in a desired-state directory before giving up: a desired state has at most
#: 1,000 files (``loader.MAX_FILES``), a ConfigMap volume adds two entries of its own, and
#: listing a directory of millions must not cost the agent its memory.
MAX_ENTRIES = 4096
_TOO_MANY_ENTRIES = (
    f"more than {MAX_ENTRIES:,} entries: not a desired-state directory (it holds 1,000 files "
    "at most)"
)


class LeavesDirectoryError(OSError):
    """A link in a desired-state directory leads outside it: not followed."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EXDEV, message)
        self.message = message


def directory_files(directory: Path) -> list[Path]:
    """The desired-state files of a directory: its ``*.yaml`` and ``*.yml`` entries that are
    files, sorted by name, not descending into subdirectories.

    A link counts when it leads to a file inside the directory; one that leads outside it is
    listed too, so that reading it says so (:func:`read_within`). Entries whose name starts
    with a dot are skipped: a ConfigMap volume keeps its real files in ``..data/`` and
    ``..<timestamp>/`` beside the ``name.yaml`` links to them, and editors keep swap and backup
    files there. Raises ``OSError`` when the directory cannot be listed or has more than
    :data:`MAX_ENTRIES` entries.
    """
    fd = os.open(directory, _DIRECTORY_FLAGS)
    try:
        names: list[str] = []
        with os.scandir(fd) as entries:
            for entry in entries:
                if len(names) == MAX_ENTRIES:
                    raise OSError(errno.EFBIG, _TOO_MANY_ENTRIES)
                names.append(entry.name)
        names.sort()
        return [
            directory / name
            for name in names
            if not name.startswith(".")
            and name.endswith((".yaml", ".yml"))
            and _is_file_within(fd, directory, name)
        ]
    finally:
        os.close(fd)


def read_within(directory: Path, name: str, *, limit: int) -> bytes:
    """At most ``limit`` bytes of the entry ``name`` of ``directory``, following links only to
    a regular file inside it (and through no link the OS would follow: a link swapped in
    meanwhile is refused, not followed). Raises :class:`LeavesDirectoryError` for a link that
    leaves it, ``OSError`` otherwise."""
    fd = os.open(directory, _DIRECTORY_FLAGS)
    try:
        rel = _resolve_within(fd, directory, name)
        file = _open_no_links(fd, rel, os.O_RDONLY | os.O_NONBLOCK)
        try:
            return _read_regular(file, limit)
        finally:
            os.close(file)
    finally:
        os.close(fd)


def read_file(path: Path, *, limit: int) -> bytes:
    """At most ``limit`` bytes of the regular file ``path`` (links followed: the operator named
    it). Never blocks: a FIFO or a device is refused, not opened for a reader that never comes."""
    file = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        return _read_regular(file, limit)
    finally:
        os.close(file)


def _read_regular(file: int, limit: int) -> bytes:
    if not stat.S_ISREG(os.fstat(file).st_mode):
        raise OSError(errno.EINVAL, "not a regular file")
    chunks, left = [], limit
    while left > 0:
        chunk = os.read(file, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _is_file_within(fd: int, directory: Path, name: str) -> bool:
    try:
        rel = _resolve_within(fd, directory, name)
    except LeavesDirectoryError:
        return True  # listed, so that reading it reports the link
    except OSError:
        return False  # dangling, a loop: not a file (as a dangling link never was)
    try:
        return stat.S_ISREG(os.stat(rel, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _resolve_within(fd: int, directory: Path, name: str) -> str:
    """``name``, with every link along it resolved inside ``directory`` (open as ``fd``): the
    path below it that passes through no link. Raises :class:`LeavesDirectoryError` when a
    link leads outside, ``FileNotFoundError`` when something on the way is missing."""
    real: list[str] = []  # the directory's real path, found once an absolute link needs it

    def read_link(here: str) -> str | None:
        try:
            return os.readlink(here, dir_fd=fd)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            return None  # not a link

    def absolute(target: str) -> str | None:
        # Inside only if it names a place below the directory's real path.
        if not real:
            real.append(os.path.realpath(directory).rstrip("/"))
        return target[len(real[0]) + 1 :] if target.startswith(real[0] + "/") else None

    try:
        rel = resolve_beneath(name, read_link, max_links=_MAX_LINKS, absolute=absolute)
    except LeavesRootError as exc:
        raise LeavesDirectoryError(_leaves(directory, exc.link, exc.target)) from None
    except TooManyLinksError:
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(directory / name)) from None
    if not rel:
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(directory / name))
    return rel


def _leaves(directory: Path, link: str, target: str) -> str:
    return (
        f"{link} is a link to {target}, outside {directory}: not read (links in a desired-state "
        "directory are followed only to files inside it)"
    )


def _open_no_links(fd: int, rel: str, flags: int) -> int:
    """Open ``rel`` below ``fd`` one directory at a time, each with ``O_NOFOLLOW``."""
    parts = rel.split("/")
    current = fd
    try:
        for part in parts[:-1]:
            following = os.open(part, _DIRECTORY_FLAGS | os.O_NOFOLLOW, dir_fd=current)
            if current != fd:
                os.close(current)
            current = following
        return os.open(
            parts[-1], flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=current
        )
    finally:
        if current != fd:
            os.close(current)


def parse_text(text: str, *, file: str) -> tuple[Document | None, list[Problem]]:
    """Parse YAML ``text``; the document (None if unusable) and every problem found in it."""
    try:
        root = compose(text)
    except ComposeError as exc:
        return None, [Problem(exc.message, file=file, line=exc.line, column=exc.column)]
    if root is None:
        message = (
            "empty document: expected a VGPUDesiredState with apiVersion, kind, metadata and spec"
        )
        return None, [Problem(message, file=file, line=1, column=1)]
    builder = _Builder(file=file)
    data = builder.build(root, ())
    document = Document(
        file=file, data=data, values=builder.values, keys=builder.keys, texts=builder.texts
    )
    return document, builder.problems


class _Builder:
    """Turns a composed node graph into plain data, recording positions on the way.

    The graph's bounds (``compose``) bound the work here: aliases are built once per use,
    which ``compose`` counted.
    """

    def __init__(self, *, file: str) -> None:
        self.file = file
        self.values: dict[JsonPath, tuple[int, int]] = {}
        self.keys: dict[JsonPath, tuple[int, int]] = {}
        self.texts: dict[JsonPath, str] = {}
        self.problems: list[Problem] = []
        self._reported: set[tuple[int, int]] = set()

    def build(self, node: Node, path: JsonPath) -> Any:
        self.values[path] = node.at
        if isinstance(node, YamlMapping):
            if node.tag not in (None, MAP):
                self._unsupported(node.at, unsupported_tag(node.tag, "a mapping"))
            return self._mapping(node, path)
        if isinstance(node, YamlList):
            if node.tag not in (None, SEQ):
                self._unsupported(node.at, unsupported_tag(node.tag, "a list"))
            return [self.build(item, (*path, i)) for i, item in enumerate(node.items)]
        if node.tag is None and node.plain and node.value == "<<":
            return node.value  # a plain ``<<`` as a value is just text
        try:
            value = scalar_value(node)
        except UnsupportedValue as exc:
            # Well-formed YAML this reader will not build (``!!python/object``, ``!!bool maybe``).
            self._unsupported(node.at, str(exc))
            return None
        if not isinstance(value, str):
            # The user's spelling, for messages (``on`` is text here, ``0x2`` the number 2).
            self.texts[path] = node.value
        return value

    def _mapping(self, node: YamlMapping, path: JsonPath) -> dict[str, Any]:
        result: dict[str, Any] = {}
        first_seen: dict[str, tuple[int, int]] = {}
        merged: dict[str, Any] = {}
        # Merged entries first, so that the positions of explicit keys (which win) are the ones
        # left in the index.
        for key_node, value_node in node.pairs:
            if _is_merge(key_node):
                merged.update(self._merge(value_node, path, merged))
        for key_node, value_node in node.pairs:
            if _is_merge(key_node):
                continue
            key_mark = key_node.at
            if not isinstance(key_node, YamlScalar):
                self._problem(key_mark, "a mapping key must be plain text, not a list or mapping")
                continue
            if key_node.tag not in (None, "!", STR):
                self._unsupported(key_mark, unsupported_tag(key_node.tag, "a key"))
            key = key_node.value
            if key in first_seen:
                # YAML would silently keep the last value; a repeated key is almost always a
                # copy-paste slip that hides one of the two entries.
                line = first_seen[key][0]
                message = (
                    f"duplicate key {quoted(key)} in {dotted(path)} (first given at line {line})"
                )
                self._problem(key_mark, message)
                continue
            first_seen[key] = key_mark
            child = (*path, key)
            self.keys[child] = key_mark
            result[key] = self.build(value_node, child)
        self.values[path] = node.at
        # Explicit keys win over merged ones (YAML merge-key semantics).
        return {**{k: v for k, v in merged.items() if k not in result}, **result}

    def _merge(self, value: Node, path: JsonPath, done: Mapping[str, Any]) -> dict[str, Any]:
        sources = value.items if isinstance(value, YamlList) else [value]
        out: dict[str, Any] = {}
        for source in sources:
            if not isinstance(source, YamlMapping):
                self._problem(source.at, "'<<' merges a mapping or a list of mappings only")
                continue
            built = self._mapping(source, path)
            # Earlier sources win in a merge list; keys already merged stay.
            out.update({k: v for k, v in built.items() if k not in out and k not in done})
        return out

    def _unsupported(self, mark: tuple[int, int], why: str) -> None:
        self._problem(mark, f"unsupported YAML: {why}")

    def _problem(self, mark: tuple[int, int], message: str) -> None:
        # An anchored node is built once per alias; its problem is reported once.
        if mark not in self._reported:
            self._reported.add(mark)
            self.problems.append(Problem(message, file=self.file, line=mark[0], column=mark[1]))


def _is_merge(key: Node) -> bool:
    """``<<`` written plain, or any key tagged ``!!merge``."""
    if not isinstance(key, YamlScalar):
        return False
    return key.tag == MERGE or (key.tag is None and key.plain and key.value == "<<")


def _line_column_bytes(raw: bytes, offset: int) -> tuple[int, int]:
    line_start = raw.rfind(b"\n", 0, offset) + 1
    # Columns count characters, as editors do, not bytes.
    column = len(raw[line_start:offset].decode("utf-8", errors="replace")) + 1
    return raw.count(b"\n", 0, offset) + 1, column
