"""Bad input: generated desired-state documents, each a located rejection or a clean acceptance.

Hypothesis draws a valid document (``generators.py``) and breaks it one way, picked uniformly
from ``MUTATIONS``: wrong types, unknown or missing fields, bad PCI addresses and VF keys,
duplicate keys, broken YAML syntax, truncation, random bytes and text, encodings (UTF-16,
Latin-1, NUL, control characters), deep nesting, huge numbers, YAML features (anchors,
aliases, merge keys, tags, directives, several documents, an alias bomb), mixed and impossible
profiles, two files defining one GPU, empty files and oversized ones.

Every document goes through ``reconciler.desired.load_desired`` in this process: anything but
a ``ValidationError`` is a finding, and so is a problem without a file, naming another file, or
without a line (unless it is about the whole file), a line past the end of the file, or a
message over several lines. A sample of the rejected ones goes through ``vgpuctl validate``
as a user runs it: exit 1, no traceback, every stderr line ``file:line:col: …`` or
``file: …`` (the CLI writes the latter ``error: file: …``).
"""

from __future__ import annotations

import copy
import json
import multiprocessing
import random
import re
import string
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from reconciler.catalog import GpuModel
from reconciler.desired import load_desired
from reconciler.model import ValidationError
from tests.reliability.generators import (
    ADDRESSES,
    CATALOG,
    MODELS,
    draw_examples,
    host_and_desired,
    vf_address,
)
from tests.reliability.hosts import vgpuctl
from tests.reliability.sizes import Context

NODE = "bad-input-node"
#: Problems that concern the file as a whole: no line to point at.
WHOLE_FILE = (
    "larger than",
    "with the files before it",
    "cannot read",
    "is a directory",
    "… and",  # how many more problems than the first ones listed
)
#: A document slower than this to load counts as slow (a figure, and a finding if any).
SLOW_SECONDS = 5.0
SAMPLES_SHOWN = 8
EXAMPLES_PER_FINDING = 3
SUSPECTS_PER_FINDING = 2
SENTINEL = "__RELIABILITY_SENTINEL__"
#: Fields of the fixed-shape mappings (an unknown one there must be rejected).
KNOWN_FIELDS = frozenset(
    {"apiVersion", "kind", "metadata", "spec", "name", "nodes", "gpus", "address", "model",
     "sriov", "vgpus", "profiles"}
)  # fmt: skip
#: YAML's line breaks, as PyYAML counts lines.
LINE_BREAK = re.compile(r"\r\n|[\r\n\x85\u2028\u2029]")
#: What a terminal takes for a new line (or a return to its start): a message must not hold it.
FORGES_LINE = re.compile(r"[\r\n]")

Path_ = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Sample:
    kind: str
    files: tuple[bytes, ...]


# --- document surgery --------------------------------------------------------------------------


def value_paths(value: Any, prefix: Path_ = ()) -> list[Path_]:
    """Every path below ``value`` (not the root itself)."""
    found: list[Path_] = []
    if isinstance(value, dict):
        for key, child in value.items():
            found.append((*prefix, key))
            found += value_paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            found.append((*prefix, i))
            found += value_paths(child, (*prefix, i))
    return found


def _get(doc: Any, path: Path_) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def set_path(doc: Any, path: Path_, value: Any) -> None:
    _get(doc, path[:-1])[path[-1]] = value


