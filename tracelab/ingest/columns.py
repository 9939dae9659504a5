"""Derived per-event columns, computed once per rank with vectorized numpy/arrow.

Used by tracelab.ingest.convert: the category of each event (classifying each distinct (cat, name) pair
once), correlation/stream ids (read from args by tracelab.ingest.decode), and the
profiler step of every event (host events by time, device events through their launch's
correlation, falling back to time).

Trace-compatibility rules applied here, as the peers read the same traces:

- categories are compared through tracelab.ingest.classify.canonical_cat (any case, PyTorch 1.8 names);
- a pid/tid written as a string of digits (`"tid": "23800"`, PyTorch 1.8 and the TensorBoard
  plugin's fixtures) is that integer, and a GPU lane written `"stream 7"` is stream 7, so
  threads and streams stay apart; any other string stays NULL with its text in lane_label;
- `external id` (lower case, PyTorch 1.8 device events) is read where `External id` is absent;
- Kineto moves "Stream Sync" events (cuda_sync) to tid = stream + 1,000,000 (libkineto
  output_json.h kSyncStreamTidOffset); without an args.stream they are mapped back to the stream.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracelab.ingest.classify import DEVICE_CATS, RUNTIME_CATS, canonical_cat, classify
from tracelab.ingest.classify import on_device as runs_on_device
from tracelab.ingest.decode import ABSENT
from tracelab.ingest.validate import INT32_MAX

#: Kineto categories (canonical names) whose events carry correlation/stream ids worth extracting.
ID_CATS = tuple(DEVICE_CATS) + RUNTIME_CATS + ("cpu_op",)
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
#: A pid/tid written as text that still names an integer: digits, or a GPU lane "stream N".
_INT_TEXT = {
    "pid": re.compile(r"^\s*(-?\d+)\s*$"),
    "tid": re.compile(r"^\s*(?:stream\s+)?(-?\d+)\s*$", re.IGNORECASE),
}
#: Kineto's tid offset of the row it moves "Stream Sync" events to (libkineto output_json.h).
SYNC_STREAM_TID_OFFSET = 1_000_000


def _int_text(value: Any, field: str) -> int | None:
    """The integer a pid/tid written as text names ("23800", "stream 7"), else None."""
    if not isinstance(value, str):
        return None
    m = _INT_TEXT[field].match(value)
    if m is None:
        return None
    v = int(m.group(1))
    return v if -(2**63) < v < 2**63 else None


#: Largest step number (the store's `step` columns are int32).
STEP_MAX = INT32_MAX


def lane_columns(
    pid: np.ndarray, tid: np.ndarray, odd_value: Callable[[int, str], Any]
) -> tuple[pa.Array, pa.Array, pa.Array]:
    """pid and tid as int64 (NULL where the trace did not write an integer, e.g. 'Spans'), and a
    'pid/tid' label for exactly those events; `odd_value(i, "pid"|"tid")` gives the value the
    trace wrote where it is not an integer. Text that names an integer ("23800", "stream 7")
    is that integer (the module's docstring says why)."""
    odd = np.flatnonzero((pid == ABSENT) | (tid == ABSENT))
    labels: list[str | None] = [None] * len(pid)
    if len(odd):
        pid, tid = pid.copy(), tid.copy()
    parsed: dict[tuple[str, Any], int | None] = {}
    labelled = 0
    for i in odd.tolist():
        raw = {}
        for field, col in (("pid", pid), ("tid", tid)):
            if col[i] != ABSENT:
                raw[field] = int(col[i])
                continue
            value = odd_value(i, field)
            key = (field, value if isinstance(value, str) else repr(value))
            if key not in parsed:
                parsed[key] = _int_text(value, field)
            as_int = parsed[key]
            if as_int is not None:
                col[i] = as_int
                raw[field] = as_int
            else:
                raw[field] = value
        if pid[i] == ABSENT or tid[i] == ABSENT:
            labels[i] = f"{raw['pid']}/{raw['tid']}"
            labelled += 1
    return (
        pa.array(pid, mask=pid == ABSENT),
        pa.array(tid, mask=tid == ABSENT),
        pa.array(labels, pa.string()) if labelled else pa.nulls(len(pid), pa.string()),
    )


def classify_columns(cats: pa.Array, names: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Category and on_device per event, classifying each distinct (cat, name) pair once."""
    dc = pc.dictionary_encode(cats.fill_null(""))
    dn = pc.dictionary_encode(names)
    width = max(len(dn.dictionary), 1)
    key = dc.indices.to_numpy().astype(np.int64) * width + dn.indices.to_numpy()
    uniq, inverse = _unique_small(key, len(dc.dictionary) * width)
    cat_values = dc.dictionary.to_pylist()
    name_values = dn.dictionary.to_pylist()
    labels = []
    device = []
    for k in uniq.tolist():
        cat = cat_values[k // width]
        labels.append(classify(cat or None, name_values[k % width]).value)
        device.append(runs_on_device(cat or None))
    take = pa.array(inverse)
    return (
        pa.array(labels, pa.string()).take(take),
        pa.array(device, pa.bool_()).take(take),
    )


def _unique_small(key: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(key, return_inverse=True) for keys in [0, bound): a table lookup, O(n + bound),
    where the key space is small enough (cat x name pairs of a trace); a sort otherwise."""
    if bound > max(4 * len(key), 1 << 20):
        uniq, inverse = np.unique(key, return_inverse=True)
        return uniq, inverse.reshape(-1)
    seen = np.zeros(bound, dtype=bool)
    seen[key] = True
    uniq = np.flatnonzero(seen)
    slot = np.cumsum(seen, dtype=np.int64) - 1
    return uniq, slot[key]


def id_columns(
    ids: dict[str, np.ndarray], cats: pa.Array, on_device: pa.Array, tids: pa.Array
) -> tuple[pa.Array, pa.Array, pa.Array]:
    """stream (device events only), correlation and External id, from the integer args the
    decoder read (tracelab.ingest.decode.ID_KEYS), for the categories that carry them (any spelling of
    the category, see tracelab.ingest.classify.canonical_cat)."""
    dc = pc.dictionary_encode(cats.fill_null(""))
    canon = [canonical_cat(c) for c in dc.dictionary.to_pylist()]
    want_cat = np.array([c in ID_CATS for c in canon] + [False], dtype=bool)
    sync_cat = np.array([c == "cuda_sync" for c in canon] + [False], dtype=bool)
    codes = dc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    want = want_cat[codes]

    def pick(key: str) -> np.ndarray:
        v = ids[key]
        return np.where(want & (v != ABSENT), v, -1)

    correlation, external, stream = pick("correlation"), pick("External id"), pick("stream")
    if "external id" in ids:  # PyTorch 1.8 device events spell it in lower case
        external = np.where(external < 0, pick("external id"), external)
    dev = on_device.to_numpy(zero_copy_only=False)
    tid_np = tids.fill_null(-1).to_numpy(zero_copy_only=False)
    moved = sync_cat[codes] & (tid_np >= SYNC_STREAM_TID_OFFSET)
    lane = np.where(moved, tid_np - SYNC_STREAM_TID_OFFSET, tid_np)
    stream = np.where(dev & (stream < 0), lane, stream)
    stream = np.where(dev, stream, -1)

    def col(a: np.ndarray) -> pa.Array:
        return pa.array(a, mask=a < 0)

    return col(stream), col(correlation), col(external)


def step_spans(
    names: pa.Array, ts_ns: np.ndarray, dur_ns: np.ndarray, on_device: np.ndarray
) -> pa.Table:
    """ProfilerStep#N host annotations as (step, start_ns, end_ns), merged by N and sorted."""
    starts = pc.starts_with(names, "ProfilerStep#").to_numpy(zero_copy_only=False) & ~on_device
    rows: dict[int, list[int]] = {}
    for i in np.flatnonzero(starts).tolist():
        m = _STEP_RE.match(names[i].as_py())
        if m is None:
            continue
        n = int(m.group(1))
        lo, hi = int(ts_ns[i]), int(ts_ns[i] + dur_ns[i])
        if n in rows:
            rows[n] = [min(rows[n][0], lo), max(rows[n][1], hi)]
        else:
            rows[n] = [lo, hi]
    if rows and max(rows) > STEP_MAX:
        raise ValueError(f"ProfilerStep#{max(rows)}: step numbers are 0..{STEP_MAX}")
    order = sorted(rows, key=lambda n: rows[n][0])
    return pa.table(
        {
            "step": pa.array(order, pa.int32()),
            "start_ns": pa.array([rows[n][0] for n in order], pa.int64()),
            "end_ns": pa.array([rows[n][1] for n in order], pa.int64()),
        }
    )


def step_by_time(ts_ns: np.ndarray, steps: pa.Table) -> np.ndarray:
    """Step containing each time, -1 outside every step."""
    starts = steps.column("start_ns").to_numpy()
    ends = steps.column("end_ns").to_numpy()
    nums = steps.column("step").to_numpy().astype(np.int64)
    if len(starts) == 0:
        return np.full(len(ts_ns), -1, dtype=np.int64)
    i = np.searchsorted(starts, ts_ns, side="right") - 1
    inside = (i >= 0) & (ts_ns < ends[np.clip(i, 0, None)])
    return np.where(inside, nums[np.clip(i, 0, None)], -1)


def step_column(
    ts_ns: np.ndarray, on_device: np.ndarray, correlation: pa.Array, steps: pa.Table
) -> np.ndarray:
    """Host events: the step they start in. Device events: their launch's step, else by time."""
    by_time = step_by_time(ts_ns, steps)
    corr = correlation.fill_null(-1).to_numpy(zero_copy_only=False)
    host_with = (~on_device) & (corr >= 0) & (by_time >= 0)
    if not host_with.any():
        return by_time
    keys = corr[host_with]
    vals = by_time[host_with]
    order = np.argsort(keys, kind="stable")
    keys, vals = keys[order], vals[order]
    dev = np.flatnonzero(on_device & (corr >= 0))
    pos = np.searchsorted(keys, corr[dev])
    pos_c = np.clip(pos, 0, len(keys) - 1)
    hit = keys[pos_c] == corr[dev]
    out = by_time.copy()
    out[dev[hit]] = vals[pos_c[hit]]
    return out
