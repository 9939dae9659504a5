"""URL query parameters in, typed values out; a bad value raises BadParam with a readable message.

Dash Pages hands `layout(**kwargs)` every query parameter as a string (a list when repeated), so
every parser here accepts str | list | None and never trusts the content.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlencode

from tracelab.render.text import int_runs

#: Most ranks, steps or categories a URL may list.
MAX_LIST = 4096


class BadParam(ValueError):
    """A URL parameter that cannot be used; the message names it and says what is expected."""


def _one(kwargs: Mapping[str, Any], name: str) -> str | None:
    value = kwargs.get(name)
    if isinstance(value, list):
        value = value[-1] if value else None
    if value is None:
        return None
    value = str(value).strip()
    return value or None


def text(kwargs: Mapping[str, Any], name: str, *, max_len: int = 300) -> str | None:
    value = _one(kwargs, name)
    if value is not None and len(value) > max_len:
        raise BadParam(f"URL parameter {name!r} is longer than {max_len} characters.")
    return value


def integer(
    kwargs: Mapping[str, Any], name: str, default: int, *, lo: int = 0, hi: int = 10**9
) -> int:
    value = _one(kwargs, name)
    if value is None:
        return default
    try:
        out = int(value)
    except ValueError:
        raise BadParam(
            f"URL parameter {name!r} must be a whole number, not {value[:40]!r}."
        ) from None
    if not lo <= out <= hi:
        raise BadParam(f"URL parameter {name!r} must be between {lo} and {hi}, not {out}.")
    return out


def number(kwargs: Mapping[str, Any], name: str) -> float | None:
    value = _one(kwargs, name)
    if value is None:
        return None
    try:
        out = float(value)
    except ValueError:
        raise BadParam(
            f"URL parameter {name!r} must be a number (ms), not {value[:40]!r}."
        ) from None
    if not math.isfinite(out) or abs(out) > 1e12:
        raise BadParam(f"URL parameter {name!r} must be a finite number of ms, not {value[:40]!r}.")
    return out


def int_list(kwargs: Mapping[str, Any], name: str) -> tuple[int, ...]:
    """'0,2,5-7' -> (0, 2, 5, 6, 7)."""
    value = _one(kwargs, name)
    if value is None:
        return ()
    out: list[int] = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part[1:]:
                lo_s, hi_s = part.split("-", 1) if not part.startswith("-") else (part, part)
                lo, hi = int(lo_s), int(hi_s)
                if hi < lo or hi - lo >= MAX_LIST:
                    raise ValueError
                out.extend(range(lo, hi + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise BadParam(
                f"URL parameter {name!r} must list whole numbers like 0,2,5-7; "
                f"{part[:40]!r} is not one."
            ) from None
        if len(out) > MAX_LIST:
            raise BadParam(f"URL parameter {name!r} lists more than {MAX_LIST} values.")
    return tuple(sorted(set(out)))


def str_list(kwargs: Mapping[str, Any], name: str, allowed: Iterable[str]) -> tuple[str, ...]:
    value = _one(kwargs, name)
    if value is None:
        return ()
    allowed = tuple(allowed)
    out = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        if part not in allowed:
            raise BadParam(
                f"URL parameter {name!r}: unknown value {part[:40]!r}; "
                f"use any of {', '.join(allowed)}."
            )
        out.append(part)
    return tuple(dict.fromkeys(out))


def compact_ints(values: Iterable[int]) -> str:
    """(0, 1, 2, 5) -> '0-2,5': the inverse of int_list, for short URLs."""
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in int_runs(values))


def href(path: str, **params: Any) -> str:
    """`path?query` with the parameters that are set (None and empty values are left out)."""
    clean: dict[str, str] = {}
    for key, value in params.items():
        if value is None or value == "" or value == () or value == []:
            continue
        if isinstance(value, (tuple, list)):
            value = (
                compact_ints(value)
                if all(isinstance(v, int) for v in value)
                else ",".join(str(v) for v in value)
            )
        elif isinstance(value, float):
            value = f"{value:.6g}" if abs(value) < 1e5 else f"{value:.3f}"
        clean[key] = str(value)
    query = urlencode(clean, safe=",")
    return f"{path}?{query}" if query else path