def _gpus(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The node's GPU list, made to exist (a mutation needs somewhere to act)."""
    node = doc["spec"]["nodes"].setdefault(NODE, {"gpus": []})
    gpus: list[dict[str, Any]] = node.setdefault("gpus", [])
    if not gpus:
        gpus.append({"address": ADDRESSES[0], "sriov": "enabled"})
    return gpus


def _dump(doc: Any, style: str) -> str:
    try:
        if style == "json":
            return json.dumps(doc, indent=2)
        return yaml.safe_dump(doc, sort_keys=False, default_flow_style=style == "flow", width=80)
    except (TypeError, ValueError, yaml.YAMLError):
        return json.dumps(doc, default=repr)


STYLES = st.sampled_from(("block", "block", "flow", "json"))
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
ANY_VALUE = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
NEAR_MISS_ADDRESSES = (
    "0000:08:00", "08:00.0", "0000:08:00.8", "0000:08:20.0", "0000:zz:00.0", "00000:08:00.0",
    "0000:08:00.0 ", " 0000:08:00.0", "0000:08:00.0\n", "", "0", "ffff:ff:1f.7", "0000:08:00.0.0",
    "0000:8:0.0", "0000:08:00.-1", "0000:08:00.O", "0000-08-00.0", "0000:08:00:0", "0x0000:08:00.0",
    "０000:08:00.0", "0000:08:00.0;rm -rf /", "../../0000:08:00.0", "0000:08:00.4/../..",
)  # fmt: skip
BAD_ADDRESS = st.one_of(
    st.sampled_from(NEAR_MISS_ADDRESSES),
    st.text(max_size=16),
    st.from_regex(r"\A[0-9a-fA-FxX:.\-]{0,16}\Z"),
    st.integers(-1, 10**9),
)
#: Numerals YAML turns into numbers too big or strange for any field (text, not Python ints:
#: writing a 5,000-digit int through PyYAML hits Python's own int-to-str limit first).
HUGE_NUMERALS = st.one_of(
    st.integers(18, 6000).map(lambda n: "1" + "0" * n),
    st.integers(18, 6000).map(lambda n: "-9" + "9" * n),
    st.integers(8, 5000).map(lambda n: "0x" + "f" * n),
    st.integers(8, 5000).map(lambda n: "0o" + "7" * n),
    # Python refuses int() of more than 4,300 decimal digits: the limit and either side of it.
    st.sampled_from(tuple("1" + "0" * (n - 1) for n in (4299, 4300, 4301, 4302, 8000))),
    st.sampled_from(
        ("1e400", "-1e400", "1e-400", ".inf", "-.Inf", ".nan", "1_000", "0b101", "+12", "012",
         "9223372036854775808", "-9223372036854775809", "18446744073709551616", "4.5", "-0")
    ),
)  # fmt: skip
#: Keys a message must not print raw: line breaks and terminal escapes would forge output lines.
NASTY_KEYS = ("bad\nkey", "x\r", "a\r\nb", "\x1b[31mred\x1b[0m", "tab\there", "nel\x85", "ls\u2028")
TAGGED = (
    "!!python/object/apply:os.system ['true']", "!!python/name:os.system", "!!binary aGVsbG8=",
    "!!set {a, b}", "!!timestamp 2001-12-14", "!custom x", "!!float abc", "!!int 0xZZ",
    "!!str 5", "!!null ''", "!!map []", "!!seq {}", "!!bool maybe", "!<tag:yaml.org,2002:str> x",
    "!!int ''", "!!int 1.5", "!!int 0o9", "!!float ''", "!!bool 1", "!!null x",
)  # fmt: skip


def _with_value(draw: st.DrawFn, doc: dict[str, Any], text: str, *, style: str) -> str:
    """The document dumped with ``text`` written, verbatim, in place of one random value."""
    path = draw(st.sampled_from(value_paths(doc)))
    set_path(doc, path, SENTINEL)
    dumped = _dump(doc, style)
    for quoted in (f'"{SENTINEL}"', f"'{SENTINEL}'", SENTINEL):
        dumped = dumped.replace(quoted, text)
    return dumped


# --- mutations: each turns a valid document into the bytes of one or two files -----------------


def m_valid(draw: st.DrawFn, doc: dict[str, Any]) -> tuple[bytes, ...]:
    return (_dump(doc, draw(STYLES)).encode(),)


def m_wrong_type(draw: st.DrawFn, doc: dict[str, Any]) -> tuple[bytes, ...]:
    path = draw(st.sampled_from(value_paths(doc)))
    old = _get(doc, path)
    set_path(doc, path, draw(ANY_VALUE.filter(lambda v: type(v) is not type(old))))
    return (_dump(doc, draw(STYLES)).encode(),)


def m_unknown_field(draw: st.DrawFn, doc: dict[str, Any]) -> tuple[bytes, ...]:
    gpus = _gpus(doc)
    fixed: list[Path_] = [(), ("metadata",), ("spec",), ("spec", "nodes", NODE)]
    fixed += [("spec", "nodes", NODE, "gpus", i) for i in range(len(gpus))]
    target = _get(doc, draw(st.sampled_from(fixed)))
    key = draw(st.one_of(
        st.text(min_size=1, max_size=12).filter(lambda k: k not in KNOWN_FIELDS),
        st.sampled_from(NASTY_KEYS),
    ))  # fmt: skip
    target[key] = draw(ANY_VALUE)
    return (_dump(doc, draw(STYLES)).encode(),)


def m_missing_field(draw: st.DrawFn, doc: dict[str, Any]) -> tuple[bytes, ...]:
    gpus = _gpus(doc)
    required: list[Path_] = [
        ("apiVersion",),
        ("kind",),
        ("metadata",),
        ("spec",),
        ("metadata", "name"),
        ("spec", "nodes"),
        ("spec", "nodes", NODE, "gpus"),
    ]
    for i, gpu in enumerate(gpus):
        required += [
            ("spec", "nodes", NODE, "gpus", i, f) for f in ("address", "sriov") if f in gpu
        ]
    path = draw(st.sampled_from(required))
    del _get(doc, path[:-1])[path[-1]]
    return (_dump(doc, draw(STYLES)).encode(),)


def m_bad_address(draw: st.DrawFn, doc: dict[str, Any]) -> tuple[bytes, ...]:
    gpus = _gpus(doc)
    gpu = draw(st.sampled_from(gpus))
    bad = draw(BAD_ADDRESS)
    vgpus = gpu.get("vgpus")
    if isinstance(vgpus, dict) and vgpus and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(vgpus, key=str)))
        vgpus[bad] = vgpus.pop(key)
    else:
        gpu["address"] = bad
    return (_dump(doc, draw(STYLES)).encode(),)


def _model_gpu(draw: st.DrawFn, doc: dict[str, Any]) -> tuple[dict[str, Any], GpuModel]:
    model = draw(st.sampled_from(MODELS))
    gpu = {"address": draw(st.sampled_from(ADDRESSES)), "model": model.name, "sriov": "enabled"}
    gpus = _gpus(doc)
    gpus[draw(st.integers(0, len(gpus) - 1))] = gpu
    return gpu, model


