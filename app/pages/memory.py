"""Memory: the peak per rank against capacity (and what the peak measures), the stage imbalance
against the schedule's prediction, and memory over time; one chart per question."""

from __future__ import annotations

from typing import Any

import dash
from dash import html

from tracelab.app import db, ids, pending
from tracelab.app.components import findings_list, graph, page, table
from tracelab.app.guard import safe_layout
from tracelab.app.state import text
from tracelab.figures.memory import estimate_figure, peaks_figure, series_figure, stages_figure
from tracelab.render.text import size
from tracelab.views.findings import targets
from tracelab.views.memory import memory_series, memory_view

MAX_ROWS = 256
RANK_COLUMNS = (
    ("rank", "rank"),
    ("stage", "stage"),
    ("peak", "peak"),
    ("capacity", "capacity"),
    ("used", "of capacity"),
)
ESTIMATE_COLUMNS = (
    ("rank", "rank"),
    ("stages", "stages"),
    ("in_flight", "microbatches held (stage: n)"),
    ("estimate", "estimate"),
    ("measured", "measured"),
    ("error", "error"),
    ("states", "of which model states"),
    ("activations", "activations"),
    ("rest", "unexplained rest"),
    ("used", "of capacity"),
)


@safe_layout("/memory")
def layout(**kwargs: Any) -> html.Div:
    wait = pending.wait_for("/memory", kwargs, [text(kwargs, "run")])
    if wait is not None:
        return wait
    with db.cursor() as cur:
        run_id, run = db.resolve(cur, text(kwargs, "run"))
        ctx = db.context(cur, run_id)
        found = db.analysis(cur, run_id)
        series = memory_series(cur, ctx)
    v = memory_view(found)
    mine = [f for f in found.findings if f.analyzer == "memory" or f.view == "memory"]
    rows = [
        {
            "rank": r["rank"],
            "stage": r.get("stage"),
            "peak": size(r.get("peak_bytes")),
            "capacity": size(r.get("capacity_bytes")) if r.get("capacity_bytes") else "unknown",
            "used": "-" if r.get("headroom_used") is None else f"{100 * r['headroom_used']:.0f}%",
        }
        for r in v.ranks[:MAX_ROWS]
    ]
    return page(
        run,
        "/memory",
        f"Memory of {run}",
        html.P(v.headline(), className="headline", id=ids.MEM_HEADLINE),
        html.P(f"Source: {v.source_text}." if v.available else "", className="hint"),
        # (without memory data nothing was measured: no "no findings" to say)
        findings_list(targets(mine, ctx), run, id=ids.MEM_SUMMARY, all_ranks=ctx.ranks)
        if v.available
        else html.Div(id=ids.MEM_SUMMARY),
        html.P(v.note, className="hint") if v.note else html.Div(),
        graph(ids.MEM_PEAKS, peaks_figure(v)),
        graph(ids.MEM_STAGES, stages_figure(v)) if v.stages else html.Div(),
        graph(ids.MEM_ESTIMATE, estimate_figure(v))
        if v.estimate
        else html.P(v.estimate_note, className="hint", id=ids.MEM_ESTIMATE),
        table(ESTIMATE_COLUMNS, v.estimate_rows()[:MAX_ROWS]) if v.estimate else html.Div(),
        graph(ids.MEM_SERIES, series_figure(series, v.capacity_bytes))
        if series.ranks
        else html.P(
            "Memory over time: the trace has no allocator events (profile with "
            "profile_memory=True to see them).",
            className="hint",
            id=ids.MEM_SERIES,
        ),
        table(RANK_COLUMNS, rows),
    )


dash.register_page(
    __name__, path="/memory", name="Memory", title="tracelab: memory", order=5, layout=layout
)
