"""YAML text → a small node graph with positions, within fixed bounds of work and memory.

Part of ``desired``'s first stage (``source`` builds plain data from the graph). A desired state
is untrusted input read by a root agent with a memory limit, so composing stops at the first
bound it passes, with one located reason, before anything grows with the input:

- at most :data:`MAX_NODES` values in the document *as built* (an alias counts as every value it
  repeats, so a "billion laughs" document is refused at the alias that crosses the bound, after
  composing a few dozen nodes);
- at most :data:`MAX_DEPTH` levels of nesting, aliases included;
- no scalar (key or value) longer than :data:`MAX_SCALAR_CHARS` characters;
- one document per file.

Events come from libyaml when PyYAML has it (ten times faster than the pure-Python parser, and
it keeps its stacks on the heap: no nesting crashes it), else from PyYAML's own parser; the
composer is ours, iterative in its bounds, and keeps per node only what ``source`` needs.

Explicit tags are read by the YAML 1.2 core schema only: ``!!str``, ``!!int``, ``!!float``,
``!!bool`` and ``!!null`` on scalars whose text is of that type, ``!!seq`` and ``!!map`` on their
own kind. Any other tag (``!!binary``, ``!!timestamp``, ``!!set``, a local ``!foo``, a
verbatim ``!<…>``) is an :class:`UnsupportedValue`, which ``source`` reports where it is written.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from functools import cache
from typing import TYPE_CHECKING, Any

from reconciler.model.errors import excerpt

if TYPE_CHECKING:
    import yaml

#: YAML nodes in one document, keys included, aliases counted as every node they repeat. A
#: 1 MiB fleet file holds 70,000 (one line per VF, as ``vgpuctl export`` writes) to 115,000
#: (a GPU per line in flow style, with counts); a document at the bound peaks at about 80 MiB in
#: ``vgpuctl watch``, well under the DaemonSet's 256 Mi limit.
MAX_NODES = 150_000
#: Levels of lists and mappings. A desired state needs 7 (``spec.nodes.N.gpus[i].vgpus``); each
#: level lengthens the position index's key of every value below it.
MAX_DEPTH = 20
#: Characters in one scalar, key or value. The longest name the format holds is a Kubernetes
#: node name (253).
MAX_SCALAR_CHARS = 1024

CORE = "tag:yaml.org,2002:"
STR, INT, FLOAT, BOOL, NULL = (CORE + t for t in ("str", "int", "float", "bool", "null"))
SEQ, MAP, MERGE = CORE + "seq", CORE + "map", CORE + "merge"

#: The YAML 1.2 core schema's plain scalars (anything else plain is text).
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
#: Larger integers are refused where they are written (no field needs more than 64 bits).
_LARGEST_INTEGER = 2**64


class YamlScalar:
    """A scalar: its text, its explicit tag (None: none written), whether it was plain."""

    __slots__ = ("at", "plain", "tag", "value")
    size = 1
    height = 0

    def __init__(self, value: str, tag: str | None, plain: bool, at: tuple[int, int]) -> None:
        self.value = value
        self.tag = tag
        self.plain = plain
        #: 1-based (line, column) where the node starts.
        self.at = at


class YamlList:
    __slots__ = ("at", "height", "items", "size", "tag")

    def __init__(self, tag: str | None, at: tuple[int, int]) -> None:
        self.tag = tag
        self.at = at
        self.items: list[Node] = []
        #: Values it stands for once built (itself included), and its levels of nesting.
        self.size = 1
        self.height = 1


class YamlMapping:
    __slots__ = ("at", "height", "pairs", "size", "tag")

    def __init__(self, tag: str | None, at: tuple[int, int]) -> None:
        self.tag = tag
        self.at = at
        self.pairs: list[tuple[Node, Node]] = []
        self.size = 1
        self.height = 1


Node = YamlScalar | YamlList | YamlMapping


class ComposeError(Exception):
    """The text is not a document this reader accepts; where and why, in one line."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column


class UnsupportedValue(ValueError):
    """A tagged value the core schema does not read (the message says why)."""


