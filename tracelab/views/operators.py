"""Operators and kernels: the top host operators and device kernels by time, per rank or over
ranks, in the chosen steps (default: the steady steps), as the TensorBoard plugin's Operator
and Kernel views show them.

An operator has two times (docs/metrics.md, "Operators"): its **total** (inclusive) time, the
events' own durations, which include the operators it calls; and its **self** time, its duration
minus its direct children's on the same thread (operators, communication ops and runtime calls
nested in it), so that a backward function and the autograd wrapper around it do not both count
the same time. Operators are ranked by self time; `by_shape` splits each name by its input shapes
(`Input Dims`), as the plugin's "group by input shape". "Share of step" divides by the summed
step time of the same (rank, step) pairs (step_spans). A kernel's launching operator is the
operator whose External id it carries, else the innermost operator around its runtime launch
(matched by correlation id and an as-of join on the launching thread). At most `limit` rows
each, whatever the trace size.

Of a run of more than MANY_RANKS ranks the page opens on the ranks the Overview draws (a
typical rank and those that stand out, each with why: opening_ranks): over every rank it reads
every rank's events, 7.1 s in process for 10,000 ranks of 51 events, against 0.08 s for five
ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracelab.derived.sqlfiles import registered
from tracelab.views._sql import EVENTS, SCOPED_RANKS, arrow, query
from tracelab.views.analysis import Analysis
from tracelab.views.overview import time_split

#: Most rows per table.
TOP_ROWS = 50
DEVICE_CATEGORIES = ("compute", "communication", "memcpy", "memset")
#: Of more ranks than this (the most a query reads from the ranks' own files), the page opens
#: on opening_ranks(), not on every rank.
MANY_RANKS = SCOPED_RANKS

_SEL = """
sel AS (
    SELECT rank, step, dur_ns FROM step_spans
    WHERE run_id = $run AND (len($ranks) = 0 OR list_contains($ranks, rank))
      AND CASE WHEN len($steps) = 0 THEN steady ELSE list_contains($steps, step) END
)"""

SELECTION_SQL = f"""
WITH {_SEL}
SELECT count(DISTINCT rank), count(DISTINCT step), coalesce(sum(dur_ns), 0),
       list(DISTINCT step ORDER BY step) FROM sel
"""

#: Host events whose nesting makes up the operator tree (the plugin's: operators and the
#: runtime calls they make); a direct child's time is not its parent's self time.
TREE_CATEGORIES = ("cpu_op", "communication", "runtime", "sync")

#: The selection's host events of the operator tree (TREE_CATEGORIES), with their input
#: shapes when $by_shape: what self_times() nests.
TREE_SQL = f"""
WITH {_SEL}
SELECT e.rank, e.pid, e.tid, e.idx, e.name, e.category, e.ts_ns, e.dur_ns,
       CASE WHEN $by_shape
            THEN coalesce(json_extract_string(e.args, '$."Input Dims"'), '') END AS shape
FROM {EVENTS} e JOIN sel USING (rank, step)
WHERE e.run_id = $run AND NOT e.on_device AND list_contains($tree_cats, e.category)
"""

#: The top operators of the tree events (TREE_SQL's rows with their self times, registered
#: as _tl_tree).
OPS_SQL = """
SELECT name, shape, count(*) AS n, sum(dur_ns) AS total_ns, sum(self_ns) AS self_ns,
       count(DISTINCT rank) AS ranks