def m_profiles(draw: st.DrawFn, doc: dict[str, Any]) -> tuple[bytes, ...]:
    """Profiles the driver's rules or the catalogue forbid (the "mixed profiles" family)."""
    gpu, model = _model_gpu(draw, doc)
    profiles = model.time_sliced_profiles
    how = draw(st.sampled_from(
        ("mixed-sizes", "over-max", "other-model", "unknown", "both-forms", "bad-count",
         "vf-out-of-range", "vf-twice", "vf-of-other-gpu", "sriov-off-with-vgpus")
    ))  # fmt: skip
    pick = draw(st.sampled_from(profiles))
    if how == "mixed-sizes":
        other = [p for p in profiles if p.framebuffer_mib != pick.framebuffer_mib]
        if other:
            gpu["vgpus"] = {0: pick.name, 1: draw(st.sampled_from(other)).name}
        else:
            gpu["vgpus"] = {0: pick.name, 1: "NVIDIA X-1Q"}
    elif how == "over-max":
        over = pick.max_instances + draw(st.integers(1, 4))
        if draw(st.booleans()):
            gpu["profiles"] = {pick.name: over}
        else:
            gpu["vgpus"] = dict.fromkeys(range(min(over, model.vfs + 2)), pick.name)
    elif how == "other-model":
        others = [m for m in MODELS if m.short != model.short]
        gpu["vgpus"] = {
            0: draw(st.sampled_from(draw(st.sampled_from(others)).time_sliced_profiles)).name
        }
    elif how == "unknown":
        name = draw(st.one_of(
            st.text(max_size=20),
            st.sampled_from((f"{model.name}-3Q", f"{model.short}-4X", pick.name.lower(),
                             pick.name + " ", "NVIDIA", "", f"{model.short}-0Q"))
        ))  # fmt: skip
        gpu["vgpus"] = {0: name}
    elif how == "both-forms":
        gpu["vgpus"] = {0: pick.name}
        gpu["profiles"] = {pick.name: 1}
    elif how == "bad-count":
        gpu["profiles"] = {
            pick.name: draw(st.sampled_from((0, -1, 1.5, "2", True, None, [1], 10**30)))
        }
    elif how == "vf-out-of-range":
        gpu["vgpus"] = {draw(st.sampled_from((model.vfs, model.vfs + 1, -1, 10**12))): pick.name}
    elif how == "vf-twice":
        gpu["vgpus"] = {0: pick.name, vf_address(gpu["address"], model, 0): pick.name}
    elif how == "vf-of-other-gpu":
        elsewhere = next(a for a in ADDRESSES if a != gpu["address"])
        gpu["vgpus"] = {vf_address(elsewhere, model, 0): pick.name}
    else:
        gpu["sriov"] = "disabled"
        gpu["vgpus"] = {0: pick.name}
    return (_dump(doc, draw(STYLES)).encode(),)


def m_structure(draw: st.DrawFn, doc: dict[str, Any]) -> tuple[bytes, ...]:
    """The right fields with the wrong shape or value at a known place."""
    gpus = _gpus(doc)
    how = draw(st.sampled_from(
        ("api-version", "kind", "name", "node-name", "nodes-list", "gpus-map", "gpu-scalar",
         "sriov-value", "root-list", "root-scalar", "model")
    ))  # fmt: skip
    if how == "api-version":
        doc["apiVersion"] = draw(
            st.sampled_from(("v1", "vgpu.reconciler.dev/v1", "", "vgpu.reconciler.dev/v1alpha1 "))
        )
    elif how == "kind":
        doc["kind"] = draw(
            st.sampled_from(("Desired", "vgpudesiredstate", "", "VGPUDesiredStates"))
        )
    elif how == "name":
        doc["metadata"]["name"] = draw(
            st.sampled_from(("", "Lab", "a" * 254, "a b", "-a", "a.", "ünï"))
        )
    elif how == "node-name":
        node = doc["spec"]["nodes"].pop(NODE)
        doc["spec"]["nodes"][
            draw(st.sampled_from(("", "Node1", "a" * 254, "a b", "a_b", "-n")))
        ] = node
    elif how == "nodes-list":
        doc["spec"]["nodes"] = [doc["spec"]["nodes"]]
    elif how == "gpus-map":
        doc["spec"]["nodes"][NODE]["gpus"] = {g.get("address", "x"): g for g in gpus}
    elif how == "gpu-scalar":
        gpus[0] = draw(st.sampled_from(("0000:08:00.0", 0, None, ["0000:08:00.0"])))
    elif how == "sriov-value":
        gpus[0]["sriov"] = draw(
            st.sampled_from(("on", "yes", True, "Enabled", "ENABLED", 1, "off", None))
        )
    elif how == "model":
        gpus[0]["model"] = draw(
            st.sampled_from(("NVIDIA T4", "", "A2 ", "nvidia a2", "GeForce RTX 4090", 5))
        )
    elif how == "root-list":
        return (_dump([doc], draw(STYLES)).encode(),)
    else:
        return (_dump(draw(SCALARS), "block").encode(),)
    return (_dump(doc, draw(STYLES)).encode(),)


