"""Stragglers: arrival skew per collective, wait time per rank, blamed ranks with evidence."""

from __future__ import annotations

from typing import Any

import dash
from dash import html
from tracelab.app import db, ids, pending
from tracelab.app.components import findings_list, graph, page, pager, table
from tracelab.app.guard import safe_layout
from tracelab.app.state import href, integer, text

from tracelab.figures.stragglers import arrival_heatmap, skew_figure, wait_figure
from tracelab.views.findings import targets
from tracelab.views.stragglers import COLLECTIVES_PER_PAGE, straggler_view

RANK_COLUMNS = (
    ("rank", "rank"), ("blamed", "blamed"), ("kind", "kind"), ("matches", "collectives"),
    ("times_last", "times last (beyond uncertainty)"), ("share_last", "share last"),
    ("lateness_ms_median", "lateness (ms, median)"),
    ("extra_compute_ms_median", "extra compute (ms, median)"), ("wait_ms_total", "wait total (ms)"),
    ("wait_ms_median", "wait median (ms)"), ("saving_ms_per_step", "saving if median (ms/step)"),
)
METRICS = (
    ("matched", "collectives matched"), ("source", "from"), ("stragglers", "blamed ranks"),
    ("step_ms_median", "step (ms, median)"), ("ideal_step_ms_median", "at median speed (ms)"),
    ("slowdown_median", "slowdown (median)"), ("transfer_ms_median", "transfer (ms, median)"),
    ("clock_uncertainty_ms_max", "clock uncertainty (ms, max)"),
    ("blameable_share", "share of collectives late beyond uncertainty"),
)
ROWS_PER_PAGE = 50


@safe_layout("/stragglers")
def layout(**kwargs: Any) -> html.Div:
    wait = pending.wait_for("/stragglers", kwargs, [text(kwargs, "run")])
    if wait is not None:
        return wait
    number = integer(kwargs, "page", 1, lo=1)
    rank_page = integer(kwargs, "rpage", 1, lo=1)
    with db.cursor() as cur:
        run_id, run = db.resolve(cur, text(kwargs, "run"))
        ctx = db.context(cur, run_id)
        found = db.analysis(cur, run_id)
    v = straggler_view(found, ctx, number)
    if not v.available:
        return page(run, "/stragglers", f"Stragglers of {run}",
                    html.P(f"Nothing to show: {v.note}", className="hint"))
    mine = [f for f in found.findings() if f.analyzer == "stragglers" or f.view == "stragglers"]
    metric_rows = [{"metric": label, "value": ", ".join(map(str, val)) if isinstance(val, list)
                    else val} for key, label in METRICS for val in [v.metrics.get(key)]]
    rows = v.ranks[(rank_page - 1) * ROWS_PER_PAGE: rank_page * ROWS_PER_PAGE]
    return page(
        run, "/stragglers", f"Stragglers of {run}",
        html.H2("Blamed ranks"),
        findings_list(targets(mine, ctx), run, id=ids.ST_BLAME),
        table((("metric", "metric"), ("value", "value")), metric_rows),
        graph(ids.ST_SKEW, skew_figure(v)),
        graph(ids.ST_WAIT, wait_figure(v)),
        graph("stragglers-arrivals", arrival_heatmap(v)),
        pager(v.page, int(v.metrics.get("matched") or 0), COLLECTIVES_PER_PAGE,
              lambda n: href("/stragglers", run=run, page=n, rpage=rank_page)),
        html.H2("Per rank"),
        table(RANK_COLUMNS, rows, id=ids.ST_PAGE),
        pager(rank_page, len(v.ranks), ROWS_PER_PAGE,
              lambda n: href("/stragglers", run=run, page=v.page, rpage=n)),
        html.P(v.note, className="hint"),
    )


dash.register_page(__name__, path="/stragglers", name="Stragglers", title="tracelab: stragglers",
                   order=4, layout=layout)