def compose(text: str) -> Node | None:
    """The single document of ``text`` as a node graph (None: no document at all).

    Raises :class:`ComposeError` for text that is not YAML, YAML syntax errors, a second
    document, and every bound above.
    """
    import yaml

    parser = _parser(text)
    try:
        return _Composer(parser).document()
    except yaml.MarkedYAMLError as exc:
        raise _syntax_error(exc, text) from None
    except yaml.reader.ReaderError as exc:
        line, column = _reader_position(text, exc.position)
        raise ComposeError(
            f"not a text file: character U+{exc.character:04X} is not allowed in YAML "
            "(is this a binary file?)",
            line,
            column,
        ) from None
    except yaml.YAMLError as exc:
        raise ComposeError(f"YAML error: {excerpt(str(exc))}") from None
    finally:
        dispose = getattr(parser, "dispose", None)
        if dispose is not None:
            dispose()


def events(text: str) -> Iterator[Any]:
    """The parser's events for ``text``, any number of documents (libyaml's parser when PyYAML
    has it: it keeps its stacks on the heap). Raises ``yaml.YAMLError`` where it refuses it."""
    parser = _parser(text)
    try:
        while parser.check_event():
            yield parser.get_event()
    finally:
        dispose = getattr(parser, "dispose", None)
        if dispose is not None:
            dispose()


def too_deep(stream: Iterable[Any], limit: int) -> tuple[int, int] | None:
    """Where (1-based line, column) the first list or mapping of an event ``stream`` nested
    deeper than ``limit`` levels starts; None when none is. For a reader that recurses once per
    level (ruamel.yaml's, in ``lint-vm``): its events, PyYAML's or ruamel.yaml's, are counted
    here first, as :class:`_Composer` counts a desired state's."""
    depth = 0
    for event in stream:
        kind = type(event).__name__
        if kind in _STARTS:
            depth += 1
            if depth > limit:
                return _at(event.start_mark)
        elif kind in _ENDS:
            depth -= 1
    return None


_STARTS = frozenset({"SequenceStartEvent", "MappingStartEvent"})
_ENDS = frozenset({"SequenceEndEvent", "MappingEndEvent"})


def scalar_value(node: YamlScalar) -> Any:
    """What a scalar means: text, or by the YAML 1.2 core schema for plain and tagged ones.

    Raises :class:`UnsupportedValue` for a tag this reader does not read, or a tagged text
    that is not of its tag's type (``!!bool maybe``, ``!!float ''``).
    """
    text, tag = node.value, node.tag
    if tag is None:
        return _implicit(text) if node.plain else text
    if tag in ("!", STR):
        return text
    if tag == INT:
        return _integer(text)
    if tag == FLOAT:
        if _FLOAT.match(text) or _INT.match(text):
            return _float(text)
        raise UnsupportedValue(f"{_shown(text)} is not a number (tag !!float)")
    if tag == BOOL:
        if _BOOL.match(text):
            return text.lower() == "true"
        raise UnsupportedValue(f"{_shown(text)} is not true or false (tag !!bool)")
    if tag == NULL:
        if _NULL.match(text):
            return None
        raise UnsupportedValue(f"{_shown(text)} is not null (tag !!null)")
    raise UnsupportedValue(unsupported_tag(tag, "text"))


def unsupported_tag(tag: str, kind: str) -> str:
    """Why ``tag`` on a ``kind`` (text, a list, a mapping, a key) is not read."""
    return (
        f"tag {shown_tag(tag)} is not supported on {kind}: a desired state is plain YAML "
        "(only !!str, !!int, !!float, !!bool, !!null on values, !!seq and !!map on lists "
        "and mappings)"
    )


def shown_tag(tag: str) -> str:
    """A tag as it is written: ``!!bool``, ``!foo``, ``!<tag:example.com,2000:x>``."""
    if tag.startswith(CORE):
        return "!!" + excerpt(tag.removeprefix(CORE), 60)
    if tag.startswith("!"):
        return excerpt(tag, 60)
    return f"!<{excerpt(tag, 60)}>"


def _implicit(text: str) -> Any:
    first = text[:1]
    if first in "tTfF" and _BOOL.match(text):
        return text.lower() == "true"
    if first in "-+0123456789" and _INT.match(text):
        return _integer(text)
    if first in "-+.0123456789" and _FLOAT.match(text):
        return _float(text)
    if first in "~nN" and _NULL.match(text):
        return None
    return text