def m_duplicate_key(draw: st.DrawFn, doc: dict[str, Any]) -> tuple[bytes, ...]:
    lines = _dump(doc, "block").splitlines(keepends=True)
    keyed = [
        i for i, line in enumerate(lines) if re.match(r"^\s*(- )?[^\s#:'\"-][^:]*:( |$)", line)
    ]
    i = draw(st.sampled_from(keyed))
    line = lines[i]
    dash = re.match(r"^(\s*)- ", line)
    copy_line = f"{dash.group(1)}  {line[dash.end() :]}" if dash else line
    lines.insert(i + 1, copy_line)
    return ("".join(lines).encode(),)


def m_yaml_syntax(draw: st.DrawFn, doc: dict[str, Any]) -> tuple[bytes, ...]:
    text = _dump(doc, draw(STYLES))
    for _ in range(draw(st.integers(1, 5))):
        pos = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(("insert", "delete", "replace", "indent")))
        char = draw(st.sampled_from(list(":{}[],&*!|>'\"%@`#\t-? \n\\")))
        if op == "insert":
            text = text[:pos] + char + text[pos:]
        elif op == "delete":
            text = text[:pos] + text[pos + 1 :]
        elif op == "replace":
            text = text[:pos] + char + text[pos + 1 :]
        else:
            start = text.rfind("\n", 0, pos) + 1
            text = text[:start] + " " * draw(st.integers(1, 3)) + text[start:]
    return (text.encode(),)


def m_truncated(draw: st.DrawFn, doc: dict[str, Any]) -> tuple[bytes, ...]:
    data = _dump(doc, draw(STYLES)).encode()
    return (data[: draw(st.integers(0, max(len(data) - 1, 0)))],)


def m_random_bytes(draw: st.DrawFn, doc: dict[str, Any]) -> tuple[bytes, ...]:
    return (draw(st.binary(max_size=4096)),)


def m_random_text(draw: st.DrawFn, doc: dict[str, Any]) -> tuple[bytes, ...]:
    alphabet = st.sampled_from(
        list(":-{}[]#&*!|>'\"%@ \t\n,?") + list(string.ascii_letters[:8] + "0189")
    )
    text = draw(st.one_of(st.text(max_size=2000), st.text(alphabet, max_size=400)))
    return (text.encode(),)


def m_encoding(draw: st.DrawFn, doc: dict[str, Any]) -> tuple[bytes, ...]:
    text = _dump(doc, draw(STYLES))
    how = draw(st.sampled_from(
        ("utf-16", "utf-32", "latin-1", "nul", "control", "bom", "lone-continuation", "overlong",
         "cr-only", "crlf", "unicode-breaks", "surrogate-escape")
    ))  # fmt: skip
    pos = draw(st.integers(0, len(text)))
    if how in ("utf-16", "utf-32"):
        return (text.encode(how),)
    if how == "latin-1":
        return (text.replace("metadata", "métadata").encode("latin-1", errors="replace"),)
    if how == "bom":
        return (b"\xef\xbb\xbf" + text.encode(),)
    if how == "cr-only":
        return (text.replace("\n", "\r").encode(),)
    if how == "crlf":
        return (text.replace("\n", "\r\n").encode(),)
    raw = text.encode()
    inserted = {
        "nul": b"\x00",
        "control": draw(
            st.sampled_from(
                (
                    b"\x01",
                    b"\x08",
                    b"\x0b",
                    b"\x0c",
                    b"\x1b",
                    b"\x7f",
                    "\x85".encode(),
                    "\ufeff".encode(),
                )
            )
        ),
        "lone-continuation": b"\x80",
        "overlong": b"\xc0\xaf",
        "unicode-breaks": draw(st.sampled_from(("\u2028".encode(), "\u2029".encode()))),
        "surrogate-escape": b"\xed\xa0\x80",
    }[how]
    return (raw[:pos] + inserted + raw[pos:],)


def m_deep_nesting(draw: st.DrawFn, doc: dict[str, Any]) -> tuple[bytes, ...]:
    # Past a few hundred levels every parser gives up the same way; the long tail checks that
    # giving up stays cheap (a block mapping's indentation grows quadratically: capped).
    depth = draw(st.one_of(st.integers(1, 600), st.sampled_from((1000, 3000, 20000, 200000))))
    form = draw(st.sampled_from(("flow-list", "flow-map", "block-map", "block-list", "mixed")))
    if form == "block-map":
        return ("".join(f"{'  ' * i}a:\n" for i in range(min(depth, 400))).encode(),)
    if form == "block-list":
        return (("- " * depth + "x\n").encode(),)
    if form == "flow-list":
        nested = "[" * depth + "]" * depth
    elif form == "flow-map":
        nested = "{a: " * depth + "1" + "}" * depth
    else:
        nested = "[{a: " * depth + "1" + "}]" * depth
    return (_with_value(draw, doc, nested, style=draw(STYLES)).encode(),)


