"""``vgpuctl import vgpu-device-manager CONFIG.yaml``: the GPU Operator's declarative vGPU
configs as a desired state (``desired/vgpu_device_manager.py`` says what becomes what).

The desired state goes to stdout, or ``-o FILE``; more than 256 node groups (a file's most)
go to ``-o DIR`` as several files, which ``vgpuctl validate DIR`` reads as one desired state.
The report goes to stderr: each rename, each refusal with its reason, each note. Exit 0 when
every config converted, 1 when something was refused (what could be converted is written all
the same) or the file is not a valid vgpu-device-manager config (nothing is written).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from reconciler.cli.files import replace_file, special_file
from reconciler.cli.options import GlobalOptions
from reconciler.cli.render import safe
from reconciler.model import PciAddress, UsageError, ValidationError

EXIT_OK, EXIT_REFUSED = 0, 1


def register(sub: Any) -> argparse.ArgumentParser:
    imp: argparse.ArgumentParser = sub.add_parser(
        "import",
        help="convert another tool's vGPU configuration into a desired state",
        description="Convert another tool's vGPU configuration into a desired state.",
    )
    isub = imp.add_subparsers(dest="import_command", metavar="FORMAT")
    isub.required = True
    p = isub.add_parser(
        "vgpu-device-manager",
        help="the GPU Operator's vgpu-device-manager config (version v1, vgpu-configs)",
        description="Each named config becomes a node group selecting the nodes labelled "
        "nvidia.com/vgpu.config=<config name>; each entry a GPU entry (devices: all → "
        "match: {all: true}; a device filter → deviceId, or model where the catalogue knows "
        "several models of that ID and the entry's types name one; GPU indices → addresses "
        "given with --gpu-address, else refused). Renames, refusals and notes go to stderr.",
    )
    p.add_argument("file", metavar="CONFIG.yaml", type=Path)
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE|DIR",
        type=Path,
        help="write the desired state here (an existing directory: one file per 256 node "
        "groups), not to stdout",
    )
    p.add_argument(
        "--name",
        default="vgpu-device-manager",
        help="metadata.name of the desired state (default: vgpu-device-manager)",
    )
    p.add_argument(
        "--config",
        dest="configs",
        metavar="NAME",
        action="append",
        default=[],
        help="convert only this config (repeat for more); default: all",
    )
    p.add_argument(
        "--gpu-address",
        dest="gpu_addresses",
        metavar="INDEX=ADDRESS",
        action="append",
        default=[],
        help="GPU INDEX (vgpu-device-manager's devices: [INDEX]) is the GPU at this PCI "
        "address on every node the configs select (repeat for more)",
    )
    p.set_defaults(handler=cmd_import_vgpu_device_manager)
    return imp


def _addresses(given: list[str]) -> dict[int, PciAddress]:
    out: dict[int, PciAddress] = {}
    for text in given:
        index, sep, address = text.partition("=")
        if not sep or not index.isdigit() or len(index) > 4:
            raise UsageError(
                f"--gpu-address {safe(text)!r}: expected INDEX=ADDRESS (0=0000:08:00.0)"
            )
        try:
            out[int(index)] = PciAddress.parse(address)
        except ValueError as exc:
            raise UsageError(f"--gpu-address {safe(text)!r}: {exc}") from None
    return out


def _write(path: Path, text: str) -> None:
    """``text`` saved at ``path`` as a new file renamed into place (``cli/files.py``): a link,
    FIFO or device there is refused, never followed (as ``plan --out``)."""
    try:
        kind = special_file(path)
        if kind is not None:
            raise UsageError(
                f"cannot write {path}: it is {kind}, which vgpuctl neither follows nor "
                "replaces (remove it, or write elsewhere)"
            )
        replace_file(path, text)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def cmd_import_vgpu_device_manager(ns: argparse.Namespace, options: GlobalOptions) -> int:
    import yaml

    from reconciler.catalog import default_catalog
    from reconciler.desired.source import read_document
    from reconciler.desired.vgpu_device_manager import NAME_PATTERN, convert

    if not NAME_PATTERN.match(ns.name) or len(ns.name) > 253:
        raise UsageError(f"--name {safe(ns.name)!r}: lower-case letters, digits, '-' and '.'")
    addresses = _addresses(ns.gpu_addresses)
    document, problems = read_document(ns.file)
    if document is None or problems:
        raise ValidationError(f"{ns.file}: cannot be read", problems)
    conversion = convert(
        document, catalog=default_catalog(), gpu_addresses=addresses, only=ns.configs
    )
    documents = conversion.documents(ns.name)
    texts = [
        yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=1 << 16) for doc in documents
    ]
    target: Path | None = ns.output
    if target is not None and special_file(target) == "a directory":
        width = len(str(len(texts)))
        for number, text in enumerate(texts, 1):
            _write(target / f"{ns.name}-{number:0{width}d}.yaml", text)
    elif len(texts) > 1:
        raise UsageError(
            f"{len(conversion.groups)} node groups are more than one file holds (256): give "
            "-o DIR (an existing directory) for one file per 256, or --config NAME for the "
            "configs your nodes use"
        )
    elif target is not None:
        _write(target, texts[0])
    else:
        sys.stdout.write(texts[0])
    for line in (*conversion.renames, *conversion.notes, *conversion.refusals):
        print(safe(line), file=sys.stderr)
    configs = len(conversion.groups)
    refused = len(conversion.refusals)
    print(
        f"{configs} config{'s' * (configs != 1)} converted"
        + (f"; {refused} refusal{'s' * (refused != 1)}" if refused else ""),
        file=sys.stderr,
    )
    return EXIT_REFUSED if refused else EXIT_OK
