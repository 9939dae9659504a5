"""The reconstructed pipeline schedule of one step: each action's span, the compute measured
inside it and the waiting around it, and the bubble against the schedule's prediction.

Actions are the pipeline analyzer's (pipeline_actions: a span, and the compute inside it); what
each rank's time was comes from the derived layer's time_parts ('compute' segments are coloured
by the action they fall in, 'pipeline' segments are waiting for another stage), so a blocking
recv inside an action reads as waiting, not as compute.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import duckdb

from tracelab.views.analysis import Analysis
from tracelab.views.context import RunContext

#: Most actions drawn for one step (a step of a huge pipeline is summarized in the status).
MAX_ACTIONS = 5000
#: Most time_parts segments drawn for one step.
MAX_SEGMENTS = 20_000

SEGMENTS_SQL = """
SELECT rank, start_ns, end_ns, part FROM time_parts
WHERE run_id = ? AND step = ? AND part IN ('compute', 'pipeline', 'transfer', 'wait', 'host')
ORDER BY rank, start_ns LIMIT ?
"""


@dataclass(frozen=True, kw_only=True)
class PipelineView:
    """What the pipeline page draws. `available` is False when the run has no pipeline."""

    available: bool
    note: str = ""
    steps: list[int] = field(default_factory=list)
    step: int | None = None
    #: Actions of the chosen step: rank, stage, kind (F/B/I/W), mb, start_ms, end_ms (its
    #: span), busy_ns (compute inside), wait_ns (the rest of the span).
    actions: list[dict[str, Any]] = field(default_factory=list)
    actions_cut: bool = False
    #: Compute segments: rank, start_ms, end_ms, and the action they fall in (kind, stage, mb;
    #: None outside actions).
    compute: list[dict[str, Any]] = field(default_factory=list)
    #: Waiting segments (time_parts 'pipeline', 'transfer', 'wait', 'host'): rank, start_ms,
    #: end_ms, part.
    waiting: list[dict[str, Any]] = field(default_factory=list)
    segments_cut: bool = False
    #: The step's window, ms since the run's start.
    window_ms: tuple[float, float] | None = None
    #: Per rank (over the steady steps): the analyzer's stage rows (raw ns).
    stages: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)


def _assign(actions: list[dict[str, Any]], s: int, e: int) -> dict[str, Any] | None:
    """The action (sorted by span start) whose span holds the middle of [s, e)."""
    mid = (s + e) // 2
    starts = [a["span_start_ns"] for a in actions]
    i = bisect.bisect_right(starts, mid) - 1
    if i >= 0 and actions[i]["span_end_ns"] > mid:
        return actions[i]
    return None


def pipeline_view(
    con: duckdb.DuckDBPyConnection, analysis: Analysis, ctx: RunContext, step: int | None = None
) -> PipelineView:
    """The pipeline analyzer's result, cut to one step (the chosen one, else a steady step)."""
    result = analysis.get("pipeline")
    if result is None:
        why = analysis.errors.get("pipeline", "the pipeline analyzer did not run")
        return PipelineView(available=False, note=why)
    if not result.metrics.get("pipeline"):
        return PipelineView(
            available=False, note=" ".join(result.notes) or "This run has no pipeline schedule."
        )
    actions = result.tables.get("actions", [])
    steps = sorted({int(a["step"]) for a in actions if a.get("step") is not None})
    step_rows = result.tables.get("steps", [])
    if step is None or step not in steps:
        steady = sorted({int(x["step"]) for x in step_rows if x.get("steady")} & set(steps))
        pool = steady or steps
        step = pool[len(pool) // 2] if pool else None
    chosen = sorted(
        (a for a in actions if a.get("step") == step), key=lambda a: (a["rank"], a["span_start_ns"])
    )
    cut = len(chosen) > MAX_ACTIONS
    chosen = chosen[:MAX_ACTIONS]
    out = [
        {
            "rank": int(a["rank"]),
            "stage": a.get("stage"),
            "kind": str(a.get("kind")),
            "mb": a.get("mb"),
            "start_ms": round(ctx.to_ms(a["span_start_ns"]), 6),
            "end_ms": round(ctx.to_ms(a["span_end_ns"]), 6),
            "busy_ns": int(a.get("busy_ns") or 0),
            "wait_ns": max(
                int(a["span_end_ns"]) - int(a["span_start_ns"]) - int(a.get("busy_ns") or 0), 0
            ),
        }
        for a in chosen
    ]
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for a in chosen:
        by_rank.setdefault(int(a["rank"]), []).append(a)
    compute: list[dict[str, Any]] = []
    waiting: list[dict[str, Any]] = []
    rows = (
        con.execute(SEGMENTS_SQL, [ctx.run_id, step, MAX_SEGMENTS + 1]).fetchall()
        if step is not None
        else []
    )
    seg_cut = len(rows) > MAX_SEGMENTS
    for rank, s, e, part in rows[:MAX_SEGMENTS]:
        rank, s, e = int(rank), int(s), int(e)
        if rank not in by_rank:
            continue
        seg = {"rank": rank, "start_ms": round(ctx.to_ms(s), 6), "end_ms": round(ctx.to_ms(e), 6)}
        if part == "compute":
            act = _assign(by_rank[rank], s, e)
            seg.update(  # type: ignore[call-overload]
                kind=None if act is None else str(act["kind"]),
                stage=None if act is None else act.get("stage"),
                mb=None if act is None else act.get("mb"),
            )
            compute.append(seg)
        else:
            waiting.append({**seg, "part": str(part)})
    window: tuple[float, float] | None = None
    srows = [x for x in step_rows if x.get("step") == step and x.get("window_start_ns")]
    if srows:
        window = (
            round(ctx.to_ms(min(x["window_start_ns"] for x in srows)), 6),
            round(ctx.to_ms(max(x["window_end_ns"] for x in srows)), 6),
        )
    elif out:
        window = (min(float(a["start_ms"]) for a in out), max(float(a["end_ms"]) for a in out))  # type: ignore[arg-type]
    return PipelineView(
        available=True,
        steps=steps,
        step=step,
        actions=out,
        actions_cut=cut,
        compute=compute,
        waiting=waiting,
        segments_cut=seg_cut,
        window_ms=window,
        stages=sorted(result.tables.get("stages", []), key=lambda x: x["rank"]),
        metrics=dict(result.metrics),
        note=" ".join(result.notes),
    )
