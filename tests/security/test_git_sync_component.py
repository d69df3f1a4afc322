"""The git-sync component keeps the node agent node-local (issue 28 item 6).

deploy/git-sync/ patched the agent's container with a strategic merge naming its ``args``;
a list of strings is replaced whole by such a merge, so the built DaemonSet lost the base's
``--delegate none``: on Harvester with pcidevices-controller running, every node's agent
would then have become a delegate candidate instead of refusing to act. The component now
changes only the directory ``watch`` reads (a JSON patch testing what it replaces). Checked
over the kustomize build of an overlay that uses the component, as deploy/README.md shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.kustomize import kustomize_with_component
from tests.simnode import REPO

DEPLOY = REPO / "deploy"
CHECKOUT = "/etc/vgpuctl/desired-state/current/desired-state"


def _base_agent() -> dict[str, Any]:
    (daemonset,) = [d for d in yaml.safe_load_all((DEPLOY / "daemonset.yaml").read_text()) if d]
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "vgpuctl"
    return dict(container)


def _built_pod(tmp_path: Path) -> dict[str, Any]:
    built = kustomize_with_component(tmp_path, "git-sync")
    (daemonset,) = [d for d in built if d["kind"] == "DaemonSet"]
    pod: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    return pod


def test_the_agent_keeps_every_argument_of_the_base_but_the_directory(tmp_path: Path) -> None:
    pod = _built_pod(tmp_path)
    # The agent's container stays first (`kubectl logs` and `exec` pick it by default).
    assert [c["name"] for c in pod["containers"]] == ["vgpuctl", "git-sync"]
    agent = pod["containers"][0]
    args = agent["args"]
    assert args[args.index("--delegate") + 1] == "none"
    base = _base_agent()["args"]
    assert base[1] == "/etc/vgpuctl/desired-state"
    assert args == [base[0], CHECKOUT, *base[2:]]
    # Nothing else of the agent's container changes.
    assert {k: v for k, v in agent.items() if k != "args"} == {
        k: v for k, v in _base_agent().items() if k != "args"
    }


def test_git_sync_runs_with_its_own_arguments(tmp_path: Path) -> None:
    pod = _built_pod(tmp_path)
    (init,) = pod["initContainers"]
    sidecar = pod["containers"][1]
    assert init["args"] == ["--root=/git", "--link=current", "--depth=1", "--one-time"]
    assert sidecar["args"] == ["--root=/git", "--link=current", "--depth=1", "--max-failures=-1"]
    # The checkout the agent watches is the one git-sync publishes (--link=current), in the
    # volume both mount.
    agent = pod["containers"][0]
    mount = next(m for m in agent["volumeMounts"] if m["name"] == "desired-state")
    assert CHECKOUT.startswith(mount["mountPath"] + "/current/")
    assert {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}["desired-state"] == "/git"
