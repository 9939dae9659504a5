"""A converted trace: the folder of Parquet files and metadata that convert_trace writes
(tracelab.ingest.convert), its schemas, and reading one back.

The folder sits beside its trace (`window-0.pt.trace.json.gz` -> `window-0.pt.trace.tracelab/`)
when the collector converted it on its rank; the ingest registers such a folder only when it is
complete, of this CONVERTED_FORMAT, valid, and made from the trace's exact bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracelab.errors import InputError
from tracelab.ingest import trace_collectives, validate

#: Version of the converted form (the Parquet files' columns and what they hold). A folder of
#: another version, e.g. left by an older collector, is converted again rather than registered.
#: 4: collectives.input_dims of gloo's list-form all-to-all counts every input tensor.
CONVERTED_FORMAT = 4


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
    #: CONVERTED_FORMAT of the Parquet files this describes (1: before it was recorded).
    format: int = 1

    def to_json(self) -> str:
        # Not dataclasses.asdict: it deep-copies the free-form metadata recursively, two
        # Python frames a level, so a trace nested 512 levels deep ran out of stack.
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self)})

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
#: The Parquet files of a converted trace, by kind (`events` -> events.parquet).
PARQUET_KINDS = ("events", "steps", "memory", "lanes", "collectives")


def _sha256(fh: Any) -> str:
    """SHA-256 of an open binary file (hashlib.file_digest is Python 3.11+)."""
    h = hashlib.sha256()
    for block in iter(lambda: fh.read(1 << 20), b""):
        h.update(block)
    return h.hexdigest()


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
    files = [folder / f"{kind}.parquet" for kind in PARQUET_KINDS]
    if not meta.is_file() or not all(f.is_file() for f in files):
        return None
    try:
        info = TraceInfo.from_json(meta.read_text())
    except (OSError, ValueError, TypeError):
        return None
    if info.format != CONVERTED_FORMAT or info.file_bytes != path.stat().st_size:
        return None
    if not _valid_converted(folder, info):
        return None
    with path.open("rb") as fh:
        if _sha256(fh) != info.sha256:
            return None
    return info


#: What each Parquet file of a converted trace holds (events: EVENTS_SCHEMA).
STEPS_SCHEMA = pa.schema(
    [
        ("step", pa.int32()),
        ("start_ns", pa.int64()),
        ("end_ns", pa.int64()),
        ("device_end_ns", pa.int64()),
    ]
)
MEMORY_SCHEMA = pa.schema(
    [("ts_ns", pa.int64()), ("step", pa.int32()), ("args", pa.string())]
    + [
        (c, pa.int64())
        for c, _ in (
            ("device_type", 0),
            ("device_id", 0),
            ("bytes", 0),
            ("total_allocated", 0),
            ("total_reserved", 0),
        )
    ]
)
LANES_SCHEMA = pa.schema(
    [
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("kind", pa.string()),
        ("value", pa.string()),
        ("sort_index", pa.int64()),
    ]
)


def _valid_converted(folder: Path, info: TraceInfo) -> bool:
    """Whether a converted folder is what convert_trace writes: its metadata typed and in
    range (tracelab.ingest.validate), each Parquet file readable with the expected columns, as many
    events as the metadata says, and every time within the limits. A folder that is not (stale,
    damaged or forged) is ignored and the trace converted again."""
    lim = validate.TIME_LIMIT_NS
    try:
        validate.rank_and_world(info.rank, info.world_size, "trace.json", folder)
        for value in (info.file_bytes, info.event_count, info.memory_event_count):
            validate.integer(value, "a count", folder, lo=0, hi=validate.INT64_MAX, optional=False)
        validate.integer(info.base_time_ns, "base_time_ns", folder, lo=-lim, hi=lim, optional=False)
        if not isinstance(info.sha256, str) or not isinstance(info.metadata, dict):
            return False
        expected = {
            "events": EVENTS_SCHEMA,
            "steps": STEPS_SCHEMA,
            "memory": MEMORY_SCHEMA,
            "lanes": LANES_SCHEMA,
            "collectives": trace_collectives.SCHEMA,
        }
        for kind, schema in expected.items():
            if not pq.read_schema(folder / f"{kind}.parquet").equals(schema, check_metadata=False):
                return False
        events = pq.read_table(folder / "events.parquet", columns=["ts_ns", "dur_ns", "step"])
        if events.num_rows != info.event_count or not events.num_rows:
            return False
        ts, dur = events.column("ts_ns"), events.column("dur_ns")
        if ts.null_count or dur.null_count or pc.min(dur).as_py() < 0:
            return False
        end = pc.add_checked(ts, dur)
        if pc.min(ts).as_py() < -lim or pc.max(end).as_py() > lim:
            return False
        step = pc.min(events.column("step")).as_py()
        return step is None or step >= 0
    except (InputError, OSError, pa.ArrowException, TypeError, ValueError):
        return False
