"""``vgpuctl`` entry point: parse, dispatch, turn errors into one line and an exit code.

Exit codes everywhere: 0 success (no changes), 1 error (usage errors too, never 2),
2 changes present (``plan --detailed-exitcode``, ``assert``, an ``apply`` that left blocked work).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from reconciler import __version__
from reconciler.cli.options import GlobalOptions, add_global_options
from reconciler.model import ReconcilerError, UsageError
from reconciler.model.errors import printable

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CHANGES = 2


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on a usage error; our contract says 1, with the usage line kept."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    from reconciler.cli import (
        capacity_command,
        commands,
        deviceplugin_command,
        lint_vm,
        sim_commands,
        watch_command,
    )

    parser = _Parser(
        prog="vgpuctl",
        description="Declarative reconciliation of NVIDIA SR-IOV vGPUs: validate a desired "
        "state, plan the changes a node needs, apply them safely, and report what is there.",
        epilog="Exit codes: 0 success/no changes, 1 error, 2 changes present "
        "(plan --detailed-exitcode, assert).",
    )
    parser.add_argument("--version", action="version", version=f"vgpuctl {__version__}")
    add_global_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for register in (
        *commands.REGISTRY,
        watch_command.register,
        capacity_command.register,
        lint_vm.register,
        deviceplugin_command.register,
        sim_commands.register,
    ):
        sp = register(sub)
        for leaf in _leaves(sp):
            add_global_options(leaf, suppress=True)
    return parser


def _leaves(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser itself, or its sub-subcommands' parsers (``sim init`` …)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [parser]
    return [leaf for s in subs for p in s.choices.values() for leaf in _leaves(p)]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
        ns = parser.parse_args(args)
        options = GlobalOptions.from_namespace(ns)
        code: int = ns.handler(ns, options)
        return code
    except ReconcilerError as exc:
        for raw in exc.lines():
            line = printable(raw)
            print(f"error: {line}" if not _located(line) else line, file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # A reader such as `head` went away: not our error. Silence the flush at exit too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:  # a bug: still one clear line, the traceback only on request
        if os.environ.get("VGPUCTL_DEBUG"):
            raise
        print(
            f"internal error: {type(exc).__name__}: {exc} "
            "(please report it; VGPUCTL_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return EXIT_ERROR


def _located(line: str) -> bool:
    """Whether a message already starts with ``file:line:col:`` (then it needs no prefix)."""
    head = line.split(": ", 1)[0]
    return head.count(":") >= 1 and head.rsplit(":", 1)[-1].isdigit()
