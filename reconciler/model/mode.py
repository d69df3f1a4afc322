"""A GPU's vGPU framebuffer mode (docs/domain.md §4): equal-size (the driver's default) or
mixed-size (``nvidia-smi vgpu -i <gpu> -shm 1``, vGPU 17+)."""

from __future__ import annotations

import enum


class VgpuMode(enum.StrEnum):
    """How the time-sliced vGPUs of one GPU may be sized.

    ``EQUAL_SIZE``: all share one framebuffer size (the default after ``sriov-manage``).
    ``MIXED_SIZE``: sizes may differ up to the GPU's total framebuffer; some maxima are lower.
    ``UNKNOWN`` (observed only, never desired): the mode could not be read on a GPU that hosts
    vGPUs (a GPU without vGPUs counts as equal-size: the driver's default).
    """

    EQUAL_SIZE = "equal-size"
    MIXED_SIZE = "mixed-size"
    UNKNOWN = "unknown"