def m_huge_number(draw: st.DrawFn, doc: dict[str, Any]) -> tuple[bytes, ...]:
    gpus = _gpus(doc)
    numeral = draw(HUGE_NUMERALS)
    where = draw(st.sampled_from(("anywhere", "count", "vf-key")))
    if where == "count":
        gpus[0].pop("vgpus", None)
        gpus[0]["sriov"] = "enabled"
        gpus[0]["profiles"] = {"NVIDIA A2-1Q": SENTINEL}
        text = _dump(doc, draw(STYLES)).replace(f'"{SENTINEL}"', numeral).replace(SENTINEL, numeral)
        return (text.encode(),)
    if where == "vf-key":
        gpus[0].pop("profiles", None)
        gpus[0]["sriov"] = "enabled"
        gpus[0]["vgpus"] = {SENTINEL: "NVIDIA A2-1Q"}
        text = _dump(doc, "block").replace(SENTINEL, numeral)
        return (text.encode(),)
    return (_with_value(draw, doc, numeral, style=draw(STYLES)).encode(),)


def _alias_bomb(levels: int, width: int) -> str:
    lines = ["a0: &a0 [x, x]"]
    for i in range(1, levels + 1):
        refs = ", ".join([f"*a{i - 1}"] * width)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


def m_yaml_features(draw: st.DrawFn, doc: dict[str, Any]) -> tuple[bytes, ...]:
    gpus = _gpus(doc)
    how = draw(st.sampled_from(
        ("alias-gpu", "merge", "merge-scalar", "tag", "documents", "complex-key", "directive",
         "bomb", "undefined-alias", "alias-key", "anchor-only")
    ))  # fmt: skip
    text = _dump(doc, "block")
    if how == "alias-gpu":
        gpu = json.dumps(gpus[0])
        head = text.split("      gpus:")[0] if "      gpus:" in text else text
        return (f"{head}      gpus: [&g {gpu}, *g]\n".encode(),)
    if how == "merge":
        gpu = json.dumps(gpus[0])
        head = text.split("      gpus:")[0] if "      gpus:" in text else text
        extra = draw(st.sampled_from(("{sriov: disabled}", '{address: "0000:41:00.0"}', "{}")))
        return (f"{head}      gpus: [&g {gpu}, {{<<: *g, <<: {extra}}}]\n".encode(),)
    if how == "merge-scalar":
        merge = draw(st.sampled_from(("{<<: 5}", "{<<: [1, 2]}", "{<<: *x}", "<<")))
        return (_with_value(draw, doc, merge, style="flow").encode(),)
    if how == "tag":
        return (_with_value(draw, doc, draw(st.sampled_from(TAGGED)), style="flow").encode(),)
    if how == "documents":
        several = (
            f"{text}---\n{text}",
            f"---\n{text}...\n",
            f"{text}---\n",
            f"--- |\n  {text[:40]}\n",
        )
        return (draw(st.sampled_from(several)).encode(),)
    if how == "complex-key":
        return (f"{text}? [a, b]\n: c\n".encode(),)
    if how == "directive":
        directives = (
            "%YAML 1.1\n---\n",
            "%YAML 2.0\n---\n",
            "%TAG !e! tag:e.com,2000:\n---\n",
            "%FOO bar\n---\n",
            "%YAML 1.1\n%YAML 1.1\n---\n",
        )
        head = draw(st.sampled_from(directives))
        return ((head + text).encode(),)
    if how == "bomb":
        # Mostly small; one in four expands past the loader's node limit (each costs ~1 s).
        levels, width = draw(st.sampled_from(((3, 3), (4, 4), (5, 3), (8, 2), (12, 3), (30, 9))))
        return ((_alias_bomb(levels, width) + text).encode(),)
    if how == "undefined-alias":
        return (_with_value(draw, doc, "*nowhere", style="flow").encode(),)
    if how == "alias-key":
        return ((text.replace("spec:", "&s spec:", 1) + "*s : again\n").encode(),)
    return (_with_value(draw, doc, "&lonely 1", style="flow").encode(),)


def m_two_files(draw: st.DrawFn, doc: dict[str, Any]) -> tuple[bytes, ...]:
    _gpus(doc)
    first = _dump(doc, draw(STYLES)).encode()
    how = draw(st.sampled_from(("same", "other-node", "mutated")))
    if how == "same":  # every GPU defined twice
        return first, _dump(doc, draw(STYLES)).encode()
    if how == "other-node":
        other = copy.deepcopy(doc)
        other["spec"]["nodes"] = {"other-node": other["spec"]["nodes"][NODE]}
        return first, _dump(other, draw(STYLES)).encode()
    kind = draw(st.sampled_from([k for k in MUTATIONS if k not in ("two-files", "valid")]))
    second = MUTATIONS[kind](draw, copy.deepcopy(doc))
    return first, second[0]


def m_empty(draw: st.DrawFn, doc: dict[str, Any]) -> tuple[bytes, ...]:
    return (draw(st.sampled_from(
        (b"", b"\n", b"   \n", b"# only a comment\n", b"---\n", b"...\n", b"null\n", b"~\n",
         b"[]\n", b"{}\n", b"42\n", b"true\n", b"'text'\n", b"- a\n- b\n", b"--- !!str\n", b"\t\n")
    )),)  # fmt: skip


