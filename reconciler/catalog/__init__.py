"""The GPU and vGPU-profile catalogue: data (``catalog.json``) and pure look-ups.

Used offline (``validate``), by the planner when SR-IOV is still off (no VF lists types yet), and
by the simulator to build realistic hosts. A GPU missing here still works from what sysfs reports.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path

from reconciler.model import VGPUType
from reconciler.model.record import record

#: ``<NVIDIA|GRID> <GPU>-[<slices>-]<GB><series>[<suffix>]`` (docs/domain.md §4). The GPU part
#: may be several words (``RTX Pro 6000 Blackwell DC``) and end in variant letters (``A100DX``,
#: ``H100XM``); MIG-backed types carry a slice count and may end in a suffix (``CME``, ``CNOME``,
#: ``CMEALL``, ``CGFX``). Anything else is still a valid name, carried opaque.
_PROFILE_NAME = re.compile(
    r"^(?P<vendor>NVIDIA|GRID) (?P<gpu>\S.*?)-(?:(?P<slices>\d+)-)?(?P<size>\d+)"
    r"(?P<series>[ABCQ])(?P<suffix>[A-Z]*)$"
)
#: The prefixes a driver puts before a profile name: the same profile, depending on the branch.
VENDOR_PREFIXES = ("NVIDIA ", "GRID ")


@record(frozen=True, slots=True)
class Profile:
    """A vGPU profile (type) a GPU model offers."""

    name: str  # "NVIDIA A2-4Q"
    series: str  # A, B, C or Q
    framebuffer_mib: int
    max_instances: int  # per physical GPU, in equal-size mode
    num_heads: int = 1
    max_resolution: str = ""
    frl_config: int = 60
    mig: bool = False
    gpu_instance_slices: int = 0
    #: The per-GPU maximum in mixed-size mode where NVIDIA published one (``L40S-4C``: 8);
    #: None: not known (the driver's refusal at create time decides). Never derived.
    mixed_size_max_instances: int | None = None

    @property
    def size_gb(self) -> int:
        return self.framebuffer_mib // 1024

    def vgpu_type(self, type_id: str = "") -> VGPUType:
        """This profile as a GPU's vGPU type, under ``type_id`` ("": the driver has not shown
        its id; ids belong to a driver branch, never to the catalogue)."""
        return VGPUType(
            name=self.name,
            type_id=type_id,
            framebuffer_mib=self.framebuffer_mib,
            max_instance=self.max_instances,
            num_heads=self.num_heads,
            max_resolution=self.max_resolution,
            frl_config=self.frl_config,
        )


@record(frozen=True, slots=True)
class PciId:
    vendor: str
    device: str
    subsystem_vendor: str = ""
    subsystem_device: str = ""


@record(frozen=True, slots=True)
class GpuModel:
    name: str  # "NVIDIA A2"
    short: str  # "A2": the part profile names use
    aliases: tuple[str, ...]
    architecture: str
    pci_ids: tuple[PciId, ...]
    framebuffer_mib: int
    vfs: int
    #: ``sriov_offset``: VF 0 is at the PF's routing id + this. None: not seen on a real host,
    #: so offline checks that need it are skipped (the host's own value is used at plan time).
    vf_offset: int | None
    vf_stride: int
    gpus_per_board: int
    multi_vgpu_series: tuple[str, ...] | None  # None: not known
    profiles: tuple[Profile, ...]
    #: The public captures this model's facts were checked against.
    sources: tuple[str, ...] = ()
    #: Where the catalogue's profile list was checked to be the whole list (a driver's own
    #: list of every type the model has); empty: the list may lack names a driver offers.
    #: ``vgpuctl validate`` refuses a name outside a whole list (``--lenient``: a note).
    profiles_complete: str = ""

    def profile(self, name: str) -> Profile | None:
        for p in self.profiles:
            if p.name == name:
                return p
        return None

    @property
    def time_sliced_profiles(self) -> tuple[Profile, ...]:
        return tuple(p for p in self.profiles if not p.mig)


@record(frozen=True, slots=True)
class ParsedProfileName:
    """What a profile name alone says: ``NVIDIA A2-4Q`` → gpu ``A2``, 4 GB, series Q."""

    name: str
    gpu: str
    size_gb: int
    series: str
    mig_slices: int = 0
    suffix: str = ""  # "ME", "NOME", "MEALL", "GFX" after a MIG-backed type's series letter


def parse_profile_name(name: str) -> ParsedProfileName | None:
    """What the name says, or None for a shape this parser does not know (never an error: a
    name the driver offers is valid whatever its shape, and is carried as it is)."""
    m = _PROFILE_NAME.match(name)
    if m is None:
        return None
    return ParsedProfileName(
        name=name,
        gpu=m["gpu"],
        size_gb=int(m["size"]),
        series=m["series"],
        mig_slices=int(m["slices"] or 0),
        suffix=m["suffix"],
    )


def long_profile_name(name: str) -> str:
    """``A2-4Q`` → ``NVIDIA A2-4Q``; names that already carry a vendor prefix are kept."""
    name = " ".join(name.split())
    if name.startswith(VENDOR_PREFIXES):
        return name
    return f"NVIDIA {name}"


def profile_body(name: str) -> str:
    """A profile name without its vendor prefix: ``GRID A100-4C`` and ``A100-4C`` → ``A100-4C``.

    Drivers print the prefix by branch (``GRID`` on the A100 family and older boards, ``NVIDIA``
    elsewhere): the body is what identifies the profile.
    """
    name = " ".join(name.split())
    for prefix in VENDOR_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def resolve_profile_name(name: str, known: Iterable[str]) -> str | None:
    """The one name among ``known`` that is ``name``, whatever prefix either carries; None when
    none is, or when several are (then nothing can be said)."""
    name = " ".join(name.split())
    body = profile_body(name)
    found = {k for k in known if k == name or profile_body(k) == body}
    if name in found:
        return name
    return next(iter(found)) if len(found) == 1 else None


def _load_models(raw: Mapping[str, object]) -> tuple[GpuModel, ...]:
    models = []
    for m in raw["models"]:  # type: ignore[attr-defined]
        models.append(
            GpuModel(
                name=m["name"],
                short=m["short"],
                aliases=tuple(m.get("aliases", [])),
                architecture=m.get("architecture", ""),
                pci_ids=tuple(
                    PciId(
                        vendor=i["vendor"],
                        device=i["device"],
                        subsystem_vendor=i.get("subsystemVendor", ""),
                        subsystem_device=i.get("subsystemDevice", ""),
                    )
                    for i in m["pciIds"]
                ),
                framebuffer_mib=m["framebufferMiB"],
                vfs=m["vfs"],
                vf_offset=m.get("vfOffset"),
                vf_stride=m["vfStride"],
                gpus_per_board=m.get("gpusPerBoard", 1),
                multi_vgpu_series=None
                if m.get("multiVgpuSeries") is None
                else tuple(m["multiVgpuSeries"]),
                sources=tuple(m.get("sources", [])),
                profiles_complete=m.get("profilesComplete", ""),
                profiles=tuple(
                    Profile(
                        name=p["name"],
                        series=p["series"],
                        framebuffer_mib=p["framebufferMiB"],
                        max_instances=p["maxInstances"],
                        num_heads=p.get("numHeads", 1),
                        max_resolution=p.get("maxResolution", ""),
                        frl_config=p.get("frlConfig", 60),
                        mig=p.get("mig", False),
                        gpu_instance_slices=p.get("gpuInstanceSlices", 0),
                        mixed_size_max_instances=p.get("mixedSizeMaxInstances"),
                    )
                    for p in m["profiles"]
                ),
            )
        )
    return tuple(models)


class Catalog:
    """Look-ups over the model list; build one from data with :meth:`from_json`."""

    def __init__(self, models: tuple[GpuModel, ...]) -> None:
        self.models = models
        self._by_profile: dict[str, tuple[GpuModel, Profile]] = {}
        self._by_body: dict[str, str] = {}
        self._by_key: dict[str, GpuModel] = {}
        for m in models:
            for p in m.profiles:
                self._by_profile[p.name] = (m, p)
                self._by_body[profile_body(p.name)] = p.name
            for key in (m.name, m.short, *m.aliases):
                self._by_key[_norm(key)] = m

    @classmethod
    def from_json(cls, raw: Mapping[str, object]) -> Catalog:
        return cls(_load_models(raw))

    def model(self, name: str) -> GpuModel | None:
        """By full name (``NVIDIA A2``), short name (``A2``) or alias (``A100-80GB``)."""
        key = _norm(name)
        if key.startswith("nvidia "):
            key_short = key.removeprefix("nvidia ")
            return self._by_key.get(key) or self._by_key.get(key_short)
        return self._by_key.get(key)

    def model_for_ids(
        self, vendor: str, device: str, subsystem_vendor: str = "", subsystem_device: str = ""
    ) -> GpuModel | None:
        """The model a PF's PCI ids name; subsystem ids decide where ids are shared (A2/A16)."""
        vendor, device = vendor.lower(), device.lower()
        by_device = [
            (m, i)
            for m in self.models
            for i in m.pci_ids
            if (i.vendor, i.device) == (vendor, device)
        ]
        exact = [
            m
            for m, i in by_device
            if i.subsystem_device and i.subsystem_device == subsystem_device.lower()
        ]
        if exact:
            return exact[0]
        candidates = {m.name: m for m, _ in by_device}
        return next(iter(candidates.values())) if len(candidates) == 1 else None

    def profile(self, name: str) -> tuple[GpuModel, Profile] | None:
        """The profile of this exact name (see :meth:`spelled` for the catalogue's spelling)."""
        return self._by_profile.get(name)

    def spelled(self, name: str) -> str | None:
        """The catalogue's spelling of a profile written with any prefix or none
        (``A100-4C`` → ``GRID A100-4C``); None when the catalogue does not know it."""
        body = profile_body(name)
        return self._by_body.get(body)


def _norm(name: str) -> str:
    return " ".join(name.lower().replace("_", " ").split())


@cache
def default_catalog() -> Catalog:
    """The catalogue shipped with the package."""
    # Beside this module in a checkout and in an installed wheel alike (see ``schema_path``).
    text = Path(__file__).with_name("catalog.json").read_text(encoding="utf-8")
    return Catalog.from_json(json.loads(text))
