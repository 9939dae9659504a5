"""What a report compares, read from one run in the store.

Op/kernel times per step come straight from SQL on `events`; every other metric family comes
from the analyzers' results (`tracelab.report.analyzer_metrics`), so the report, the CLI and
the app show the same numbers. Warm-up steps (the first `warmup_steps` of every rank) are
dropped everywhere.
"""

from __future__ import annotations

import json
from typing import Any

import duckdb
import numpy as np

from tracelab.errors import InputError
from tracelab.report.compare import MetricValue, RunMetrics, RunSummary
from tracelab.report.thresholds import ReportSettings

NS_PER_MS = 1e6
#: Op/kernel names longer than this are shortened in labels (the row key keeps the full name).
LABEL_CHARS = 90
#: Device categories whose per-name totals make the op/kernel table on GPU runs.
DEVICE_OP_CATEGORIES = ("compute", "communication", "memcpy", "memset")

_KEPT_STEPS_SQL = """
    WITH numbered AS (
        SELECT rank, step, end_ns - start_ns AS dur_ns,
               row_number() OVER (PARTITION BY rank ORDER BY step) AS k
        FROM steps WHERE run_id = $run
    )
    SELECT rank, step, dur_ns FROM numbered WHERE k > $warmup
"""


def _scalar(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any]) -> Any:
    row = con.execute(sql, params).fetchone()
    return None if row is None else row[0]


def kept_steps(con: duckdb.DuckDBPyConnection, run_id: int, warmup: int) -> set[tuple[int, int]]:
    """(rank, step) pairs left after dropping each rank's first `warmup` steps."""
    rows = con.execute(_KEPT_STEPS_SQL, {"run": run_id, "warmup": warmup}).fetchall()
    return {(int(r), int(s)) for r, s, _ in rows}


def _op_times(con: duckdb.DuckDBPyConnection, run_id: int, s: ReportSettings
              ) -> dict[str, MetricValue]:
    """Time per step of each op (CPU runs) or kernel (GPU runs), averaged over ranks.

    Inclusive time summed per name: nested cpu_ops each count their own span, so values are
    "time spent inside ops of this name", not shares that add up to the step.
    """
    on_gpu = _scalar(
        con,
        "SELECT count(*) > 0 FROM events WHERE run_id = ? AND on_device AND category IN "
        f"({', '.join('?' for _ in DEVICE_OP_CATEGORIES)})",
        [run_id, *DEVICE_OP_CATEGORIES],
    )
    where = ("e.on_device AND e.category IN ('compute', 'communication', 'memcpy', 'memset')"
             if on_gpu else "lower(e.cat) IN ('cpu_op', 'operator')")
    rows = con.execute(
        f"""
        WITH kept AS ({_KEPT_STEPS_SQL}),
        per_step AS (SELECT step, count(*) AS ranks FROM kept GROUP BY step)
        SELECT e.name, e.step, sum(e.dur_ns) / any_value(p.ranks) AS dur_ns
        FROM events e
        JOIN kept k ON e.rank = k.rank AND e.step = k.step
        JOIN per_step p ON p.step = e.step
        WHERE e.run_id = $run AND {where}
        GROUP BY e.name, e.step
        """,
        {"run": run_id, "warmup": s.warmup_steps},
    ).fetchall()
    steps = sorted({int(step) for _, step, _ in rows})
    col = {step: i for i, step in enumerate(steps)}
    by_name: dict[str, np.ndarray] = {}
    for name, step, dur in rows:
        arr = by_name.setdefault(name, np.zeros(len(steps)))
        arr[col[int(step)]] = float(dur) / NS_PER_MS
    kind = "kernel" if on_gpu else "op"
    out = {}
    for name, arr in by_name.items():
        label = name if len(name) <= LABEL_CHARS else name[: LABEL_CHARS - 1] + "…"
        key = f"op_time[{name}]"
        out[key] = MetricValue(key=key, gate="op_time", label=f"{kind} {label}",
                               value=float(np.median(arr)), samples=tuple(arr.tolist()))
    return out


def _summary(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[str, tuple[str, ...], int,
                                                                      int | None]:
    row = con.execute("SELECT name, source, rank_count, world_size FROM runs WHERE run_id = ?",
                      [run_id]).fetchone()
    if row is None:
        raise InputError(f"run id {run_id} is not in the store")
    source = tuple(str(p) for p in json.loads(row[1] or "[]"))
    return str(row[0]), source, int(row[2]), None if row[3] is None else int(row[3])


def extract(con: duckdb.DuckDBPyConnection, run_id: int, settings: ReportSettings) -> RunMetrics:
    """Every metric of one run that the report compares."""
    from tracelab.report.analyzer_metrics import from_analyzers

    name, source, rank_count, world = _summary(con, run_id)
    total = int(_scalar(con, "SELECT count(DISTINCT step) FROM steps WHERE run_id = ?",
                        [run_id]))
    kept = len({step for _, step in kept_steps(con, run_id, settings.warmup_steps)})
    extra = from_analyzers(con, run_id, settings)
    values = dict(extra.values)
    values.update(_op_times(con, run_id, settings))
    summary = RunSummary(name=name, run_id=run_id, source=source, ranks=rank_count,
                         world_size=world, steps_used=kept, steps_dropped=max(total - kept, 0))
    return RunMetrics(run=summary, values=values, findings=extra.findings,
                      tables={"per_rank": _merge_per_rank(extra.per_rank)},
                      notes=tuple(extra.notes))


def _merge_per_rank(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per rank from the analyzers' per-rank pieces."""
    by_rank: dict[int, dict[str, Any]] = {}
    for row in rows:
        by_rank.setdefault(int(row["rank"]), {"rank": int(row["rank"])}).update(row)
    return [by_rank[r] for r in sorted(by_rank)]
