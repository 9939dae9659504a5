"""Operators and kernels: the top host operators and device kernels by time, per rank or over
ranks, in the chosen steps (default: the steady steps), as the TensorBoard plugin's Operator
and Kernel views show them.

Times are the events' own durations (an operator's total includes the operators it calls, as
the plugin's "total duration"); "share of step" divides by the summed step time of the same
(rank, step) pairs (step_spans). A kernel's launching operator is the operator whose External
id it carries, else the innermost operator around its runtime launch (matched by correlation id
and an as-of join on the launching thread). At most `limit` rows each, whatever the trace size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb

from tracelab.views._sql import query

#: Most rows per table.
TOP_ROWS = 50
DEVICE_CATEGORIES = ("compute", "communication", "memcpy", "memset")

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

OPS_SQL = f"""
WITH {_SEL}
SELECT e.name, count(*) AS n, sum(e.dur_ns) AS total_ns, count(DISTINCT e.rank) AS ranks
FROM events e JOIN sel USING (rank, step)
WHERE e.run_id = $run AND e.category = 'cpu_op'
GROUP BY e.name ORDER BY total_ns DESC, e.name LIMIT $limit
"""

KERNELS_SQL = f"""
WITH {_SEL},
k AS (
    SELECT e.rank, e.name, e.category, e.dur_ns, e.correlation, e.external_id
    FROM events e JOIN sel USING (rank, step)
    WHERE e.run_id = $run AND e.on_device AND list_contains($dev_cats, e.category)
),
ops AS (
    SELECT rank, pid, tid, ts_ns, ts_ns + dur_ns AS end_ns, name, external_id FROM events
    WHERE run_id = $run AND category = 'cpu_op' AND list_contains((SELECT list(DISTINCT rank) FROM sel), rank)
),
by_ext AS (SELECT rank, external_id, any_value(name) AS op FROM ops
           WHERE external_id IS NOT NULL GROUP BY ALL),
launch AS (
    SELECT rank, pid, tid, ts_ns, correlation FROM events
    WHERE run_id = $run AND category = 'runtime' AND correlation IS NOT NULL
      AND list_contains((SELECT list(DISTINCT rank) FROM sel), rank)
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


@dataclass(frozen=True, kw_only=True)
class OperatorsView:
    """The top operators and kernels of the selection, raw ns. `step_ns` is the summed step
    time of the selected (rank, step) pairs: a row's total over it is its share of the step."""

    ranks: int
    steps: list[int]
    step_ns: int
    operators: list[dict[str, Any]] = field(default_factory=list)
    kernels: list[dict[str, Any]] = field(default_factory=list)

    @property
    def per_step(self) -> int:
        """(rank, step) pairs: totals divided by this are per rank and step."""
        return max(self.ranks * len(self.steps), 1)


def operators_view(
    con: duckdb.DuckDBPyConnection,
    run_id: int,
    ranks: tuple[int, ...] = (),
    steps: tuple[int, ...] = (),
    limit: int = TOP_ROWS,
) -> OperatorsView:
    p: dict[str, Any] = {
        "run": run_id,
        "ranks": list(ranks),
        "steps": list(steps),
        "limit": int(limit),
        "dev_cats": list(DEVICE_CATEGORIES),
    }
    n_ranks, _n_steps, step_ns, step_list = query(con, SELECTION_SQL, p)[0]
    step_ns = int(step_ns or 0)

    def rows(sql: str, keys: tuple[str, ...]) -> list[dict[str, Any]]:
        out = []
        for r in query(con, sql, p):
            d = dict(zip(keys, r, strict=True))
            d["total_ns"] = int(d["total_ns"] or 0)
            d["mean_ns"] = d["total_ns"] / max(int(d["n"]), 1)
            d["share"] = d["total_ns"] / step_ns if step_ns else None
            out.append(d)
        return out

    return OperatorsView(
        ranks=int(n_ranks or 0),
        steps=[int(s) for s in (step_list or [])],
        step_ns=step_ns,
        operators=rows(OPS_SQL, ("name", "n", "total_ns", "ranks")),
        kernels=rows(KERNELS_SQL, ("name", "category", "op", "n", "total_ns", "ranks")),
    )
