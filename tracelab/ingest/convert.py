"""Convert one Kineto trace file into tracelab's columnar form (Parquet), and nothing else.

This is the one function that turns JSON into columns. Ingest runs it in a process pool, one
trace per task; the collector may run it on each rank when a window ends, so that a 1,000-rank
job never funnels through one parser. Output, in `out_dir`:

- `events.parquet`: the X events with every derived column of the store's `events` table
  (category, on_device, stream, correlation, external_id, step), sorted by time
- `steps.parquet`: the ProfilerStep spans
- `memory.parquet`: the `[memory]` instants (ts_ns, step, args, and the numeric fields of args)
- `lanes.parquet`: process/thread names and sort indices from `M` events
- `collectives.parquet`: the collectives the events show (tracelab.ingest.trace_collectives)
- `trace.json`: the file's metadata (rank info, base time, counts) as `TraceInfo` (not in an
  ingest's own staging folder, whose TraceInfo travels back as the result)

The folder's schemas, and reading it back, are tracelab.ingest.converted.

Decoding (tracelab.ingest.decode) yields one column per field, with `args` kept as raw JSON text, so no
Python object is built per event; derived columns are computed with numpy/arrow in
tracelab.ingest.columns. All of it runs in the worker that parses the file, so the store's load is a
plain columnar copy.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import mmap
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracelab.errors import InputError, TraceFormatError
from tracelab.ingest import columns, gunzip, trace_collectives, validate
from tracelab.ingest.converted import (
    CONVERTED_FORMAT,
    EVENTS_SCHEMA,
    TraceInfo,
    converted_dir,
    load_converted,
)
from tracelab.ingest.decode import (
    ABSENT,
    DecodedTrace,
    base_time_ns,
    decode,
    decode_member,
    time_error,
)

#: Rows per Parquet row group: several per rank, so DuckDB reads one file with several threads.
_ROW_GROUP = 122_880
#: Parquet codec of the converted files: LZ4 (raw) writes a rank's events in 0.041 CPU-s against
#: snappy's 0.057 for the same size (4 MB for 123k events); DuckDB reads both at the same cost.
_CODEC = "lz4"


@contextlib.contextmanager
def _mapped(path: Path) -> Iterator[mmap.mmap]:
    """The file's bytes, memory-mapped: the page cache is read in place, with no copy."""
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise TraceFormatError(f"cannot read the file: {exc.strerror}", str(path)) from exc
    with fh:
        if os.fstat(fh.fileno()).st_size == 0:
            raise TraceFormatError("the file is empty (0 bytes). Re-export the trace.", str(path))
        try:
            view = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise TraceFormatError(f"cannot read the file: {exc}", str(path)) from exc
        try:
            yield view
        finally:
            view.close()


class _HashInBackground:
    """SHA-256 of a buffer, computed on a thread; result() waits for it."""

    def __init__(self, data: bytes | mmap.mmap) -> None:
        self._hash = hashlib.sha256()
        self._thread = threading.Thread(target=self._hash.update, args=(data,), daemon=True)
        self._thread.start()

    def result(self) -> str:
        self._thread.join()
        return self._hash.hexdigest()


def _decompress(raw: bytes | mmap.mmap, path: Path) -> bytes | mmap.mmap:
    if not gunzip.is_gzip(raw):
        return raw
    try:
        return gunzip.gunzip(raw)
    except gunzip.GzipError as exc:
        raise TraceFormatError(
            f"corrupt or truncated gzip data ({exc}). The file was probably cut off while "
            "copying or writing; copy it again from the training host.",
            str(path),
        ) from exc


def _int_or_none(value: Any) -> int | None:
    return value if type(value) is int else None


#: distributedInfo fields tracelab reads, and what each must be (tracelab.ingest.validate).
_DIST_FIELDS = {
    "rank": validate.RANK_ID,
    "world_size": ("int", 1, validate.INT32_MAX),
    "backend": validate.TEXT,
    "pg_config": validate.ARRAY,
}


def _distributed_info(top: dict[str, bytes], path: Path) -> dict[str, Any]:
    raw = top.get("distributedInfo")
    if raw is None:
        return {}
    info = decode_member(raw, path)
    if info is None:
        return {}
    try:
        validate.fields(info, _DIST_FIELDS, "distributedInfo", path)
        validate.rank_and_world(info.get("rank"), info.get("world_size"), "distributedInfo", path)
        for group in info.get("pg_config") or []:
            validate.fields(
                group,
                {"ranks": validate.INTS, "pg_size": validate.INT32},
                "distributedInfo.pg_config entry",
                path,
            )
    except InputError as exc:
        raise TraceFormatError(str(exc).removeprefix(f"{path}: "), str(path)) from None
    return info


