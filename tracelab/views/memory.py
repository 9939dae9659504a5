"""Memory: the peak per rank against capacity, the stage imbalance against what the schedule
predicts, and memory over time.

Peaks, capacity and imbalance are the memory analyzer's (raw bytes; the page and `tracelab
analyze` agree); the source is named (device allocator peak, the trace's allocator events, or
the process RSS). The time series is binned in SQL: at most MAX_SERIES_RANKS ranks (the highest
peaks) and SERIES_BINS points each, whatever the number of allocation events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb

from tracelab.render.text import size
from tracelab.store.files import run_memory_sql
from tracelab.views.analysis import Analysis
from tracelab.views.context import RunContext

SERIES_BINS = 400
MAX_SERIES_RANKS = 16
MIB = 1024**2
GIB = 1024**3

#: What the memory analyzer's `source` measures, in words.
SOURCES = {
    "step_peak": "device allocator peak per step (the collector's torch.cuda.max_memory_allocated)",
    "trace": "allocator events in the trace ([memory]); a lower bound of the true peak",
    "rss": "process RSS on the CPU (the collector's sample per step; includes the "
    "interpreter and libraries, not only tensors)",
    "trace_baseline": "CPU allocator events of the first window plus the model-state bytes "
    "live when it opened (the collector's count)",
}
SHORT_SOURCES = {
    "step_peak": "allocated (device allocator)",
    "trace": "allocated (trace events)",
    "rss": "process RSS",
    "trace_baseline": "allocated (CPU allocator events + baseline)",
}

SERIES_SQL = """
WITH m AS (
    SELECT m.rank, m.ts_ns - o.off_ns AS t, m.allocated_bytes, m.reserved_bytes
    FROM {memory} m JOIN (SELECT unnest(?::INTEGER[]) AS rank, unnest(?::BIGINT[]) AS off_ns) o
      USING (rank)
    WHERE m.run_id = ? AND m.source = 'trace' AND m.allocated_bytes IS NOT NULL
),
top AS (SELECT rank FROM m GROUP BY rank ORDER BY max(allocated_bytes) DESC, rank LIMIT ?),
b AS (SELECT min(t) AS lo, greatest(max(t) - min(t), 1) AS span FROM m)
SELECT m.rank, least(CAST(floor((m.t - b.lo) * ? / b.span) AS BIGINT), ? - 1) AS bin,
       max(m.allocated_bytes), max(m.reserved_bytes), min(m.t)
FROM m JOIN top USING (rank), b
GROUP BY ALL ORDER BY m.rank, bin
"""


def unit_for(max_bytes: float | None) -> tuple[str, float]:
    """(unit, divisor) for an axis whose largest value is `max_bytes`: MiB below 1 GiB."""
    if max_bytes is not None and max_bytes >= GIB:
        return "GiB", float(GIB)
    return "MiB", float(MIB)


@dataclass(frozen=True, kw_only=True)
class MemorySeries:
    """Per rank: bin start (ms since run start) and the max allocated/reserved bytes per bin."""

    ranks: list[int]
    t_ms: dict[int, list[float]]
    allocated_bytes: dict[int, list[int | None]]
    reserved_bytes: dict[int, list[int | None]]
    total_ranks: int

    @property
    def max_bytes(self) -> int | None:
        vals = [v for xs in self.allocated_bytes.values() for v in xs if v is not None]
        return max(vals) if vals else None


def memory_series(con: duckdb.DuckDBPyConnection, ctx: RunContext) -> MemorySeries:
    """Allocated and reserved memory over time from the trace's [memory] events, binned."""
    p = ctx.params()
    memory = run_memory_sql(con, ctx.run_id)
    found = con.execute(
        f"SELECT count(DISTINCT rank) FROM {memory} WHERE run_id = ? AND source = 'trace'",
        [ctx.run_id],
    ).fetchone()
    total = found[0] if found else 0
    rows = con.execute(
        SERIES_SQL.format(memory=memory),
        [p["off_ranks"], p["off_ns"], ctx.run_id, MAX_SERIES_RANKS, SERIES_BINS, SERIES_BINS],
    ).fetchall()
    t: dict[int, list[float]] = {}
    alloc: dict[int, list[int | None]] = {}
    res: dict[int, list[int | None]] = {}
    for rank, _bin, a, rsv, t0 in rows:
        rank = int(rank)
        t.setdefault(rank, []).append(round(ctx.to_ms(t0), 6))
        alloc.setdefault(rank, []).append(None if a is None else int(a))
        res.setdefault(rank, []).append(None if rsv is None else int(rsv))
    return MemorySeries(
        ranks=sorted(t), t_ms=t, allocated_bytes=alloc, reserved_bytes=res, total_ranks=int(total)
    )


