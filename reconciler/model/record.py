"""``record``: :func:`dataclasses.dataclass` for vgpuctl's own types, cheaper to define.

Every class of vgpuctl that ``dataclasses`` would make is made with ``@record(...)`` instead, with
the same arguments. The classes behave as dataclasses do — ``dataclasses.fields``,
``replace``, ``asdict`` and ``is_dataclass`` work on them, and the type checker sees
``dataclasses.dataclass`` itself — but defining one costs a tenth as much.

Why: CPython 3.11's ``dataclass`` writes every method it adds as source text and compiles it,
six of them for a frozen class. A cold ``vgpuctl plan`` defines about 90 classes, and compiling
their methods was a quarter of all the instructions the process ran (callgrind: 356 M of
1,315 M in the parser and the compiler, against 163 M for the whole of ``python3 -c "import
yaml"``). Here ``dataclasses`` still collects the fields (its own rules: defaults,
``field()``, ``kw_only``, ``slots``, the mutable-default check) but generates nothing;
``__eq__``, ``__hash__``, ``__repr__``, and a frozen class's ``__setattr__``/``__delattr__``
(and, with slots, ``__getstate__``/``__setstate__``) are functions written once, below, that
read the field names the class keeps; and ``__init__`` is compiled the first time the class is
instantiated — the same code ``dataclasses`` would write (positional and keyword-only
parameters, defaults, ``default_factory``, ``init=False`` fields, ``__post_init__``), so a class
a command never instantiates costs nothing more.

What differs from ``dataclasses.dataclass``, and is held by ``tests/unit/test_record.py``
(which compares each behaviour with a real dataclass): ``__dataclass_params__`` records what
``dataclasses`` generated (nothing: ``init``, ``repr``, ``eq`` and ``frozen`` read false);
the hash of a record with one compared field is the hash of that value, not of a 1-tuple;
``__init__`` carries no annotations (``inspect.signature`` shows the parameters, not their
types); a class without a docstring gets ``Name(field, …)`` as one, without the types; and a
frozen record refuses every attribute assignment, where a dataclass allows an
unrelated attribute on a plain subclass. Arguments other than ``frozen``, ``eq``, ``slots``
and ``kw_only`` are refused, as are ``InitVar`` fields: vgpuctl uses neither.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from operator import attrgetter
from typing import TYPE_CHECKING, Any

#: ``__init__``'s default for a parameter whose field has a ``default_factory``.
_FACTORY = object()


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


if TYPE_CHECKING:
    from dataclasses import dataclass as record
else:
    record = define

__all__ = ["define", "record"]


def _put(cls: type[Any], name: str, value: object) -> None:
    type.__setattr__(cls, name, value)


def _make(cls: type[Any], *, frozen: bool, eq: bool, slots: bool, kw_only: bool) -> type[Any]:
    body = cls.__dict__
    if frozen and ("__setattr__" in body or "__delattr__" in body):
        raise TypeError(f"cannot overwrite __setattr__ or __delattr__ in frozen {cls.__name__}")
    hash_in_body = body.get("__hash__", dataclasses.MISSING)
    explicit_hash = not (
        hash_in_body is dataclasses.MISSING or (hash_in_body is None and "__eq__" in body)
    )
    documented = body.get("__doc__") is not None
    if not documented:
        # dataclasses would write the signature, through inspect (a tenth of a class's cost).
        _put(cls, "__doc__", cls.__name__)
    # Fields, defaults, __match_args__, slots: dataclasses' own rules, with no method generated.
    cls = dataclasses.dataclass(
        cls, init=False, repr=False, eq=False, frozen=False, slots=slots, kw_only=kw_only
    )
    every = cls.__dataclass_fields__.values()
    if any(_is_initvar(f.type) for f in every):
        raise TypeError(f"{cls.__name__}: InitVar fields are not supported by record")
    fields = dataclasses.fields(cls)
    _check_order(cls, fields)
    if not documented:
        _put(cls, "__doc__", f"{cls.__name__}({', '.join(f.name for f in fields)})")
    body = cls.__dict__
    if "__init__" not in body:
        _put(cls, "__init__", _first_init(cls, frozen))
    if "__repr__" not in body:
        _put(cls, "__record_repr__", tuple(f.name for f in fields if f.repr))
        _put(cls, "__repr__", _repr)
    if eq:
        if "__eq__" not in body:
            _put(cls, "__record_eq__", _key(f.name for f in fields if f.compare))
            _put(cls, "__eq__", _eq)
        if not explicit_hash:
            if frozen:
                hashed = (f.name for f in fields if (f.compare if f.hash is None else f.hash))
                _put(cls, "__record_hash__", _key(hashed))
                _put(cls, "__hash__", _hash)
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


def _is_initvar(kind: object) -> bool:
    if isinstance(kind, str):  # postponed annotations: the text as written
        return kind.startswith(("InitVar", "dataclasses.InitVar"))
    return isinstance(kind, dataclasses.InitVar) or kind is dataclasses.InitVar


def _has_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _check_order(cls: type[Any], fields: tuple[dataclasses.Field[Any], ...]) -> None:
    """What ``dataclasses`` checks when it writes ``__init__``, checked when the class is made."""
    seen_default = False
    for f in fields:
        if not f.init or f.kw_only:
            continue
        if _has_default(f):
            seen_default = True
        elif seen_default:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")
        if f.name == "self":
            raise TypeError(f"{cls.__name__}: a field named 'self' is not supported by record")


def _key(names: Any) -> Callable[[Any], Any] | None:
    """The values an instance is compared or hashed by (``None``: no field takes part)."""
    names = tuple(names)
    return attrgetter(*names) if names else None


def _first_init(cls: type[Any], frozen: bool) -> Callable[..., None]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init = _compile_init(cls, frozen)
        _put(cls, "__init__", init)
        init(self, *args, **kwargs)

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    return __init__


def _compile_init(cls: type[Any], frozen: bool) -> Callable[..., None]:
    """The ``__init__`` ``dataclasses`` would write for ``cls``, compiled now."""
    scope: dict[str, Any] = {"__record_set": object.__setattr__, "__record_factory": _FACTORY}
    positional: list[str] = []
    keyword: list[str] = []
    lines: list[str] = []
    for f in dataclasses.fields(cls):
        name = f.name
        value = name
        if f.default is not dataclasses.MISSING:
            scope[f"__record_default_{name}"] = f.default
            default = f"=__record_default_{name}"
            if not f.init:
                value = f"__record_default_{name}"
        elif f.default_factory is not dataclasses.MISSING:
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
    exec(source, scope)  # noqa: S102 - text built above from field names only
    init: Callable[..., None] = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    return init


def _repr(self: Any) -> str:
    names = type(self).__record_repr__
    args = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
    return f"{type(self).__qualname__}({args})"


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is self.__class__:
        key = self.__class__.__record_eq__
        return True if key is None else key(self) == key(other)
    return NotImplemented


def _hash(self: Any) -> int:
    key = self.__class__.__record_hash__
    return hash(() if key is None else key(self))


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def _getstate(self: Any) -> list[Any]:
    return [getattr(self, f.name) for f in dataclasses.fields(self)]


def _setstate(self: Any, state: list[Any]) -> None:
    for f, value in zip(dataclasses.fields(self), state, strict=False):
        object.__setattr__(self, f.name, value)
