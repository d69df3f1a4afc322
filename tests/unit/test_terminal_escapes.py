"""Terminal text escapes every value that came from outside, and keeps vgpuctl's own colours:
the plan (host, cluster, device-plugin, drift and unchanged lines, notes), the status table and
GPU lines, and the watch agent's log lines (text and JSON).

C0 controls (ESC, CR), DEL and the C1 controls (CSI, U+009B, which some terminals take for
``ESC[``) are all escaped; the user-level scenarios are ``tests/security/test_terminal_output.py``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from reconciler.cli.render import Style, gpu_line, plan_text, status_table
from reconciler.model import (
    VGPU,
    Blocked,
    CrUpdate,
    DevicePluginRefresh,
    Gpu,
    Interface,
    Inventory,
    KubevirtUpdate,
    MediatedDevice,
    Observation,
    PciAddress,
    PciHostDevice,
    Plan,
    SriovEnable,
    Vf,
    VgpuCreate,
    VgpuRemove,
)
from reconciler.model.cluster import KubeObject
from reconciler.model.plan import Drift, FieldChange, Noop
from reconciler.watch.logs import JsonFormatter, TextFormatter

HOSTILE = ["\x1b[1A\x1b[2K", "\r", "\x9b2K", "\x7f", "\x07"]
ESCAPED = ["\\x1b[1A\\x1b[2K", "\\r", "\\x9b2K", "\\x7f", "\\x07"]
GPU = "0000:08:00.0"


def _no_controls_but_colours(text: str) -> None:
    """Every ESC in ``text`` opens one of vgpuctl's colour codes (``ESC[<digits>m``); there is
    no other control character but the line break."""
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\x1b":
            end = text.find("m", i)
            code = text[i + 2 : end]
            assert text[i + 1] == "[" and end > i and code.isdigit(), repr(text[i : i + 12])
            i = end + 1
            continue
        assert ch == "\n" or ch.isprintable(), repr(text)
        i += 1


@pytest.mark.parametrize(("bad", "shown"), list(zip(HOSTILE, ESCAPED, strict=True)))
def test_every_line_of_a_plan_escapes_what_came_from_outside(bad: str, shown: str) -> None:
    gpu = PciAddress.parse(GPU)
    host: dict[str, Any] = {"gpu": gpu, "vf_index": 1, "uuid": "u"}
    plan = Plan(
        node=f"node{bad}",
        interface="mdev",
        observed=Observation("f"),
        actions=(
            VgpuRemove(seq=1, target="0000:08:00.5", reason=f"r{bad}", **host,
                       type_name=f"T{bad}", replaced_by="B"),
            VgpuCreate(seq=2, target="0000:08:00.5", reason=f"c{bad}", **host,
                       type_name="B", replaces=f"T{bad}"),
            SriovEnable(seq=3, target=GPU, reason=f"e{bad}", gpu=gpu, num_vfs=16),
            CrUpdate(seq=4, target=f"obj{bad}", reason=f"u{bad}", resource_version="1",
                     object=KubeObject(f"K{bad}", f"obj{bad}"), spec_changed=True,
                     status_changed=False, drift=True,
                     changes=(FieldChange(f"p{bad}", f"a{bad}", 1),)),
            KubevirtUpdate(seq=5, target=f"kubevirt/ns/kv{bad}", reason=f"k{bad}",
                           namespace="ns", name="kv", resource_version="1",
                           add=(MediatedDevice(f"s{bad}", "nvidia.com/s"),), remove=(f"t{bad}",),
                           add_pci=(PciHostDevice(f"10DE:{bad}", f"nvidia.com/p{bad}"),),
                           remove_pci=(f"nvidia.com/q{bad}",)),
            DevicePluginRefresh(seq=6, target=f"nvidia.com/x{bad}", reason=f"d{bad}",
                                resource="nvidia.com/x", type_name="x", devices=("u",)),
        ),
        blocked=(
            Blocked(VgpuRemove(target="0000:08:00.6", reason=f"in use by pid 1 ({bad})",
                               gpu=gpu, vf_index=2, type_name=f"T{bad}", uuid="v")),
        ),
        noops=(Noop(f"0000:08:00.7{bad}", f"n{bad}"),),
        notes=(f"first{bad}\n  second{bad}",),
        drift=(Drift(f"obj{bad}", f"K{bad}", (FieldChange(f"p{bad}", f"a{bad}", "b"),)),),
    )  # fmt: skip
    inventory = Inventory(
        node="n", gpus=(Gpu(PciAddress.parse(GPU), "10de", "25b6", model=f"M{bad}"),)
    )
    for style in (Style(True), Style(False)):
        text = plan_text(plan, inventory=inventory, style=style, verbose=True)
        _no_controls_but_colours(text)
        assert text.count(shown) >= 20, text
    coloured = plan_text(plan, inventory=inventory, style=Style(True), verbose=True)
    assert "\x1b[33m-/+\x1b[0m" in coloured and "\x1b[31m!\x1b[0m" in coloured
    # The note keeps its own line break, and only that.
    plain = plan_text(plan, inventory=inventory, style=Style(False), verbose=True)
    assert f"Note: first{shown}\n  second{shown}\n" in plain
    # The KubeVirt CR's lines, both allow-lists.
    assert (
        f"        + mediatedDevices: s{shown}\n"
        f"        - mediatedDevices: t{shown}\n"
        f"        + pciHostDevices: nvidia.com/p{shown} (10DE:{shown})\n"
        f"        - pciHostDevices: nvidia.com/q{shown}\n"
    ) in plain


@pytest.mark.parametrize(("bad", "shown"), list(zip(HOSTILE, ESCAPED, strict=True)))
def test_the_status_table_and_gpu_lines_escape_sysfs_text_and_holders(bad: str, shown: str) -> None:
    vgpu = VGPU(uuid="u", type_name=f"NVIDIA A2-4Q{bad}", in_use=True, holder=f"pid 7 ({bad})")
    vf = Vf(PciAddress.parse("0000:08:00.4"), 0, vgpu)
    gpu = Gpu(PciAddress.parse(GPU), "10de", f"25b6{bad}", driver=f"vfio{bad}", vfs=(vf,),
              interface=Interface.MDEV)  # fmt: skip
    table = status_table(Inventory(node="n", gpus=(gpu,)))
    _no_controls_but_colours(table)
    assert f"NVIDIA A2-4Q{shown}" in table and f"pid 7 ({shown})" in table
    line = gpu_line(gpu)
    _no_controls_but_colours(line)
    assert f"bound to vfio{shown}" in line


def _record(message: str, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("vgpuctl.watch", logging.WARNING, "f", 1, message, None, None)
    record.__dict__.update(extra)
    return record


@pytest.mark.parametrize(("bad", "shown"), list(zip(HOSTILE, ESCAPED, strict=True)))
def test_log_lines_escape_messages_and_fields(bad: str, shown: str) -> None:
    record = _record(f"blocked: in use by pid 1 ({bad})", holder=f"q{bad}", items=[f"i{bad}"])
    text = TextFormatter().format(record)
    _no_controls_but_colours(text)
    assert f"({shown})" in text
    as_json = JsonFormatter().format(record)
    _no_controls_but_colours(as_json)
    doc = json.loads(as_json)
    assert doc["msg"] == f"blocked: in use by pid 1 ({shown})"
    assert doc["holder"] == f"q{shown}" and doc["items"] == [f"i{shown}"]
