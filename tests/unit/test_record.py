"""``reconciler.model.record`` behaves as ``dataclasses.dataclass`` does: each behaviour is
compared with a real dataclass of the same body (the oracle), not with expectations of ours."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import FrozenInstanceError, field
from pathlib import Path
from typing import Any, ClassVar

import pytest

from reconciler.model.record import define


def _pair(body: dict[str, Any], **params: Any) -> tuple[type[Any], type[Any]]:
    """The same class body made by ``dataclasses.dataclass`` and by ``record``."""
    annotations = body.get("__annotations__", {})

    def make(decorator: Any) -> type[Any]:
        namespace = {**body, "__annotations__": dict(annotations), "__module__": __name__}
        return decorator(**params)(type("Thing", (), namespace))

    return make(dataclasses.dataclass), make(define)


PLAIN = {"__annotations__": {"a": "int", "b": "str"}, "b": "x"}
FACTORY = {
    "__annotations__": {"a": "int", "items": "list[int]", "tag": "str", "hidden": "int"},
    "items": field(default_factory=list),
    "tag": field(default="t", repr=False),
    "hidden": field(default=7, init=False, compare=False),
}
PARAMS = [
    pytest.param({"frozen": True, "slots": True}, id="frozen-slots"),
    pytest.param({"frozen": True}, id="frozen"),
    pytest.param({}, id="mutable"),
    pytest.param({"slots": True}, id="mutable-slots"),
]


@pytest.mark.parametrize("params", PARAMS)
def test_instances_compare_hash_and_print_as_a_dataclass_s(params: dict[str, Any]) -> None:
    real, ours = _pair(FACTORY, **params)
    for args, kwargs in [((1,), {}), ((1, [2, 3]), {}), ((), {"a": 4, "tag": "u"})]:
        r, o = real(*args, **kwargs), ours(*args, **kwargs)
        assert repr(o) == repr(r)
        assert dataclasses.asdict(o) == dataclasses.asdict(r)
        assert o == ours(*args, **kwargs)
        assert (o == ours(99)) is (r == real(99))
        assert o.__eq__(r) is NotImplemented  # another class, as a dataclass says
        if params.get("frozen"):
            # Hashed by the fields, as a dataclass is: a list field makes both unhashable.
            with pytest.raises(TypeError, match="unhashable type: 'list'"):
                hash(r)
            with pytest.raises(TypeError, match="unhashable type: 'list'"):
                hash(o)
        else:
            assert type(o).__hash__ is None and type(r).__hash__ is None
    # A fresh list each time (default_factory), the init=False field set from its default.
    first, second = ours(1), ours(1)
    assert first.items == [] and first.items is not second.items and first.hidden == 7
    # compare=False: not part of equality.
    if not params.get("frozen"):
        second.hidden = 8
        assert first == second


@pytest.mark.parametrize("params", PARAMS)
def test_the_dataclasses_api_works_on_records(params: dict[str, Any]) -> None:
    real, ours = _pair(PLAIN, **params)
    assert dataclasses.is_dataclass(ours)
    assert [f.name for f in dataclasses.fields(ours)] == [f.name for f in dataclasses.fields(real)]
    assert ours.__match_args__ == real.__match_args__ == ("a", "b")
    changed = dataclasses.replace(ours(1), b="y")
    assert (changed.a, changed.b) == (1, "y") and type(changed) is ours
    assert dataclasses.astuple(ours(1)) == dataclasses.astuple(real(1)) == (1, "x")
    with pytest.raises(TypeError) as ours_error:
        ours(1, "b", 3)
    with pytest.raises(TypeError) as real_error:
        real(1, "b", 3)
    assert "positional argument" in str(ours_error.value) and "positional" in str(real_error.value)
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'a'"):
        ours()


@pytest.mark.parametrize("slots", [True, False])
def test_a_frozen_record_refuses_assignment_and_deletion(slots: bool) -> None:
    real, ours = _pair(PLAIN, frozen=True, slots=slots)
    for thing in (real(1), ours(1)):
        with pytest.raises(FrozenInstanceError, match="cannot assign to field 'a'"):
            thing.a = 2
        with pytest.raises(FrozenInstanceError, match="cannot delete field 'a'"):
            del thing.a
        assert thing.a == 1
    assert not hasattr(ours(1), "__dict__") if slots else hasattr(ours(1), "__dict__")


def test_records_survive_copy_and_deepcopy() -> None:
    for thing in (Point(1, 2), Tagged(1, ("a",))):
        assert hash(thing) == hash(copy.copy(thing)) != hash(Point(2, 1))
        assert copy.deepcopy(thing) == thing and copy.copy(thing) == thing


def test_keyword_only_fields_are_keyword_only() -> None:
    real, ours = _pair(PLAIN, frozen=True, slots=True, kw_only=True)
    assert repr(ours(a=1)) == repr(real(a=1))
    with pytest.raises(TypeError, match="positional"):
        ours(1)
    with pytest.raises(TypeError, match="positional"):
        real(1)


def test_post_init_runs_after_the_fields_are_set() -> None:
    seen: list[tuple[int, str]] = []

    def post_init(self: Any) -> None:
        seen.append((self.a, self.b))
        object.__setattr__(self, "b", self.b.upper())

    body = {**PLAIN, "__post_init__": post_init}
    real, ours = _pair(body, frozen=True, slots=True)
    assert ours(1).b == real(1).b == "X"
    assert seen == [(1, "x"), (1, "x")]


def test_methods_written_in_the_body_are_kept() -> None:
    body = {
        **PLAIN,
        "__repr__": lambda self: "mine",
        "__eq__": lambda self, other: True,
        "__hash__": lambda self: 5,
    }
    real, ours = _pair(body, frozen=True, slots=True)
    for cls in (real, ours):
        assert repr(cls(1)) == "mine" and cls(1) == cls(2) and hash(cls(1)) == 5


def test_eq_false_keeps_identity() -> None:
    real, ours = _pair(PLAIN, eq=False, slots=True)
    for cls in (real, ours):
        one = cls(1)
        assert one.__eq__(one) is True and one != cls(1) and hash(one) == object.__hash__(one)


def test_a_subclass_record_adds_its_fields_after_the_base_s() -> None:
    assert Labelled(1, 2, "here") == Labelled(1, 2, "here")
    assert repr(Labelled(1, 2, "here")) == "Labelled(x=1, y=2, label='here')"
    assert Point(1, 2) != Labelled(1, 2, "here")  # another class
    assert [f.name for f in dataclasses.fields(Labelled)] == ["x", "y", "label"]


def test_the_same_mistakes_are_refused_when_the_class_is_made() -> None:
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
        define(type("Bad", (), {"__annotations__": {"a": "int", "b": "int"}, "a": 1}))
    with pytest.raises(ValueError, match="mutable default"):
        define(type("Bad", (), {"__annotations__": {"a": "list[int]"}, "a": []}))
    with pytest.raises(TypeError, match="InitVar"):
        define(type("Bad", (), {"__annotations__": {"a": "InitVar[int]"}}))
    with pytest.raises(TypeError, match="cannot overwrite __setattr__"):
        define(frozen=True)(type("Bad", (), {"__setattr__": lambda s, n, v: None}))


def test_eq_and_hash_are_compiled_on_first_use_and_then_kept() -> None:
    cls = define(frozen=True, slots=True)(
        type("Lazy", (), {"__annotations__": {"a": "int", "b": "str"}, "__module__": __name__})
    )
    eq, hash_ = cls.__dict__["__eq__"], cls.__dict__["__hash__"]
    assert cls(1, "x") == cls(1, "x") and cls(1, "x") != cls(1, "y")
    assert hash(cls(1, "x")) == hash((1, "x"))  # as a dataclass hashes: the fields' tuple
    assert cls.__dict__["__eq__"] is not eq and cls.__dict__["__hash__"] is not hash_
    assert cls(2, "z") == cls(2, "z") and hash(cls(2, "z")) == hash((2, "z"))


def test_init_is_compiled_on_first_use_and_then_kept() -> None:
    cls = define(frozen=True, slots=True)(
        type("Lazy", (), {"__annotations__": {"a": "int"}, "__module__": __name__})
    )
    placeholder = cls.__dict__["__init__"]
    assert cls(1).a == 1
    compiled = cls.__dict__["__init__"]
    assert compiled is not placeholder
    assert cls(2).a == 2 and cls.__dict__["__init__"] is compiled


@define(frozen=True, slots=True)
class Point:
    x: int
    y: int


@define(frozen=True, slots=True)
class Labelled(Point):
    label: str


@define(frozen=True)
class Tagged:
    x: int
    tags: tuple[str, ...] = field(default_factory=tuple)


def test_vgpuctl_s_own_classes_are_records() -> None:
    """A ``@dataclass`` in the product would bring back the compile cost at every start, and
    ``dataclasses`` itself the import of ``inspect``: ``field``, ``fields`` and ``replace``
    come from record too."""
    root = Path(__file__).resolve().parents[2] / "reconciler"
    found = [
        f"{path.relative_to(root.parent)}:{number}"
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if line.lstrip().startswith(("@dataclass", "from dataclasses import", "import dataclasses"))
        or "dataclasses.dataclass(" in line
    ]
    # record.py itself hands the classes to dataclasses.dataclass, with nothing to generate.
    assert [f for f in found if not f.startswith("reconciler/model/record.py:")] == []


def test_record_s_own_field_fields_and_replace_mean_what_dataclasses_do() -> None:
    from reconciler.model.record import field as own_field
    from reconciler.model.record import fields as own_fields
    from reconciler.model.record import replace as own_replace

    @define(frozen=True, slots=True)
    class Own:
        kind: ClassVar[str] = "own"
        a: int
        items: tuple[int, ...] = own_field(default_factory=tuple)
        tag: str = own_field(default="t", repr=False, compare=False)
        hidden: int = own_field(default=7, init=False)

    @dataclasses.dataclass(frozen=True, slots=True)
    class Real:
        a: int
        items: tuple[int, ...] = field(default_factory=tuple)
        tag: str = field(default="t", repr=False, compare=False)
        hidden: int = field(default=7, init=False)

    assert repr(Own(1)) == repr(Real(1)).replace("Real", "Own")
    assert Own(1, tag="x") == Own(1) and Own(1, (2,)) != Own(1)
    seen = [(f.name, f.init, f.repr, f.compare, f.default) for f in own_fields(Own)]
    real = [(f.name, f.init, f.repr, f.compare, f.default) for f in dataclasses.fields(Real)]
    assert [s[:4] for s in seen] == [r[:4] for r in real]
    assert [s[4] for s in seen[2:]] == [r[4] for r in real[2:]] == ["t", 7]
    changed = own_replace(Own(1, (2,)), a=5)
    assert (changed.a, changed.items, changed.tag, changed.hidden) == (5, (2,), "t", 7)
    with pytest.raises(ValueError, match="init=False"):
        own_replace(Own(1), hidden=1)
    with pytest.raises(ValueError, match="init=False"):
        dataclasses.replace(Real(1), hidden=1)
    with pytest.raises(TypeError, match="record type or instance"):
        own_fields(object())
    # A ClassVar is not a field, and keeps its value on the class.
    assert [f.name for f in dataclasses.fields(Own)] == ["a", "items", "tag", "hidden"]
    assert Own.kind == "own" and Own(1).kind == "own"
