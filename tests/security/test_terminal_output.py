"""Nothing from input reaches a terminal raw, and names NVIDIA never writes are refused.

The attacks (issue 10, item 4): an action reason carrying ``ESC[1A ESC[2K`` erased the line of
the plan the operator was meant to review before answering the confirmation prompt. Reasons,
the status table and notes quote text from outside: sysfs (an mdev type's ``name``), the
process holding a vGPU (its name is whatever the process set), the desired state. Each reaches
the output here with its control characters escaped (``\\x1b``), while vgpuctl's own colours on
a terminal stay. And a Cyrillic ``А2-4A`` (U+0410) was "valid" offline: it reads as ``A2-4A``.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reconciler.sim import hold
from tests.simnode import REPO, SEED, SimNode, make_sim, run_vgpuctl

#: Up one line, erase it: what a hostile name carries.
ERASE = "\x1b[1A\x1b[2K"
ESCAPED = "\\x1b[1A\\x1b[2K"
#: The seed's vGPU on VF 0000:08:00.5 (NVIDIA A2-4Q), as the README shows it.
U5 = "5ed3b3e8-ffe3-55db-be73-567bd703a205"


@pytest.fixture
def applied(tmp_path: Path) -> SimNode:
    """The seed's node with the seed applied: A2-4A on VFs .4 and .6, A2-4Q on .5 and .7."""
    node = make_sim(tmp_path / "host", ["A2@0000:08:00.0"])
    node.ok("apply", SEED, "--yes")
    return node


@pytest.fixture
def all_4a(tmp_path: Path) -> Path:
    """The seed with every VF on A2-4A: the two A2-4Q vGPUs are to be replaced."""
    path = tmp_path / "all-4a.yaml"
    path.write_text(SEED.read_text().replace("NVIDIA A2-4Q", "NVIDIA A2-4A"))
    return path


def _rename_type(node: SimNode, name: str, new: str) -> None:
    """Every mdev type ``name`` file of the host that says ``name`` now says ``new``."""
    renamed = 0
    for path in (node.dir / "sys").rglob("name"):
        if path.is_file() and path.read_text() == f"{name}\n":
            path.write_text(f"{new}\n")
            renamed += 1
    assert renamed


def _assert_escaped(output: str) -> None:
    assert "\x1b" not in output, repr(output)
    assert ESCAPED in output, output


def test_an_mdev_type_name_with_escapes_is_refused_and_quoted_escaped(
    applied: SimNode, all_4a: Path
) -> None:
    """A type name becomes a kubelet resource name, so one with control characters is not
    published at all: status, plan and apply stop at it, naming the file, and quote it escaped.
    Nothing is changed."""
    _rename_type(applied, "NVIDIA A2-4Q", f"NVIDIA A2-4Q{ERASE}")
    for args in (("status",), ("plan", all_4a), ("apply", all_4a, "--yes")):
        res = applied.run(*args)
        assert res.returncode == 1, (args, res.stdout, res.stderr)
        _assert_escaped(res.stdout + res.stderr)
        assert "/name: not a vGPU type name" in res.stderr
        assert f"got 'NVIDIA A2-4Q{ESCAPED}'" in res.stderr
    _rename_type(applied, f"NVIDIA A2-4Q{ERASE}", "NVIDIA A2-4Q")
    assert applied.ok("status").stdout.count("NVIDIA A2-4Q") == 2


def test_a_holders_process_name_with_escapes_is_shown_escaped(
    applied: SimNode, all_4a: Path
) -> None:
    # A process names itself (prctl PR_SET_NAME): the /proc probe reports "pid N (name)".
    hold(applied.dir, U5, holder=f"pid 4242 ({ERASE})")
    status = applied.ok("status")
    _assert_escaped(status.stdout + status.stderr)
    plan = applied.ok("plan", all_4a)
    _assert_escaped(plan.stdout + plan.stderr)
    assert f"in use by pid 4242 ({ESCAPED})" in plan.stdout
    assert_ = applied.run("assert", all_4a)
    assert assert_.returncode == 2
    _assert_escaped(assert_.stdout + assert_.stderr)


