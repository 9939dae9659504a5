"""What tracelab accepts: the limits every input value must meet before anything is written.

One definition of each limit, used by the converter (trace values), discovery (capture
manifests, rank.json), the capture records (collectives.jsonl) and the CLI (run names, --rank).
A value outside its limit is an InputError naming the file, the key or event, the value and what
is allowed, so that nothing that ingests can make a later query fail for other runs (a stored
`ts_ns + dur_ns` that overflows int64 once broke `tracelab runs` for every run).

The limits (docs/capture-format.md, "Limits"):

- times, absolute, in ns (`baseTimeNanoseconds + ts`, `ts + dur`, every `*_ns` field): within
  +-TIME_LIMIT_NS (2^62 ns, 146 years), so that the sum or difference of any two fits int64;
- ranks, world sizes, steps, pipeline stages, group sizes, device ids: int32, ranks and steps
  non-negative, world sizes positive, 0 <= rank < world_size;
- sizes and counts (bytes, sequence numbers): int64, sizes non-negative;
- JSON: valid UTF-8 (a leading byte-order mark is allowed), no lone surrogate, nesting at most
  MAX_DEPTH levels;
- run names: 1..MAX_NAME_CHARS characters, valid UTF-8, no control characters.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from tracelab.errors import InputError, UsageError

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
#: Every absolute time, duration or end, in ns, lies within +-TIME_LIMIT_NS.
TIME_LIMIT_NS = 2**62
#: Deepest JSON nesting accepted (the C scanner's MAX_DEPTH; tests hold the two equal).
MAX_DEPTH = 512
MAX_NAME_CHARS = 256
#: UTF-8 byte-order mark, allowed (and skipped) at the start of a JSON file.
BOM = b"\xef\xbb\xbf"

_LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def has_lone_surrogate(raw: bytes) -> bool:
    """Whether JSON text escapes half a UTF-16 surrogate pair (`"\\ud800"`), which no UTF-8
    string can hold."""
    return _LONE_SURROGATE.search(raw) is not None


def json_error_hint(raw: bytes, exc: BaseException) -> str:
    """What is wrong with JSON that failed to decode, in words that name the fix."""
    text = str(exc)
    if isinstance(exc, RecursionError):
        return (
            f"it nests arrays or objects deeper than {MAX_DEPTH} levels, more than "
            "tracelab reads. Check the exporter; drop this file (--skip-bad)."
        )
    if has_lone_surrogate(raw):
        return (
            'it holds a lone UTF-16 surrogate escape (like "\\ud800"), which is not '
            "valid text. Fix the exporter's string encoding or drop this file (--skip-bad)."
        )
    if "out of range" in text.lower():
        return (
            f"it holds a number too large for a 64-bit float ({text}). Fix the exporter "
            "or drop this file (--skip-bad)."
        )
    if "truncated" in text.lower() or "end of" in text.lower():
        return "the JSON ends early: the file is truncated. Copy or export it again."
    if "utf-8" in text.lower():
        return f"it is not valid UTF-8 ({text}). Re-export it with a current profiler."
    return f"it is not valid JSON ({text})."


def decode_json(raw: bytes, path: str | Path, what: str) -> Any:
    """Decode a small JSON document (manifest, rank.json, one collectives line): strict UTF-8,
    a leading BOM skipped, no lone surrogates, nesting limited; InputError otherwise."""
    if raw.startswith(BOM):
        raw = raw[len(BOM) :]
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise InputError(f"unreadable {what}: {json_error_hint(raw, exc)}", str(path)) from None


def read_json(path: Path, what: str) -> Any:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read the {what} ({exc.strerror}).", str(path)) from None
    return decode_json(raw, path, what)


# ------------------------------------------------------------------ typed values


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(value: Any) -> str:
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
    }.get(type(value), "null")


def integer(
    value: Any, what: str, path: str | Path, *, lo: int, hi: int, optional: bool = True
) -> int | None:
    """An integer in [lo, hi] (None allowed when optional); booleans are not integers."""
    if value is None and optional:
        return None
    if type(value) is not int:
        raise InputError(
            f"{what} must be an integer, not {_type_name(value)} ({_describe(value)}).", str(path)
        )
    if not lo <= value <= hi:
        raise InputError(f"{what} is {value}, outside the allowed range {lo}..{hi}.", str(path))
    return value


def text(value: Any, what: str, path: str | Path, *, optional: bool = True) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise InputError(
            f"{what} must be a string, not {_type_name(value)} ({_describe(value)}).", str(path)
        )
    return value


def rank_and_world(rank: int | None, world: int | None, what: str, path: str | Path) -> None:
    """0 <= rank < world_size, each an int32; world sizes are positive."""
    integer(world, f"{what} world_size", path, lo=1, hi=INT32_MAX)
    integer(rank, f"{what} rank", path, lo=0, hi=INT32_MAX - 1)
    if rank is not None and world is not None and rank >= world:
        raise InputError(
            f"{what} rank {rank} is not below world_size {world} (ranks are "
            f"0..{world - 1}). Fix the metadata, or map the rank with --rank FILE=N.",
            str(path),
        )


#: Field kinds of the capture's JSON records: (what values are allowed, lo, hi).
RANK_ID = ("int", 0, INT32_MAX - 1)
INT32 = ("int", -(2**31), INT32_MAX)
STEP = ("int", 0, INT32_MAX)
SIZE = ("int", 0, INT64_MAX)
INT64 = ("int", -INT64_MAX - 1, INT64_MAX)
TIME = ("int", -TIME_LIMIT_NS, TIME_LIMIT_NS)
TEXT = ("str", 0, 0)
OBJECT = ("dict", 0, 0)
ARRAY = ("list", 0, 0)
BOOL = ("bool", 0, 0)
INTS = ("ints", -INT64_MAX - 1, INT64_MAX)
TEXTS = ("strs", 0, 0)


def fields(
    record: Any, spec: Mapping[str, tuple[str, int, int]], what: str, path: str | Path
) -> dict[str, Any]:
    """Check the keys of `spec` in a JSON object (each may be absent or null); other keys are
    kept unchecked. Returns the record."""
    if not isinstance(record, dict):
        raise InputError(
            f"{what} must be an object, not {_type_name(record)} ({_describe(record)}).", str(path)
        )
    for key, (kind, lo, hi) in spec.items():
        value = record.get(key)
        if value is None:
            continue
        label = f"{what}: {key!r}"
        if kind == "int":
            integer(value, label, path, lo=lo, hi=hi)
        elif kind == "str":
            text(value, label, path)
        elif kind == "bool":
            if not isinstance(value, bool):
                raise InputError(
                    f"{label} must be true or false, not {_describe(value)}.", str(path)
                )
        elif kind in ("dict", "list"):
            if type(value).__name__ != kind:
                raise InputError(
                    f"{label} must be {_type_name({'dict': {}, 'list': []}[kind])}"
                    f", not {_type_name(value)} ({_describe(value)}).",
                    str(path),
                )
        elif kind in ("ints", "strs"):
            if not isinstance(value, list):
                raise InputError(f"{label} must be an array, not {_describe(value)}.", str(path))
            if _all_valid(value, kind, lo, hi):
                continue
            for item in value:  # the first bad item, named
                if kind == "ints":
                    integer(item, f"{label} item", path, lo=lo, hi=hi, optional=False)
                else:
                    text(item, f"{label} item", path, optional=False)
    return record


def _all_valid(items: list[Any], kind: str, lo: int, hi: int) -> bool:
    """Whether every item of a JSON array is an int in [lo, hi] ("ints") or a string
    ("strs"), checked by C builtins: a trace's process groups list every member rank, and
    item by item that was 10 ms of a 22 ms conversion at 10,000 ranks."""
    types = set(map(type, items))
    if kind == "strs":
        return types <= {str}
    return types <= {int} and (not items or (lo <= min(items) and max(items) <= hi))


# ------------------------------------------------------------------ names and terminals


def run_name(name: Any, *, option: str = "--run") -> str:
    """A run name to store or look up: UsageError unless 1..MAX_NAME_CHARS characters of valid
    UTF-8 without control characters."""
    if not isinstance(name, str) or not name.strip():
        raise UsageError(f"{option} needs a non-empty run name.")
    if len(name) > MAX_NAME_CHARS:
        raise UsageError(
            f"{option}: a run name has at most {MAX_NAME_CHARS} characters, not {len(name)}."
        )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{option} {name!r} is not valid UTF-8 text. Use a plain name.") from None
    if _CONTROL.search(name):
        raise UsageError(f"{option} {name!r} holds control characters. Use a plain name.")
    return name


def ingest_run_name(name: str, path: str | Path) -> str:
    """A run name that came from a manifest or a folder name: an InputError naming the file."""
    try:
        return run_name(name, option="the run name")
    except UsageError as exc:
        raise InputError(f"{exc} Pass --run NAME.", str(path)) from None


_ESCAPE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, clear screen
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: window title, hyperlinks
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS, SOS, PM, APC strings
    r"|\x1b[@-_]?"  # any other escape
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"  # other C0/C1 controls (tab and newline stay)
)


def strip_control(value: str) -> str:
    """Text safe to print to a terminal: escape sequences and control characters removed
    (newline and tab kept), so that a trace's names cannot clear the screen, retitle the window
    or forge output lines."""
    return _ESCAPE.sub("", value)
