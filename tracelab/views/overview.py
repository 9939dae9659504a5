"""The overview of a run: step time per rank x step, the time breakdown per rank, the findings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb

from tracelab.views._run import RunContext
from tracelab.views.analysis import Analysis

#: Most ranks and steps in the heatmap (the rest is summarized in the note).
MAX_HEAT_RANKS = 256
MAX_HEAT_STEPS = 200

#: Parts of the breakdown as drawn; they add up to the rank's window. The analyzer's compute
#: includes the time communication overlaps it, so it is split into compute_only (no
#: communication running) and overlapped_comm (compute with communication underneath).
BREAKDOWN_PARTS = ("compute_only", "overlapped_comm", "exposed_comm", "exposed_memcpy", "idle")


@dataclass(frozen=True, kw_only=True)
class StepMatrix:
    """Step time (ms) per rank (rows) and step (columns); None where a rank lacks the step."""

    ranks: list[int]
    steps: list[int]
    ms: list[list[float | None]]
    total_ranks: int
    total_steps: int

    @property
    def truncated(self) -> bool:
        return len(self.ranks) < self.total_ranks or len(self.steps) < self.total_steps


STEP_MATRIX_SQL = """
WITH d AS (
    SELECT rank, step, (coalesce(device_end_ns, end_ns) - start_ns) / 1e6 AS ms
    FROM steps WHERE run_id = ?
),
r AS (SELECT DISTINCT rank FROM d ORDER BY rank LIMIT ?),
s AS (SELECT DISTINCT step FROM d ORDER BY step LIMIT ?)
SELECT d.rank, d.step, d.ms FROM d JOIN r USING (rank) JOIN s USING (step)
"""


def step_matrix(con: duckdb.DuckDBPyConnection, run_id: int) -> StepMatrix:
    """Step durations (host start to the later of host end and device end), bounded."""
    totals = con.execute(
        "SELECT count(DISTINCT rank), count(DISTINCT step) FROM steps WHERE run_id = ?", [run_id]
    ).fetchone() or (0, 0)
    rows = con.execute(STEP_MATRIX_SQL, [run_id, MAX_HEAT_RANKS, MAX_HEAT_STEPS]).fetchall()
    ranks = sorted({int(r) for r, _, _ in rows})
    steps = sorted({int(s) for _, s, _ in rows})
    ri = {r: i for i, r in enumerate(ranks)}
    si = {s: i for i, s in enumerate(steps)}
    grid: list[list[float | None]] = [[None] * len(steps) for _ in ranks]
    for r, s, v in rows:
        grid[ri[int(r)]][si[int(s)]] = round(float(v), 4)
    return StepMatrix(ranks=ranks, steps=steps, ms=grid, total_ranks=int(totals[0]),
                      total_steps=int(totals[1]))


@dataclass(frozen=True, kw_only=True)
class Breakdown:
    """Per rank, ms of each part over the rank's profiled window (from the breakdown analyzer);
    `window` is the sum of the parts."""

    ranks: list[int]
    parts: dict[str, list[float | None]]
    window_ms: list[float | None]
    overlap_pct: list[float | None]
    mode: list[str]
    notes: tuple[str, ...] = ()


def breakdown(analysis: Analysis, max_ranks: int = MAX_HEAT_RANKS) -> Breakdown | None:
    """The breakdown analyzer's per-rank table, or None when it produced none."""
    rows = sorted(analysis.table("breakdown", "ranks"), key=lambda x: x.get("rank", 0))[:max_ranks]
    if not rows:
        return None
    parts = {p: [_num(x.get(f"{p}_ms")) for x in rows] for p in BREAKDOWN_PARTS}
    parts["compute_only"] = [
        None if x.get("compute_ms") is None
        else round(float(x["compute_ms"]) - float(x.get("overlapped_comm_ms") or 0.0), 6)
        for x in rows
    ]
    result = analysis.get("breakdown")
    return Breakdown(
        ranks=[int(x["rank"]) for x in rows], parts=parts,
        window_ms=[_num(x.get("window_ms")) for x in rows],
        overlap_pct=[_num(x.get("overlap_pct")) for x in rows],
        mode=[str(x.get("mode", "")) for x in rows],
        notes=result.notes if result else (),
    )


def _num(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True, kw_only=True)
class Summary:
    """Headline numbers of a run for the overview's first line."""

    items: list[tuple[str, str]]


def summary(ctx: RunContext, analysis: Analysis, matrix: StepMatrix) -> Summary:
    vals = [v for row in matrix.ms for v in row if v is not None]
    vals.sort()
    items = [
        ("ranks", f"{len(ctx.ranks)}" + (f" of {ctx.world_size}" if ctx.world_size else "")),
        ("steps", str(matrix.total_steps)),
        ("events", f"{ctx.event_count:,}"),
        ("profiled span", f"{ctx.span_ms:,.1f} ms"),
    ]
    if vals:
        items.append(("median step", f"{vals[len(vals) // 2]:,.3f} ms"))
    overlap = analysis.metric("breakdown", "overlap_pct_mean")
    if overlap is not None:
        items.append(("comm/compute overlap", f"{overlap:.1f}%"))
    items.append(("clocks", {"measured": "aligned (measured offsets)",
                             "estimated": "aligned (offsets estimated from collectives)",
                             "same_host": "one host, one clock",
                             "none": "not aligned"}.get(ctx.offset_source, ctx.offset_source)))
    return Summary(items=items)
