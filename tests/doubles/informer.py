"""Informers for the doubles: a cache of one resource kept from a list and a watch over HTTP, as
client-go's reflector keeps a shared informer's store (k8s.io/client-go tools/cache
reflector.go ``ListAndWatch``: a list, the store replaced with its items, then a watch from the
list's resourceVersion, each ADDED/MODIFIED/DELETED event applied to the store; a watch that
ends is started again from the last resourceVersion seen; 410 Gone, or any other error, lists
again).

Through the unmodified ``kubernetes`` client, so a double runs against any API server: the
emulator (``emulator.py``) or the real kube-apiserver (``tests/real_apiserver.py``). What a
double reads of the cluster comes from these caches, as the Go controller's listers and its
webhook's caches read theirs: the API server sees only the lists and watches.

:meth:`Informers.sync` is for tests that drive a double step by step: it waits until every
cache holds at least what a fresh list holds (client-go's ``WaitForCacheSync`` only waits for
the first list; a test stepping a double needs the writes it just made to have reached it, as
they would have on a real cluster a moment later).
"""

from __future__ import annotations

import contextlib
import copy
import json
import socket
import threading
from collections.abc import Iterable
from typing import Any

from kubernetes import client

JsonObject = dict[str, Any]
#: (group, version, plural): "" is the core group.
Res = tuple[str, str, str]
#: How long one watch request stays open before it is started again (client-go's reflector
#: picks 5 to 10 minutes; shorter here so a stopped double's requests end soon).
WATCH_SECONDS = 30
#: How long :meth:`Informers.sync` waits for the watch events of a fresh list.
SYNC_SECONDS = 30.0


def _path(res: Res, namespace: str | None) -> str:
    group, version, plural = res
    base = f"/api/{version}" if group == "" else f"/apis/{group}/{version}"
    if namespace is not None:
        base += f"/namespaces/{namespace}"
    return f"{base}/{plural}"


def _key(obj: JsonObject) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _rv(obj: JsonObject) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