def m_oversized(draw: st.DrawFn, doc: dict[str, Any]) -> tuple[bytes, ...]:
    text = _dump(doc, "block")
    how = draw(st.sampled_from(("comment-padding", "long-name", "long-line")))
    if how == "comment-padding":
        return (text.encode() + b"#" * (4 * 1024 * 1024),)
    if how == "long-name":
        doc["metadata"]["name"] = "a" * draw(st.integers(254, 20_000))
        return (_dump(doc, "block").encode(),)
    return ((text + "x: " + "y" * 100_000 + "\n").encode(),)


MUTATIONS: dict[str, Callable[[st.DrawFn, dict[str, Any]], tuple[bytes, ...]]] = {
    "valid": m_valid,
    "wrong-type": m_wrong_type,
    "unknown-field": m_unknown_field,
    "missing-field": m_missing_field,
    "bad-address": m_bad_address,
    "mixed-profiles": m_profiles,
    "structure": m_structure,
    "duplicate-key": m_duplicate_key,
    "yaml-syntax": m_yaml_syntax,
    "truncated": m_truncated,
    "random-bytes": m_random_bytes,
    "random-text": m_random_text,
    "encoding": m_encoding,
    "deep-nesting": m_deep_nesting,
    "huge-number": m_huge_number,
    "yaml-features": m_yaml_features,
    "two-files": m_two_files,
    "empty": m_empty,
    "oversized": m_oversized,
}


@st.composite
def samples(draw: st.DrawFn) -> Sample:
    kind = draw(st.sampled_from(sorted(MUTATIONS)))
    _, doc = draw(host_and_desired(NODE, max_gpus=2))
    return Sample(kind, MUTATIONS[kind](draw, doc))


# --- judging ------------------------------------------------------------------------------------


def _line_count(data: bytes) -> int:
    try:
        return len(LINE_BREAK.findall(data.decode("utf-8"))) + 1
    except UnicodeDecodeError:
        return data.count(b"\n") + 1


COUNTS = (
    "documents", "rejected", "accepted", "problems", "exceptions", "unlocated", "wrong_file",
    "line_out_of_range", "multiline", "control", "slow",
)  # fmt: skip


@dataclass(slots=True)
class Tally:
    documents: int = 0
    rejected: int = 0
    accepted: int = 0
    problems: int = 0
    exceptions: int = 0
    unlocated: int = 0  # no file
    wrong_file: int = 0  # a file not given
    line_out_of_range: int = 0
    multiline: int = 0  # messages with raw line breaks: they forge output lines
    control: int = 0  # messages with other raw control characters: they garble terminals
    slowest: float = 0.0
    slow: int = 0
    file_only: Counter[str] = field(default_factory=Counter)
    exception_types: Counter[str] = field(default_factory=Counter)
    by_kind: dict[str, Counter[str]] = field(default_factory=dict)
    #: What went wrong, by kind of finding: a few examples each.
    findings: dict[str, list[str]] = field(default_factory=dict)
    #: Documents behind findings, by kind of finding, sent through the CLI first: what does a
    #: user see?
    suspects: dict[str, list[Sample]] = field(default_factory=dict)
    #: kind → rejected samples kept for the CLI (a bounded reservoir per kind).
    reservoir: dict[str, list[Sample]] = field(default_factory=dict)
    seen_rejected: Counter[str] = field(default_factory=Counter)

    def finding(self, what: str, text: str, sample: Sample | None = None) -> None:
        shown = self.findings.setdefault(what, [])
        if len(shown) < EXAMPLES_PER_FINDING and text not in shown:
            shown.append(text)
            kept = self.suspects.setdefault(what, [])
            if sample is not None and len(kept) < SUSPECTS_PER_FINDING and sample not in kept:
                kept.append(sample)

    def kind(self, kind: str) -> Counter[str]:
        return self.by_kind.setdefault(kind, Counter())

    def absorb(self, other: Tally) -> None:
        """Add another shard's tally to this one."""
        for name in COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.slowest = max(self.slowest, other.slowest)
        self.file_only.update(other.file_only)
        self.exception_types.update(other.exception_types)
        for kind, counts in other.by_kind.items():
            self.kind(kind).update(counts)
        for what, texts in other.findings.items():
            for text in texts:
                self.finding(what, text)
        for what, kept in other.suspects.items():
            mine = self.suspects.setdefault(what, [])
            mine += kept[: SUSPECTS_PER_FINDING - len(mine)]
        for kind, kept in other.reservoir.items():
            self.reservoir.setdefault(kind, []).extend(kept)


def _describe(sample: Sample) -> str:
    head = sample.files[0][:160]
    return f"[{sample.kind}] {head!r}{'…' if len(sample.files[0]) > 160 else ''}"


