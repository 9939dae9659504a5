"""Convert one Kineto trace file into tracelab's columnar form (Parquet), and nothing else.

This is the one function that turns JSON into columns. Ingest runs it in a process pool, one
trace per task; the collector may run it on each rank when a window ends, so that a 1,000-rank
job never funnels through one parser. Output, in `out_dir`:

- `events.parquet`: the X events with every derived column of the store's `events` table
  (category, on_device, stream, correlation, external_id, step), sorted by time
- `steps.parquet`: the ProfilerStep spans
- `memory.parquet`: the `[memory]` instants (ts_ns, step, args)
- `lanes.parquet`: process/thread names and sort indices from `M` events
- `trace.json`: the file's metadata (rank info, base time, counts) as `TraceInfo`

Decoding uses typed msgspec structs with `args` kept as raw JSON bytes, so no Python dict is built
per event; derived columns are computed with numpy/arrow in tracelab.columns. All of it runs in
the worker that parses the file, so the store's load is a plain columnar copy.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import zlib
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracelab import columns
from tracelab.errors import TraceFormatError

#: Above 2**43 µs a float64 can no longer hold µs with ns resolution; such traces (no
#: baseTimeNanoseconds, absolute µs) take the exact decimal path.
_FLOAT_EXACT_LIMIT_US = float(2**43)
_GZIP_MAGIC = b"\x1f\x8b"


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
    ph: str = ""
    ts: Any = None
    dur: Any = None


_EVENTS_DECODER = msgspec.json.Decoder(list[_Event])
_EXACT_DECODER = msgspec.json.Decoder(list[_ExactTimes], float_hook=str)
_TOP_DECODER = msgspec.json.Decoder(dict[str, msgspec.Raw])


@dataclass(frozen=True, kw_only=True)
class TraceInfo:
    """What a trace file says about itself; written next to its Parquet files."""

    file: str
    file_bytes: int
    sha256: str
    rank: int | None
    world_size: int | None
    backend: str | None
    process_groups: list[dict[str, Any]]
    host: str | None
    device: str | None
    device_memory_bytes: int | None
    device_properties: list[Any] | None
    base_time_ns: int
    event_count: int
    memory_event_count: int
    ignored_event_count: int
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> TraceInfo:
        return cls(**json.loads(text))


EVENTS_SCHEMA = pa.schema(
    [
        ("idx", pa.int64()),
        ("cat", pa.string()),
        ("name", pa.string()),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("lane_label", pa.string()),
        ("ts_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("category", pa.string()),
        ("on_device", pa.bool_()),
        ("stream", pa.int64()),
        ("correlation", pa.int64()),
        ("external_id", pa.int64()),
        ("step", pa.int32()),
        ("args", pa.string()),
    ]
)


#: Suffix of the folder holding a trace's columnar form next to the trace itself.
CONVERTED_SUFFIX = ".tracelab"
_PARQUET_FILES = ("events.parquet", "steps.parquet", "memory.parquet", "lanes.parquet")


def converted_dir(trace_path: str | os.PathLike[str]) -> Path:
    """Where the collector leaves a trace's columnar form: `window-0.pt.trace.json.gz` ->
    `window-0.pt.trace.tracelab/` beside it."""
    path = Path(trace_path)
    name = path.name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return path.with_name(name + CONVERTED_SUFFIX)


def load_converted(trace_path: str | os.PathLike[str]) -> TraceInfo | None:
    """The TraceInfo of a trace converted earlier (e.g. on its rank by the collector), when its
    columnar form is complete and was made from these exact bytes; else None."""
    path = Path(trace_path)
    folder = converted_dir(path)
    meta = folder / "trace.json"
    if not meta.is_file() or not all((folder / f).is_file() for f in _PARQUET_FILES):
        return None
    try:
        info = TraceInfo.from_json(meta.read_text())
    except (OSError, ValueError, TypeError):
        return None
    if info.file_bytes != path.stat().st_size:
        return None
    with path.open("rb") as fh:
        if hashlib.file_digest(fh, "sha256").hexdigest() != info.sha256:
            return None
    return info


def read_trace_bytes(path: Path) -> bytes:
    """The decompressed bytes of a `.json` or `.json.gz` file (sniffed, not trusted by name)."""
    return _decompress(_read_raw(path), path)


def _read_raw(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceFormatError(f"cannot read the file: {exc.strerror}", str(path)) from exc
    if not raw:
        raise TraceFormatError("the file is empty (0 bytes). Re-export the trace.", str(path))
    return raw


def _decompress(raw: bytes, path: Path) -> bytes:
    if raw[:2] != _GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceFormatError(
            f"corrupt or truncated gzip data ({exc}). The file was probably cut off while "
            "copying or writing; copy it again from the training host.",
            str(path),
        ) from exc


def _decode_error(path: Path, exc: Exception, buf: bytes = b"") -> TraceFormatError:
    text = str(exc)
    if b"NaN" in buf or b"Infinity" in buf:
        hint = (
            f"it holds NaN or Infinity, which JSON does not allow ({text}): a NaN or infinite "
            "duration or timestamp. Fix the exporter or drop this rank (--skip-bad)."
        )
    elif "truncated" in text.lower() or "end of" in text.lower():
        hint = "the JSON ends early: the file is truncated. Copy or export it again."
    elif "utf-8" in text.lower():
        hint = f"it is not valid UTF-8 ({text}). Re-export the trace with a current profiler."
    else:
        hint = f"it is not valid Kineto JSON ({text})."
    return TraceFormatError(hint, str(path))


def _int_or_none(value: Any) -> int | None:
    return value if type(value) is int else None


def _us_to_ns(us: np.ndarray) -> np.ndarray:
    """µs floats to integer ns without losing the integer part above 2**53 ns."""
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000.0).astype(np.int64)


def _exact_times_ns(buf: bytes, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """ts and dur of X events in ns, parsed from the decimal text (no float rounding)."""
    try:
        times = _EXACT_DECODER.decode(buf)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise _decode_error(path, exc) from exc

    def ns(value: Any) -> int:
        if type(value) is int:
            return value * 1000
        return int((Decimal(value) * 1000).to_integral_value())

    xs = [t for t in times if t.ph == "X"]
    return (
        np.fromiter((ns(t.ts) for t in xs), dtype=np.int64, count=len(xs)),
        np.fromiter((ns(t.dur) for t in xs), dtype=np.int64, count=len(xs)),
    )


def _distributed_info(top: dict[str, msgspec.Raw], path: Path) -> dict[str, Any]:
    raw = top.get("distributedInfo")
    if raw is None:
        return {}
    info = msgspec.json.decode(raw)
    if not isinstance(info, dict):
        raise TraceFormatError("distributedInfo is not an object.", str(path))
    return info


def _metadata(top: dict[str, msgspec.Raw]) -> dict[str, Any]:
    skip = {"traceEvents", "distributedInfo", "deviceProperties"}
    out: dict[str, Any] = {}
    for key, raw in top.items():
        if key in skip or len(raw) > 65536:
            continue
        out[key] = msgspec.json.decode(raw)
    return out


def convert_trace(path: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> TraceInfo:
    """Decode one Kineto trace and write its columnar form into `out_dir`.

    Raises TraceFormatError, naming the file and the fix, for every kind of bad input.
    """
    path = Path(path)
    out = Path(out_dir)
    raw = _read_raw(path)
    file_sha256 = hashlib.sha256(raw).hexdigest()
    buf = _decompress(raw, path)
    del raw
    try:
        top = _TOP_DECODER.decode(buf)
    except msgspec.ValidationError as exc:
        raise TraceFormatError(
            "the top level is not a JSON object, so this is not a Kineto trace "
            "(torch.profiler's export_chrome_trace writes {\"traceEvents\": [...]}).",
            str(path),
        ) from exc
    except msgspec.DecodeError as exc:
        raise _decode_error(path, exc, buf) from exc
    if "traceEvents" not in top:
        raise TraceFormatError(
            "no 'traceEvents' key, so this is not a Kineto trace. Pass torch.profiler's "
            "exported JSON (export_chrome_trace or tensorboard_trace_handler).",
            str(path),
        )
    try:
        events = _EVENTS_DECODER.decode(top["traceEvents"])
    except msgspec.ValidationError as exc:
        raise TraceFormatError(f"unexpected event shape: {exc}", str(path)) from exc
    except msgspec.DecodeError as exc:
        raise _decode_error(path, exc) from exc

    xs: list[_Event] = []
    mem: list[_Event] = []
    lanes: list[_Event] = []
    for e in events:
        ph = e.ph
        if ph == "X":
            xs.append(e)
        elif ph == "M":
            lanes.append(e)
        elif (ph == "i" or ph == "I") and e.name == "[memory]":
            mem.append(e)
    if not xs:
        raise TraceFormatError(
            f"the trace holds no complete ('X') events ({len(events)} events in all): it is "
            "empty. Profile at least one active step.",
            str(path),
        )
    dist = _distributed_info(top, path)
    base_raw = top.get("baseTimeNanoseconds")
    base_ns = int(msgspec.json.decode(base_raw)) if base_raw is not None else 0

    ts_f = list(map(attrgetter("ts"), xs))
    dur_f = list(map(attrgetter("dur"), xs))
    if None in ts_f:
        bad = ts_f.index(None)
        raise TraceFormatError(f"X event #{bad} ({xs[bad].name!r}) has no 'ts'.", str(path))
    if None in dur_f:
        dur_f = [0.0 if d is None else d for d in dur_f]
    ts_arr = np.asarray(ts_f, dtype=np.float64)
    dur_arr = np.asarray(dur_f, dtype=np.float64)
    del ts_f, dur_f
    if (dur_arr < 0).any():
        bad = int(np.argmax(dur_arr < 0))
        raise TraceFormatError(
            f"X event #{bad} ({xs[bad].name!r}) has a negative duration {dur_arr[bad]} us. "
            "The profiler clock went backwards; drop this rank (--skip-bad) or re-capture.",
            str(path),
        )
    if (
        base_ns == 0
        and np.abs(ts_arr).max() >= _FLOAT_EXACT_LIMIT_US
        and not (np.all(ts_arr == np.floor(ts_arr)) and np.all(dur_arr == np.floor(dur_arr)))
    ):
        # Absolute µs with fractions: a float64 cannot hold them to the ns, parse the text.
        ts_ns, dur_ns = _exact_times_ns(top["traceEvents"], path)
    else:
        ts_ns = _us_to_ns(ts_arr) + base_ns
        dur_ns = _us_to_ns(dur_arr)

    pids = list(map(attrgetter("pid"), xs))
    tids = list(map(attrgetter("tid"), xs))
    cat_arr = pa.array(list(map(attrgetter("cat"), xs)), pa.string())
    name_arr = pa.array(list(map(attrgetter("name"), xs)), pa.string())
    category, on_device = columns.classify_columns(cat_arr, name_arr)
    pid_col, tid_col, label_col = columns.lane_columns(pids, tids)
    raw_args = [bytes(e.args) for e in xs]
    stream, correlation, external_id = columns.id_columns(raw_args, cat_arr, on_device, tid_col)
    try:
        args = pa.array([a or None for a in raw_args], pa.binary()).cast(pa.string())
    except pa.ArrowInvalid as exc:
        raise TraceFormatError(
            f"event args are not valid UTF-8 ({exc}). Re-export the trace.", str(path)
        ) from exc
    del raw_args
    device_np = on_device.to_numpy(zero_copy_only=False)
    steps = columns.step_spans(name_arr, ts_ns, dur_ns, device_np)
    step = columns.step_column(ts_ns, device_np, correlation, steps)
    table = pa.Table.from_arrays(
        [
            pa.array(np.arange(len(xs), dtype=np.int64)),
            cat_arr,
            name_arr,
            pid_col,
            tid_col,
            label_col,
            pa.array(ts_ns),
            pa.array(dur_ns),
            category,
            on_device,
            stream,
            correlation,
            external_id,
            pa.array(step.astype(np.int32), mask=step < 0),
            args,
        ],
        schema=EVENTS_SCHEMA,
    ).sort_by([("ts_ns", "ascending")])
    del pids, tids
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        table, out / "events.parquet", compression="snappy", row_group_size=1 << 20,
        # Dictionary-encode only the repetitive text; args are mostly unique.
        use_dictionary=["cat", "name", "category", "lane_label"],
        write_statistics=["idx", "ts_ns", "dur_ns", "step"],
    )
    _write_memory(mem, base_ns, steps, out / "memory.parquet")
    _write_steps(steps, ts_ns + dur_ns, device_np, step, out / "steps.parquet")
    _write_lanes(lanes, out / "lanes.parquet")
    del table, xs

    info = TraceInfo(
        file=str(path),
        file_bytes=path.stat().st_size,
        sha256=file_sha256,
        rank=_int_or_none(dist.get("rank")),
        world_size=_int_or_none(dist.get("world_size")),
        backend=dist.get("backend"),
        process_groups=list(dist.get("pg_config") or []),
        host=_host(top),
        **_device(top),
        base_time_ns=base_ns,
        event_count=len(ts_ns),
        memory_event_count=len(mem),
        ignored_event_count=len(events) - len(ts_ns) - len(mem) - len(lanes),
        metadata=_metadata(top),
    )
    (out / "trace.json").write_text(info.to_json())
    return info


def _host(top: dict[str, msgspec.Raw]) -> str | None:
    for key in ("host_name", "hostname"):
        if key in top:
            value = msgspec.json.decode(top[key])
            return value if isinstance(value, str) else None
    return None


def _device(top: dict[str, msgspec.Raw]) -> dict[str, Any]:
    raw = top.get("deviceProperties")
    props = msgspec.json.decode(raw) if raw is not None else None
    if not isinstance(props, list) or not props or not isinstance(props[0], dict):
        return {"device": None, "device_memory_bytes": None, "device_properties": None}
    first = props[0]
    mem = first.get("totalGlobalMem")
    return {
        "device": first.get("name"),
        "device_memory_bytes": mem if isinstance(mem, int) else None,
        "device_properties": props,
    }


def _write_steps(
    steps: pa.Table, end_ns: np.ndarray, on_device: np.ndarray, step: np.ndarray, path: Path
) -> None:
    """steps.parquet: the step spans plus the end of each step's last device event."""
    device_end: list[int | None] = []
    for n in steps.column("step").to_pylist():
        hit = on_device & (step == n)
        device_end.append(int(end_ns[hit].max()) if hit.any() else None)
    pq.write_table(
        steps.append_column("device_end_ns", pa.array(device_end, pa.int64())), path
    )


