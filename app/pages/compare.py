"""Compare: two runs side by side: the report's comparison rows (the metrics, thresholds, tests
and verdicts of `tracelab report`), most significant first, and the step time distributions."""

from __future__ import annotations

import logging
from typing import Any

import dash
from dash import Input, Output, callback, dcc, html

from tracelab.app import db, ids, pending
from tracelab.app.components import graph, page, table
from tracelab.app.guard import describe, safe_layout
from tracelab.app.state import href, text
from tracelab.figures.compare import step_distributions
from tracelab.views.compare import comparison_rows, finding_changes, report, step_comparison
from tracelab.views.runs import run_names

log = logging.getLogger(__name__)

PICK_A = "compare-pick-a"
PICK_B = "compare-pick-b"
PICK_LINK = "compare-pick-link"
#: Most metric rows shown (the most significant first).
MAX_ROWS = 80
COLUMNS = (
    ("metric", "metric"),
    ("a", "A"),
    ("b", "B"),
    ("change", "change"),
    # The p of the regression test, Holm-adjusted: an improvement's own p is in its "why".
    ("p", "p of a regression (Holm)"),
    ("threshold", "threshold"),
    ("verdict", "verdict"),
    ("reason", "why"),
)


def pickers(names: list[str], a: str | None, b: str | None) -> html.Div:
    options = [{"label": n, "value": n} for n in names]
    return html.Div(
        [
            dcc.Dropdown(
                id=PICK_A,
                options=options,
                value=a,
                placeholder="baseline run (A)",
                className="picker",
            ),
            dcc.Dropdown(
                id=PICK_B,
                options=options,
                value=b,
                placeholder="candidate run (B)",
                className="picker",
            ),
            dcc.Link(
                "Compare →", id=PICK_LINK, href=href("/compare", a=a, b=b), className="button"
            ),
        ],
        className="row",
    )


@safe_layout("/compare")
def layout(**kwargs: Any) -> html.Div:
    a_arg, b_arg = text(kwargs, "a"), text(kwargs, "b")
    if a_arg and b_arg:
        wait = pending.wait_for("/compare", kwargs, [a_arg, b_arg])
        if wait is not None:
            return wait
    with db.cursor() as cur:
        names = run_names(cur)
        if not a_arg or not b_arg:
            return page(
                a_arg,
                "/compare",
                "Compare two runs",
                pickers(names, a_arg, b_arg),
                html.P("Pick a baseline (A) and a candidate (B).", className="hint"),
            )
        a_id, a = db.resolve(cur, a_arg)
        b_id, b = db.resolve(cur, b_arg)
        an_a, an_b = db.analysis(cur, a_id), db.analysis(cur, b_id)
        steps = step_comparison(cur, a_id, b_id)
        try:
            rep = db.memo(
                cur,
                a_id,
                "report",
                (b_id, db.run_key(cur, b_id)),
                lambda: report(cur, a_id, b_id, (an_a, an_b)),
            )
        except Exception as exc:  # noqa: BLE001 - the step distributions do not need it
            log.exception("the report of %s against %s failed", b, a)
            rep, failure = None, describe(exc)
    changes = finding_changes(an_a, an_b)
    cols = tuple((k, f"A: {a}" if k == "a" else f"B: {b}" if k == "b" else h) for k, h in COLUMNS)
    if rep is None:
        title, message, _ = failure
        metrics: list[Any] = [
            html.Div(
                f"The report could not be built ({title}: {message}), so its metrics are not "
                "judged here; `tracelab report` says the same. The step times below come from "
                "the runs' steps alone.",
                id=ids.CMP_SUMMARY,
                className="warning-box",
            )
        ]
    else:
        rows = comparison_rows(rep)
        counts = {
            k: sum(1 for r in rows if r["verdict_key"] == k)
            for k in ("regression", "improved", "warn")
        }
        failed = "; ".join(f"{what}: {why}" for what, why in rep.errors.items())
        metrics = [
            html.Div(
                f"Verdict: {rep.verdict}. {counts['regression']} regression(s), "
                f"{counts['improved']} improvement(s), {counts['warn']} metric(s) that cannot be "
                f"judged, against the report's default thresholds ({len(rows)} metrics). "
                f"Findings: {len(changes['new'])} new in B, {len(changes['resolved'])} gone, "
                f"{len(changes['persisting'])} in both."
                + (
                    f" Analyzers that failed (their metrics are missing, and `tracelab report` "
                    f"exits 3): {failed}."
                    if failed
                    else ""
                ),
                id=ids.CMP_SUMMARY,
                className="warning-box" if failed else "status",
            ),
            html.H2("Metrics, most significant first"),
            table(cols, rows[:MAX_ROWS], id=ids.CMP_METRICS),
            html.P(f"{len(rows) - MAX_ROWS} more rows not shown." if len(rows) > MAX_ROWS else ""),
        ]
    return page(
        a,
        "/compare",
        f"Compare {a} (A) with {b} (B)",
        pickers(names, a, b),
        *metrics,
        graph(ids.CMP_STEPS, step_distributions(steps, a, b)),
        html.H2("Findings"),
        html.Div(
            [
                html.Div(
                    [html.H3(f"{title} ({len(items)})"), html.Ul([html.Li(t) for t in items[:30]])]
                )
                for title, items in (
                    ("New in B", changes["new"]),
                    ("Gone in B", changes["resolved"]),
                    ("In both", changes["persisting"]),
                )
            ],
            className="tables",
        ),
    )


def compare_link(a: str | None, b: str | None) -> str:
    return href("/compare", a=a, b=b)


callback(Output(PICK_LINK, "href"), Input(PICK_A, "value"), Input(PICK_B, "value"))(compare_link)

dash.register_page(
    __name__, path="/compare", name="Compare", title="tracelab: compare", order=6, layout=layout
)