class Informer:
    """One resource's cache (every namespace, or ``namespace``), kept by a thread."""

    def __init__(self, api: Any, res: Res, namespace: str | None = None) -> None:
        self.res = res
        self._api = api
        self._path = _path(res, namespace)
        self._items: dict[tuple[str, str], JsonObject] = {}
        self._cond = threading.Condition()
        self._synced = False
        self._stopping = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None
        #: Errors met by the list or watch (the reflector logs them and starts again).
        self.errors: list[str] = []

    # -- reads (the lister) --

    def get(self, name: str, namespace: str = "") -> JsonObject | None:
        with self._cond:
            found = self._items.get((namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def list(self) -> list[JsonObject]:
        """Every cached object, by namespace and name (as the emulator's store lists them)."""
        with self._cond:
            return [copy.deepcopy(self._items[k]) for k in sorted(self._items)]

    # -- the reflector --

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, name=f"informer-{self.res[2]}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        response = self._response
        if response is not None:  # end the watch's read now, not at its timeout
            with contextlib.suppress(Exception):
                response.connection.sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(Exception):
                response.close()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def wait_for_sync(self, timeout: float = SYNC_SECONDS) -> None:
        """client-go ``WaitForCacheSync``: the first list is in the cache."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._synced, timeout):
                raise TimeoutError(f"{self._path}: not synced after {timeout} s: {self.errors}")

    def _get(self, query: list[tuple[str, Any]], *, stream: bool = False) -> Any:
        """A GET of the collection (a list, or a watch whose body is read as it comes)."""
        method, url, headers, _, _ = self._api.param_serialize(
            "GET",
            self._path,
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self._api.call_api(
            method, url, header_params=headers, _request_timeout=None if stream else 30
        )
        if not 200 <= response.status < 300:
            raise client.ApiException(status=response.status, reason=response.response.data)
        return response.response

    def fetch(self) -> tuple[list[JsonObject], int]:
        """A list from the API server (not the cache): its items and resourceVersion."""
        response = self._get([])
        body = json.loads(response.data)
        return list(body.get("items") or []), int(body["metadata"]["resourceVersion"])

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                items, rv = self.fetch()
                with self._cond:
                    self._items = {_key(o): o for o in items}
                    self._synced = True
                    self._cond.notify_all()
                self._watch(rv)
            except Exception as error:  # the reflector logs it and lists again
                if self._stopping.is_set():
                    return
                self.errors[:] = [*self.errors[-19:], repr(error)]
                self._stopping.wait(0.2)

    def _watch(self, rv: int) -> None:
        """Watches from ``rv`` until one fails (then the caller lists again)."""
        while not self._stopping.is_set():
            query = [
                ("watch", "true"),
                ("resourceVersion", str(rv)),
                ("allowWatchBookmarks", "true"),
                ("timeoutSeconds", str(WATCH_SECONDS)),
            ]
            response = self._get(query, stream=True)
            self._response = response
            try:
                buffer = b""
                for chunk in response.stream(4096, decode_content=True):
                    buffer += chunk
                    while b"\n" in buffer:
                        line, _, buffer = buffer.partition(b"\n")
                        if line.strip():
                            rv = self._apply(json.loads(line), rv)
            finally:
                self._response = None
                with contextlib.suppress(Exception):
                    response.release_conn()

    def _apply(self, event: JsonObject, rv: int) -> int:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":  # 410 Gone and the like: list again
            raise RuntimeError(f"watch error: {obj.get('code')} {obj.get('message')}")
        with self._cond:
            if kind in ("ADDED", "MODIFIED"):
                self._items[_key(obj)] = obj
            elif kind == "DELETED":
                self._items.pop(_key(obj), None)
            self._cond.notify_all()
        return max(rv, _rv(obj))

    def caught_up(self, listed: Iterable[JsonObject], list_rv: int) -> bool:
        """Whether the cache holds at least what ``listed`` (a list at ``list_rv``) held:
        each listed object at its version or later, nothing older the list no longer had."""
        with self._cond:
            return self._caught_up(listed, list_rv)

    def _caught_up(self, listed: Iterable[JsonObject], list_rv: int) -> bool:
        wanted = {_key(o): _rv(o) for o in listed}
        for key, rv in wanted.items():
            cached = self._items.get(key)
            if cached is None or _rv(cached) < rv:
                return False
        return all(key in wanted or _rv(o) > list_rv for key, o in self._items.items())

    def sync(self, timeout: float = SYNC_SECONDS) -> None:
        """Wait until the cache holds at least what a list made now holds."""
        self.wait_for_sync(timeout)
        listed, list_rv = self.fetch()
        with self._cond:
            if not self._cond.wait_for(lambda: self._caught_up(listed, list_rv), timeout):
                raise TimeoutError(
                    f"{self._path}: the watch did not catch up with the list at {list_rv} "
                    f"within {timeout} s: {self.errors}"
                )


class Informers:
    """A set of informers on one client (a shared informer factory)."""

    def __init__(self, api: Any) -> None:
        self._api = api
        self._by_res: dict[tuple[Res, str | None], Informer] = {}

    def add(self, res: Res, namespace: str | None = None) -> Informer:
        key = (res, namespace)
        if key not in self._by_res:
            self._by_res[key] = Informer(self._api, res, namespace)
        return self._by_res[key]

    def __getitem__(self, res: Res) -> Informer:
        return self._by_res[(res, None)]

    def start(self) -> None:
        for informer in self._by_res.values():
            informer.start()
        for informer in self._by_res.values():
            informer.wait_for_sync()

    def stop(self) -> None:
        for informer in self._by_res.values():
            informer._stopping.set()
        for informer in self._by_res.values():
            informer.stop()

    def sync(self) -> None:
        for informer in self._by_res.values():
            informer.sync()


__all__ = ["Informer", "Informers"]
