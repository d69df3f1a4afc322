"""The image's inputs are pinned by their content (issue 28 item 6).

The Containerfile built from ``python:3.11-slim`` (a tag its publisher moves) and installed
vgpuctl's dependencies as pip resolved them that day, from whatever the index served: two
builds of one commit could differ, and a compromised or replaced release would go in
unnoticed. Now the base image is named by digest, and every Python package comes from a
hashed lock installed with ``--require-hashes`` (pip refuses a file whose sha256 is not in the
lock, and any package the lock does not pin). Checked from the files themselves: the
Containerfile's stages and pip commands, and the locks against pyproject.toml. (The image is
not built here: no container runtime; test_containerfile.py replays its wheel build.)
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.containerfile import instructions
from tests.simnode import REPO

LOCK = REPO / "requirements.lock"
BUILD_LOCK = REPO / "requirements-build.lock"
DIGEST = re.compile(r"[^\s@]+@sha256:[0-9a-f]{64}")
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


def _args() -> dict[str, str]:
    return {
        name: value
        for word, rest in instructions()
        if word == "ARG"
        for name, _, value in [rest.partition("=")]
    }


def _lock(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name → (version, hashes) of a pip-compile lock with hashes (continuation lines
    joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out: dict[str, tuple[str, list[str]]] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        spec, *options = line.split()
        name, sep, version = spec.partition("==")
        assert sep and re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", version), f"not pinned: {line}"
        out[canonicalize_name(name)] = (version, options)
    return out


def _pip_commands() -> list[list[str]]:
    """Every pip command the Containerfile's RUN instructions run."""
    commands = []
    for word, rest in instructions():
        if word != "RUN":
            continue
        for part in re.split(r"&&|;", rest):
            words = shlex.split(part)
            if "pip" in words:
                words = [w for w in words if not w.startswith("--mount=")]
                commands.append(words[words.index("pip") + 1 :])
    return commands


def test_every_stage_starts_from_the_base_image_pinned_by_digest() -> None:
    base = _args()["BASE_IMAGE"]
    assert DIGEST.fullmatch(base), base
    assert base.startswith("docker.io/library/python:3.11-slim@")
    froms = [rest.split()[0] for word, rest in instructions() if word == "FROM"]
    assert froms == ["${BASE_IMAGE}", "${BASE_IMAGE}"]
    # No other ARG feeds a FROM (a tag could come back that way).
    assert set(_args()) == {"BASE_IMAGE"}


def test_every_package_is_installed_from_a_hashed_lock() -> None:
    commands = _pip_commands()
    assert commands, "no pip command found"
    locks = set()
    for command in commands:
        verb = command[0]
        if verb == "check":
            continue
        if "-r" in command:
            # From a lock: every file's hash required, binary wheels only when downloading.
            assert "--require-hashes" in command, command
            locks.add(Path(command[command.index("-r") + 1]).name)
            if verb == "download":
                assert "--only-binary=:all:" in command, command
            continue
        # Otherwise vgpuctl's own wheel: built and installed without any dependency, from
        # nothing but the build context and the first stage's directory.
        assert "--no-deps" in command, command
        if verb == "wheel":
            assert "--no-build-isolation" in command and command[-1] == ".", command
        else:
            assert verb == "install" and "--no-index" in command, command
            assert command[-1].startswith("/wheels/vgpuctl-"), command
    assert locks == {"requirements.lock", "requirements-build.lock"}
    # The final stage installs from the first stage's wheels only, and checks what it has.
    final = commands[-3:]
    assert all("--no-index" in c for c in final if c[0] == "install")
    assert ["check"] in final
    copied = " ".join(rest for word, rest in instructions() if word == "COPY")
    assert "requirements.lock" in copied and "requirements-build.lock" in copied


def test_the_locks_pin_every_package_with_its_hashes() -> None:
    for path in (LOCK, BUILD_LOCK):
        lock = _lock(path)
        assert lock, path
        for name, (_, options) in lock.items():
            assert options and all(HASH.fullmatch(o) for o in options), (path.name, name)


def test_the_locks_hold_what_pyproject_asks_for() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    for path, wanted in (
        (LOCK, project["project"]["dependencies"]),
        (BUILD_LOCK, project["build-system"]["requires"]),
    ):
        lock = _lock(path)
        for text in wanted:
            requirement = Requirement(text)
            name = canonicalize_name(requirement.name)
            assert name in lock, f"{path.name} lacks {name}: run `just lock`"
            version = lock[name][0]
            assert requirement.specifier.contains(version, prereleases=True), (
                f"{path.name} pins {name} {version}, pyproject.toml asks {text}: `just lock`"
            )
