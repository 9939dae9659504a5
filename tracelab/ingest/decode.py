"""Kineto JSON bytes -> one column per field, for every event of `traceEvents`.

Two decoders produce the same `DecodedTrace`:

- the fast path, `tracelab._kineto.scan` (C, one pass, no Python object per event), used
  whenever the extension is built and the input is inside its fast path;
- the reference decoder (typed msgspec structs), used when the extension is missing, and for any
  input the scanner declines: invalid JSON of every kind, so that every error message comes from
  one place, and rare valid shapes (e.g. a timestamp written with an exponent).

tests/foundation/test_fast_scan.py checks that both give identical columns on every shared trace
and agree on accepting or rejecting damaged ones.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from decimal import Decimal
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from tracelab.errors import TraceFormatError
from tracelab.ingest import validate

try:
    from tracelab.ingest import _kineto
except ImportError:  # built without a C compiler: the reference decoder does everything
    _kineto = None

#: Integer args read for every event: correlation/stream ids and the [memory] fields, and
#: PyTorch 1.8's lower-case `external id` of device events (tracelab.ingest.columns prefers
#: `External id`). The order is the C scanner's (tracelab/_kineto.c ID_KEYS).
ID_KEYS = (
    "correlation",
    "External id",
    "stream",
    "Device Type",
    "Device Id",
    "Bytes",
    "Total Allocated",
    "Total Reserved",
    "external id",
)
#: "not an integer" in pid/tid/id columns.
ABSENT = np.iinfo(np.int64).min
#: Above 2**43 µs a float64 can no longer hold µs with ns resolution.
_FLOAT_EXACT_LIMIT_US = float(2**43)


@dataclass(frozen=True, kw_only=True)
class DecodedTrace:
    """Every event's fields as columns (length n), plus the other top-level members, raw."""

    n: int
    #: First byte of a one-character ph (b"X"[0], ...), else 0.
    ph: np.ndarray
    name: pa.Array
    cat: pa.Array
    #: pid/tid as int64, ABSENT where not a JSON integer; `odd` holds the Python value of those
    #: ((index, "pid"|"tid") -> value; None when absent).
    pid: np.ndarray
    tid: np.ndarray
    odd: dict[tuple[int, str], Any]
    #: ts/dur in ns relative to the trace's base time; `*_missing` where absent or null.
    ts_ns: np.ndarray
    dur_ns: np.ndarray
    ts_missing: np.ndarray
    dur_missing: np.ndarray
    #: args as JSON text, verbatim; null where absent.
    args: pa.Array
    #: ID_KEYS -> int64 column, ABSENT where the args lack an integer value for it.
    ids: dict[str, np.ndarray]
    #: Top-level members other than traceEvents: key -> raw JSON bytes.
    top: dict[str, bytes]


def decode(buf: bytes | mmap.mmap, path: Path) -> DecodedTrace:
    """Decode a trace's bytes (or a read-only map of them); raises TraceFormatError naming
    `path` and the fix. Nothing returned refers to `buf`, which the caller may close. A leading
    UTF-8 byte-order mark is skipped (RFC 8259 lets a parser ignore it)."""
    if buf[:3] == validate.BOM:
        buf = bytes(buf[3:])
    if _kineto is not None:
        scanned = _kineto.scan(buf)
        if scanned is not None:
            return _from_scan(scanned, buf, path)
    # msgspec.Raw values point into the buffer they were decoded from: give it its own copy,
    # so that no error traceback can pin the caller's map.
    return decode_reference(buf if isinstance(buf, bytes) else bytes(buf), path)


