"""The record of the vGPU types vgpuctl has seen on NVIDIA's vendor-specific VFIO interface.

A VF's ``nvidia/current_vgpu_type`` says only a type id, and once the lists narrow (a GPU at a
profile's maximum: one L40S-48Q, two L40S-24Q) no VF names that id any more (docs/domain.md
§3b). So before its first write on a GPU, the host driver (``apply/vfio.py``) records the name
of every type any of the GPU's VFs lists, not only the one it writes, and of every id it had to
ask the driver about (``observe/vgputypes.py``: ``nvidia-smi vgpu -s -v``): a crash right after
the write never leaves an id vgpuctl cannot name, and a record that was lost is written again
from the driver's answer. The record is ``<state_dir>/<node>.vfio-types.json``:

    {"formatVersion": 1,
     "types": [{"driver": "550.54.10", "gpu": "0000:08:00.0", "id": "1156",
                "name": "NVIDIA L40S-48Q"}]}

Type ids are a driver branch's, so each entry carries the NVIDIA driver's version
(``module/nvidia/version``) and only the running driver's entries are used. The file is in the
state directory, so it is opened as ``state.py`` says and read as untrusted input: bounded in
size, every entry checked (a PCI address, a decimal id, a type name as a driver prints one), a
malformed file or entry ignored with a note. Ignoring is the safe side: a type the record does
not name is asked of the driver, and one nobody can name keeps its GPU's changes blocked
(``plan.guard``). Writes (under the node lock) replace the
file whole (a new file renamed over it), so a reader never sees half of one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from reconciler.apply.state import node_file, open_node_file, open_state_dir, replace_node_file
from reconciler.model import ApplyError, PciAddress, ReconcilerError, TypeNames
from reconciler.model.errors import excerpt
from reconciler.model.record import record
from reconciler.observe.parse import parse_type_name
from reconciler.observe.sysfs import SysfsTree

SUFFIX = ".vfio-types.json"
FORMAT_VERSION = 1
#: Bounds on what is read: far above what a node needs (8 GPUs × a few dozen types).
MAX_BYTES = 256 * 1024
MAX_ENTRIES = 4096
NVIDIA_VERSION = "module/nvidia/version"


@record(frozen=True, slots=True)
class RecordedType:
    driver: str
    gpu: PciAddress
    type_id: str
    name: str

    def to_json(self) -> dict[str, str]:
        return {"driver": self.driver, "gpu": str(self.gpu), "id": self.type_id, "name": self.name}


@record(frozen=True, slots=True)
class TypeRecordRead:
    """The running driver's recorded type names, and why the record was not (all) used."""

    names: TypeNames
    note: str | None = None


def driver_version(sysfs_root: Path) -> str:
    """The NVIDIA driver's version (``module/nvidia/version``), "" when it cannot be read."""
    try:
        text = SysfsTree(sysfs_root).read_text(NVIDIA_VERSION).strip()
    except (OSError, ReconcilerError):  # absent; a link leaving the root
        return ""
    return text if text.isprintable() and len(text) <= 64 else ""


