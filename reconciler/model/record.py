"""``record``: :func:`dataclasses.dataclass` for vgpuctl's own types, cheaper to define.

Every class of vgpuctl that ``dataclasses`` would make is made with ``@record(...)`` instead, with
the same arguments, and ``field``, ``fields`` and ``replace`` come from here too. The type checker
sees ``dataclasses`` itself (this module hands it ``dataclasses.dataclass``, ``field``, ``fields``
and ``replace`` under those names), and at run time the classes behave as dataclasses do —
``dataclasses.fields``, ``replace``, ``asdict`` and ``is_dataclass`` work on them too — but
defining one costs a small fraction as much, and a command that uses none of ``dataclasses``'
own functions never imports it.

Why: CPython 3.11's ``dataclass`` writes every method it adds as source text and compiles it,
six of them for a frozen class, and collects the fields with checks that import ``inspect``
(and with it ``ast``, ``dis`` and ``tokenize``). A cold ``vgpuctl plan`` defines about 90
classes: compiling their methods was a quarter of all the instructions the process ran
(callgrind: 356 M of 1,315 M, against 163 M for the whole of ``python3 -c "import yaml"``), and
collecting their fields and importing ``inspect`` a tenth of what was left. Here the fields
are collected by :func:`_make` with ``dataclasses``' rules (defaults and ``field()``,
``ClassVar`` left out, inherited fields first, ``kw_only``, ``slots``, the mutable-default
check, a non-default parameter after a default refused); ``__repr__`` and a frozen class's
``__setattr__``/``__delattr__`` (and, with slots, ``__getstate__``/``__setstate__``) are
functions written once, below, that read the field names the class keeps; and ``__init__``,
``__eq__`` and ``__hash__`` are compiled the first time each is called, as the code
``dataclasses`` would write (for ``__init__``: positional and keyword-only parameters,
defaults, ``default_factory``, ``init=False`` fields, ``__post_init__``), so a class a command
never instantiates or compares costs nothing more (compiled code reads slots faster than a
function shared by every class could: a fleet's plan hashes millions of addresses).
``__dataclass_fields__`` (what ``dataclasses``' functions read) is made on first access, from
``dataclasses.Field`` objects.

What differs from ``dataclasses.dataclass``, and is held by ``tests/unit/test_record.py``
(which compares each behaviour with a real dataclass): there is no ``__dataclass_params__``
(so a real ``@dataclass`` cannot subclass a record); ``__init__`` carries no annotations
(``inspect.signature`` shows the parameters, not their types); a class without a docstring gets
``Name(field, …)`` as one, without the types; and a frozen record refuses every attribute
assignment, where a dataclass allows an unrelated attribute on a plain subclass. Arguments
other than ``frozen``, ``eq``, ``slots`` and ``kw_only`` are refused, as are ``InitVar``
fields and ``KW_ONLY`` markers: vgpuctl uses none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, get_origin


class _Missing:
    """No default (``dataclasses.MISSING``'s role)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
#: ``__init__``'s default for a parameter whose field has a ``default_factory``.
_FACTORY = object()
_NO_METADATA: Mapping[Any, Any] = MappingProxyType({})


class RecordField:
    """One field of a record: what ``dataclasses.Field`` says of one, under the same names.
    Made by ``field(...)`` (this class: ``dataclasses.field``'s keyword parameters)."""

    __slots__ = (
        "compare",
        "default",
        "default_factory",
        "hash",
        "init",
        "kw_only",
        "metadata",
        "name",
        "repr",
        "type",
    )

    def __init__(
        self,
        *,
        default: Any = MISSING,
        default_factory: Any = MISSING,
        init: bool = True,
        repr: bool = True,
        hash: bool | None = None,
        compare: bool = True,
        metadata: Mapping[Any, Any] | None = None,
        kw_only: Any = MISSING,
    ) -> None:
        if default is not MISSING and default_factory is not MISSING:
            raise ValueError("cannot specify both default and default_factory")
        self.name = ""
        self.type: Any = None
        self.default = default
        self.default_factory = default_factory
        self.init = init
        self.repr = repr
        self.hash = hash
        self.compare = compare
        self.metadata = _NO_METADATA if metadata is None else MappingProxyType(dict(metadata))
        self.kw_only = kw_only

    def _named(self, name: str, kind: Any, kw_only: bool) -> RecordField:
        made = RecordField(
            default=self.default,
            default_factory=self.default_factory,
            init=self.init,
            repr=self.repr,
            hash=self.hash,
            compare=self.compare,
            metadata=self.metadata,
            kw_only=kw_only if self.kw_only is MISSING else self.kw_only,
        )
        made.name = name
        made.type = kind
        return made

    def __repr__(self) -> str:
        return f"RecordField(name={self.name!r}, type={self.type!r}, default={self.default!r})"


def define(
    cls: type[Any] | None = None,
    /,
    *,
    frozen: bool = False,
    eq: bool = True,
    slots: bool = False,
    kw_only: bool = False,
) -> Any:
    """``@record`` / ``@record(frozen=..., eq=..., slots=..., kw_only=...)``."""

    def wrap(cls: type[Any]) -> type[Any]:
        return _make(cls, frozen=frozen, eq=eq, slots=slots, kw_only=kw_only)

    return wrap if cls is None else wrap(cls)


def record_fields(class_or_instance: Any) -> tuple[RecordField, ...]:
    """``fields(...)``: the fields of a record (class or instance), in order."""
    try:
        found: tuple[RecordField, ...] = class_or_instance.__record_fields__
    except AttributeError:
        raise TypeError("must be called with a record type or instance") from None
    return found


def record_replace(obj: Any, /, **changes: Any) -> Any:
    """``replace(obj, **changes)``: a new record of ``obj``'s class, ``changes`` applied."""
    for f in record_fields(obj):
        if not f.init:
            if f.name in changes:
                raise ValueError(
                    f"field {f.name} is declared with init=False, it cannot be specified with "
                    "replace()"
                )
            continue
        if f.name not in changes:
            changes[f.name] = getattr(obj, f.name)
    return obj.__class__(**changes)


if TYPE_CHECKING:
    from dataclasses import dataclass as record
    from dataclasses import field, fields, replace
else:
    record = define
    field = RecordField
    fields = record_fields
    replace = record_replace

__all__ = ["MISSING", "RecordField", "define", "field", "fields", "record", "replace"]


def _put(cls: type[Any], name: str, value: object) -> None:
    type.__setattr__(cls, name, value)


def _make(cls: type[Any], *, frozen: bool, eq: bool, slots: bool, kw_only: bool) -> type[Any]:
    body = dict(cls.__dict__)
    if frozen and ("__setattr__" in body or "__delattr__" in body):
        raise TypeError(f"cannot overwrite __setattr__ or __delattr__ in frozen {cls.__name__}")
    hash_in_body = body.get("__hash__", MISSING)
    explicit_hash = not (hash_in_body is MISSING or (hash_in_body is None and "__eq__" in body))
    fields = _collect(cls, body, kw_only)
    _check_order(cls, fields)
    if slots:
        cls = _with_slots(cls, body, fields)
    body = dict(cls.__dict__)
    _put(cls, "__record_fields__", fields)
    _put(cls, "__dataclass_fields__", _DataclassFields())
    if "__match_args__" not in body:
        _put(cls, "__match_args__", tuple(f.name for f in fields if f.init and not f.kw_only))
    if body.get("__doc__") is None:
        _put(cls, "__doc__", f"{cls.__name__}({', '.join(f.name for f in fields)})")
    if "__init__" not in body:
        _put(cls, "__init__", _on_first_use(cls, "__init__", lambda: _init_source(cls, frozen)))
    if "__repr__" not in body:
        _put(cls, "__record_repr__", tuple(f.name for f in fields if f.repr))
        _put(cls, "__repr__", _repr)
    if eq:
        if "__eq__" not in body:
            compared = [f.name for f in fields if f.compare]
            _put(cls, "__eq__", _on_first_use(cls, "__eq__", lambda: (_eq_source(compared), {})))
        if not explicit_hash:
            if frozen:
                hashed = [f.name for f in fields if (f.compare if f.hash is None else f.hash)]
                hashing = _on_first_use(cls, "__hash__", lambda: (_hash_source(hashed), {}))
                _put(cls, "__hash__", hashing)
            else:
                _put(cls, "__hash__", None)
    if frozen:
        _put(cls, "__setattr__", _frozen_setattr)
        _put(cls, "__delattr__", _frozen_delattr)
        if slots:
            if "__getstate__" not in body:
                _put(cls, "__getstate__", _getstate)
            if "__setstate__" not in body:
                _put(cls, "__setstate__", _setstate)
    return cls


def _collect(cls: type[Any], body: dict[str, Any], kw_only: bool) -> tuple[RecordField, ...]:
    """The fields of ``cls``: its record bases' first, then its own annotations in order (a
    field declared again keeps its place), and the class attributes set as ``dataclasses``
    leaves them (a plain default stays, a ``field()`` gives way to its default or to none)."""
    found: dict[str, RecordField] = {}
    for base in cls.__mro__[-1:0:-1]:
        for f in base.__dict__.get("__record_fields__", ()):
            found[f.name] = f
    annotations: dict[str, Any] = body.get("__annotations__", {})
    for name, kind in annotations.items():
        if _is_classvar(kind):
            continue
        if _is_special(kind):
            raise TypeError(
                f"{cls.__name__}.{name}: InitVar and KW_ONLY are not supported by record"
            )
        value = _own_field(body.get(name, MISSING))
        if isinstance(value, RecordField):
            made = value._named(name, kind, kw_only)
            if made.default is MISSING:
                if name in body:
                    type.__delattr__(cls, name)
            else:
                _put(cls, name, made.default)
        else:
            made = RecordField(default=value)._named(name, kind, kw_only)
        default = made.default
        if default is not MISSING and type(default).__hash__ is None:
            raise ValueError(
                f"mutable default {type(default)} for field {name} is not allowed: use "
                "default_factory"
            )
        found[name] = made
    for name, value in body.items():
        if isinstance(_own_field(value), RecordField) and name not in annotations:
            raise TypeError(f"{name!r} is a field but has no type annotation")
    return tuple(found.values())


def _own_field(value: Any) -> Any:
    """A ``dataclasses.field()`` in a record's body as the :class:`RecordField` it means."""
    kind = type(value)
    if kind.__name__ != "Field" or kind.__module__ != "dataclasses":
        return value
    import dataclasses

    def mine(v: Any) -> Any:
        return MISSING if v is dataclasses.MISSING else v

    return RecordField(
        default=mine(value.default),
        default_factory=mine(value.default_factory),
        init=value.init,
        repr=value.repr,
        hash=value.hash,
        compare=value.compare,
        metadata=value.metadata,
        kw_only=mine(value.kw_only),
    )


def _is_classvar(kind: Any) -> bool:
    if isinstance(kind, str):  # postponed annotations: the text as written
        return kind.startswith(("ClassVar[", "typing.ClassVar[")) or kind in (
            "ClassVar",
            "typing.ClassVar",
        )
    return kind is ClassVar or get_origin(kind) is ClassVar


def _is_special(kind: Any) -> bool:
    if isinstance(kind, str):
        return kind.startswith(("InitVar", "dataclasses.InitVar")) or kind in (
            "KW_ONLY",
            "dataclasses.KW_ONLY",
        )
    module = getattr(type(kind), "__module__", "")
    return module == "dataclasses" or getattr(kind, "__module__", "") == "dataclasses"


def _check_order(cls: type[Any], fields: tuple[RecordField, ...]) -> None:
    """What ``dataclasses`` checks when it writes ``__init__``, checked when the class is made."""
    seen_default = False
    for f in fields:
        if not f.init or f.kw_only:
            continue
        if f.default is not MISSING or f.default_factory is not MISSING:
            seen_default = True
        elif seen_default:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")
        if f.name == "self":
            raise TypeError(f"{cls.__name__}: a field named 'self' is not supported by record")


def _with_slots(cls: type[Any], body: dict[str, Any], fields: tuple[RecordField, ...]) -> type[Any]:
    """``cls`` made again with ``__slots__`` for its fields (those no base has a slot for), as
    ``dataclasses`` does for ``slots=True``."""
    inherited: set[str] = set()
    for base in cls.__mro__[1:-1]:
        slots = base.__dict__.get("__slots__", ())
        inherited.update((slots,) if isinstance(slots, str) else slots)
    names = [f.name for f in fields]
    made = {
        k: v for k, v in body.items() if k not in names and k not in ("__dict__", "__weakref__")
    }
    made["__slots__"] = tuple(n for n in names if n not in inherited)
    metaclass: Any = type(cls)
    new: type[Any] = metaclass(cls.__name__, cls.__bases__, made)
    new.__qualname__ = cls.__qualname__
    return new


class _DataclassFields:
    """``__dataclass_fields__``, made on first access: what ``dataclasses.fields``,
    ``replace``, ``asdict`` and ``is_dataclass`` read (``dataclasses.Field`` objects), for
    callers of those; vgpuctl's own code reads ``__record_fields__``."""

    def __get__(self, instance: Any, owner: type[Any]) -> dict[str, Any]:
        import dataclasses

        made: dict[str, Any] = {}
        for f in record_fields(owner):
            same: Any = dataclasses.field(
                default=dataclasses.MISSING if f.default is MISSING else f.default,
                default_factory=(
                    dataclasses.MISSING if f.default_factory is MISSING else f.default_factory
                ),
                init=f.init,
                repr=f.repr,
                hash=f.hash,
                compare=f.compare,
                metadata=f.metadata,
                kw_only=f.kw_only,
            )
            same.name = f.name
            same.type = f.type
            # What dataclasses marks a true field with (not a ClassVar or InitVar pseudo-field).
            same._field_type = dataclasses._FIELD  # type: ignore[attr-defined]
            made[f.name] = same
        if "__record_fields__" in owner.__dict__:
            _put(owner, "__dataclass_fields__", made)
        return made


def _eq_source(names: list[str]) -> str:
    """``__eq__`` as ``dataclasses`` writes it: same class, then the compared fields in order."""
    mine = "".join(f"self.{n}," for n in names)
    theirs = "".join(f"other.{n}," for n in names)
    return (
        "def __eq__(self, other):\n"
        "    if other.__class__ is self.__class__:\n"
        f"        return ({mine})==({theirs})\n"
        "    return NotImplemented\n"
    )


def _hash_source(names: list[str]) -> str:
    """``__hash__`` as ``dataclasses`` writes it: the hash of the hashed fields' tuple."""
    return f"def __hash__(self):\n    return hash(({''.join(f'self.{n},' for n in names)}))\n"


def _on_first_use(
    cls: type[Any], name: str, source: Callable[[], tuple[str, dict[str, Any]]]
) -> Callable[..., Any]:
    """Method ``name`` of ``cls``, compiled from ``source()`` (its text and the names it
    reads) the first time it is called, then kept on ``cls``: compiled code reads slots faster
    than any function written once for every class (a fleet's plan compares and hashes
    millions of addresses), and a class whose instances are never made or compared costs
    nothing. ``source`` is read then, as ``dataclasses`` would have read the class."""

    def first(self: Any, *args: Any, **kwargs: Any) -> Any:
        text, scope = source()
        exec(text, scope)  # noqa: S102 - text built from field names only
        method = scope[name]
        method.__qualname__ = f"{cls.__qualname__}.{name}"
        method.__module__ = cls.__module__
        _put(cls, name, method)
        return method(self, *args, **kwargs)

    first.__qualname__ = f"{cls.__qualname__}.{name}"
    return first


def _init_source(cls: type[Any], frozen: bool) -> tuple[str, dict[str, Any]]:
    """The ``__init__`` ``dataclasses`` would write for ``cls``, and the names it reads."""
    scope: dict[str, Any] = {"__record_set": object.__setattr__, "__record_factory": _FACTORY}
    positional: list[str] = []
    keyword: list[str] = []
    lines: list[str] = []
    for f in record_fields(cls):
        name = f.name
        value = name
        if f.default is not MISSING:
            scope[f"__record_default_{name}"] = f.default
            default = f"=__record_default_{name}"
            if not f.init:
                value = f"__record_default_{name}"
        elif f.default_factory is not MISSING:
            scope[f"__record_make_{name}"] = f.default_factory
            default = "=__record_factory"
            value = (
                f"__record_make_{name}() if {name} is __record_factory else {name}"
                if f.init
                else f"__record_make_{name}()"
            )
        else:
            default = ""
            if not f.init:
                continue  # no parameter, no default: left unset, as dataclasses leaves it
        if f.init:
            (keyword if f.kw_only else positional).append(name + default)
        if frozen:
            lines.append(f"    __record_set(self, {name!r}, {value})")
        else:
            lines.append(f"    self.{name} = {value}")
    if hasattr(cls, "__post_init__"):
        lines.append("    self.__post_init__()")
    params = ["self", *positional, *(["*", *keyword] if keyword else [])]
    source = f"def __init__({', '.join(params)}):\n" + ("\n".join(lines) or "    pass") + "\n"
    return source, scope


def _repr(self: Any) -> str:
    names = type(self).__record_repr__
    args = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
    return f"{type(self).__qualname__}({args})"


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    from dataclasses import FrozenInstanceError

    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    from dataclasses import FrozenInstanceError

    raise FrozenInstanceError(f"cannot delete field {name!r}")


def _getstate(self: Any) -> list[Any]:
    return [getattr(self, f.name) for f in record_fields(self)]


def _setstate(self: Any, state: list[Any]) -> None:
    for f, value in zip(record_fields(self), state, strict=False):
        object.__setattr__(self, f.name, value)
