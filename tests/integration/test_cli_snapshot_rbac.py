"""The snapshot is taken under CI's read-only identity (examples/gitops/snapshot.md: the
refreshing job runs as ``ci-rbac.yaml``'s ``vgpuctl-ci``): it reads only, needs no grant a
plan does not, and uses every grant of that role; the plan from it is the live plan. Against
the emulator (the RBAC model of ``tests/rbac.py``) and the real kube-apiserver (its RBAC
authorizer; its audit log says what was asked).
"""

from __future__ import annotations

import time
from pathlib import Path

from kubernetes import client

from tests import rbac
from tests.api_servers import (
    Served,
    create_ignoring_conflict,
    harvester_cluster,
    install_rbac,
    node_of,
)
from tests.simnode import NODE, SEED, run_vgpuctl

GROUP, VERSION = "devices.harvesterhci.io", "v1beta1"


def test_the_snapshot_job_needs_only_the_ci_role(tmp_path: Path, api_server: Served) -> None:
    harvester_cluster(api_server)
    node_of(tmp_path, api_server).ok("apply", SEED, "--yes")
    core = client.CoreV1Api(api_server.api)
    create_ignoring_conflict(core.create_node, {"metadata": {"name": NODE}})
    role = None
    if api_server.emulator is not None:
        role = rbac.enforce(api_server.emulator, rbac.CI_RBAC, rbac.CI_ACCOUNT)
        ci = api_server.emulator.kubeconfig(tmp_path / "ci", user=role.user)
    else:
        assert api_server.real is not None
        install_rbac(api_server, rbac.CI_RBAC)
        ci = api_server.real.kubeconfig(tmp_path / "ci", "ci")
        deadline = time.monotonic() + 30  # the authorizer's informers see the new binding
        while api_server.real.get(f"/apis/{GROUP}/{VERSION}/vgpudevices", identity="ci")[0] != 200:
            assert time.monotonic() < deadline, "the CI ClusterRoleBinding never applied"
            time.sleep(0.1)
        mark = api_server.real.audit_mark()
    try:
        res = run_vgpuctl("export", "--observed", "cluster", "-o", "snapshot", "--kubeconfig", ci)
        live = run_vgpuctl("plan", SEED, "--observed", "cluster", "--kubeconfig", ci)
    finally:
        core.delete_node(NODE)
    assert res.returncode == 0, res.stderr
    if role is not None:
        assert role.refused() == []
        assert rbac.unused(role.granted, role.requests) == set()
        verbs = {r.verb for r in role.requests}
    else:
        assert api_server.real is not None
        verbs = {r[0] for r in api_server.real.requests("ci", since=mark)}
    assert verbs <= {"get", "list"}  # it reads, only

    snapshot = tmp_path / "snapshot.json"
    snapshot.write_text(res.stdout)
    from_file = run_vgpuctl("plan", SEED, "--observed", snapshot)
    assert live.returncode == from_file.returncode == 0, live.stderr + from_file.stderr
    assert from_file.stdout == live.stdout
    assert "Cluster plan: 1 node, 0 with changes" in from_file.stdout