@dataclass(frozen=True, kw_only=True)
class MemoryView:
    available: bool
    note: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    #: The analyzer's per-rank rows (rank, stage, peak_bytes, reserved_bytes, capacity_bytes,
    #: headroom_used, lower_bound), raw bytes.
    ranks: list[dict[str, Any]] = field(default_factory=list)
    #: Per stage (pipelines): peak_bytes, over_mean, expected_over_mean.
    stages: list[dict[str, Any]] = field(default_factory=list)
    #: Per pipeline rank: the memory estimate beside the measured peak (the analyzer's
    #: `estimate` table: model_states_bytes, activations_bytes, backward/optimizer workspace,
    #: allowance_bytes, estimate_bytes, measured_bytes, error and its split, predicted_bytes when
    #: a `tracelab estimate` config was given), raw bytes.
    estimate: list[dict[str, Any]] = field(default_factory=list)
    #: Why there is no estimate (the analyzer's note naming what is missing), or ''.
    estimate_note: str = ""

    def estimate_rows(self) -> list[dict[str, Any]]:
        """The estimate table as text, one row per pipeline rank: stages, microbatches held per
        stage, estimate, measured, error, and the error's split (model states, activations,
        unexplained rest), measured peak / capacity."""

        def pct(x: Any) -> str:
            return "-" if x is None else f"{100 * x:+.1f}%"

        return [
            {
                "rank": r["rank"],
                "stages": ", ".join(str(s) for s in r["stages"]),
                "in_flight": ", ".join(f"{k}: {n}" for k, n in sorted(r["in_flight"].items())),
                "estimate": size(r["estimate_bytes"]),
                "measured": size(r.get("measured_bytes")),
                "error": pct(r.get("error")),
                "states": size(r.get("diff_model_states_bytes")),
                "activations": size(r.get("diff_activations_bytes")),
                "rest": size(r.get("diff_rest_bytes")),
                "used": "-"
                if r.get("headroom_used") is None
                else f"{100 * r['headroom_used']:.0f}%",
            }
            for r in self.estimate
        ]

    @property
    def source(self) -> str:
        return str(self.metrics.get("source") or "")

    @property
    def source_text(self) -> str:
        return SOURCES.get(self.source, self.source or "unknown")

    @property
    def peak_label(self) -> str:
        """What the peaks are: 'process RSS', 'allocated (device allocator)', ..."""
        return SHORT_SOURCES.get(self.source, "peak")

    @property
    def capacity_bytes(self) -> int | None:
        caps = [int(r["capacity_bytes"]) for r in self.ranks if r.get("capacity_bytes")]
        cap = self.metrics.get("capacity_bytes")
        return int(cap) if cap else (max(caps) if caps else None)

    def headline(self) -> str:
        """The peak, its source, the headroom and the imbalance in one or two sentences."""
        m = self.metrics
        if m.get("peak_bytes_max") is None:
            return "No memory measured in this run."
        peak_rank = max(self.ranks, key=lambda r: r.get("peak_bytes") or 0, default=None)
        where = f" on rank {peak_rank['rank']}" if peak_rank else ""
        bound = " (a lower bound)" if m.get("peak_is_lower_bound") else ""
        parts = [
            f"Highest peak {size(m['peak_bytes_max'])}{where}{bound}, measured as {self.peak_label}"
        ]
        cap = self.capacity_bytes
        if cap:
            used = [
                float(r["headroom_used"]) for r in self.ranks if r.get("headroom_used") is not None
            ]
            parts.append(
                f"device capacity {size(cap)}"
                + (f", up to {100 * max(used):.0f}% used" if used else "")
            )
        else:
            parts.append("device capacity unknown (no capacity in the trace)")
        if m.get("max_over_mean") is not None:
            exp = m.get("expected_max_over_mean")
            parts.append(
                f"stage imbalance max/mean {m['max_over_mean']:.2f}"
                + (
                    f" (the {m.get('schedule')} schedule's activations predict {exp:.2f})"
                    if exp
                    else ""
                )
            )
        err = m.get("estimate_max_abs_error")
        if err is not None:
            parts.append(
                f"measured peaks within {100 * err:.0f}% of the memory estimate on every "
                "pipeline rank"
            )
        return "; ".join(parts) + "." if parts else ""


def memory_view(analysis: Analysis) -> MemoryView:
    """The memory analyzer's per-rank and per-stage peaks (bytes), with capacity."""
    result = analysis.get("memory")
    if result is None:
        return MemoryView(
            available=False, note=analysis.errors.get("memory", "the memory analyzer did not run")
        )
    ranks = sorted((dict(r) for r in result.tables.get("ranks", [])), key=lambda r: r["rank"])
    stages = sorted((dict(r) for r in result.tables.get("stages", [])), key=lambda r: r["stage"])
    estimate = sorted(
        (dict(r) for r in result.tables.get("estimate", [])), key=lambda r: min(r["stages"])
    )
    # The estimate's note goes where the estimate would be drawn, not again with the others.
    estimate_note = next((n for n in result.notes if n.startswith("no memory estimate")), "")
    return MemoryView(
        available=bool(ranks),
        metrics=dict(result.metrics),
        ranks=ranks,
        stages=stages,
        estimate=estimate,
        estimate_note=estimate_note,
        note=" ".join(n for n in result.notes if n != estimate_note)
        or ("" if ranks else "No memory samples in this run."),
    )