class TypeRecord:
    """The record of one node, for one driver version."""

    def __init__(self, state_dir: Path, node: str, *, driver: str) -> None:
        self.state_dir = Path(state_dir)
        self.path = node_file(state_dir, node, SUFFIX)
        self._new = node_file(state_dir, node, SUFFIX + ".new")
        self.driver = driver

    def read(self) -> TypeRecordRead:
        """The running driver's entries; nothing (and a note) when the file is malformed or
        cannot be read (a state directory another user owns, say: ``status`` still works)."""
        try:
            entries, note = self._entries()
        except ApplyError as e:
            return TypeRecordRead({}, f"the record of configured vGPU types not read: {e.message}")
        names = {(e.gpu, e.type_id): e.name for e in entries if e.driver == self.driver}
        return TypeRecordRead(names, note)

    def add(self, gpu: PciAddress, type_id: str, name: str) -> None:
        """Record that type ``type_id`` of ``gpu`` is ``name`` under the running driver (the
        caller holds the node lock). Raises ``ApplyError`` when the file cannot be written."""
        self.remember(gpu, {type_id: name})

    def remember(self, gpu: PciAddress, names: Mapping[str, str]) -> None:
        """Record every type id → name of ``gpu`` in ``names`` under the running driver (the
        caller holds the node lock), before the write that could make one of them unlisted:
        the file is rewritten only when an entry is new or changed. Raises ``ApplyError`` when
        the file cannot be written."""
        entries, _ = self._entries()  # a malformed record is replaced
        have = {(e.driver, e.gpu, e.type_id): e.name for e in entries}
        new = [
            RecordedType(self.driver, gpu, type_id, name)
            for type_id, name in sorted(names.items())
            if have.get((self.driver, gpu, type_id)) != name
        ]
        if not new:
            return
        replaced = {(e.driver, e.gpu, e.type_id) for e in new}
        kept = [e for e in entries if (e.driver, e.gpu, e.type_id) not in replaced]
        # Another driver's entries go first when the record is full: they name nothing now.
        kept.sort(key=lambda e: e.driver == self.driver)
        self._write([*kept, *new][-MAX_ENTRIES:])

    def _write(self, entries: list[RecordedType]) -> None:
        doc = {"formatVersion": FORMAT_VERSION, "types": [e.to_json() for e in entries]}
        body = (json.dumps(doc, indent=1) + "\n").encode()
        dir_fd = open_state_dir(self.state_dir)
        try:
            fd, _ = open_node_file(dir_fd, self._new, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                os.ftruncate(fd, 0)
                os.write(fd, body)
                os.fsync(fd)
                opened = os.fstat(fd)
            finally:
                os.close(fd)
            replace_node_file(dir_fd, self._new, self.path, opened=opened)
        except OSError as e:
            raise ApplyError(f"cannot write {self.path}: {e.strerror or e}") from e
        finally:
            os.close(dir_fd)

    def _entries(self) -> tuple[list[RecordedType], str | None]:
        try:
            dir_fd = open_state_dir(self.state_dir, create=False)
        except FileNotFoundError:
            return [], None
        try:
            try:
                fd, _ = open_node_file(dir_fd, self.path, os.O_RDONLY)
            except FileNotFoundError:
                return [], None
            try:
                raw = os.read(fd, MAX_BYTES + 1)
            finally:
                os.close(fd)
        finally:
            os.close(dir_fd)
        if len(raw) > MAX_BYTES:
            return [], f"{self.path} is larger than {MAX_BYTES} bytes: not read"
        try:
            doc = json.loads(raw)
            return _parse(doc), None
        except (ValueError, TypeError, ReconcilerError) as e:
            return [], f"{self.path} is malformed ({excerpt(str(e))}): not used"


def _parse(doc: object) -> list[RecordedType]:
    if not isinstance(doc, dict) or doc.get("formatVersion") != FORMAT_VERSION:
        raise ValueError(f"expected formatVersion {FORMAT_VERSION}")
    types = doc.get("types")
    if not isinstance(types, list) or len(types) > MAX_ENTRIES:
        raise ValueError(f"types: expected a list of at most {MAX_ENTRIES} entries")
    out = []
    for i, entry in enumerate(types):
        if not isinstance(entry, dict):
            raise ValueError(f"types[{i}] is not an object")
        driver, gpu, type_id, name = (_text(entry, k, i) for k in ("driver", "gpu", "id", "name"))
        if len(driver) > 64 or not type_id.isdigit() or len(type_id) > 9:
            raise ValueError(f"types[{i}]: not a driver version and a decimal type id")
        out.append(
            RecordedType(
                driver,
                PciAddress.parse(gpu),
                str(int(type_id)),
                parse_type_name(name, source=f"types[{i}].name"),
            )
        )
    return out


def _text(entry: dict[str, object], key: str, i: int) -> str:
    value = entry.get(key)
    if not isinstance(value, str):
        raise ValueError(f"types[{i}].{key} must be a string")
    return value