def test_a_desired_state_name_with_escapes_is_refused_and_quoted_escaped(tmp_path: Path) -> None:
    # YAML's double-quoted "\e" is ESC: no reader stops it.
    path = tmp_path / "escapes.yaml"
    path.write_text(
        SEED.read_text()
        .replace('"0000:08:00.5": NVIDIA A2-4Q', '"0000:08:00.5": "NVIDIA A2-4Q\\e[1A\\e[2K"')
        .replace("model: NVIDIA A2", 'model: "NVIDIA A2\\e[2K"')
    )
    result = run_vgpuctl("validate", path)
    assert result.returncode == 1
    assert "\x1b" not in result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        f"{path}:20:11: model 'NVIDIA A2\\x1b[2K' has a character NVIDIA's names never have "
        "(they are printable ASCII): U+001B, a control character",
        f"{path}:24:13: profile 'NVIDIA A2-4Q\\x1b[1A\\x1b[2K' has a character NVIDIA's "
        "names never have (they are printable ASCII): U+001B, a control character",
    ]


def _apply_on_a_terminal(node: SimNode, desired: Path, answer: str) -> tuple[str, int]:
    """``vgpuctl apply DESIRED`` on a pseudo-terminal (colours on), answering the prompt."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR" and not k.startswith("VGPUCTL")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "reconciler", "apply", str(desired), *node.flags],
        stdin=slave, stdout=slave, stderr=slave, cwd=REPO, env=env,
    )  # fmt: skip
    os.close(slave)
    seen = b""
    answered = False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        try:
            data = os.read(master, 65536)
        except OSError:  # the other side closed: the process is done
            break
        if not data:
            break
        seen += data
        if not answered and b"Only 'yes' will be accepted: " in seen:
            os.write(master, answer.encode() + b"\n")
            answered = True
    code = proc.wait(timeout=30)
    os.close(master)
    assert answered, seen.decode(errors="replace")
    return seen.decode(errors="replace"), code


def test_the_plan_before_the_confirmation_prompt_cannot_erase_itself(
    applied: SimNode, all_4a: Path
) -> None:
    hold(applied.dir, U5, holder=f"pid 4242 ({ERASE})")
    out, code = _apply_on_a_terminal(applied, all_4a, "no")
    assert code == 1 and "apply cancelled (nothing was changed)" in out
    # vgpuctl's own colours are there (a yellow replacement, a red blocked line)...
    assert "\x1b[33m-/+\x1b[0m" in out and "\x1b[31m!\x1b[0m" in out
    # ...and no cursor movement or erasure: what came from input is shown escaped.
    assert "\x1b[1A" not in out and "\x1b[2K" not in out
    assert f"in use by pid 4242 ({ESCAPED})" in out
    # Nothing was changed.
    assert applied.ok("status").stdout.count("NVIDIA A2-4Q") == 2


@pytest.mark.parametrize(
    ("written", "character"),
    [
        ("NVIDIA А2-4A", "U+0410 CYRILLIC CAPITAL LETTER A, which looks like 'A'"),
        ("NVIDIA A2-4Α", "U+0391 GREEK CAPITAL LETTER ALPHA, which looks like 'A'"),
        ("NVIDIA Ａ2-4A", "U+FF21 FULLWIDTH LATIN CAPITAL LETTER A, which looks like 'A'"),
        ("NVIDIA A2-4A\u200b", "U+200B ZERO WIDTH SPACE"),
    ],
)
def test_a_profile_name_with_a_look_alike_letter_is_refused_naming_it(
    written: str, character: str, tmp_path: Path
) -> None:
    path = tmp_path / "lookalike.yaml"
    path.write_text(
        SEED.read_text().replace('"0000:08:00.4": NVIDIA A2-4A', f'"0000:08:00.4": "{written}"')
    )
    result = run_vgpuctl("validate", path)
    assert result.returncode == 1
    shown = written.replace("\u200b", "\\u200b")
    assert result.stderr == (
        f"{path}:23:13: profile '{shown}' has a character NVIDIA's names never "
        f"have (they are printable ASCII): {character}\n"
    )


def test_a_gpu_model_with_a_look_alike_letter_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "lookalike.yaml"
    path.write_text(SEED.read_text().replace("model: NVIDIA A2", "model: NVIDIA А2"))
    result = run_vgpuctl("validate", path)
    assert result.returncode == 1
    assert result.stderr == (
        f"{path}:20:11: model 'NVIDIA А2' has a character NVIDIA's names never "
        "have (they are printable ASCII): U+0410 CYRILLIC CAPITAL LETTER A, which looks like 'A'\n"
    )
