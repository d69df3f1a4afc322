"""Work begun now and collected later: ``fn()`` on a daemon thread, its result a future.

The cluster side overlaps waiting with work this way (the fleet reader lists VGPUDevices while
the desired state is read; the pager asks for a list's next page while it decodes this one).
A ``ThreadPoolExecutor`` is not used: its threads are joined when the interpreter exits, so
work the caller has given up on would keep the process alive.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


def in_background(fn: Callable[[], T], *, name: str) -> Future[T]:
    """``fn()`` on a daemon thread called ``name``: its future, which holds what ``fn``
    returned or raised. Nothing waits for it unless the caller asks for ``result()``."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as error:  # the caller of result() gets it
            future.set_exception(error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
