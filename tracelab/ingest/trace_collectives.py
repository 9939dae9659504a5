"""The collectives one rank's trace shows, read where the rank is converted.

NCCL/RCCL kernels (with their `record_param_comms` metadata, their launch, and the `nccl:<op>`
host annotation around that launch) and gloo annotations become rows of the store's
`collectives` table. This runs on one trace's events while they are in memory, in the process
that converts the trace (tracelab.ingest.convert: a pool worker, a Ray task, or the collector on
the training rank): Arrow picks the few thousand events involved, and only their args are
parsed. The result travels as the trace's small `collectives.parquet`, the args' fields as
text; the ingest's load types them in one statement over every rank's file, and keeps each
named group's member list on the group's first call of the run
(tracelab.ingest.load.load_trace_collectives).

This used to be SQL in the ingest's process over the `events` view of the whole run, which
read every rank's events files five times over: 0.29 s of the 8-rank set's 3.3 s, and 4.5 s of
a 2,000-rank ingest whose ranks hold 39 events each (opening 2,000 files a scan).
"""

from __future__ import annotations

import bisect
import json
import math
from collections import defaultdict
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from tracelab.vocabulary import collective_op

#: Kernel/record_param_comms args read for each collective (the store's columns are typed
#: from them at load: tracelab.ingest.load.load_trace_collectives); `Process Group Ranks` is
#: read for the calls that keep it only (_first_members).
COLLECTIVE_ARGS = (
    "Collective name",
    "Process Group Name",
    "Process Group Description",
    "Group size",
    "Seq",
    "seq",
    "In msg nelems",
    "Out msg nelems",
    "dtype",
    "Comms Id",
    "Src Rank",
    "Dst Rank",
)

#: The rows a trace yields, as collectives.parquet holds them: per NCCL/RCCL kernel (source
#: 'kernel': one row per record_param_comms and launch it joins, as the SQL joins did) and per
#: gloo annotation ('host'), the raw text the store's columns are typed from at load (load.py):
#: `fields`, the COLLECTIVE_ARGS of the kernel's args, each else its record_param_comms'; the
#: `nccl:`/`rccl:` host annotation around the kernel's launch; a gloo op's first input's dims
#: (JSON) and type; `pg_ranks`, of each named group's first call in the trace and of every call
#: that names no group. event_idx is the event's `idx` in its file (the load adds the file's
#: offset); enqueue_ns is the kernel's launch.
SCHEMA = pa.schema(
    [
        ("source", pa.string()),
        ("name", pa.string()),
        ("host_op", pa.string()),
        ("fields", pa.list_(pa.string())),
        ("pg_ranks", pa.string()),
        ("input_dims", pa.string()),
        ("input_type", pa.string()),
        ("enqueue_ns", pa.int64()),
        ("start_ns", pa.int64()),
        ("end_ns", pa.int64()),
        ("step", pa.int32()),
        ("event_idx", pa.int64()),
    ]
)

_MEMBERS = "Process Group Ranks"
_PG_NAME = COLLECTIVE_ARGS.index("Process Group Name")


