"""What the host was doing while a rank waited on it: the named host spans under its 'host' time.

Shared by the analyzers that explain host-bound time (breakdown's HOST_BOUND, stragglers' kind
of a straggler): per name of a host span on the rank's step thread (a user annotation such as
`injected_delay`, a DataLoader's `enumerate(DataLoader)#...`, an operator, a runtime call, a
Python function), how much of the 'host' time it overlaps. Nested spans each count their own
overlap, so the figures say where host time went, not shares that add up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracelab.analyzers._common import RunContext
from tracelab.derived.batches import rank_batches
from tracelab.derived.intervals import int64s
from tracelab.derived.sqlrows import first
from tracelab.store.files import rank_events_sql

#: The host segments of the steady steps, of the ranks $lo..$hi, ordered by rank and start.
_SEGMENTS_SQL = """
SELECT rank, start_ns, end_ns - start_ns AS len FROM time_parts
WHERE run_id = $run AND part = 'host' AND rank BETWEEN $lo AND $hi
  AND step IN (SELECT step FROM step_spans WHERE run_id = $run AND ordinal >= $min_ordinal)
ORDER BY rank, start_ns
"""

#: The named host spans of the ranks $lo..$hi, on the reference clock: of the step thread
#: (the one that holds ProfilerStep#), where the ranks have one. {events}: `events`, or the
#: named ranks' own files (tracelab.store.files.rank_events_sql).
_SPANS_SQL = """
WITH main AS (SELECT DISTINCT rank, tid FROM {events}
              WHERE run_id = $run AND rank BETWEEN $lo AND $hi AND NOT on_device
                AND name LIKE 'ProfilerStep#%')
SELECT e.rank, e.name, e.ts_ns - o.offset_ns AS t0, e.ts_ns + e.dur_ns - o.offset_ns AS t1
FROM {events} e JOIN clock_offsets o ON o.run_id = e.run_id AND o.rank = e.rank
WHERE e.run_id = $run AND e.rank BETWEEN $lo AND $hi AND NOT e.on_device
  AND e.name NOT LIKE 'ProfilerStep#%'
  AND e.category IN ('annotation', 'cpu_op', 'runtime', 'python', 'sync', 'other')
  AND (NOT EXISTS (SELECT 1 FROM main) OR (e.rank, e.tid) IN (SELECT (rank, tid) FROM main))
"""


def _host_before(seg: pa.Table, rank: np.ndarray, t: np.ndarray) -> np.ndarray:
    """H(rank, t): the rank's host time before t. The host segments as a cumulative function:
    a span's overlap with them is H(t1) - H(t0), one sort for all spans, where an interval
    join would pair every span with every segment of its rank. `seg` is ordered by rank and
    start; segments do not overlap."""
    sr, ss, sl = int64s(seg, "rank"), int64s(seg, "start_ns"), int64s(seg, "len")
    n = len(sr)
    out = np.zeros(len(rank), dtype=np.int64)
    if not n or not len(rank):
        return out
    # Host time before each segment on its own rank: the running sum, restarted at each rank.
    run = np.cumsum(sl) - sl
    first = np.ones(n, dtype=bool)
    first[1:] = sr[1:] != sr[:-1]
    before = run - np.maximum.accumulate(np.where(first, run, 0))
    # Each query takes the last segment of its rank that starts at or before it: one sort of
    # segments and queries together by (rank, time), a segment before a query at equal time.
    keys = np.concatenate([sr, rank])
    times = np.concatenate([ss, t])
    is_q = np.concatenate([np.zeros(n, bool), np.ones(len(rank), bool)])
    order = np.lexsort((is_q, times, keys))
    cand = np.maximum.accumulate(np.where(is_q[order], -1, order))[is_q[order]]
    q = order[is_q[order]] - n
    ok = cand >= 0
    q, g = q[ok], cand[ok]
    ok = sr[g] == rank[q]
    q, g = q[ok], g[ok]
    out[q] = before[g] + np.minimum(t[q] - ss[g], sl[g])
    return out


def host_total(
    con: duckdb.DuckDBPyConnection, ctx: RunContext, ranks: Sequence[int] | None = None
) -> int:
    """Host time over the steady steps (of `ranks`, or every rank), ns."""
    row = first(
        con.execute(
            """SELECT coalesce(sum(host_ns), 0) FROM step_parts
           WHERE run_id = $run AND ordinal >= $min_ordinal
             AND (len($ranks) = 0 OR list_contains($ranks, rank))""",
            {**ctx.params, "ranks": [int(r) for r in ranks or []]},
        )
    )
    return int(row[0]) if row else 0


def host_activity(
    con: duckdb.DuckDBPyConnection,
    ctx: RunContext,
    ranks: Sequence[int] | None = None,
    top: int = 5,
) -> list[dict[str, Any]]:
    """The `top` named host spans by their overlap with the steady steps' host time (of
    `ranks`, or every rank, a batch of ranks at a time): rows {name, ns} (total ns over those
    steps and ranks), largest first. This reads the ranks' events: a caller that explains a
    whole job names a bounded sample of ranks (breakdown's HOST_BOUND: the ranks with the most
    host time), or the reads grow with the run (10,000 ranks: 9.3 s of a 16.9 s analysis)."""
    events = "events"
    if ranks:
        batches = [(r, r) for r in ranks]
        events = rank_events_sql(con, ctx.run_id, ranks)
    else:
        batches = rank_batches(con, ctx.run_id)
    spans_sql = _SPANS_SQL.format(events=events)
    total: dict[str, int] = {}
    for lo, hi in batches:  # a batch of ranks at a time: the spans grow with events
        params = {"run": ctx.run_id, "lo": lo, "hi": hi}
        seg = con.sql(
            _SEGMENTS_SQL, params={**params, "min_ordinal": ctx.min_ordinal}
        ).to_arrow_table()
        if not len(seg):
            continue
        spans = con.sql(spans_sql, params=params).to_arrow_table()
        if not len(spans):
            continue
        r = int64s(spans, "rank")
        ns = _host_before(seg, r, int64s(spans, "t1")) - _host_before(seg, r, int64s(spans, "t0"))
        names = pc.dictionary_encode(spans.column("name")).combine_chunks()
        keep = ns > 0
        sums = np.zeros(len(names.dictionary), dtype=np.int64)
        np.add.at(sums, names.indices.to_numpy(zero_copy_only=False)[keep], ns[keep])
        for name, v in zip(names.dictionary.to_pylist(), sums.tolist(), strict=True):
            if v > 0:
                total[name] = total.get(name, 0) + v
    ranked = sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return [{"name": name, "ns": ns} for name, ns in ranked]
