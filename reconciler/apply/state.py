"""The node's state directory: where the apply lock and the journal live.

File names are built from the node name, so it is checked to be one plain file-name component.
"""

from __future__ import annotations

import re
from pathlib import Path

from reconciler.model import ApplyError

# Kubernetes node names (RFC 1123 subdomains), with upper case and '_' tolerated for hosts.
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


def node_file(state_dir: Path, node: str, suffix: str) -> Path:
    """``<state_dir>/<node><suffix>``, creating the directory (mode 0700) when missing."""
    if not _NODE_NAME.fullmatch(node):
        raise ApplyError(f"invalid node name {node!r}: expected a host or Kubernetes node name")
    state_dir = Path(state_dir)
    try:
        # Only root's own apply runs belong here: the journal names devices and commands.
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise ApplyError(f"cannot create state directory {state_dir}: {e.strerror or e}") from e
    return state_dir / f"{node}{suffix}"