def judge(
    sample: Sample, paths: Sequence[Path], tally: Tally, rng: random.Random, keep: int
) -> None:
    for path, data in zip(paths, sample.files, strict=False):
        path.write_bytes(data)
    given = paths[: len(sample.files)]
    tally.documents += 1
    tally.kind(sample.kind)["documents"] += 1
    started = time.monotonic()
    try:
        load_desired(list(given), catalog=CATALOG)
    except ValidationError as exc:
        tally.rejected += 1
        tally.kind(sample.kind)["rejected"] += 1
        _check_problems(sample, given, exc, tally)
        # Reservoir sampling: each rejected document of a kind equally likely to reach the CLI.
        tally.seen_rejected[sample.kind] += 1
        kept = tally.reservoir.setdefault(sample.kind, [])
        if len(kept) < keep:
            kept.append(sample)
        else:
            slot = rng.randrange(tally.seen_rejected[sample.kind])
            if slot < keep:
                kept[slot] = sample
    except Exception as exc:  # the finding this scenario exists for
        tally.exceptions += 1
        tally.exception_types[f"{type(exc).__name__}: {str(exc)[:90]}"] += 1
        tally.finding("exception", f"{type(exc).__name__}: {_describe(sample)}", sample)
    else:
        tally.accepted += 1
        tally.kind(sample.kind)["accepted"] += 1
    seconds = time.monotonic() - started
    tally.kind(sample.kind)["ms"] += round(seconds * 1000)
    tally.slowest = max(tally.slowest, seconds)
    if seconds > SLOW_SECONDS:
        tally.slow += 1
        tally.finding("slow", f"{seconds:.1f} s to load: {_describe(sample)}", sample)


def _check_problems(
    sample: Sample, given: Sequence[Path], exc: ValidationError, tally: Tally
) -> None:
    files = {str(p): data for p, data in zip(given, sample.files, strict=False)}
    if not exc.problems:
        tally.unlocated += 1
        tally.finding("no-problems", f"{exc.message}: {_describe(sample)}", sample)
    for problem in exc.problems:
        tally.problems += 1
        if problem.file is None:
            tally.unlocated += 1
            tally.finding("no-file", f"{problem.message!r}: {_describe(sample)}", sample)
        elif problem.file not in files:
            tally.wrong_file += 1
            tally.finding("wrong-file", f"{problem.file}: {_describe(sample)}", sample)
        elif problem.line is None:
            tally.file_only[problem.message[:48]] += 1
            if not problem.message.startswith(WHOLE_FILE):
                tally.finding("no-line", f"{problem.message!r}: {_describe(sample)}", sample)
        elif not (
            1 <= problem.line <= _line_count(files[problem.file]) and (problem.column or 1) >= 1
        ):
            tally.line_out_of_range += 1
            tally.finding("line-out-of-range", f"{problem}: {_describe(sample)}", sample)
        text = str(problem)
        if FORGES_LINE.search(text):
            tally.multiline += 1
            tally.finding("message-with-line-break", repr(text), sample)
        elif _control_characters(text):
            tally.control += 1
            tally.finding("message-with-control-characters", repr(text), sample)


def _control_characters(text: str) -> bool:
    """Control characters other than a tab (ESC, BEL, backspace…): they garble a terminal."""
    return any(unicodedata.category(c) == "Cc" and c != "\t" for c in text)


def _unlocated_file_only(tally: Tally) -> int:
    return sum(n for msg, n in tally.file_only.items() if not msg.startswith(WHOLE_FILE))


# --- the CLI sample -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CliVerdict:
    exit: str
    bug: str | None
    bad_lines: tuple[str, ...]
    forms: tuple[str, ...]
    silent: bool


_AT_LINE = re.compile(r"^\d+:\d+: \S")


def line_form(line: str, paths: Sequence[str]) -> str | None:
    """``located`` (file:line:col: …), ``file`` (file: …), ``error-file`` (error: file: …)."""
    for prefix, form in (("", "located"), ("error: ", "error-file")):
        for path in paths:
            head = f"{prefix}{path}:"
            if line.startswith(head):
                rest = line[len(head) :]
                if _AT_LINE.match(rest):
                    return "located"
                if rest.startswith(" ") and rest.strip():
                    return "file" if form == "located" else form
    return None


def validate_cli(sample: Sample, directory: Path) -> CliVerdict:
    directory.mkdir(parents=True)
    paths = [directory / name for name in ("desired.yaml", "more.yaml")[: len(sample.files)]]
    for path, data in zip(paths, sample.files, strict=True):
        path.write_bytes(data)
    run = vgpuctl("validate", *paths, timeout=60)
    names = [str(p) for p in paths]
    # Lines as a terminal shows them: a raw carriage return starts the line over.
    lines = [line for line in run.stderr.split("\n") if line.strip()]
    forms = tuple(
        "unlocated" if "\r" in line else (line_form(line, names) or "unlocated") for line in lines
    )
    bad = tuple(line for line, form in zip(lines, forms, strict=True) if form == "unlocated")
    return CliVerdict(run.outcome(), run.bug, bad, forms, silent=not lines)


# --- the scenario -------------------------------------------------------------------------------


#: Documents drawn per hypothesis run: judged after the run, outside it, because hypothesis
#: raises the recursion limit while it runs, and a deeply nested document then parses deeper
#: (and slower) than it ever would in ``vgpuctl``.
BATCH = 500


def judge_shard(seed_value: int, count: int, keep: int, workdir: Path, deadline: float) -> Tally:
    """Draw and judge ``count`` documents in this process (one shard of the scenario)."""
    workdir.mkdir(parents=True, exist_ok=True)
    paths = [workdir / "desired.yaml", workdir / "more.yaml"]
    tally = Tally()
    rng = random.Random(f"{seed_value}:reservoir")  # noqa: S311 - sampling, not cryptography
    batch = 0
    while tally.documents < count and time.time() < deadline:
        wanted = min(BATCH, count - tally.documents)
        drawn = draw_examples(samples(), count=wanted, seed_value=seed_value * 10_000 + batch)
        if not drawn:
            break
        for sample in drawn:
            if time.time() > deadline:
                break
            judge(sample, paths, tally, rng, keep)
        batch += 1
    return tally