def _check_times(
    ts_ns: np.ndarray,
    dur_ns: np.ndarray,
    base_ns: int,
    names: pa.Array,
    sel: np.ndarray,
    path: Path,
) -> None:
    """Every time, duration and end, after adding the base, within +-TIME_LIMIT_NS; `sel` maps
    each row to its event's index in the trace."""
    lim = validate.TIME_LIMIT_NS
    if not len(ts_ns):
        return
    for name, arr in (("ts", ts_ns), ("dur", dur_ns)):
        bad = (arr >= lim) | (arr <= -lim)
        if bad.any():
            i = int(np.argmax(bad))
            raise time_error(path, int(sel[i]), names[i].as_py(), name, int(arr[i]))
    end = ts_ns + dur_ns  # both under 2**62 in magnitude: no overflow
    for name, arr in (("ts + dur", end), ("ts", ts_ns)):
        hi, lo = int(arr.max()) + base_ns, int(arr.min()) + base_ns
        if hi > lim or lo < -lim:
            i = int(np.argmax(arr)) if hi > lim else int(np.argmin(arr))
            raise time_error(path, int(sel[i]), names[i].as_py(), name, int(arr[i]), base_ns)


def _metadata(top: dict[str, bytes], path: Path) -> dict[str, Any]:
    skip = {"distributedInfo", "deviceProperties"}
    out: dict[str, Any] = {}
    for key, raw in top.items():
        if key in skip or len(raw) > 65536:
            continue
        out[key] = decode_member(raw, path)
    return out


def convert_trace(
    path: str | os.PathLike[str], out_dir: str | os.PathLike[str], *, info_file: bool = True
) -> TraceInfo:
    """Decode one Kineto trace and write its columnar form into `out_dir`, with its TraceInfo
    as `trace.json` unless not `info_file`: a later ingest reads that file to register a folder
    converted beside its trace, but an ingest's own staging folder needs none (at 10,000 ranks
    each rank's process groups made it 60 KB, 0.6 GB written and deleted again).

    Raises TraceFormatError, naming the file and the fix, for every kind of bad input, and an
    InputError for a disk that fills as it writes.
    """
    try:
        return _convert(Path(path), Path(out_dir), info_file)
    except OSError as exc:
        if exc.errno not in _FULL:  # (pyarrow's write errors name no file: by errno)
            raise
        raise InputError(
            f"no space left to write its converted files in {Path(out_dir).parent} "
            f"({exc.strerror or exc}). Free space there and run it again.",
            str(path),
        ) from None


def _convert(path: Path, out: Path, info_file: bool) -> TraceInfo:
    d, file_sha256 = _read(path)
    top = d.top
    xs = np.flatnonzero(d.ph == ord("X"))
    lanes = np.flatnonzero(d.ph == ord("M"))
    mem = _memory_instants(d)
    if not len(xs):
        raise TraceFormatError(
            f"the trace holds no complete ('X') events ({d.n} events in all): it is "
            "empty. Profile at least one active step.",
            str(path),
        )
    dist = _distributed_info(top, path)
    base_ns = base_time_ns(top, path)
    _check_x_events(d, xs, path)
    events = _events(d, xs, mem, base_ns, path)
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        events.table,
        out / "events.parquet",
        compression=_CODEC,
        row_group_size=_ROW_GROUP,
        # Dictionary-encode only the repetitive text; args are mostly unique.
        use_dictionary=["cat", "name", "category", "lane_label"],
        write_statistics=["idx", "ts_ns", "dur_ns", "step"],
    )
    _write_memory(d, mem, base_ns, events.steps, out / "memory.parquet")
    _write_steps(events.steps, events.end_ns, events.on_device, events.step, out / "steps.parquet")
    _write_lanes(d, lanes, out / "lanes.parquet", path)
    pq.write_table(
        trace_collectives.trace_collectives(events.table),
        out / "collectives.parquet",
        compression=_CODEC,
    )
    del events

    info = TraceInfo(
        file=str(path),
        file_bytes=path.stat().st_size,
        sha256=file_sha256,
        rank=_int_or_none(dist.get("rank")),
        world_size=_int_or_none(dist.get("world_size")),
        backend=dist.get("backend"),
        process_groups=list(dist.get("pg_config") or []),
        host=_host(top, path),
        **_device(top, path),
        base_time_ns=base_ns,
        event_count=len(xs),
        memory_event_count=len(mem),
        ignored_event_count=d.n - len(xs) - len(mem) - len(lanes),
        metadata=_metadata(top, path),
        format=CONVERTED_FORMAT,
    )
    if info_file:
        (out / "trace.json").write_text(info.to_json())
    return info


