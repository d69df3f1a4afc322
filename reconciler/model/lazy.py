"""Names a package exports but imports only when first used (PEP 562's module ``__getattr__``).

A cold ``vgpuctl plan`` imports what its path needs and no more: ``reconciler.apply``,
``engine``, ``observe``, ``sim`` and ``deviceplugin`` each list where their names live, and the
module is imported (and the name kept in the package) at the first ``package.name``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, homes: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: each name of ``homes`` from its module (a full
    dotted name), kept in ``namespace`` (the package's ``globals()``) once imported."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value
        return value

    return __getattr__
