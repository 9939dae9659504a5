"""Memory: peak per rank and per stage against capacity, the imbalance, and memory over time."""

from __future__ import annotations

from typing import Any

import dash
from dash import html
from tracelab.app import db, ids, pending
from tracelab.app.components import findings_list, graph, page, table
from tracelab.app.guard import safe_layout
from tracelab.app.state import text

from tracelab.figures.memory import peaks_figure, series_figure
from tracelab.views.findings import targets
from tracelab.views.memory import memory_series, memory_view

MAX_ROWS = 256


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
    mine = [f for f in found.findings() if f.analyzer == "memory" or f.view == "memory"]
    metric_rows = [{"metric": k, "value": val} for k, val in v.metrics.items()
                   if not isinstance(val, (dict, list))]
    rank_cols = tuple((k, k.replace("_", " ")) for k in (v.ranks[0].keys() if v.ranks else ())
                      if not k.endswith("_bytes"))
    stage_cols = tuple((k, k.replace("_", " ")) for k in (v.stages[0].keys() if v.stages else ())
                       if not k.endswith("_bytes"))
    return page(
        run, "/memory", f"Memory of {run}",
        html.Div(v.headline(), className="status"),
        findings_list(targets(mine, ctx), run, id=ids.MEM_SUMMARY),
        html.P(v.note, className="hint") if v.note else html.Div(),
        graph(ids.MEM_PEAKS, peaks_figure(v, "rank")),
        graph(ids.MEM_STAGES, peaks_figure(v, "stage")) if v.stages else html.Div(),
        graph(ids.MEM_SERIES, series_figure(series)),
        html.Div([
            table((("metric", "metric"), ("value", "value")), metric_rows),
            table(rank_cols, v.ranks[:MAX_ROWS]),
            table(stage_cols, v.stages[:MAX_ROWS]) if v.stages else html.Div(),
        ], className="tables"),
    )


dash.register_page(__name__, path="/memory", name="Memory", title="tracelab: memory", order=5,
                   layout=layout)
