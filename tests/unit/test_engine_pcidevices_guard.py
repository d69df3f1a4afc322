"""The engine refuses to act while Harvester's pcidevices-controller runs, or may: in process, on
a simulated seed node, with the in-memory cluster (read only: any write fails the test).

Every way in is covered: ``reconcile`` as watch calls it (observe, then the lock only when there
is something to do), with nothing to do as well, and ``carry_out`` handed a plan whose
observation saw the controller. Without a cluster nothing can tell, and nothing is refused.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from reconciler.engine import NodePorts, RunSettings, observe_and_plan, reconcile
from reconciler.engine.pipeline import carry_out
from reconciler.model import (
    ClusterUnavailableError,
    DesiredNode,
    ForbiddenError,
    ForeignControllerError,
)
from reconciler.model.cluster import ClusterState
from tests.doubles.cluster import FakeCluster
from tests.pcidevices_controller import daemonset, webhook
from tests.simnode import NODE, SEED

RUNNING = (
    "refusing to change node harvester-kgd9c: Harvester's pcidevices-controller is running "
    "(ValidatingWebhookConfiguration pcidevices-validator exists): "
)
SETTINGS = RunSettings(verify_timeout=5.0)


class Node:
    """A simulated seed host, before any apply, and the engine's ports for it."""

    def __init__(self, tmp_path: Path) -> None:
        from reconciler.cli.host import Host
        from reconciler.cli.options import GlobalOptions
        from reconciler.desired import load_desired
        from reconciler.sim import init_host

        self.sim = init_host(tmp_path / "host", ["A2@0000:08:00.0"])
        host = Host(
            GlobalOptions(
                sysfs_root=self.sim.sysfs_root, sriov_manage=None, node=NODE, state_dir=None,
                no_color=True, kubelet_dir=tmp_path / "kubelet",
            )
        )  # fmt: skip
        self.host_ports: NodePorts = host.ports(write_timeout=5.0)
        desired = load_desired([SEED], catalog=host.catalog).node(NODE)
        assert desired is not None
        self.desired: DesiredNode = desired
        self.api = FakeCluster(read_only=True)

    def ports(self) -> NodePorts:
        """With a cluster that has none of our objects yet (its reads: ``self.api``)."""
        return replace(
            self.host_ports,
            cluster_api=self.api,
            observe_cluster=lambda: ClusterState(node=NODE),
            events=None,
        )

    def files(self) -> dict[str, Any]:
        root = self.sim.sysfs_root.parent
        return {
            str(p.relative_to(root)): p.readlink() if p.is_symlink() else p.read_bytes()
            for p in sorted(root.rglob("*"))
            if p.is_symlink() or p.is_file()
        }


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_reconcile_refuses_before_any_write(node: Node) -> None:
    node.api.seed("validatingwebhookconfigurations", [webhook()])
    before = node.files()
    with pytest.raises(ForeignControllerError) as raised:
        reconcile(node.ports(), node.desired, settings=SETTINGS)
    assert raised.value.message.startswith(RUNNING)
    assert not raised.value.transient
    assert node.files() == before
    assert not (node.sim.sysfs_root.parent / "state").exists()  # not even the node lock


def test_reconcile_refuses_with_nothing_to_do(node: Node) -> None:
    empty = replace(node.desired, gpus=())
    assert not observe_and_plan(node.host_ports, empty).plan.actions  # no cluster: no refusal
    node.api.seed("daemonsets", [daemonset(ready=2)])
    with pytest.raises(ForeignControllerError, match="has 2 ready pods"):
        reconcile(node.ports(), empty, settings=SETTINGS)


def test_carry_out_refuses_a_plan_whose_observation_saw_the_controller(node: Node) -> None:
    node.api.seed("validatingwebhookconfigurations", [webhook()])
    planned = observe_and_plan(node.ports(), node.desired)
    assert planned.controller is not None and planned.controller.running
    assert planned.plan.actions  # the plan itself is made, and says apply would refuse
    assert planned.plan.notes[0].startswith(
        "vgpuctl apply and watch refuse to act on this node: Harvester's pcidevices-controller "
        "is running (ValidatingWebhookConfiguration pcidevices-validator exists)"
    )
    before = node.files()
    with pytest.raises(ForeignControllerError):
        carry_out(node.ports(), node.desired, planned, settings=SETTINGS)
    assert node.files() == before


def test_a_denied_read_refuses(node: Node) -> None:
    node.api.fail["addons"] = ForbiddenError(
        "RBAC denies get on addons.harvesterhci.io in namespace harvester-system (forbidden)"
    )
    before = node.files()
    with pytest.raises(ForeignControllerError) as raised:
        reconcile(node.ports(), node.desired, settings=SETTINGS)
    assert raised.value.message == (
        "refusing to change node harvester-kgd9c: cannot tell whether Harvester's "
        "pcidevices-controller is running (RBAC denies get on addons.harvesterhci.io in "
        "namespace harvester-system (forbidden)): vgpuctl acts only when it knows the "
        "controller is not running (deploy/rbac.yaml grants the reads it needs)"
    )
    assert node.files() == before


def test_an_unreachable_server_stops_the_run_as_a_transient_error(node: Node) -> None:
    node.api.down = True
    before = node.files()
    with pytest.raises(ClusterUnavailableError) as raised:
        reconcile(node.ports(), node.desired, settings=SETTINGS)
    assert raised.value.transient
    assert node.files() == before


def test_without_a_cluster_nothing_can_tell_and_nothing_is_refused(node: Node) -> None:
    planned = observe_and_plan(node.host_ports, node.desired)
    assert planned.controller is None
    assert not [n for n in planned.plan.notes if "pcidevices" in n]
    result = reconcile(node.host_ports, node.desired, settings=SETTINGS)
    assert result.ok and result.ran
