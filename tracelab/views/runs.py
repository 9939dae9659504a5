"""The runs in the store, a page at a time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb

from tracelab.views import PAGE_ROWS
from tracelab.vocabulary import STEP_PARTS

RUNS_SQL = """
WITH page AS (
    SELECT run_id, name, created_at, rank_count, world_size, json_array_length(skipped) AS skipped
    FROM runs ORDER BY run_id DESC LIMIT ? OFFSET ?
),
st AS (
    SELECT j.run_id, count(*) AS steps, count(*) FILTER (WHERE j.steady) AS steady,
           max(j.end_ns) - min(j.start_ns) AS span_ns,
           coalesce(avg(j.dur_ns) FILTER (WHERE j.steady), avg(j.dur_ns)) AS step_ns
    FROM job_steps j JOIN page USING (run_id) GROUP BY j.run_id
),
pt AS (
    SELECT p.run_id, avg(p.step_ns) AS step_ns, avg(p.compute_ns) AS compute, avg(p.transfer_ns) AS transfer,
           avg(p.memcpy_ns) AS memcpy, avg(p.wait_ns) AS wait, avg(p.bubble_ns) AS bubble,
           avg(p.stall_ns) AS stall, avg(p.host_ns) AS host, avg(p.idle_ns) AS idle
    FROM step_parts p JOIN page USING (run_id) WHERE p.steady GROUP BY p.run_id
),
ev AS (
    SELECT k.run_id, sum(k.event_count) AS events, string_agg(DISTINCT k.backend, ', ') AS backend,
           string_agg(DISTINCT k.device, ', ') AS device
    FROM ranks k JOIN page USING (run_id) GROUP BY k.run_id
)
SELECT page.run_id, page.name, page.created_at, page.rank_count, page.world_size,
       coalesce(st.steps, 0), st.steady, st.span_ns, st.step_ns, ev.events, ev.backend,
       ev.device, page.skipped, pt.step_ns, pt.compute, pt.transfer, pt.memcpy, pt.wait,
       pt.bubble, pt.stall, pt.host, pt.idle
FROM page LEFT JOIN st USING (run_id) LEFT JOIN pt USING (run_id) LEFT JOIN ev USING (run_id)
ORDER BY page.run_id DESC
"""

_KEYS = (
    "run_id",
    "name",
    "created_at",
    "ranks",
    "world_size",
    "steps",
    "steady_steps",
    "span_ns",
    "step_ns",
    "events",
    "backend",
    "device",
    "skipped",
)
#: The lost-time parts (step_parts), in the order of the SELECT above.
_PARTS = STEP_PARTS


@dataclass(frozen=True, kw_only=True)
class RunsPage:
    rows: list[dict[str, Any]]
    total: int
    page: int
    page_rows: int


def runs_page(
    con: duckdb.DuckDBPyConnection, page: int = 1, page_rows: int = PAGE_ROWS
) -> RunsPage:
    """Runs newest first: ranks, steps, profiled span, the step time (mean steady step of
    job_steps: the steps analyzer's step_ns) and the largest loss of the lost-time model
    (step_parts over the steady steps: `loss_part`, `loss_share`). Reads the derived layer only:
    no analyzer runs for a row."""
    row = con.execute("SELECT count(*) FROM runs").fetchone()
    total = int(row[0]) if row else 0
    page = max(1, min(page, max(1, -(-total // page_rows))))
    rows = con.execute(RUNS_SQL, [page_rows, (page - 1) * page_rows]).fetchall()
    out = []
    for row in rows:
        d = dict(zip(_KEYS, row[: len(_KEYS)], strict=True))
        d["created_at"] = str(d["created_at"])[:19]
        step, parts = row[len(_KEYS)], dict(zip(_PARTS, row[len(_KEYS) + 1 :], strict=True))
        lost = {k: float(v) for k, v in parts.items() if k != "compute" and v}
        d["loss_part"] = max(lost, key=lambda k: lost[k]) if lost and step else None
        d["loss_share"] = lost[d["loss_part"]] / float(step) if d["loss_part"] else None
        d["compute_share"] = (float(parts["compute"] or 0) / float(step)) if step else None
        out.append(d)
    return RunsPage(rows=out, total=total, page=page, page_rows=page_rows)


def newest_run_ids(con: duckdb.DuckDBPyConnection, count: int) -> list[int]:
    """Ids of the `count` newest runs, newest first."""
    rows = con.execute("SELECT run_id FROM runs ORDER BY run_id DESC LIMIT ?", [count]).fetchall()
    return [int(r[0]) for r in rows]


def run_names(con: duckdb.DuckDBPyConnection, limit: int = 500) -> list[str]:
    """Names of the newest runs (for pickers), newest first."""
    rows = con.execute("SELECT name FROM runs ORDER BY run_id DESC LIMIT ?", [limit]).fetchall()
    return [str(r[0]) for r in rows]
