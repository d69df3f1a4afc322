"""``vgpuctl`` entry point: parse, dispatch, turn errors into one line and an exit code.

Exit codes everywhere: 0 success (no changes), 1 error (usage errors too, never 2),
2 changes present (``plan --detailed-exitcode``, ``assert``, an ``apply`` that left blocked work),
75 no rollout slot became free within ``apply --slot-timeout`` (``cli/budget.py``).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from reconciler import __version__
from reconciler.cli.options import GlobalOptions, add_global_options
from reconciler.model import ReconcilerError, UsageError
from reconciler.model.errors import printable

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CHANGES = 2


class _Formatter(argparse.HelpFormatter):
    """argparse's help formatter, told the terminal's width as ``shutil.get_terminal_size``
    finds it (``COLUMNS``, else the terminal, else 80) without importing ``shutil``, which
    brings zlib, bz2 and lzma: argparse makes a formatter for every argument it adds, so a
    cold start paid for them just to parse a command line."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        if width is None:
            width = _columns() - 2
        super().__init__(prog, indent_increment, max_help_position, width)


def _columns() -> int:
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on a usage error; our contract says 1, with the usage line kept."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see '{self.prog} --help')")


#: The commands registered outside :mod:`reconciler.cli.commands`, by the module that registers
#: each: a run imports and builds the parser of its own command only (``just bench``).
_REGISTERED_IN = {
    "watch": "watch_command",
    "capacity": "capacity_command",
    "lint-vm": "lint_vm",
    "device-plugin": "deviceplugin_command",
    "sim": "sim_commands",
    "import": "import_command",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command; with ``command``, one that knows that command only (or,
    for a module that registers a family, ``sim``'s say, that family), and parses its command
    lines as the whole one does.
    A name no command has gets the whole parser (whose error lists them all)."""
    parser = _Parser(
        prog="vgpuctl",
        description="Declarative reconciliation of NVIDIA SR-IOV vGPUs: validate a desired "
        "state, plan the changes a node needs, apply them safely, and report what is there.",
        epilog="Exit codes: 0 success/no changes, 1 error, 2 changes present "
        "(plan --detailed-exitcode, assert), 75 no rollout slot free (apply --slot-timeout).",
    )
    parser.add_argument("--version", action="version", version=f"vgpuctl {__version__}")
    add_global_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for register in _registers(command):
        sp = register(sub)
        for leaf in _leaves(sp):
            add_global_options(leaf, suppress=True)
    if command is not None and command not in sub.choices:
        return build_parser()
    return parser


def _registers(command: str | None) -> tuple[Callable[[Any], argparse.ArgumentParser], ...]:
    from reconciler.cli import commands

    if command is None:
        from reconciler.cli import (
            capacity_command,
            deviceplugin_command,
            import_command,
            lint_vm,
            sim_commands,
            watch_command,
        )

        return (
            *commands.REGISTRY.values(),
            watch_command.register,
            capacity_command.register,
            lint_vm.register,
            deviceplugin_command.register,
            sim_commands.register,
            import_command.register,
        )
    module = _REGISTERED_IN.get(command)
    if module is None:
        own = commands.REGISTRY.get(command)
        return (own,) if own is not None else tuple(commands.REGISTRY.values())
    from importlib import import_module

    register: Callable[[Any], argparse.ArgumentParser]
    register = import_module(f"reconciler.cli.{module}").register
    return (register,)


def command_of(args: Sequence[str]) -> str | None:
    """The command ``args`` name, found as the whole parser finds it (global options before it
    parsed, abbreviated or not); None when there is none, or help, a version or an error comes
    first: then the whole parser parses them."""
    options = _Parser(prog="vgpuctl", add_help=False)
    add_global_options(options, suppress=False)
    try:
        _, rest = options.parse_known_args(args)
    except UsageError:
        return None
    return rest[0] if rest and not rest[0].startswith("-") else None


def _leaves(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser itself, or its sub-subcommands' parsers (``sim init`` …)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [parser]
    return [leaf for s in subs for p in s.choices.values() for leaf in _leaves(p)]


#: Commands that run until stopped: they keep the cyclic garbage collector on.
_LONG_RUNNING = frozenset({"watch", "device-plugin"})


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    # A command that ends within seconds makes little cyclic garbage, and the collector's
    # passes over everything its imports made were 3 % of a cold plan: off until it ends (a
    # fleet's plan already pauses it while it plans, plan/fleet.py).
    collecting = gc.isenabled()
    gc.disable()
    try:
        command = command_of(args)
        if command in _LONG_RUNNING and collecting:
            gc.enable()
        return _run(args, command)
    finally:
        if collecting:
            gc.enable()


def _run(args: list[str], command: str | None) -> int:
    try:
        parser = build_parser(command)
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