FROM _tl_tree WHERE category = 'cpu_op'
GROUP BY name, shape ORDER BY self_ns DESC, total_ns DESC, name, shape LIMIT $limit
"""


def self_times(tree: pa.Table) -> np.ndarray:
    """Each event's self time: its duration minus its direct children's (at least 0), of
    events with rank, pid, tid, idx, ts_ns and dur_ns (docs/metrics.md, "Operators").

    By nesting depth, with sorts and prefix sums only: a running count of open events over
    each thread's starts and ends (an end before a start at the same time; a parent starts
    before and ends after a child with the same times; then the trace's order) gives each
    event its depth and the positions of its start and end; its direct children are the
    events one level deeper that start between the two, so their summed time is the
    difference of that level's prefix sums of durations at its end and at its start.
    Zero-length events have no children, and events without a pid or tid (a trace's
    non-numeric tid: its text is the lane's label) neither have nor are children: their self
    time is their duration. (The same in SQL window functions took 1.6-2.4 s over the 8-rank
    set's 646,856 host events.)"""
    ts = tree.column("ts_ns").to_numpy()
    dur = tree.column("dur_ns").to_numpy()
    out = dur.copy()
    known = pc.and_(pc.is_valid(tree.column("pid")), pc.is_valid(tree.column("tid")))
    live = np.flatnonzero((dur > 0) & known.to_numpy(zero_copy_only=False))
    m = len(live)
    if not m:
        return out
    idx = tree.column("idx").to_numpy()[live]
    thread = [
        np.tile(tree.column(c).cast(pa.int64()).to_numpy()[live], 2) for c in ("rank", "pid", "tid")
    ]
    start, end, d = ts[live], ts[live] + dur[live], dur[live]
    order = np.lexsort(
        (
            np.concatenate([idx, -idx]),
            np.concatenate([-end, -start]),
            np.concatenate([np.ones(m, np.int8), np.zeros(m, np.int8)]),
            np.concatenate([start, end]),
            *reversed(thread),
        )
    )
    # Each thread's starts and ends cancel out, so one running sum over the threads (each
    # contiguous in `order`) is each thread's own.
    open_after = np.cumsum(np.where(order < m, 1, -1))
    pos = np.empty(2 * m, np.int64)
    pos[order] = np.arange(2 * m)
    start_pos, end_pos = pos[:m], pos[m:]
    depth = open_after[start_pos]
    # A level's starts in position order; positions do not interleave across threads.
    key = depth * (2 * m) + start_pos
    by_key = np.argsort(key, kind="stable")
    keys = key[by_key]
    below = (depth + 1) * (2 * m)
    hi = np.searchsorted(keys, below + end_pos)
    lo = np.searchsorted(keys, below + start_pos)
    prefix = np.concatenate([[0], np.cumsum(d[by_key])])
    child = prefix[hi] - prefix[lo]  # exact unless the children sum past 2^63 (wraps)
    # Only children of durations near the ingest's limit (MAX_DUR_NS each) can sum past 2^63;
    # a sum of floats tells those apart, and their parent's self time is 0, as no duration
    # passes MAX_DUR_NS (the margin covers the floats' rounding, and sums just past
    # MAX_DUR_NS give 0 either way).
    rough = np.concatenate([[0.0], np.cumsum(d[by_key].astype(np.float64))])
    huge = rough[hi] - rough[lo] >= float(MAX_DUR_NS) + 2.0**40
    out[live] = np.where(huge, 0, np.maximum(d - child, 0))
    return out


#: The longest duration the ingest accepts (tracelab.ingest.validate.TIME_LIMIT_NS).
MAX_DUR_NS = 2**62


#: The selection's ranks' events a kernel row needs, read once: the kernels of the selected
#: steps, and the operators and runtime launches of any step (a kernel's launch may precede
#: its step). Three scans of the events, one per relation, took 10.3 s at 10,000 ranks (each
#: binds the store's whole file list), one 4.1 s.
KERNELS_SQL = f"""
WITH {_SEL},
ev AS MATERIALIZED (
    SELECT e.rank, e.pid, e.tid, e.ts_ns, e.dur_ns, e.name, e.category, e.on_device, e.step,
           e.correlation, e.external_id
    FROM {EVENTS} e
    WHERE e.run_id = $run AND list_contains((SELECT list(DISTINCT rank) FROM sel), e.rank)
      AND ((e.on_device AND list_contains($dev_cats, e.category)) OR e.category = 'cpu_op'
           OR (e.category = 'runtime' AND e.correlation IS NOT NULL))
),
k AS (
    SELECT e.rank, e.name, e.category, e.dur_ns, e.correlation, e.external_id
    FROM ev e JOIN sel USING (rank, step)
    WHERE e.on_device AND list_contains($dev_cats, e.category)
),
ops AS (
    SELECT rank, pid, tid, ts_ns, ts_ns + dur_ns AS end_ns, name, external_id FROM ev
    WHERE category = 'cpu_op'
),
by_ext AS (SELECT rank, external_id, any_value(name) AS op FROM ops
           WHERE external_id IS NOT NULL GROUP BY ALL),
launch AS (
    SELECT rank, pid, tid, ts_ns, correlation FROM ev
    WHERE category = 'runtime' AND correlation IS NOT NULL
),
launched AS (
    SELECT l.rank, l.correlation, CASE WHEN o.end_ns >= l.ts_ns THEN o.name END AS op
    FROM launch l ASOF LEFT JOIN ops o
      ON l.rank = o.rank AND l.pid = o.pid AND l.tid = o.tid AND l.ts_ns >= o.ts_ns
)
SELECT k.name, k.category, coalesce(x.op, l.op, '(unknown)') AS op, count(*) AS n,
       sum(k.dur_ns) AS total_ns, count(DISTINCT k.rank) AS ranks
FROM k
LEFT JOIN by_ext x ON x.rank = k.rank AND x.external_id = k.external_id
LEFT JOIN launched l ON l.rank = k.rank AND l.correlation = k.correlation
GROUP BY ALL ORDER BY total_ns DESC, k.name LIMIT $limit
"""


STEPS_SQL = "SELECT DISTINCT step FROM step_spans WHERE run_id = $run ORDER BY step"


def opening_ranks(analysis: Analysis, n_ranks: int) -> list[tuple[int, str]]:
    """The ranks the page opens on, with why each, where the run has more than MANY_RANKS: the
    ranks the Overview's "where the time goes" draws (tracelab.views.overview.time_split: a
    typical rank, then those the findings single out and the outliers), so that one rank set
    is shown on both; empty (every rank) for fewer ranks, or a run without a step budget."""
    if n_ranks <= MANY_RANKS:
        return []
    split = time_split(analysis)
    if split is None or not split.reasons:
        return []
    return list(zip(split.ranks, split.reasons, strict=True))


def run_steps(con: duckdb.DuckDBPyConnection, run_id: int) -> list[int]:
    """The run's profiler steps, in order (the page's step picker)."""
    return [int(r[0]) for r in query(con, STEPS_SQL, {"run": run_id})]


@dataclass(frozen=True, kw_only=True)
class OperatorsView:
    """The top operators (by self time) and kernels (by time) of the selection, raw ns. An
    operator row has `total_ns` (inclusive) and `self_ns`, and `shape` (its input shapes) when
    `by_shape`. `step_ns` is the summed step time of the selected (rank, step) pairs: a row's
    time over it is its share of the step (`share`: total, `self_share`: self)."""

    ranks: int
    steps: list[int]
    step_ns: int
    by_shape: bool = False
    operators: list[dict[str, Any]] = field(default_factory=list)
    kernels: list[dict[str, Any]] = field(default_factory=list)

    @property
    def per_step(self) -> int:
        """(rank, step) pairs: totals divided by this are per rank and step."""
        return max(self.ranks * len(self.steps), 1)


def _top_operators(con: duckdb.DuckDBPyConnection, p: dict[str, Any]) -> list[tuple[Any, ...]]:
    """OPS_SQL's rows: the selection's tree events with their self times (self_times)."""
    tree = arrow(con, TREE_SQL, p)
    tree = tree.append_column("self_ns", pa.array(self_times(tree), pa.int64()))
    with registered(con, {"_tl_tree": tree}):
        return con.execute(OPS_SQL, {"limit": p["limit"]}).fetchall()


def operators_view(
    con: duckdb.DuckDBPyConnection,
    run_id: int,
    ranks: tuple[int, ...] = (),
    steps: tuple[int, ...] = (),
    limit: int = TOP_ROWS,
    by_shape: bool = False,
) -> OperatorsView:
    """The selection's top operators and kernels: `ranks` (default all) and `steps` (default
    the steady steps), operators split by input shape when `by_shape`."""
    p: dict[str, Any] = {
        "run": run_id,
        "ranks": list(ranks),
        "steps": list(steps),
        "limit": int(limit),
        "dev_cats": list(DEVICE_CATEGORIES),
        "tree_cats": list(TREE_CATEGORIES),
        "by_shape": bool(by_shape),
    }
    n_ranks, _n_steps, step_ns, step_list = query(con, SELECTION_SQL, p)[0]
    step_ns = int(step_ns or 0)

    def rows(raw: list[tuple[Any, ...]], keys: tuple[str, ...]) -> list[dict[str, Any]]:
        out = []
        for r in raw:
            d = dict(zip(keys, r, strict=True))
            d["total_ns"] = int(d["total_ns"] or 0)
            d["mean_ns"] = d["total_ns"] / max(int(d["n"]), 1)
            d["share"] = d["total_ns"] / step_ns if step_ns else None
            if "self_ns" in d:
                d["self_ns"] = int(d["self_ns"] or 0)
                d["self_share"] = d["self_ns"] / step_ns if step_ns else None
            out.append(d)
        return out

    return OperatorsView(
        ranks=int(n_ranks or 0),
        steps=[int(s) for s in (step_list or [])],
        step_ns=step_ns,
        by_shape=bool(by_shape),
        operators=rows(
            _top_operators(con, p), ("name", "shape", "n", "total_ns", "self_ns", "ranks")
        ),
        kernels=rows(
            query(con, KERNELS_SQL, p), ("name", "category", "op", "n", "total_ns", "ranks")
        ),
    )