def _strings(offsets: bytes, data: bytes, valid: bytes | None, n: int) -> pa.Array:
    validity = None
    nulls = 0
    if valid is not None:
        mask = np.frombuffer(valid, dtype=np.bool_)
        nulls = n - int(mask.sum())
        validity = pa.py_buffer(np.packbits(mask, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(
        pa.large_string(),
        n,
        [validity, pa.py_buffer(offsets), pa.py_buffer(data)],
        null_count=nulls,
    )


def _from_scan(
    s: dict[str, Any], buf: bytes | mmap.mmap, path: Path = Path("<trace>")
) -> DecodedTrace:
    n = s["n"]
    pid_kind = np.frombuffer(s["pid_kind"], dtype=np.uint8)
    tid_kind = np.frombuffer(s["tid_kind"], dtype=np.uint8)
    pid = np.where(pid_kind == 1, np.frombuffer(s["pid"], dtype=np.int64), ABSENT)
    tid = np.where(tid_kind == 1, np.frombuffer(s["tid"], dtype=np.int64), ABSENT)
    odd: dict[tuple[int, str], Any] = {}
    for i in np.flatnonzero(pid_kind == 0).tolist():
        odd[(i, "pid")] = None
    for i in np.flatnonzero(tid_kind == 0).tolist():
        odd[(i, "tid")] = None
    # An integer equal to the ABSENT sentinel (-2**63) is kept as an odd value, like the
    # reference decoder does, so that it is never mistaken for "absent".
    for i in np.flatnonzero((pid_kind == 1) & (pid == ABSENT)).tolist():
        odd[(i, "pid")] = int(ABSENT)
    for i in np.flatnonzero((tid_kind == 1) & (tid == ABSENT)).tolist():
        odd[(i, "tid")] = int(ABSENT)
    other = np.frombuffer(s["other"], dtype=np.int64).reshape(-1, 4)
    for i, field, start, end in other.tolist():
        odd[(i, "pid" if field == 0 else "tid")] = decode_member(buf[start:end], path)
    args = _strings(s["args_off"], s["args_data"], s["args_valid"], n)
    return DecodedTrace(
        n=n,
        ph=np.frombuffer(s["ph"], dtype=np.uint8),
        name=_strings(s["name_off"], s["name_data"], None, n),
        cat=_strings(s["cat_off"], s["cat_data"], s["cat_valid"], n),
        pid=pid,
        tid=tid,
        odd=odd,
        ts_ns=np.frombuffer(s["ts"], dtype=np.int64),
        dur_ns=np.frombuffer(s["dur"], dtype=np.int64),
        ts_missing=np.frombuffer(s["ts_kind"], dtype=np.uint8) == 0,
        dur_missing=np.frombuffer(s["dur_kind"], dtype=np.uint8) == 0,
        args=args,
        ids={k: np.frombuffer(v, dtype=np.int64) for k, v in s["ids"].items()},
        top={decode_member(key, path): buf[start:end] for key, start, end in s["top"]},
    )


# ------------------------------------------------------------------ reference decoder


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str | None = None
    name: str = ""
    pid: Any = None
    tid: Any = None
    ts: float | None = None
    dur: float | None = None
    args: msgspec.Raw = msgspec.Raw(b"")


class _ExactTimes(msgspec.Struct, gc=False):
    ts: Any = None
    dur: Any = None


#: ID_KEYS as struct fields k0, k1, ... (the keys themselves hold spaces).
_ID_FIELDS = tuple(f"k{i}" for i in range(len(ID_KEYS)))
_Ids = msgspec.defstruct(
    "_Ids",
    [(f, Any, None) for f in _ID_FIELDS],
    gc=False,
    rename=dict(zip(_ID_FIELDS, ID_KEYS, strict=True)),
)
_EVENTS_DECODER = msgspec.json.Decoder(list[_Event])
_EXACT_DECODER = msgspec.json.Decoder(list[_ExactTimes], float_hook=str)
_TOP_DECODER = msgspec.json.Decoder(dict[str, msgspec.Raw])
_IDS_DECODER = msgspec.json.Decoder(_Ids)


def decode_error(path: Path, exc: BaseException, buf: bytes = b"") -> TraceFormatError:
    """The error for a trace msgspec could not decode, with what to do about it."""
    text = str(exc)
    if buf.find(b"NaN") >= 0 or buf.find(b"Infinity") >= 0:
        hint = (
            f"it holds NaN or Infinity, which JSON does not allow ({text}): a NaN or infinite "
            "duration or timestamp. Fix the exporter or drop this rank (--skip-bad)."
        )
    else:
        hint = validate.json_error_hint(buf, exc).replace("valid JSON", "valid Kineto JSON")
    return TraceFormatError(hint, str(path))


def decode_member(raw: bytes, path: Path) -> Any:
    """One JSON value of a trace that the scanner validated as text (a top-level member, an
    odd pid, an event's args): decoded, or a TraceFormatError naming the file (a number past
    a float's range, nesting past the stack)."""
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise decode_error(path, exc, bytes(raw)) from None


def time_error(
    path: Path, index: int, name: str, field: str, value_ns: float | int, base_ns: int = 0
) -> TraceFormatError:
    """An event whose time lies outside +-validate.TIME_LIMIT_NS (alone or after the base)."""
    where = f"{field} {value_ns / 1000:g} us" + (
        f" after the base time {base_ns} ns" if base_ns else ""
    )
    return TraceFormatError(
        f"event #{index} ({name!r}) has {where}, beyond the {validate.TIME_LIMIT_NS} ns "
        "(146 years) that tracelab stores. The exporter wrote a bad time; fix it or drop this "
        "rank (--skip-bad).",
        str(path),
    )


def base_time_ns(top: dict[str, bytes], path: Path) -> int:
    """`baseTimeNanoseconds`: an integer within +-TIME_LIMIT_NS; absent or null means 0."""
    raw = top.get("baseTimeNanoseconds")
    value = decode_member(raw, path) if raw is not None else None
    if value is None:
        return 0
    if type(value) is not int or abs(value) > validate.TIME_LIMIT_NS:
        raise TraceFormatError(
            f"baseTimeNanoseconds is {str(value)[:40]}: it must be an integer number of ns "
            f"within +-{validate.TIME_LIMIT_NS}. Fix the exporter or drop this rank (--skip-bad).",
            str(path),
        )
    return value


def _us_to_ns(us: np.ndarray) -> np.ndarray:
    """µs floats to integer ns without losing the integer part above 2**53 ns."""
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000.0).astype(np.int64)


def _exact_ns(value: Any) -> int:
    if value is None:
        return 0
    if type(value) is int:
        return value * 1000
    return int((Decimal(value) * 1000).to_integral_value())


def _times(
    events: list[_Event], raw_events: bytes, base_ns: int, path: Path
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    ts_f = list(map(attrgetter("ts"), events))
    dur_f = list(map(attrgetter("dur"), events))
    ts_missing = np.fromiter((t is None for t in ts_f), dtype=np.bool_, count=len(ts_f))
    dur_missing = np.fromiter((d is None for d in dur_f), dtype=np.bool_, count=len(dur_f))
    ts_arr = np.asarray([0.0 if t is None else t for t in ts_f], dtype=np.float64)
    dur_arr = np.asarray([0.0 if d is None else d for d in dur_f], dtype=np.float64)
    limit_us = validate.TIME_LIMIT_NS / 1000
    for field, arr in (("ts", ts_arr), ("dur", dur_arr)):
        bad = ~(np.abs(arr) < limit_us)  # NaN too
        if bad.any():
            i = int(np.argmax(bad))
            raise time_error(path, i, events[i].name, field, float(arr[i]) * 1000)
    if (
        base_ns == 0
        and len(ts_arr)
        and np.abs(ts_arr).max() >= _FLOAT_EXACT_LIMIT_US
        and not (np.all(ts_arr == np.floor(ts_arr)) and np.all(dur_arr == np.floor(dur_arr)))
    ):
        # Absolute µs with fractions: a float64 cannot hold them to the ns, parse the text.
        try:
            exact = _EXACT_DECODER.decode(raw_events)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise decode_error(path, exc) from exc
        return (
            np.fromiter((_exact_ns(t.ts) for t in exact), np.int64, len(exact)),
            np.fromiter((_exact_ns(t.dur) for t in exact), np.int64, len(exact)),
            ts_missing,
            dur_missing,
        )
    return _us_to_ns(ts_arr), _us_to_ns(dur_arr), ts_missing, dur_missing


def _int_column(values: list[Any]) -> np.ndarray:
    return np.fromiter(
        (v if type(v) is int and -(2**63) < v < 2**63 else ABSENT for v in values),
        dtype=np.int64,
        count=len(values),
    )


def _ids(raw_args: list[bytes]) -> dict[str, np.ndarray]:
    empty = _Ids()
    decoded = []
    for a in raw_args:
        if not a:
            decoded.append(empty)
            continue
        try:
            decoded.append(_IDS_DECODER.decode(a))
        except (msgspec.ValidationError, RecursionError):  # not an object: no ids
            decoded.append(empty)
    return {
        key: _int_column(list(map(attrgetter(field), decoded)))
        for key, field in zip(ID_KEYS, _ID_FIELDS, strict=True)
    }


def decode_reference(buf: bytes, path: Path) -> DecodedTrace:
    """The reference decoder: typed msgspec structs, args kept as raw JSON bytes."""
    try:
        top = _TOP_DECODER.decode(buf)
    except RecursionError as exc:
        raise decode_error(path, exc, buf) from None
    except msgspec.ValidationError as exc:
        raise TraceFormatError(
            "the top level is not a JSON object, so this is not a Kineto trace "
            '(torch.profiler\'s export_chrome_trace writes {"traceEvents": [...]}).',
            str(path),
        ) from exc
    except msgspec.DecodeError as exc:
        raise decode_error(path, exc, buf) from exc
    if "traceEvents" not in top:
        raise TraceFormatError(
            "no 'traceEvents' key, so this is not a Kineto trace. Pass torch.profiler's "
            "exported JSON (export_chrome_trace or tensorboard_trace_handler).",
            str(path),
        )
    try:
        events = _EVENTS_DECODER.decode(top["traceEvents"])
    except RecursionError as exc:
        raise decode_error(path, exc, buf) from None
    except msgspec.ValidationError as exc:
        if "out of range" in str(exc):
            raise TraceFormatError(
                f"a number is too large for a 64-bit float ({exc}). Fix the exporter or drop "
                "this rank (--skip-bad).",
                str(path),
            ) from None
        raise TraceFormatError(f"unexpected event shape: {exc}", str(path)) from exc
    except msgspec.DecodeError as exc:
        raise decode_error(path, exc, bytes(top["traceEvents"])) from exc
    base_ns = base_time_ns(top, path)  # type: ignore[arg-type]
    ts_ns, dur_ns, ts_missing, dur_missing = _times(events, top["traceEvents"], base_ns, path)
    pids = list(map(attrgetter("pid"), events))
    tids = list(map(attrgetter("tid"), events))
    pid, tid = _int_column(pids), _int_column(tids)
    odd: dict[tuple[int, str], Any] = {}
    for i in np.flatnonzero(pid == ABSENT).tolist():
        odd[(i, "pid")] = pids[i]
    for i in np.flatnonzero(tid == ABSENT).tolist():
        odd[(i, "tid")] = tids[i]
    raw_args = [bytes(e.args) for e in events]
    try:
        args = pa.array([a or None for a in raw_args], pa.large_binary()).cast(pa.large_string())
    except pa.ArrowInvalid as exc:
        raise TraceFormatError(
            f"event args are not valid UTF-8 ({exc}). Re-export the trace.", str(path)
        ) from exc
    return DecodedTrace(
        n=len(events),
        ph=np.fromiter(
            (ord(e.ph) if len(e.ph) == 1 and e.ph.isascii() else 0 for e in events),
            dtype=np.uint8,
            count=len(events),
        ),
        name=pa.array(list(map(attrgetter("name"), events)), pa.large_string()),
        cat=pa.array(list(map(attrgetter("cat"), events)), pa.large_string()),
        pid=pid,
        tid=tid,
        odd=odd,
        ts_ns=ts_ns,
        dur_ns=dur_ns,
        ts_missing=ts_missing,
        dur_missing=dur_missing,
        args=args,
        ids=_ids(raw_args),
        top={k: bytes(v) for k, v in top.items() if k != "traceEvents"},
    )
