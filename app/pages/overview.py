"""Overview of a run: step time per rank x step, the time breakdown per rank, the findings."""

from __future__ import annotations

from typing import Any

import dash
from dash import html
from tracelab.app import db, ids, pending
from tracelab.app.components import findings_list, graph, page
from tracelab.app.guard import safe_layout
from tracelab.app.state import text

from tracelab.figures.overview import breakdown_bars, step_heatmap
from tracelab.views.findings import targets
from tracelab.views.overview import breakdown, step_matrix, summary


def analyzer_errors(errors: dict[str, str]) -> list[Any]:
    if not errors:
        return []
    return [html.Div(
        [html.Strong("Some analyses failed; their results are missing: ")]
        + [html.Div(f"{name}: {msg}") for name, msg in errors.items()],
        className="warning-box",
    )]


@safe_layout("/overview")
def layout(**kwargs: Any) -> html.Div:
    wait = pending.wait_for("/overview", kwargs, [text(kwargs, "run")])
    if wait is not None:
        return wait
    with db.cursor() as cur:
        run_id, run = db.resolve(cur, text(kwargs, "run"))
        ctx = db.context(cur, run_id)
        found = db.analysis(cur, run_id)
        matrix = step_matrix(cur, run_id)
    head = summary(ctx, found, matrix)
    found_targets = targets(found.findings(), ctx)
    notes = [html.Li(n) for r in found.results for n in r.notes]
    return page(
        run, "/overview", f"Overview of {run}",
        html.Dl([x for k, v in head.items for x in (html.Dt(k), html.Dd(v))],
                id=ids.OV_SUMMARY, className="summary"),
        *analyzer_errors(found.errors),
        html.H2(f"Findings ({len(found_targets)})"),
        findings_list(found_targets, run, id=ids.OV_FINDINGS),
        graph(ids.OV_HEATMAP, step_heatmap(matrix)),
        graph(ids.OV_BREAKDOWN, breakdown_bars(breakdown(found))),
        html.Details([html.Summary("Analysis notes"), html.Ul(notes)]) if notes else html.Div(),
    )

# Registered last: Dash Pages needs the layout function at registration.
dash.register_page(__name__, path="/overview", name="Overview", title="tracelab: overview", order=1, layout=layout)
