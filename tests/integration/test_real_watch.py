"""A watch from a resourceVersion the server no longer keeps: vgpuctl's kube adapter gets 410
(:class:`~reconciler.model.errors.ExpiredError`), lists again and watches on from the list's
version, against the emulator and the real kube-apiserver alike (the ``api_server`` fixture;
the real one is ``just test-real``).

History is dropped on purpose: the emulator's ``compact``; on the real server, etcd compacted
(``RealApiServer.compact``) under a resource served without a watch cache (a watch cache keeps
its own window of events, which only time and traffic move on; its 410 is the same Status)."""

from __future__ import annotations

from typing import Any

import pytest

from reconciler.kube import connect
from reconciler.model.errors import ExpiredError
from tests.api_servers import WATCH_PROBES, Served, preserving_crd

GROUP, VERSION, PLURAL = WATCH_PROBES


def probe(name: str, n: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "WatchProbe",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"n": n},
    }


def test_a_watch_from_a_compacted_version_is_410_and_a_relist_resumes(api_server: Served) -> None:
    api_server.install_crd(preserving_crd(GROUP, VERSION, PLURAL, "WatchProbe"))
    custom = api_server.custom
    where = {"group": GROUP, "version": VERSION, "plural": PLURAL, "namespace": "default"}
    created = custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, probe("a", 0)
    )
    old = created["metadata"]["resourceVersion"]
    latest = old
    for n in range(1, 4):
        latest = custom.replace_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, "a",
            {**probe("a", n), "metadata": {**probe("a", n)["metadata"], "resourceVersion": latest}},
        )["metadata"]["resourceVersion"]  # fmt: skip
    if api_server.emulator is not None:
        api_server.emulator.compact()
    else:
        assert api_server.real is not None
        api_server.real.compact(int(latest))

    api = connect(api_server.kubeconfig_path, timeout=30)
    with pytest.raises(ExpiredError):
        for _ in api.watch_objects(**where, resource_version=old, timeout_seconds=5):
            pass
    listed = api.list_collection(**where)
    assert [o["spec"] for o in listed.items] == [{"n": 3}]
    stream = api.watch_objects(**where, resource_version=listed.resource_version, timeout_seconds=5)
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "a", {"spec": {"n": 4}}
    )
    events = iter(stream)
    event = next(e for e in events if e.type != "BOOKMARK")
    assert (event.type, event.object["spec"]) == ("MODIFIED", {"n": 4})
