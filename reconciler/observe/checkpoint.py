"""The kubelet's device-plugin checkpoint: which pod was given which vGPU.

The kubelet records every device allocation in ``<kubelet dir>/device-plugins/
kubelet_internal_checkpoint`` (docs/domain.md §7)::

    {"Data": {"PodDeviceEntries": [{"PodUID": "…", "ContainerName": "compute",
                                    "ResourceName": "nvidia.com/NVIDIA_A2-4Q",
                                    "DeviceIDs": {"0": ["<mdev uuid>"]}, "AllocResp": "…"}],
              "RegisteredDevices": {"nvidia.com/NVIDIA_A2-4Q": ["<uuid>", …]}},
     "Checksum": 1234}

``DeviceIDs`` maps NUMA node → IDs on current kubelets (1.20+) and is a plain list on older
ones; ``AllocResp`` (the plugin's answer, base64) is not needed. A vGPU listed here is
allocated to a pod, so it is in use even before (or without) a VM opening it.

:func:`parse_checkpoint` is pure; :func:`read_checkpoint` is the thin read around it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reconciler.model import ObserveError
from reconciler.model.record import record

#: Relative to the kubelet's root directory (``--kubelet-dir``, default ``/var/lib/kubelet``).
CHECKPOINT_PATH = Path("device-plugins") / "kubelet_internal_checkpoint"

#: Kubelets write a few KiB per pod; anything far beyond is not a checkpoint.
_MAX_BYTES = 64 * 1024 * 1024


@record(frozen=True, slots=True)
class CheckpointEntry:
    """One container's allocation of one resource."""

    pod_uid: str
    container: str
    resource_name: str  # nvidia.com/NVIDIA_A2-4Q
    device_ids: tuple[str, ...]  # mdev UUIDs (or VF addresses on the vfio interface)


def parse_checkpoint(text: str, *, source: str) -> list[CheckpointEntry]:
    """Every allocation in a checkpoint's JSON text, in file order.

    Raises :class:`ObserveError` naming ``source`` when the text is not JSON or not shaped
    like a device-plugin checkpoint (guessing would risk calling an allocated vGPU free).
    """

    def bad(why: str) -> ObserveError:
        return ObserveError(f"{source}: not a kubelet device-plugin checkpoint: {why}")

    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise bad(f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    if not isinstance(doc, dict):
        raise bad(f"the top level is {_kind(doc)}, not an object")
    data = doc.get("Data")
    if not isinstance(data, dict):
        raise bad('no "Data" object' if data is None else f'"Data" is {_kind(data)}')
    raw_entries = data.get("PodDeviceEntries")
    if raw_entries is None:
        return []  # a Go nil slice: nothing allocated
    if not isinstance(raw_entries, list):
        raise bad(f'"PodDeviceEntries" is {_kind(raw_entries)}, not a list')
    entries = []
    for i, raw in enumerate(raw_entries):
        where = f"PodDeviceEntries[{i}]"
        if not isinstance(raw, dict):
            raise bad(f"{where} is {_kind(raw)}, not an object")
        fields = {}
        for name in ("PodUID", "ContainerName", "ResourceName"):
            value = raw.get(name)
            if not isinstance(value, str) or not value:
                raise bad(f"{where}.{name} is {_kind(value)}, not a non-empty string")
            fields[name] = value
        try:
            ids = _device_ids(raw.get("DeviceIDs"))
        except ValueError as e:
            raise bad(f"{where}.DeviceIDs {e}") from None
        entries.append(
            CheckpointEntry(
                pod_uid=fields["PodUID"],
                container=fields["ContainerName"],
                resource_name=fields["ResourceName"],
                device_ids=ids,
            )
        )
    return entries


def _device_ids(raw: Any) -> tuple[str, ...]:
    """A plain list (old kubelets) or NUMA node → list (current ones), NUMA nodes in
    numeric order; a node's list may be ``null``."""
    if raw is None:
        return ()
    if isinstance(raw, list):
        return _id_list(raw)
    if isinstance(raw, Mapping):
        ids: list[str] = []
        for numa in sorted(raw, key=_numa_order):
            ids.extend(_id_list(raw[numa] or []))
        return tuple(dict.fromkeys(ids))  # an ID counts once even if listed twice
    raise ValueError(f"is {_kind(raw)}, not a list or a map of NUMA node to list")


def _id_list(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(x, str) and x for x in raw):
        raise ValueError("must list device IDs as non-empty strings")
    return tuple(raw)


def _numa_order(key: str) -> tuple[int, int | str]:
    try:
        return (0, int(key))
    except ValueError:
        return (1, key)


def _kind(value: object) -> str:
    if value is None:
        return "null"
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }.get(type(value), type(value).__name__)


def checkpoint_file(kubelet_dir: Path) -> Path:
    return kubelet_dir / CHECKPOINT_PATH


def read_checkpoint(kubelet_dir: Path) -> list[CheckpointEntry] | None:
    """The allocations recorded under ``kubelet_dir``; ``None`` when there is no checkpoint
    (a node where no device plugin ever registered has none: not an error, the caller notes
    it). Unreadable or malformed → :class:`ObserveError` naming the file."""
    path = checkpoint_file(kubelet_dir)
    try:
        with path.open("rb") as f:
            blob = f.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except PermissionError:
        raise ObserveError(f"cannot read {path}: permission denied (run as root?)") from None
    except OSError as e:
        raise ObserveError(f"cannot read {path}: {e.strerror or e}") from None
    if len(blob) > _MAX_BYTES:
        raise ObserveError(
            f"{path}: not a kubelet device-plugin checkpoint: larger than {_MAX_BYTES} bytes"
        )
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ObserveError(
            f"{path}: not a kubelet device-plugin checkpoint: not UTF-8 text (byte {e.start})"
        ) from None
    return parse_checkpoint(text, source=str(path))