def bad_input(ctx: Context) -> dict[str, Any]:
    """Scenario: generated documents through the loader in process, a sample through the CLI.

    The documents are split over ``ctx.jobs`` processes (shard i draws with seed
    ``seed × 100 + i``), so the same seed and job count give the same documents.
    """
    started = time.monotonic()
    size = ctx.size
    work = ctx.scratch("bad-input")
    keep = max(2, 2 * -(-size.bad_cli_sample // len(MUTATIONS)))
    deadline = time.time() + size.budget
    shards = max(1, min(ctx.jobs, size.bad_documents))
    counts = [
        size.bad_documents // shards + (i < size.bad_documents % shards) for i in range(shards)
    ]
    tally = Tally()
    if shards == 1:
        tally = judge_shard(ctx.seed * 100, counts[0], keep, work / "shard-0", deadline)
    else:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=shards, mp_context=context) as pool:
            futures = [
                pool.submit(judge_shard, ctx.seed * 100 + i, n, keep, work / f"shard-{i}", deadline)
                for i, n in enumerate(counts)
            ]
            for future in futures:
                tally.absorb(future.result())
    in_process_seconds = time.monotonic() - started

    # The CLI sample: documents behind findings first, then rejected ones; each round-robin
    # (over kinds of finding, then over kinds of document) so every kind is represented.
    chosen: list[Sample] = []
    for source in (tally.suspects, tally.reservoir):
        pools = {k: list(v) for k, v in sorted(source.items())}
        while len(chosen) < size.bad_cli_sample and any(pools.values()):
            for waiting in pools.values():
                if waiting and len(chosen) < size.bad_cli_sample:
                    sample = waiting.pop(0)
                    if sample not in chosen:
                        chosen.append(sample)
    cli_started = time.monotonic()
    with ThreadPoolExecutor(max_workers=ctx.jobs) as threads:
        verdicts = list(
            threads.map(
                lambda iv: validate_cli(iv[1], work / f"cli-{iv[0]:04d}"), enumerate(chosen)
            )
        )
    cli_findings = [
        f"[{s.kind}] {v.exit}: {v.bug or (v.bad_lines[:1] or ('no message',))[0]}"
        for s, v in zip(chosen, verdicts, strict=True)
        if v.exit != "exit 1" or v.bug or v.bad_lines or v.silent
    ]
    cli: dict[str, Any] = {
        "documents": len(verdicts),
        "exit_1": sum(1 for v in verdicts if v.exit == "exit 1"),
        "exits": dict(Counter(v.exit for v in verdicts)),
        "tracebacks": sum(1 for v in verdicts if v.bug),
        "unlocated_lines": sum(len(v.bad_lines) for v in verdicts),
        "silent_rejections": sum(1 for v in verdicts if v.silent),
        "line_forms": dict(Counter(f for v in verdicts for f in v.forms)),
        "kinds": dict(Counter(s.kind for s in chosen)),
        "findings": cli_findings[:SAMPLES_SHOWN],
        "seconds": round(time.monotonic() - cli_started, 1),
    }
    by_kind = {
        kind: {
            "documents": c["documents"],
            "rejected": c["rejected"],
            "accepted": c["accepted"],
            "load_ms_mean": round(c["ms"] / max(c["documents"], 1), 1),
        }
        for kind, c in sorted(tally.by_kind.items())
    }
    figures: dict[str, Any] = {
        "documents": tally.documents,
        "planned_documents": size.bad_documents,
        "rejected": tally.rejected,
        "accepted": tally.accepted,
        "exceptions": tally.exceptions,
        "exception_types": dict(tally.exception_types.most_common(SAMPLES_SHOWN)),
        "problems": tally.problems,
        "unlocated_problems": tally.unlocated + tally.wrong_file + _unlocated_file_only(tally),
        "problems_without_file": tally.unlocated,
        "problems_naming_another_file": tally.wrong_file,
        "problems_with_file_only": dict(tally.file_only.most_common()),
        "lines_out_of_range": tally.line_out_of_range,
        "messages_with_line_breaks": tally.multiline,
        "messages_with_other_control_characters": tally.control,
        "slowest_document_s": round(tally.slowest, 3),
        "slow_documents": tally.slow,
        "by_kind": by_kind,
        "findings": tally.findings,
        "in_process_seconds": round(in_process_seconds, 1),
        "shards": shards,
        "cli": cli,
        "tracebacks": cli["tracebacks"],
        "seconds": round(time.monotonic() - started, 1),
        "budget_exceeded": tally.documents < size.bad_documents,
    }
    figures["ok"] = (
        not figures["budget_exceeded"]
        and tally.exceptions == 0
        and figures["unlocated_problems"] == 0
        and tally.line_out_of_range == 0
        and tally.multiline == 0
        and tally.slow == 0
        and not cli_findings
        and cli["documents"] >= min(size.bad_cli_sample, tally.rejected)
    )
    return figures
