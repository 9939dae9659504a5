"""Pipeline: the reconstructed schedule per stage (F/B/W by microbatch) with bubbles shaded, and
the bubble shares against the schedule's prediction."""

from __future__ import annotations

from typing import Any

import dash
from dash import dcc, html

from tracelab.app import db, ids, pending
from tracelab.app.components import graph, page, table
from tracelab.app.guard import safe_layout
from tracelab.app.state import BadParam, href, integer, text
from tracelab.figures.pipeline import bubble_figure, schedule_figure
from tracelab.render.text import duration, value
from tracelab.views.pipeline import pipeline_view

STAGE_COLUMNS = (
    ("rank", "rank"),
    ("stages", "stages"),
    ("window", "pipeline window"),
    ("busy", "compute"),
    ("bubble", "bubble (needed)"),
    ("stall", "stall (beyond)"),
    ("leading", "leading idle"),
    ("trailing", "trailing idle"),
    ("share", "idle share"),
)
METRICS = (
    ("schedule", "schedule"),
    ("ranks", "ranks"),
    ("stages_per_rank", "stages per rank"),
    ("microbatches", "microbatches"),
    ("bubble_share_mean", "idle share of the step (mean)"),
    ("textbook_bubble_share", "textbook bubble of the schedule"),
    ("bubble_ns_mean", "bubble the schedule needs, per step"),
    ("stall_ns_mean", "stall beyond it, per step"),
    ("source", "reconstructed from"),
)


def _stage_row(s: dict[str, Any]) -> dict[str, Any]:
    return {
        "rank": s["rank"],
        "stages": ", ".join(str(x) for x in s.get("stages") or []),
        "window": duration(s.get("window_ns")),
        "busy": duration(s.get("busy_ns")),
        "bubble": duration(s.get("bubble_ns")),
        "stall": duration(s.get("stall_ns")),
        "leading": duration(s.get("leading_ns")),
        "trailing": duration(s.get("trailing_ns")),
        "share": value("bubble_share", s.get("bubble_share")),
    }


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
        v = pipeline_view(cur, found, ctx, None if step_arg < 0 else step_arg)
    if not v.available:
        return page(
            run,
            "/pipeline",
            f"Pipeline of {run}",
            html.P(f"No pipeline to show: {v.note}", className="hint"),
        )
    if step_arg >= 0 and step_arg not in v.steps:
        raise BadParam(
            f"URL parameter 'step': run {run} has no pipeline step {step_arg}; its "
            f"steps are {', '.join(str(s) for s in v.steps[:20])}."
        )
    step_links = [
        dcc.Link(
            str(s),
            href=href("/pipeline", run=run, step=s),
            className="active" if s == v.step else "",
        )
        for s in v.steps[:200]
    ]
    metric_rows = [
        {"metric": label, "value": value(key, v.metrics.get(key))}
        for key, label in METRICS
        if key in v.metrics
    ]
    idle = v.metrics.get("bubble_share_mean")
    tb = v.metrics.get("textbook_bubble_share")
    headline = (
        f"The stages are idle {100 * idle:.0f}% of the step on average"
        + (
            f" (the {v.metrics.get('schedule')} schedule alone needs {100 * tb:.0f}%)"
            if isinstance(tb, (int, float))
            else ""
        )
        + ": "
        + f"{duration(v.metrics.get('bubble_ns_mean'))} bubble and "
        + f"{duration(v.metrics.get('stall_ns_mean'))} stall per step."
        if isinstance(idle, (int, float))
        else ""
    )
    return page(
        run,
        "/pipeline",
        f"Pipeline of {run}",
        html.P(headline, className="headline", id=ids.PP_HEADLINE),
        html.Div(["Step: ", *step_links], className="steps-picker"),
        html.P(
            f"Only the first {len(v.actions)} actions of this step are drawn."
            if v.actions_cut
            else "",
            className="hint",
        ),
        graph(ids.PP_SCHEDULE, schedule_figure(v)),
        graph(ids.PP_BUBBLES, bubble_figure(v)),
        html.Div(
            [
                table((("metric", "metric"), ("value", "value")), metric_rows),
                table(STAGE_COLUMNS, [_stage_row(s) for s in v.stages], id=ids.PP_TABLE),
            ],
            className="tables",
        ),
        html.P(v.note, className="hint"),
    )


dash.register_page(
    __name__, path="/pipeline", name="Pipeline", title="tracelab: pipeline", order=3, layout=layout
)
