"""Pipeline: the reconstructed schedule per stage (F/B/W by microbatch) with bubbles shaded, and
the bubble shares against the schedule's prediction."""

from __future__ import annotations

from typing import Any

import dash
from dash import dcc, html
from tracelab.app import db, ids, pending
from tracelab.app.components import graph, page, table
from tracelab.app.guard import safe_layout
from tracelab.app.state import href, integer, text

from tracelab.figures.pipeline import bubble_figure, schedule_figure
from tracelab.views.pipeline import pipeline_view

STAGE_COLUMNS = (
    ("rank", "rank"), ("stages", "stages"), ("window_ms", "step window (ms)"),
    ("busy_ms", "compute (ms)"), ("idle_ms", "idle (ms)"), ("leading_ms", "leading (ms)"),
    ("internal_ms", "internal (ms)"), ("trailing_ms", "trailing (ms)"),
    ("bubble_share", "bubble share"), ("bubble_share_megatron", "bubble / compute"),
    ("inherent_idle_ms", "inherent idle (ms)"), ("excess_idle_ms", "excess idle (ms)"),
)
METRICS = (
    ("schedule", "schedule"), ("ranks", "stages (ranks)"), ("stages_per_rank", "stages per rank"),
    ("microbatches", "microbatches"), ("bubble_share_mean", "bubble share (mean)"),
    ("textbook_bubble_share", "schedule's prediction"),
    ("bubble_share_megatron_mean", "bubble / compute (mean)"),
    ("textbook_bubble_share_megatron", "prediction, / compute form"),
    ("excess_idle_ms_mean", "excess idle per step (ms)"), ("source", "reconstructed from"),
)


@safe_layout("/pipeline")
def layout(**kwargs: Any) -> html.Div:
    wait = pending.wait_for("/pipeline", kwargs, [text(kwargs, "run")])
    if wait is not None:
        return wait
    step_arg = integer(kwargs, "step", -1, lo=-1)
    with db.cursor() as cur:
        run_id, run = db.resolve(cur, text(kwargs, "run"))
        ctx = db.context(cur, run_id)
        found = db.analysis(cur, run_id)
    v = pipeline_view(found, ctx, None if step_arg < 0 else step_arg)
    if not v.available:
        return page(run, "/pipeline", f"Pipeline of {run}",
                    html.P(f"No pipeline to show: {v.note}", className="hint"))
    step_links = [dcc.Link(str(s), href=href("/pipeline", run=run, step=s),
                           className="active" if s == v.step else "") for s in v.steps[:200]]
    metric_rows = [{"metric": label, "value": v.metrics.get(key)} for key, label in METRICS]
    return page(
        run, "/pipeline", f"Pipeline of {run}",
        html.Div(["Step: ", *step_links], className="steps-picker"),
        html.P(f"Only the first {len(v.actions)} actions of this step are drawn."
               if v.actions_cut else "", className="hint"),
        graph(ids.PP_SCHEDULE, schedule_figure(v)),
        graph(ids.PP_BUBBLES, bubble_figure(v)),
        html.Div([
            table((("metric", "metric"), ("value", "value")), metric_rows),
            table(STAGE_COLUMNS, v.stages, id=ids.PP_TABLE),
        ], className="tables"),
        html.P(v.note, className="hint"),
    )


dash.register_page(__name__, path="/pipeline", name="Pipeline", title="tracelab: pipeline",
                   order=3, layout=layout)
