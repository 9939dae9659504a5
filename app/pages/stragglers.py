"""Stragglers: arrival skew per collective, wait time per rank, blamed ranks with evidence."""

from __future__ import annotations

from typing import Any

import dash
from dash import html

from tracelab.app import db, ids, pending
from tracelab.app.components import findings_list, graph, page, pager, table
from tracelab.app.guard import safe_layout
from tracelab.app.state import BadParam, href, integer, text
from tracelab.figures.stragglers import arrival_heatmap, skew_figure, wait_figure
from tracelab.render.text import duration, value
from tracelab.views.findings import step_windows, targets
from tracelab.views.stragglers import COLLECTIVES_PER_PAGE, straggler_view
from tracelab.vocabulary import Code

RANK_COLUMNS = (
    ("rank", "rank"),
    ("blamed", "blamed"),
    ("kind", "slow because of"),
    ("matches", "collectives"),
    ("times_last", "times last"),
    ("share_last", "share last"),
    ("lateness", "lateness (median)"),
    ("waited", "waited per step"),
    ("caused", "made others wait per step"),
    ("saving", "saving if at median speed"),
    ("excess_compute", "extra compute per step"),
    ("excess_host", "extra host per step"),
)
ROWS_PER_PAGE = 50
METRICS = (
    ("matched", "collectives matched across ranks"),
    ("stragglers", "blamed ranks"),
    ("slowdown_median", "slowdown (actual / every rank at the median speed)"),
    ("wait_share", "waiting for other ranks (share of the step)"),
    ("transfer_ns_median", "transfer per collective (median)"),
    ("clock_uncertainty_ns_max", "clock uncertainty (max)"),
    ("blameable_share", "collectives late beyond the clock uncertainty"),
)


def _metric(key: str, val: Any) -> str:
    if key == "stragglers":
        return ", ".join(f"rank {r}" for r in val) if val else "none"
    if key == "slowdown_median" and isinstance(val, (int, float)):
        return f"{val:.2f}×"
    return value(key, val)


def _rank_row(x: dict[str, Any]) -> dict[str, Any]:
    return {
        "rank": x["rank"],
        "blamed": x.get("blamed", ""),
        "kind": x.get("kind") or "-",
        "matches": x.get("matches"),
        "times_last": x.get("times_last"),
        "share_last": "-" if x.get("share_last") is None else f"{100 * x['share_last']:.0f}%",
        "lateness": duration(x.get("lateness_ns_median")),
        "waited": duration(x.get("wait_ns_per_step")),
        "caused": duration(x.get("caused_wait_ns_per_step")),
        "saving": duration(x.get("saving_ns_per_step")),
        "excess_compute": duration(x.get("excess_compute_ns")),
        "excess_host": duration(x.get("excess_host_ns")),
    }


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
        v = straggler_view(cur, found, ctx, number)
        windows, typical = step_windows(cur, run_id)
    if not v.available:
        return page(
            run,
            "/stragglers",
            f"Stragglers of {run}",
            html.P(f"Nothing to show: {v.note}", className="hint"),
        )
    if number > v.pages:
        raise BadParam(f"URL parameter 'page' must be between 1 and {v.pages}, not {number}.")
    mine = [f for f in found.findings if f.analyzer == "stragglers" or f.view == "stragglers"]
    metric_rows = [
        {"metric": label, "value": _metric(key, v.metrics.get(key))}
        for key, label in METRICS
        if key in v.metrics
    ]
    rows = [
        _rank_row(x) for x in v.ranks[(rank_page - 1) * ROWS_PER_PAGE : rank_page * ROWS_PER_PAGE]
    ]
    return page(
        run,
        "/stragglers",
        f"Stragglers of {run}",
        html.P(_headline(v.blamed, mine), className="headline", id=ids.ST_HEADLINE),
        findings_list(
            targets(mine, ctx, windows, typical), run, id=ids.ST_BLAME, all_ranks=ctx.ranks
        ),
        graph(ids.ST_WAIT, wait_figure(v)),
        table((("metric", "metric"), ("value", "value")), metric_rows),
        graph(ids.ST_SKEW, skew_figure(v)),
        graph("stragglers-arrivals", arrival_heatmap(v)),
        pager(
            v.page,
            int(v.metrics.get("matched") or 0),
            COLLECTIVES_PER_PAGE,
            lambda n: href("/stragglers", run=run, page=n, rpage=rank_page),
        ),
        html.H2("Per rank"),
        table(RANK_COLUMNS, rows, id=ids.ST_PAGE),
        pager(
            rank_page,
            len(v.ranks),
            ROWS_PER_PAGE,
            lambda n: href("/stragglers", run=run, page=v.page, rpage=n),
        ),
        html.P(v.note, className="hint"),
    )


dash.register_page(
    __name__,
    path="/stragglers",
    name="Stragglers",
    title="tracelab: stragglers",
    order=4,
    layout=layout,
)


def _headline(blamed: list[int], mine: list[Any]) -> str:
    """Who is blamed; with no one, whether the ranks still wait for each other (SYNC_WAIT: a
    different rank last each time), which "Blamed: none" above that finding's card denied."""
    if blamed:
        return f"Blamed: {', '.join(f'rank {r}' for r in blamed)}."
    spread = next((f for f in mine if f.code == Code.SYNC_WAIT), None)
    if spread is not None:
        return (
            "Blamed: no single rank. The ranks wait for each other "
            f"{duration(spread.impact_ns_per_step)} per step, a different rank last each time "
            "(jitter, uneven inputs): see the waiting below."
        )
    return "Blamed: none. No rank is late often enough, and by enough, to cost the others time."
