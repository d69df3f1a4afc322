"""Where the JSON Schemas (``schemas/*.json``) are at run time.

A source checkout keeps them at ``<repo>/schemas/``; a wheel carries them inside the package as
``reconciler/_schemas/`` (pyproject force-includes them), because a non-editable install has no
repository around it. Every layer that validates against a schema (desired state, plan,
inventory) finds its file here.
"""

from __future__ import annotations

from pathlib import Path

from reconciler.model import ReconcilerError


def schema_path(name: str) -> Path:
    """The file of schema ``name`` (``desired-state.schema.json``), installed or in a checkout.

    Raises :class:`ReconcilerError` naming both places looked at when neither has it: a broken
    install is a packaging bug, and the message should say where the file was expected.
    """
    if not name or Path(name).name != name:
        raise ValueError(f"schema name must be a bare file name, got {name!r}")
    here = Path(__file__).resolve()
    # The package's own directory: a wheel installs as plain files (a zip import would not be
    # one; vgpuctl is not shipped that way). Not through importlib.resources: that alone
    # costs a cold ``vgpuctl plan`` the import of zipfile, tempfile and threading.
    installed = here.parents[1] / "_schemas" / name
    if installed.is_file():
        return installed
    checkout = here.parents[2] / "schemas" / name
    if checkout.is_file():
        return checkout
    raise ReconcilerError(
        f"schema {name} not found: looked in {installed} (installed package) and {checkout} "
        "(source checkout); reinstall vgpuctl"
    )
