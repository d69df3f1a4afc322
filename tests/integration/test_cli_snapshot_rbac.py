"""The snapshot is taken under CI's read-only identity (examples/gitops/snapshot.md: the
refreshing job runs as ``ci-rbac.yaml``'s ``vgpuctl-ci``): it needs no grant a plan does not,
and every grant of that role is used; the plan from it is the live plan.

Against the API-server emulator with the RBAC model of ``tests/rbac.py``.
"""

from __future__ import annotations

from pathlib import Path

from tests import rbac
from tests.cluster_node import cluster_node
from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import NODE, SEED, run_vgpuctl


def test_the_snapshot_job_needs_only_the_ci_role(tmp_path: Path, emu: ApiServerEmulator) -> None:
    node = cluster_node(tmp_path, emu)
    node.ok("apply", SEED, "--yes")
    emu.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    role = rbac.enforce(emu, rbac.CI_RBAC, rbac.CI_ACCOUNT)
    ci = emu.kubeconfig(tmp_path / "ci.kubeconfig", user=role.user)

    res = run_vgpuctl("export", "--observed", "cluster", "-o", "snapshot", "--kubeconfig", ci)
    assert res.returncode == 0, res.stderr
    assert role.refused() == []
    assert rbac.unused(role.granted, role.requests) == set()
    assert all(r.verb in ("get", "list") for r in role.requests)  # it reads, only

    snapshot = tmp_path / "snapshot.json"
    snapshot.write_text(res.stdout)
    live = run_vgpuctl("plan", SEED, "--observed", "cluster", "--kubeconfig", ci)
    from_file = run_vgpuctl("plan", SEED, "--observed", snapshot)
    assert live.returncode == from_file.returncode == 0, live.stderr + from_file.stderr
    assert from_file.stdout == live.stdout
    assert "Cluster plan: 1 node, 0 with changes" in from_file.stdout
