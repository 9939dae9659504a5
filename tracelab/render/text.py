"""Untrusted text (names from traces, run names) made safe for where it is printed, and raw
values (ns, bytes, 0..1 shares, by the unit in their key) made readable."""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Iterable
from typing import Any

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]|~])")
#: C0/C1 control characters and the escape sequences they start (CSI, OSC, ...): a trace or
#: run name must not clear a terminal, retitle it or forge lines. And Unicode's bidirectional
#: controls (embeddings, overrides, isolates, marks): a name holding U+202E reversed the text
#: after it on every surface ("drawrof.lellaraPataDdetubirtsiD ... %67" in the app).
_CONTROL = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)?|"
    r"\x1b[@-Z\\-_]|[\x00-\x08\x0b-\x1f\x7f-\x9f]|[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def md(text: object) -> str:
    """Untrusted text, safe inside Markdown (and a table cell): one line, HTML and Markdown
    syntax escaped."""
    flat = " ".join(terminal(str(text)).split())
    return _MD_SPECIAL.sub(r"\\\1", html.escape(flat, quote=False))


def md_code(text: object) -> str:
    """Untrusted text as an inline code span (shown literally: no escapes apply inside)."""
    return "`" + " ".join(terminal(str(text)).split()).replace("`", "'") + "`"


def terminal(text: str) -> str:
    """Text without control characters or escape sequences (newlines and tabs kept)."""
    return _CONTROL.sub("", text)


def one_line(text: object) -> str:
    """Untrusted text for one line of a terminal or a page: terminal(), with every run of
    whitespace (newlines included) one space, so a name cannot forge a line."""
    return " ".join(terminal(str(text)).split())


def int_runs(values: Iterable[int]) -> list[tuple[int, int]]:
    """The distinct integers as runs of consecutive ones, (first, last), in order:
    (2, 3, 4, 8) -> [(2, 4), (8, 8)]."""
    out: list[tuple[int, int]] = []
    for v in sorted(set(values)):
        if out and v == out[-1][1] + 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


def int_ranges(values: Iterable[int]) -> str:
    """Integers as runs: (2, 3, 4, 8) -> '2–4, 8' (steps 2, 8 and 9 were shown as 'steps
    2–9', as if eight steps)."""
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in int_runs(values))


def size(n: float | None) -> str:
    """Bytes as '64.0 MiB'; 'unknown' when None."""
    if n is None:
        return "unknown"
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} TiB"


def duration(ns: float | None) -> str:
    """Nanoseconds as '12.3 ms', '45.6 µs' or '1.23 s'."""
    if ns is None:
        return "-"
    a = abs(ns)
    if a >= 1e9:
        return f"{ns / 1e9:.3g} s"
    if a >= 1e6:
        return f"{ns / 1e6:,.3g} ms" if a < 1e8 else f"{ns / 1e6:,.0f} ms"
    if a >= 1e3:
        return f"{ns / 1e3:.3g} µs"
    return f"{ns:.0f} ns"


def value(key: str, v: Any) -> str:
    """A raw value by the unit its key names: *_ns as a duration, *_bytes as a size, *_share
    as a percentage, *_gbps as GB/s; lists and mappings as JSON; None as '-'."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        key = key.split("[", 1)[0]  # `transfer_share[tp]` is a share
        if key.endswith("_ns") or "_ns_" in key:
            return duration(v)
        if key.endswith("_bytes"):
            return size(v)
        if key.endswith("_share") or "_share_" in key:
            return f"{100 * v:.1f}%"
        if key.endswith("_gbps"):
            return f"{v:.3g} GB/s"
        return f"{v:.4g}" if isinstance(v, float) else str(v)
    if isinstance(v, (list, tuple, dict)):
        return terminal(json.dumps(v, default=str))
    return terminal(str(v))