def _object(text: str | None) -> dict[str, Any]:
    """An args JSON object ({} when it is none, or not an object)."""
    if not text:
        return {}
    try:
        try:
            value = msgspec.json.decode(text)
        except msgspec.ValidationError:  # a number beyond 64 bits, which json reads
            value = json.loads(text)
    except (msgspec.DecodeError, ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str | None:
    """A JSON value as DuckDB's json_extract_string gives it: strings as they are, JSON null as
    NULL, anything else as its JSON text."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, separators=(",", ":"))


def _fields(args: dict[str, Any]) -> list[str | None]:
    return [_text(args.get(key)) for key in COLLECTIVE_ARGS]


def _mask(table: pa.Table, condition: pa.ChunkedArray | pa.Array) -> pa.Table:
    return table.filter(pc.fill_null(condition, False))


class _HostOps:
    """The `nccl:`/`rccl:` host annotations of each thread, for the one around a launch: of those
    whose span holds the launch's time, the latest to start."""

    def __init__(self, ann: pa.Table) -> None:
        by_tid: dict[Any, list[tuple[int, int, str]]] = defaultdict(list)
        for tid, ts, dur, name in zip(
            *(ann.column(c).to_pylist() for c in ("tid", "ts_ns", "dur_ns", "name")), strict=True
        ):
            by_tid[tid].append((ts, ts + dur, name))
        self._starts = {}
        self._spans = {}
        for tid, spans in by_tid.items():
            spans.sort(key=lambda s: s[0])
            self._spans[tid] = spans
            self._starts[tid] = [s[0] for s in spans]

    def around(self, tid: Any, at: int | None) -> str | None:
        if at is None or tid is None or tid not in self._spans:
            return None
        spans = self._spans[tid]
        for i in range(bisect.bisect_right(self._starts[tid], at) - 1, -1, -1):
            if spans[i][1] >= at:
                return spans[i][2]
        return None


def trace_collectives(events: pa.Table) -> pa.Table:
    """The collectives rows (SCHEMA) of one trace's events, as convert writes them
    (tracelab.ingest.converted.EVENTS_SCHEMA)."""
    category, name = events.column("category"), events.column("name")
    device = events.column("on_device")
    host = pc.invert(device)
    comm = pc.equal(category, "communication")
    kernels = _mask(events, pc.and_(device, comm))
    k_ext = kernels.column("external_id").combine_chunks()
    k_corr = kernels.column("correlation").combine_chunks()
    records = _mask(
        events,
        pc.and_(
            pc.and_(host, pc.equal(name, "record_param_comms")),
            pc.is_in(events.column("external_id"), value_set=k_ext.drop_null()),
        ),
    )
    launches = _mask(
        events,
        pc.and_(
            pc.equal(category, "runtime"),
            pc.is_in(events.column("correlation"), value_set=k_corr.drop_null()),
        ),
    )
    ops = _HostOps(
        _mask(
            events,
            pc.and_(host, pc.or_(pc.starts_with(name, "nccl:"), pc.starts_with(name, "rccl:"))),
        )
    )
    gloo = _mask(events, pc.and_(pc.and_(host, comm), pc.starts_with(name, "gloo:")))

    by_ext: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for ext, text in zip(
        records.column("external_id").to_pylist(), records.column("args").to_pylist(), strict=True
    ):
        by_ext[ext].append(_object(text))
    by_corr: dict[int, list[tuple[int | None, Any]]] = defaultdict(list)
    for corr, ts, tid in zip(
        *(launches.column(c).to_pylist() for c in ("correlation", "ts_ns", "tid")), strict=True
    ):
        by_corr[corr].append((ts, tid))

    rows: dict[str, list[Any]] = {f.name: [] for f in SCHEMA}
    # Per kernel row, the args it came from: its kernel's, and that kernel's records.
    sources: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    for kname, ts, dur, step, idx, ext, corr, text in zip(
        *(
            kernels.column(c).to_pylist()
            for c in (
                "name",
                "ts_ns",
                "dur_ns",
                "step",
                "idx",
                "external_id",
                "correlation",
                "args",
            )
        ),
        strict=True,
    ):
        ka = _object(text)
        recs = by_ext.get(ext, []) if ext is not None else []
        source = (ka, recs)
        own = _fields(ka)
        joined = [
            [k if k is not None else r for k, r in zip(own, _fields(ra), strict=True)]
            for ra in recs
        ] or [own]
        launches_of = (by_corr.get(corr) if corr is not None else None) or [(None, None)]
        for fields in joined:
            for launch_ts, tid in launches_of:
                rows["source"].append("kernel")
                rows["name"].append(kname)
                rows["host_op"].append(ops.around(tid, launch_ts))
                rows["fields"].append(fields)
                rows["enqueue_ns"].append(launch_ts)
                rows["start_ns"].append(ts)
                rows["end_ns"].append(ts + dur)
                rows["step"].append(step)
                rows["event_idx"].append(idx)
                sources.append(source)
    rows["pg_ranks"] = _first_members(rows, sources)
    n_kernel = len(rows["source"])
    rows["input_dims"] = [None] * n_kernel
    rows["input_type"] = [None] * n_kernel
    for gname, ts, dur, step, idx, text in zip(
        *(gloo.column(c).to_pylist() for c in ("name", "ts_ns", "dur_ns", "step", "idx", "args")),
        strict=True,
    ):
        args = _object(text)
        dims, types = args.get("Input Dims"), args.get("Input type")
        rows["source"].append("host")
        rows["name"].append(gname)
        rows["host_op"].append(None)
        rows["fields"].append(None)
        rows["pg_ranks"].append(None)
        rows["input_dims"].append(_input_dims(gname, dims))
        rows["input_type"].append(_text(types[0]) if isinstance(types, list) and types else None)
        rows["enqueue_ns"].append(None)
        rows["start_ns"].append(ts)
        rows["end_ns"].append(ts + dur)
        rows["step"].append(step)
        rows["event_idx"].append(idx)
    return pa.table(rows, schema=SCHEMA)


def _input_dims(name: str, dims: Any) -> str | None:
    """The input buffer's dims (JSON) of a gloo annotation: its first tensor's; for the list
    form of an all-to-all (`dist.all_to_all`: one input tensor per peer, all of them sent) the
    tensors' total elements as one dimension. Only the first tensor was read, and a call of 4
    tensors of 64 x 64 floats sent 16 KiB instead of 64."""
    if not isinstance(dims, list) or not dims or dims[0] is None:
        return None
    shapes = [d for d in dims if isinstance(d, list)]
    if len(dims) > 1 and collective_op(name) == "all_to_all" and len(shapes) == len(dims):
        try:
            return json.dumps([sum(math.prod(int(x) for x in d) for d in shapes)])
        except (TypeError, ValueError):
            return None
    return json.dumps(dims[0])


def _first_members(
    rows: dict[str, list[Any]], sources: list[tuple[dict[str, Any], list[dict[str, Any]]]]
) -> list[str | None]:
    """Per kernel row, `Process Group Ranks` (the kernel's, else its first record_param_comms'
    that has one) where the row is its group's first call in the trace (earliest start, then
    event) or names no group; else None. Every call of a group has the same ranks, and a
    10,000-rank group's list on every call would grow as ranks x calls x group size (3.6 GB of
    JSON at 10,000 ranks x 6 calls). Only these lists are turned into text."""
    first: dict[str, tuple[int, int]] = {}
    for fields, start, idx in zip(rows["fields"], rows["start_ns"], rows["event_idx"], strict=True):
        group = fields[_PG_NAME]
        if group is not None and (group not in first or (start, idx) < first[group]):
            first[group] = (start, idx)
    members: dict[int, str | None] = {}
    out: list[str | None] = []
    for fields, start, idx, (ka, recs) in zip(
        rows["fields"], rows["start_ns"], rows["event_idx"], sources, strict=True
    ):
        group = fields[_PG_NAME]
        if group is not None and first[group] != (start, idx):
            out.append(None)
            continue
        if idx not in members:
            value = ka.get(_MEMBERS)
            if value is None:
                value = next((r[_MEMBERS] for r in recs if r.get(_MEMBERS) is not None), None)
            members[idx] = _text(value)
        out.append(members[idx])
    return out
