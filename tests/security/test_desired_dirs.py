"""Desired-state directories (issue 10, item 2), driven as in production: ``vgpuctl watch DIR``
in a subprocess on a simulated host, with the API-server emulator as its cluster.

Whoever can write the directory (a ConfigMap's editors, a git repository's committers: git-sync
checks out whatever links the repository holds) could make the agent, running as root, read a
file outside it: a link to ``/etc/shadow`` came back, a password hash and all, in the
``InvalidDesiredState`` Event. Links are now followed only to files inside the directory; one
leaving it is refused, naming it, and no message quotes the file. The layouts the directory
really comes in keep working: a ConfigMap volume (the kubelet's atomic writer:
``name.yaml -> ..data/name.yaml``, ``..data -> ..<timestamp>``) and a git-sync root (``current
-> .worktrees/<hash>``, vgpuctl pointed at ``current/desired-state``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.cluster_node import ClusterNode, cluster_node
from tests.doubles.emulator import ApiServerEmulator
from tests.watch_agent import Watch, seed_text, vgpus, wait_for

#: A shadow file's first line: parsed as YAML it is a mapping key, quoted whole before.
SHADOW = (
    "root:$6$Kx8.saltsalt$Q1w2E3r4T5y6U7i8O9p0AsDfGhJkLzXcVbNm1234567890qwertyuiopASDFGHJ:"
    "19000:0:99999:7:::\n"
)
#: A piece of the hash no output may carry.
LEAK = "Q1w2E3r4T5y6U7i8O9p0"
A2_4Q, A2_4C = "NVIDIA A2-4Q", "NVIDIA A2-4C"


def configmap_volume(root: Path, files: dict[str, str], stamp: str) -> Path:
    """The kubelet's ConfigMap volume, as its atomic writer makes and updates it
    (pkg/volume/util/atomic_writer.go): the data in ``..<timestamp>/``, ``..data`` a link to it
    swapped by rename, each key a link ``name -> ..data/name``."""
    root.mkdir(exist_ok=True)
    (root / stamp).mkdir()
    for name, text in files.items():
        (root / stamp / name).write_text(text)
    (root / "..data_tmp").symlink_to(stamp)
    os.replace(root / "..data_tmp", root / "..data")
    for name in files:
        if not (root / name).is_symlink():
            (root / name).symlink_to(f"..data/{name}")
    return root


def git_sync_root(
    root: Path, commit: str, files: dict[str, str], links: dict[str, str] | None = None
) -> Path:
    """git-sync v4's root: each commit checked out in ``.worktrees/<hash>``, published by
    renaming a fresh relative link over ``current`` (publishSymlink in its main.go). ``links``:
    links the commit holds in ``desired-state/`` (git stores a link as its target's text)."""
    tree = root / ".worktrees" / commit / "desired-state"
    tree.mkdir(parents=True)
    for name, text in files.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text)
    for name, target in (links or {}).items():
        (tree / name).symlink_to(target)
    (root / "tmp-link").symlink_to(f".worktrees/{commit}")
    os.replace(root / "tmp-link", root / "current")
    return root


def events(emu: ApiServerEmulator) -> list[dict[str, Any]]:
    return [
        e
        for e in emu.objects("", "v1", "events", "default")
        if e["reason"] == "InvalidDesiredState"
    ]


def invalid(watch: Watch) -> bool:
    return watch.metric("vgpuctl_desired_state_valid") == 0


def test_a_link_to_a_file_outside_the_directory_is_refused_and_not_quoted(
    tmp_path: Path, emu: ApiServerEmulator, start_watch: Callable[..., Watch]
) -> None:
    node = cluster_node(tmp_path, emu)
    shadow = tmp_path / "etc" / "shadow"
    shadow.parent.mkdir()
    shadow.write_text(SHADOW)
    volume = configmap_volume(tmp_path / "cm", {"node.yaml": seed_text()}, "..2026_01_14_1")
    watch = start_watch(node, volume)
    wait_for(watch.ready, "the first convergence")

    # Someone who can write the repository or the ConfigMap adds a link to the host's secret.
    planted = volume / "zz-shadow.yaml"
    planted.symlink_to(shadow)
    wait_for(lambda: bool(events(emu)), "the InvalidDesiredState Event", timeout=20)
    (event,) = events(emu)
    logged = json.dumps(watch.logs())
    assert LEAK not in str(event["message"])
    assert LEAK not in logged
    assert (
        f"{planted}: zz-shadow.yaml is a link to {shadow}, outside {volume}: not read (links in "
        "a desired-state directory are followed only to files inside it)"
    ) in str(event["message"])
    assert invalid(watch)
    assert sorted(vgpus(node).values()).count(A2_4Q) == 2  # the last valid state stays
    assert watch.stop() == 0


def test_a_relative_link_climbing_out_of_the_directory_is_refused(
    tmp_path: Path, emu: ApiServerEmulator, start_watch: Callable[..., Watch]
) -> None:
    node = cluster_node(tmp_path, emu)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "shadow").write_text(SHADOW)
    root = git_sync_root(tmp_path / "git", "0a1b2c", {"node.yaml": seed_text()})
    directory = root / "current" / "desired-state"
    watch = start_watch(node, directory)
    wait_for(watch.ready, "the first convergence")

    # A commit that adds a link out of the checkout (git stores links as their target text).
    git_sync_root(
        root, "3d4e5f", {"node.yaml": seed_text()}, {"shadow.yaml": "../../../../etc/shadow"}
    )
    wait_for(lambda: bool(events(emu)), "the InvalidDesiredState Event", timeout=20)
    (event,) = events(emu)
    assert LEAK not in str(event["message"]) + json.dumps(watch.logs())
    assert "shadow.yaml is a link to ../../../../etc/shadow, outside " in str(event["message"])
    assert watch.stop() == 0


def test_a_configmap_volume_and_its_updates_are_followed(
    tmp_path: Path, emu: ApiServerEmulator, start_watch: Callable[..., Watch]
) -> None:
    node = cluster_node(tmp_path, emu)
    volume = configmap_volume(tmp_path / "cm", {"node.yaml": seed_text()}, "..2026_01_14_1")
    watch = start_watch(node, volume)
    wait_for(watch.ready, "the first convergence")
    assert sorted(vgpus(node).values()).count("NVIDIA A2-4A") == 2
    configmap_volume(volume, {"node.yaml": seed_text(A2_4C)}, "..2026_01_14_2")
    wait_for(lambda: A2_4C in vgpus(node).values(), "the ConfigMap update applied", timeout=30)
    assert not events(emu)
    assert watch.stop() == 0


def test_a_git_sync_checkout_and_its_new_commits_are_followed(
    tmp_path: Path, emu: ApiServerEmulator, start_watch: Callable[..., Watch]
) -> None:
    node: ClusterNode = cluster_node(tmp_path, emu)
    # A link between two files inside the directory is fine (a repository may keep one).
    root = git_sync_root(
        tmp_path / "git",
        "0a1b2c",
        {".shared/node.yaml": seed_text()},
        {"node.yaml": ".shared/node.yaml"},
    )
    watch = start_watch(node, root / "current" / "desired-state")
    wait_for(watch.ready, "the first convergence")
    git_sync_root(root, "3d4e5f", {"node.yaml": seed_text(A2_4C)})
    wait_for(lambda: A2_4C in vgpus(node).values(), "the new commit applied", timeout=30)
    assert not events(emu)
    assert watch.stop() == 0
