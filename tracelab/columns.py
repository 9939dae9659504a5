"""Derived per-event columns, computed once per rank with vectorized numpy/arrow.

Used by tracelab.convert: the category of each event (classifying each distinct (cat, name) pair
once), correlation/stream ids (read from args by tracelab.decode), and the
profiler step of every event (host events by time, device events through their launch's
correlation, falling back to time).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracelab.classify import DEVICE_CATS, classify
from tracelab.decode import ABSENT
from tracelab.validate import INT32_MAX

#: Kineto categories whose events carry correlation/stream ids worth extracting.
ID_CATS = tuple(DEVICE_CATS) + ("cuda_runtime", "cuda_driver", "cpu_op")
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
#: Largest step number (the store's `step` columns are int32).
STEP_MAX = INT32_MAX


def lane_columns(
    pid: np.ndarray, tid: np.ndarray, odd_value: Callable[[int, str], Any]
) -> tuple[pa.Array, pa.Array, pa.Array]:
    """pid and tid as int64 (NULL where the trace did not write an integer, e.g. 'Spans'), and a
    'pid/tid' label for exactly those events; `odd_value(i, "pid"|"tid")` gives the value the
    trace wrote where it is not an integer."""
    odd = np.flatnonzero((pid == ABSENT) | (tid == ABSENT))
    labels: list[str | None] = [None] * len(pid)
    for i in odd.tolist():
        p = odd_value(i, "pid") if pid[i] == ABSENT else int(pid[i])
        t = odd_value(i, "tid") if tid[i] == ABSENT else int(tid[i])
        labels[i] = f"{p}/{t}"
    return (
        pa.array(pid, mask=pid == ABSENT),
        pa.array(tid, mask=tid == ABSENT),
        pa.array(labels, pa.string()) if len(odd) else pa.nulls(len(pid), pa.string()),
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
        device.append(cat in DEVICE_CATS)
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
    decoder read (tracelab.decode.ID_KEYS), for the categories that carry them."""
    want = pc.is_in(cats.fill_null(""), value_set=pa.array(ID_CATS)).to_numpy(zero_copy_only=False)

    def pick(key: str) -> np.ndarray:
        v = ids[key]
        return np.where(want & (v != ABSENT), v, -1)

    correlation, external, stream = pick("correlation"), pick("External id"), pick("stream")
    dev = on_device.to_numpy(zero_copy_only=False)
    tid_np = tids.fill_null(-1).to_numpy(zero_copy_only=False)
    stream = np.where(dev & (stream < 0), tid_np, stream)
    stream = np.where(dev, stream, -1)

    def col(a: np.ndarray) -> pa.Array:
        return pa.array(a, mask=a < 0)

    return col(stream), col(correlation), col(external)


def step_spans(names: pa.Array, ts_ns: np.ndarray, dur_ns: np.ndarray, on_device: np.ndarray) -> pa.Table:
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
