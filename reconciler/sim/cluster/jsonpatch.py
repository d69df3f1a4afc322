"""RFC 6902 JSON patch as the Kubernetes API server applies it (for the emulator and fakes).

The API server's patch handler (k8s.io/apiserver pkg/endpoints/handlers/patch.go,
``jsonPatcher.applyJSPatch``) decodes the body with gopkg.in/evanphx/json-patch.v4 and applies
it to the stored object; any operation that fails makes the whole request a 422 (nothing is
written). This module follows that library's ``patch.go`` where it differs from the RFC:

- ``test`` of a key missing from an object passes when the value is ``null`` (or absent);
  a missing *parent* is an error;
- ``replace`` of a key missing from an object adds it (only array indices must exist);
- negative array indices count from the end (``SupportNegativeIndices``);
- values compare structurally; scalars by their JSON text, so ``1`` and ``1.0`` and ``true``
  differ.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

#: The most operations one patch may hold (patch.go: maxJSONPatchOperations): 413 beyond.
MAX_OPERATIONS = 10000


class JsonPatchError(Exception):
    """An operation that does not apply (the API server answers 422)."""


class JsonPatchDecodeError(Exception):
    """A body that is not a JSON patch (the API server answers 400)."""


def decode(body: bytes) -> list[dict[str, Any]]:
    """The operations of a request body: a JSON array of objects, else 400."""
    try:
        doc = json.loads(body)
    except ValueError as e:
        raise JsonPatchDecodeError(str(e)) from None
    if not isinstance(doc, list) or not all(isinstance(op, dict) for op in doc):
        kind = type(doc).__name__ if not isinstance(doc, list) else "array of non-objects"
        raise JsonPatchDecodeError(
            f"json: cannot unmarshal {kind} into Go value of type jsonpatch.Patch"
        )
    return doc


def apply(document: Any, operations: Sequence[Mapping[str, Any]]) -> Any:
    """``document`` with ``operations`` applied in order (a deep copy; the input is kept).
    Raises :class:`JsonPatchError` at the first operation that does not apply."""
    doc = copy.deepcopy(document)
    for op in operations:
        kind = op.get("op")
        if kind == "add":
            doc = _add(doc, _path(op), _value(op))
        elif kind == "remove":
            _remove(doc, _path(op))
        elif kind == "replace":
            doc = _replace(doc, _path(op), _value(op))
        elif kind == "move":
            value = _get_for(doc, _from(op), "move")
            _remove(doc, _from(op))
            doc = _add(doc, _path(op), value)
        elif kind == "copy":
            doc = _add(doc, _path(op), copy.deepcopy(_get_for(doc, _from(op), "copy")))
        elif kind == "test":
            _test(doc, op)
        else:
            raise JsonPatchError(f"Unexpected kind: {kind}")
    return doc


def equal(a: Any, b: Any) -> bool:
    """Structural equality as json-patch's ``lazyNode.equal``: JSON types must match."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict | list) or isinstance(b, dict | list):
        return False
    return json.dumps(a) == json.dumps(b)


# -- internals ----------------------------------------------------------------------------------


def _path(op: Mapping[str, Any]) -> str:
    path = op.get("path")
    if not isinstance(path, str):
        raise JsonPatchError("operation missing path field: missing value")
    return path


def _from(op: Mapping[str, Any]) -> str:
    path = op.get("from")
    if not isinstance(path, str):
        raise JsonPatchError("operation, missing from field: missing value")
    return path


_ABSENT = object()


def _value(op: Mapping[str, Any]) -> Any:
    return copy.deepcopy(op["value"]) if "value" in op else None


