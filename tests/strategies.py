"""Hypothesis strategies shared by the property test (``tests/property/test_converge.py``) and
the reliability suite's generators (``tests/reliability/generators.py``)."""

from __future__ import annotations

from hypothesis import strategies as st

from reconciler.catalog import GpuModel


@st.composite
def gpu_config(draw: st.DrawFn, model: GpuModel) -> tuple[int, list[tuple[int, str]]]:
    """One framebuffer size and a valid set of (VF index, profile) of that size."""
    profiles = model.time_sliced_profiles
    size = draw(st.sampled_from(sorted({p.framebuffer_mib for p in profiles})))
    same_size = [p for p in profiles if p.framebuffer_mib == size]
    limit = min(p.max_instances for p in same_size)
    count = draw(st.integers(min_value=0, max_value=min(limit, 6)))
    vfs = draw(st.lists(st.integers(0, model.vfs - 1), min_size=count, max_size=count, unique=True))
    names = [draw(st.sampled_from(same_size)).name for _ in vfs]
    return size, list(zip(vfs, names, strict=True))
