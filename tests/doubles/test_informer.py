"""The doubles' informers (``informer.py``) keep a cache from a list and a watch over HTTP, on
the emulator and on the real kube-apiserver alike: what the pcidevices double reads."""

from __future__ import annotations

import time
from collections.abc import Callable

from tests.api_servers import Served, preserving_crd
from tests.doubles.informer import Informers

RES = ("informers.realapi.vgpuctl.invalid", "v1", "probes")


def _eventually(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_an_informer_follows_creates_changes_and_deletes(api_server: Served) -> None:
    api_server.install_crd(preserving_crd(*RES, "Probe"))
    custom = api_server.custom
    body = {"apiVersion": f"{RES[0]}/{RES[1]}", "kind": "Probe", "metadata": {"name": "before"}}
    custom.create_namespaced_custom_object(*RES[:2], "default", RES[2], body)
    informers = Informers(api_server.api)
    informer = informers.add(RES)
    informers.start()  # the first list is in the cache
    try:
        assert [o["metadata"]["name"] for o in informer.list()] == ["before"]
        after = {**body, "metadata": {"name": "after"}, "spec": {"n": 1}}
        custom.create_namespaced_custom_object(*RES[:2], "default", RES[2], after)
        _eventually(lambda: informer.get("after", "default") is not None, "the ADDED event")
        changed = custom.patch_namespaced_custom_object(
            *RES[:2], "default", RES[2], "after", {"spec": {"n": 2}}
        )
        _eventually(
            lambda: (informer.get("after", "default") or {}).get("spec") == {"n": 2},
            "the MODIFIED event",
        )
        cached = informer.get("after", "default")
        assert cached is not None
        assert cached["metadata"]["resourceVersion"] == changed["metadata"]["resourceVersion"]
        custom.delete_namespaced_custom_object(*RES[:2], "default", RES[2], "before")
        informers.sync()  # a list now, and the cache caught up with it
        assert [o["metadata"]["name"] for o in informer.list()] == ["after"]
        assert informer.errors == []
    finally:
        informers.stop()