def convert_beside(path: str | os.PathLike[str]) -> TraceInfo:
    """Convert a trace into the folder beside it (converted_dir), as `tracelab convert`, the
    collector and Ray's tasks do. The folder is written under a temporary, hidden name (a
    folder scan skips it) and renamed when whole: a conversion killed halfway never leaves a
    folder that a later ingest would take as converted, and an earlier conversion's files are
    replaced, never rewritten in place, so a store that ingested them (its events files are
    links to them, tracelab.ingest.write) keeps what it ingested. Two conversions of one trace
    at once (two ingests on a cluster, `tracelab convert` beside one) each move the other's
    folder aside rather than fail."""
    final = converted_dir(path)
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp = final.with_name(f".{final.name}.tmp-{tag}")
    aside = final.with_name(f".{final.name}.old-{tag}")
    try:
        try:
            info = convert_trace(path, tmp)
        except OSError as exc:
            if exc.errno not in _UNWRITABLE or not str(exc.filename or "").startswith(str(tmp)):
                raise
            # (on Ray a worker's PermissionError was "internal error ... a bug", exit 70)
            raise InputError(
                f"cannot write the converted files beside this trace ({exc.strerror}: "
                f"{exc.filename}). Converting beside a trace (`tracelab convert`, the collector's "
                "convert=True, --engine ray on every node) needs its folder writable: make it "
                "so, or ingest without --engine ray, which converts into a folder beside the "
                "store.",
                str(path),
            ) from None
        for _ in range(_REPLACE_TRIES):
            with contextlib.suppress(FileNotFoundError):  # another conversion moved it first
                os.rename(final, aside)
            try:
                os.rename(tmp, final)
                break
            except OSError:  # another conversion's folder landed in between: again
                shutil.rmtree(aside, ignore_errors=True)
        else:
            raise OSError(f"{final}: another process keeps replacing this folder")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(aside, ignore_errors=True)
    return info


def converted_beside(path: str | os.PathLike[str]) -> TraceInfo:
    """The columnar form beside the trace: the folder already there when it is complete and
    made from these exact bytes (load_converted, which hashes the trace where this runs), else
    a new one (convert_beside). A Ray task of the ingest: a capture its ranks converted is
    checked on the cluster's nodes, not hashed trace by trace on the driver."""
    found = load_converted(path)
    return found if found is not None else convert_beside(path)


#: The errors of a folder that cannot be written (convert_beside names the folder).
_UNWRITABLE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
#: How often convert_beside moves a folder another conversion just put in place aside.
_REPLACE_TRIES = 20


def _read(path: Path) -> tuple[DecodedTrace, str]:
    """The decoded trace and the SHA-256 of the file's bytes."""
    with _mapped(path) as raw:
        # hashlib releases the GIL on large inputs: the hash runs on another core while the
        # scanner reads the same pages (a core is often idle: one file, or a pool's last files).
        digest = _HashInBackground(raw)
        try:
            buf = _decompress(raw, path)
            d = decode(buf, path)
            del buf
        finally:
            file_sha256 = digest.result()
    return d, file_sha256


def _memory_instants(d: DecodedTrace) -> np.ndarray:
    """Indices of the `[memory]` instant events."""
    instants = np.flatnonzero((d.ph == ord("i")) | (d.ph == ord("I")))
    if not len(instants):
        return instants
    names = d.name.take(pa.array(instants))
    return instants[pc.equal(names, "[memory]").to_numpy(zero_copy_only=False)]


def _check_x_events(d: DecodedTrace, xs: np.ndarray, path: Path) -> None:
    """Every X event has a time and a duration of at least zero."""
    if d.ts_missing[xs].any():
        bad = int(np.argmax(d.ts_missing[xs]))
        raise TraceFormatError(
            f"X event #{bad} ({d.name[int(xs[bad])].as_py()!r}) has no 'ts'.", str(path)
        )
    if (d.dur_ns[xs] < 0).any():
        bad = int(np.argmax(d.dur_ns[xs] < 0))
        raise TraceFormatError(
            f"X event #{bad} ({d.name[int(xs[bad])].as_py()!r}) has a negative duration "
            f"{d.dur_ns[xs[bad]] / 1000:g} us. The profiler clock went backwards; drop this rank "
            "(--skip-bad) or re-capture.",
            str(path),
        )


@dataclass(frozen=True, kw_only=True)
class _Events:
    """The X events as the events.parquet table, and what the other files are built from."""

    table: pa.Table
    #: The step spans (columns.step_spans).
    steps: pa.Table
    #: Per event, in time order: its end, whether it ran on a device, its step (-1: none).
    end_ns: np.ndarray
    on_device: np.ndarray
    step: np.ndarray