def _decode_key(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _find(doc: Any, path: str) -> tuple[Any, str] | None:
    """The container holding the last token of ``path``, and that token (json-patch's
    ``findObject``): None when a parent is missing, null or not a container."""
    parts = path.split("/")
    if len(parts) < 2:
        return None
    node = doc
    for raw in parts[1:-1]:
        key = _decode_key(raw)
        if isinstance(node, dict):
            node = node.get(key)
        elif isinstance(node, list):
            index = _index(node, key, extra=0)
            if index is None:
                return None
            node = node[index]
        else:
            return None
        if not isinstance(node, dict | list):
            return None
    return node, _decode_key(parts[-1])


def _index(array: list[Any], key: str, *, extra: int) -> int | None:
    """An index into ``array`` (``extra`` 1 allows one past the end, for add), or None."""
    try:
        index = int(key)
    except ValueError:
        return None
    size = len(array) + extra
    if index < 0:
        if index < -size:
            return None
        index += size
    return index if index < size else None


def _add(doc: Any, path: str, value: Any) -> Any:
    found = _find(doc, path)
    if found is None:
        raise JsonPatchError(f'add operation does not apply: doc is missing path: "{path}"')
    container, key = found
    if isinstance(container, dict):
        container[key] = value
    elif key == "-":
        container.append(value)
    else:
        index = _index(container, key, extra=1)
        if index is None:
            raise JsonPatchError(f"error in add for path: '{path}': invalid index referenced")
        container.insert(index, value)
    return doc


def _remove(doc: Any, path: str) -> None:
    found = _find(doc, path)
    if found is None:
        raise JsonPatchError(f'remove operation does not apply: doc is missing path: "{path}"')
    container, key = found
    if isinstance(container, dict):
        if key not in container:
            raise JsonPatchError(
                f"error in remove for path: '{path}': Unable to remove nonexistent key: {key}"
            )
        del container[key]
        return
    index = _index(container, key, extra=0)
    if index is None:
        raise JsonPatchError(f"error in remove for path: '{path}': invalid index referenced")
    del container[index]


def _replace(doc: Any, path: str, value: Any) -> Any:
    if path == "":
        if not isinstance(value, dict | list):
            raise JsonPatchError("replace operation value must be object or array")
        return value
    found = _find(doc, path)
    if found is None:
        raise JsonPatchError(f"replace operation does not apply: doc is missing path: {path}")
    container, key = found
    if isinstance(container, dict):
        container[key] = value  # json-patch v4 does not require the key to exist
        return doc
    index = _index(container, key, extra=0)
    if index is None:
        raise JsonPatchError(f"replace operation does not apply: doc is missing key: {path}")
    container[index] = value
    return doc


def _get_for(doc: Any, path: str, what: str) -> Any:
    found = _find(doc, path)
    if found is None:
        raise JsonPatchError(f"{what} operation does not apply: doc is missing from path: {path}")
    container, key = found
    if isinstance(container, dict):
        return container.get(key)
    index = _index(container, key, extra=0)
    if index is None:
        raise JsonPatchError(f"error in {what} for path: '{key}': invalid index referenced")
    return container[index]


def _test(doc: Any, op: Mapping[str, Any]) -> None:
    path = _path(op)
    expected = op.get("value", _ABSENT)
    if path == "":
        if expected is _ABSENT or not equal(doc, expected):
            raise JsonPatchError(f"testing value {path} failed: test failed")
        return
    found = _find(doc, path)
    if found is None:
        raise JsonPatchError(f"test operation does not apply: is missing path: {path}")
    container, key = found
    if isinstance(container, dict):
        actual = container.get(key)
    else:
        index = _index(container, key, extra=0)
        if index is None:
            raise JsonPatchError(f"error in test for path: '{path}': invalid index referenced")
        actual = container[index]
    if actual is None:
        # A missing key or a null: passes when the test expects null or names no value.
        if expected is _ABSENT or expected is None:
            return
        raise JsonPatchError(f"testing value {path} failed: test failed")
    if expected is _ABSENT or expected is None or not equal(actual, expected):
        raise JsonPatchError(f"testing value {path} failed: test failed")
