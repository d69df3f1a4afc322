"""The simulated host's programs in ``DIR/bin``: small scripts that run a module's ``main`` on
``DIR/sys`` with the interpreter that built the host (``sriov-manage``, ``nvidia-smi``).

They run in isolated mode (``-I``) and import vgpuctl from the directory that built the host:
never from the directory they are started in, nor from ``PYTHONPATH``."""

from __future__ import annotations

import sys
from pathlib import Path


def install_program(directory: Path, name: str, *, module: str, summary: str) -> Path:
    """Write ``DIR/bin/<name>``: runs ``<module>.main(argv, sysfs_root=DIR/sys)`` and exits
    with what it returns. ``summary`` is the script's docstring (one line)."""
    package_parent = Path(__file__).resolve().parents[2]
    script = directory / "bin" / name
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(
        f"#!{Path(sys.executable).absolute()} -I\n"
        f'"""{summary}"""\n'
        "import sys\n"
        "from pathlib import Path\n"
        "\n"
        "# The vgpuctl that built this host, first (-I left out the current directory).\n"
        f"sys.path.insert(0, {str(package_parent)!r})\n"
        f"from {module} import main\n"
        "\n"
        'root = Path(__file__).resolve().parent.parent / "sys"\n'
        "sys.exit(main(sys.argv[1:], sysfs_root=root))\n",
        encoding="utf-8",
    )
    script.chmod(0o755)
    return script