def _events(d: DecodedTrace, xs: np.ndarray, mem: np.ndarray, base_ns: int, path: Path) -> _Events:
    """The X events in time order with every derived column; `idx` keeps each one's place in
    the trace. The times of the X events and the memory instants are checked here."""
    order = np.argsort(d.ts_ns[xs], kind="stable")
    sel = xs[order]
    take = pa.array(sel)
    name_arr = d.name.take(take).cast(pa.string())
    _check_times(d.ts_ns[sel], d.dur_ns[sel], base_ns, name_arr, sel, path)
    _check_times(
        d.ts_ns[mem],
        np.zeros(len(mem), np.int64),
        base_ns,
        d.name.take(pa.array(mem, pa.int64())),
        mem,
        path,
    )
    ts_ns = d.ts_ns[sel] + base_ns
    dur_ns = d.dur_ns[sel]
    cat_arr = d.cat.take(take).cast(pa.string())
    category, on_device = columns.classify_columns(cat_arr, name_arr)
    pid_col, tid_col, label_col = columns.lane_columns(
        d.pid[sel], d.tid[sel], lambda i, f: d.odd[(int(sel[i]), f)]
    )
    stream, correlation, external_id = columns.id_columns(
        {k: v[sel] for k, v in d.ids.items()}, cat_arr, on_device, tid_col
    )
    device_np = on_device.to_numpy(zero_copy_only=False)
    try:
        steps = columns.step_spans(name_arr, ts_ns, dur_ns, device_np)
    except ValueError as exc:  # a step number beyond int32
        raise TraceFormatError(
            f"{exc}. Fix the trace or drop this rank (--skip-bad).", str(path)
        ) from None
    step = columns.step_column(ts_ns, device_np, correlation, steps)
    table = pa.Table.from_arrays(
        [
            pa.array(order.astype(np.int64)),
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
            d.args.take(take).cast(pa.string()),
        ],
        schema=EVENTS_SCHEMA,
    )
    return _Events(table=table, steps=steps, end_ns=ts_ns + dur_ns, on_device=device_np, step=step)


def _host(top: dict[str, bytes], path: Path) -> str | None:
    for key in ("host_name", "hostname"):
        if key in top:
            value = decode_member(top[key], path)
            return value if isinstance(value, str) else None
    return None


def _device(top: dict[str, bytes], path: Path) -> dict[str, Any]:
    raw = top.get("deviceProperties")
    props = decode_member(raw, path) if raw is not None else None
    if not isinstance(props, list) or not props or not isinstance(props[0], dict):
        return {"device": None, "device_memory_bytes": None, "device_properties": None}
    first = props[0]
    mem = first.get("totalGlobalMem")
    name = first.get("name")
    return {
        "device": name if isinstance(name, str) else None,
        "device_memory_bytes": mem if type(mem) is int and 0 <= mem <= validate.INT64_MAX else None,
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
    pq.write_table(steps.append_column("device_end_ns", pa.array(device_end, pa.int64())), path)


#: The [memory] args kept as columns: (column, args key).
MEMORY_FIELDS = (
    ("device_type", "Device Type"),
    ("device_id", "Device Id"),
    ("bytes", "Bytes"),
    ("total_allocated", "Total Allocated"),
    ("total_reserved", "Total Reserved"),
)


def _write_memory(
    d: DecodedTrace, mem: np.ndarray, base_ns: int, steps: pa.Table, path: Path
) -> None:
    """memory.parquet: each [memory] instant's time, step, args and its numeric fields."""
    ts_ns = d.ts_ns[mem] + base_ns
    step = columns.step_by_time(ts_ns, steps)
    data = {
        "ts_ns": pa.array(ts_ns),
        "step": pa.array(step.astype(np.int32), mask=step < 0),
        "args": d.args.take(pa.array(mem, pa.int64())).cast(pa.string()),
    }
    for column, key in MEMORY_FIELDS:
        values = d.ids[key][mem]
        data[column] = pa.array(values, mask=values == ABSENT)
    pq.write_table(pa.table(data), path, compression=_CODEC)


def _write_lanes(d: DecodedTrace, lanes: np.ndarray, path: Path, trace: Path) -> None:
    rows: dict[str, list[Any]] = {"pid": [], "tid": [], "kind": [], "value": [], "sort_index": []}
    idx = pa.array(lanes, pa.int64())
    for i, kind, text in zip(
        lanes.tolist(), d.name.take(idx).to_pylist(), d.args.take(idx).to_pylist(), strict=True
    ):
        args = decode_member(text, trace) if text else {}
        if not isinstance(args, dict):
            continue
        value = args.get("name", args.get("labels"))
        sort_index = args.get("sort_index")
        pid, tid = int(d.pid[i]), int(d.tid[i])
        rows["pid"].append(None if pid == ABSENT else pid)
        rows["tid"].append(None if tid == ABSENT or not kind.startswith("thread") else tid)
        rows["kind"].append(kind)
        rows["value"].append(value if isinstance(value, str) else None)
        sort_index = _int_or_none(sort_index)
        rows["sort_index"].append(
            sort_index if sort_index is None or abs(sort_index) <= validate.INT64_MAX else None
        )
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
    pq.write_table(table, path, compression=_CODEC)