def _integer(text: str) -> int:
    if not _INT.match(text):
        raise UnsupportedValue(f"{_shown(text)} is not an integer")
    if len(text.lstrip("-+0")) > 40:
        # Python will not even print an integer of more than 4,300 digits.
        raise UnsupportedValue(f"{_shown(text)} is too large a number")
    # YAML 1.2: "010" is ten (PyYAML's 1.1 reading would make it octal eight).
    value = int(text, 0) if text.startswith(("0x", "0o")) else int(text, 10)
    if abs(value) > _LARGEST_INTEGER:
        raise UnsupportedValue(f"{_shown(text)} is too large a number")
    return value


def _float(text: str) -> float:
    lowered = text.lower()
    if lowered.endswith(".inf"):
        return -math.inf if lowered.startswith("-") else math.inf
    if lowered == ".nan":
        return math.nan
    return float(text)


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


# --- the parser ----------------------------------------------------------------------------


def _parser(text: str) -> Any:
    """An event source for ``text``: libyaml's when PyYAML was built with it."""
    if uses_libyaml():
        from yaml._yaml import CParser

        return CParser(text)
    return _pure_python_parser()(text)


def uses_libyaml() -> bool:
    import yaml

    return bool(yaml.__with_libyaml__)


@cache
def _pure_python_parser() -> type:
    import yaml

    class PurePythonParser(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser):
        def __init__(self, text: str) -> None:
            yaml.reader.Reader.__init__(self, text)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)

    return PurePythonParser


class _Composer:
    """Events → nodes, counting as it goes (see the module's bounds)."""

    def __init__(self, parser: Any) -> None:
        import yaml

        self.parser = parser
        self.anchors: dict[str, Node] = {}
        #: Anchors of the lists and mappings being composed (an alias to one is a cycle).
        self.open: dict[str, tuple[int, int]] = {}
        #: Nodes the document stands for so far, aliases expanded.
        self.total = 0
        self.events = yaml.events

    def document(self) -> Node | None:
        events, parser = self.events, self.parser
        parser.get_event()  # the stream's start
        if parser.check_event(events.StreamEndEvent):
            return None
        parser.get_event()  # the document's start
        root = self.node(parser.get_event(), 1)
        parser.get_event()  # the document's end
        if not parser.check_event(events.StreamEndEvent):
            event = parser.get_event()
            raise ComposeError(
                "YAML syntax error: found another document (expected a single document in "
                "the stream: one desired state per file)",
                *_at(event.start_mark),
            )
        return root

    def node(self, event: Any, depth: int) -> Node:
        events = self.events
        kind = type(event)
        at = _at(event.start_mark)
        if kind is events.AliasEvent:
            return self.alias(event.anchor, depth, at)
        anchor = event.anchor
        if anchor is not None and (anchor in self.anchors or anchor in self.open):
            first = self.anchors[anchor].at if anchor in self.anchors else self.open[anchor]
            raise ComposeError(
                f"YAML syntax error: anchor &{excerpt(anchor, 60)} is defined twice "
                f"(first at line {first[0]})",
                *at,
            )
        self.count(1, at)
        node: Node
        if kind is events.ScalarEvent:
            value = event.value
            if len(value) > MAX_SCALAR_CHARS:
                raise ComposeError(
                    f"a value of {len(value):,} characters: no field takes more than "
                    f"{MAX_SCALAR_CHARS:,}",
                    *at,
                )
            # "!" (the non-specific tag) makes a scalar text, whatever it looks like.
            node = YamlScalar(value, event.tag, event.tag is None and event.implicit[0], at)
        elif kind is events.SequenceStartEvent or kind is events.MappingStartEvent:
            if depth > MAX_DEPTH:
                raise ComposeError(f"nested deeper than {MAX_DEPTH} levels", *at)
            tag = None if event.tag == "!" else event.tag
            if anchor is not None:
                self.open[anchor] = at
            if kind is events.SequenceStartEvent:
                node = self.sequence(YamlList(tag, at), depth)
            else:
                node = self.mapping(YamlMapping(tag, at), depth)
            if anchor is not None:
                del self.open[anchor]
        else:  # the parser yields no other event where a node is due
            raise ComposeError(f"YAML syntax error: unexpected {kind.__name__}", *at)
        if anchor is not None:
            self.anchors[anchor] = node
        return node

    def sequence(self, node: YamlList, depth: int) -> YamlList:
        end, get = self.events.SequenceEndEvent, self.parser.get_event
        while type(event := get()) is not end:
            item = self.node(event, depth + 1)
            node.items.append(item)
            node.size += item.size
            node.height = max(node.height, item.height + 1)
        return node

    def mapping(self, node: YamlMapping, depth: int) -> YamlMapping:
        end, get = self.events.MappingEndEvent, self.parser.get_event
        while type(event := get()) is not end:
            key = self.node(event, depth + 1)
            value = self.node(get(), depth + 1)
            node.pairs.append((key, value))
            # Keys are names, never built as values: only the value counts.
            node.size += value.size
            node.height = max(node.height, key.height + 1, value.height + 1)
        return node

    def alias(self, anchor: str, depth: int, at: tuple[int, int]) -> Node:
        target = self.anchors.get(anchor)
        name = excerpt(anchor, 60)
        if target is None:
            if anchor in self.open:
                raise ComposeError(
                    f"alias *{name} refers to the list or mapping it is in (a recursive structure)",
                    *at,
                )
            raise ComposeError(
                f"YAML syntax error: alias *{name} has no anchor &{name} before it", *at
            )
        if depth + target.height - 1 > MAX_DEPTH:
            raise ComposeError(
                f"alias *{name} nests deeper than {MAX_DEPTH} levels once expanded", *at
            )
        self.count(target.size, at, alias=name)
        return target

    def count(self, size: int, at: tuple[int, int], *, alias: str | None = None) -> None:
        self.total += size
        if self.total > MAX_NODES:
            what = f"alias *{alias} (it repeats {size:,} nodes)" if alias else "value"
            raise ComposeError(
                f"document too large: more than {MAX_NODES:,} YAML nodes by this {what}; "
                "aliases count as every node they repeat",
                *at,
            )