def _write_memory(mem: list[_Event], base_ns: int, steps: pa.Table, path: Path) -> None:
    ts = [e.ts if e.ts is not None else 0.0 for e in mem]
    ts_ns = _us_to_ns(np.asarray(ts, dtype=np.float64)) + base_ns
    step = columns.step_by_time(ts_ns, steps)
    table = pa.table(
        {
            "ts_ns": pa.array(ts_ns),
            "step": pa.array(step.astype(np.int32), mask=step < 0),
            "args": pa.array([bytes(e.args) or None for e in mem], pa.binary()).cast(pa.string()),
        }
    )
    pq.write_table(table, path, compression="snappy")


def _write_lanes(lanes: list[_Event], path: Path) -> None:
    rows: dict[str, list[Any]] = {"pid": [], "tid": [], "kind": [], "value": [], "sort_index": []}
    for e in lanes:
        args = msgspec.json.decode(e.args) if bytes(e.args) else {}
        if not isinstance(args, dict):
            continue
        value = args.get("name", args.get("labels"))
        sort_index = args.get("sort_index")
        rows["pid"].append(_int_or_none(e.pid))
        rows["tid"].append(_int_or_none(e.tid) if e.name.startswith("thread") else None)
        rows["kind"].append(e.name)
        rows["value"].append(value if isinstance(value, str) else None)
        rows["sort_index"].append(_int_or_none(sort_index))
    table = pa.table(
        rows,
        schema=pa.schema(
            [
                ("pid", pa.int64()),
                ("tid", pa.int64()),
                ("kind", pa.string()),
                ("value", pa.string()),
                ("sort_index", pa.int64()),
            ]
        ),
    )
    pq.write_table(table, path, compression="snappy")
