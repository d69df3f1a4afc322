"""Property: for any valid desired state on any simulated host, apply converges, and a second
apply makes no write at all. "Converges" is judged by ``tests/oracle.py`` from the sysfs tree
and the desired file (every desired vGPU with its profile and UUID, SR-IOV as desired, nothing
else on a managed GPU, unmanaged GPUs untouched), not by vgpuctl's own plan.

Hosts and desired states are drawn by hypothesis within the driver's rules (one framebuffer size
per GPU, at most the size's maximum), with random starting vGPUs, random SR-IOV states, both
desired forms (per-VF and counts), index and address keys, and unmanaged GPUs. The real loader,
observer, planner, mdev driver and executor run against the simulator; sriov-manage runs as a
real subprocess.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.apply import ConfinedSysfsWriter, Journal, MdevDriver, SubprocessRunner, execute
from reconciler.catalog import GpuModel, default_catalog, profile_body
from reconciler.desired import load_desired
from reconciler.model import PciAddress
from reconciler.observe import observe_host
from reconciler.plan import plan_node
from reconciler.sim import SimHost, build_host
from reconciler.sim.rules import SimModel
from tests import oracle
from tests.strategies import gpu_config

NODE = "prop-node"
CATALOG = default_catalog()
MODELS = ["A2", "L4", "A10"]
ADDRESSES = ["0000:08:00.0", "0000:41:00.0"]


def _model(name: str) -> GpuModel:
    model = CATALOG.model(name)
    assert model is not None
    return model


@st.composite
def scenario(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    n = draw(st.integers(1, 2))
    host_gpus, desired_gpus = [], []
    for address in ADDRESSES[:n]:
        model = _model(draw(st.sampled_from(MODELS)))
        on = draw(st.booleans())
        _, start = draw(gpu_config(model))
        host_gpus.append(
            {
                "model": model.short,
                "address": address,
                "sriov": "enabled" if on else "disabled",
                "vgpus": dict(start) if on else {},
            }
        )
        if not draw(st.integers(0, 9)):
            continue  # unmanaged: must be left exactly as it is
        entry: dict[str, Any] = {"address": address}
        if draw(st.integers(0, 4)) == 0:
            entry["sriov"] = "disabled"
        else:
            entry["sriov"] = "enabled"
            _, want = draw(gpu_config(model))
            if draw(st.booleans()):
                counts: dict[str, int] = {}
                for _, name in want:
                    counts[name] = counts.get(name, 0) + 1
                entry["profiles"] = counts
            else:
                pf = PciAddress.parse(address)
                vgpus: dict[Any, str] = {}
                for index, name in want:
                    if draw(st.booleans()):
                        key: Any = index
                    else:
                        # Where the simulator puts the VF (the catalogue may not claim an offset).
                        sim = SimModel.from_catalog(model)
                        routing = pf.routing_id + sim.vf_offset + index * sim.vf_stride
                        key = str(PciAddress.from_routing_id(pf.domain, routing))
                    short = draw(st.booleans())
                    vgpus[key] = profile_body(name) if short else name
                entry["vgpus"] = vgpus
        desired_gpus.append(entry)
    desired = {
        "apiVersion": "vgpu.reconciler.dev/v1alpha1",
        "kind": "VGPUDesiredState",
        "metadata": {"name": "property"},
        "spec": {"nodes": {NODE: {"gpus": desired_gpus}}},
    }
    return {"gpus": host_gpus, "extraDevices": False}, desired


def _apply_once(host_dir: Path, sim: SimHost, desired_file: Path) -> tuple[int, int]:
    """One ``apply`` as the CLI does it; returns (actions planned, blocked)."""
    root = host_dir / "sys"
    node = load_desired([desired_file], catalog=CATALOG).node(NODE)
    inventory = observe_host(root, node=NODE, catalog=CATALOG, hold_probe=sim.hold_probe())
    plan = plan_node(node, inventory, catalog=CATALOG)
    driver = MdevDriver(
        sysfs_root=root,
        writer=ConfinedSysfsWriter(root, kernel=sim.writer()),
        runner=SubprocessRunner(),
        sriov_manage=[str(host_dir / "bin" / "sriov-manage")],
        command_timeout=60,
    )
    result = execute(plan, driver=driver, journal=Journal(host_dir / "state", NODE))
    assert result.ok, result.failed
    return len(plan.actions), len(plan.blocked)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenario())
def test_apply_converges_and_second_apply_writes_nothing(
    case: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    host_spec, desired = case
    with tempfile.TemporaryDirectory(prefix="vgpuctl-prop-") as d:
        host_dir = Path(d) / "host"
        sim = build_host(host_dir, host_spec, catalog=CATALOG)
        desired_file = Path(d) / "desired.yaml"
        desired_file.write_text(yaml.safe_dump(desired))
        before = oracle.snapshot(host_dir / "sys")

        _apply_once(host_dir, sim, desired_file)

        # The verdict is the tests' own oracle's (the tree against the file), not vgpuctl's plan.
        problems = oracle.judge(host_dir / "sys", desired_file, NODE, before=before)
        assert problems == [], problems
        # And, as an extra, vgpuctl agrees that nothing is left to do.
        after = observe_host(host_dir / "sys", node=NODE, catalog=CATALOG)
        node = load_desired([desired_file], catalog=CATALOG).node(NODE)
        replan = plan_node(node, after, catalog=CATALOG)
        assert replan.actions == () and replan.blocked == (), replan.to_json()

        counters = sim.stats()
        actions, blocked = _apply_once(host_dir, sim, desired_file)
        assert (actions, blocked) == (0, 0)
        assert sim.stats() == counters, "the second apply wrote to the host"