def _at(mark: yaml.Mark | None) -> tuple[int, int]:
    if mark is None:
        return (1, 1)
    return (mark.line + 1, mark.column + 1)


def _syntax_error(exc: yaml.MarkedYAMLError, text: str) -> ComposeError:
    mark = exc.problem_mark or exc.context_mark
    if exc.problem and "maximum nesting depth" in exc.problem:
        # libyaml 0.2.5 (PyYAML 6.0.4's wheels) stops at 1,000 levels while it scans ahead,
        # before this composer sees the 21st: the same problem, said the same way.
        return ComposeError(f"nested deeper than {MAX_DEPTH} levels", *_within(text, _at(mark)))
    # PyYAML's words can quote the document (a tag, a character): no more than an excerpt.
    problem, context = (excerpt(t) if t else t for t in (exc.problem, exc.context))
    message = f"YAML syntax error: {problem or context or 'invalid document'}"
    if context and problem and exc.context_mark is not None:
        message += f" ({context} at line {exc.context_mark.line + 1})"
    if mark is None:
        return ComposeError(message)
    return ComposeError(message, *_within(text, _at(mark)))


def _within(text: str, at: tuple[int, int]) -> tuple[int, int]:
    """``at``, or the end of the last line when it is past it (libyaml puts the end of a file
    without a final line break on the line after it)."""
    lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    if at[0] <= max(lines, 1):
        return at
    last = text.rstrip("\n").rsplit("\n", 1)[-1] if text.strip("\n") else ""
    return (max(lines, 1), len(last) + 1)


def _reader_position(text: str, position: int) -> tuple[int, int]:
    """1-based line and column of a reader error (libyaml counts bytes of UTF-8, PyYAML
    characters)."""
    if uses_libyaml():
        raw = text.encode("utf-8", errors="surrogatepass")
        head = raw[:position].decode("utf-8", errors="replace")
    else:
        head = text[:position]
    line_start = head.rfind("\n") + 1
    return head.count("\n") + 1, len(head) - line_start + 1
