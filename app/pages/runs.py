"""Runs: every run in the store with ranks, steps, duration and top findings; open or compare."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, callback, dcc, html
from tracelab.app import db, ids
from tracelab.app.components import fmt, page, pager, table
from tracelab.app.guard import describe, safe_layout
from tracelab.app.state import href, integer

from tracelab.views import PAGE_ROWS
from tracelab.views.runs import RunsPage, run_names, runs_page

COLUMNS = (
    ("name", "run"),
    ("ranks", "ranks"),
    ("world_size", "world size"),
    ("steps", "steps"),
    ("median_step_ms", "median step (ms)"),
    ("span_ms", "profiled span (ms)"),
    ("events", "events"),
    ("backend", "backend"),
    ("created_at", "ingested (UTC)"),
    ("findings", "top findings"),
)
TOP_FINDINGS = 3


def runs_table(p: RunsPage, findings: dict[str, str]) -> html.Div:
    rows = [{**r, "findings": findings.get(r["name"], "analyzing…")} for r in p.rows]
    return table(COLUMNS, rows, links={"name": lambda r: href("/overview", run=r["name"])},
                 empty="The store holds no runs yet. Ingest traces with `tracelab ingest`.")


@safe_layout("/")
def layout(**kwargs: Any) -> html.Div:
    number = integer(kwargs, "page", 1, lo=1)
    with db.cursor() as cur:
        p = runs_page(cur, number)
        names = run_names(cur)
        cached = {}
        for r in p.rows:
            found = db.peek_analysis(cur, int(r["run_id"]))
            if found is not None:
                cached[r["name"]] = top_findings_text(found)
    options = [{"label": n, "value": n} for n in names]
    return page(
        None, "/", "Runs",
        html.Div(runs_table(p, cached), id=ids.RUNS_TABLE),
        pager(p.page, p.total, p.page_rows, lambda n: href("/", page=n)),
        dcc.Store(id=ids.RUNS_TRIGGER, data={"page": p.page}),
        html.H2("Compare two runs"),
        html.Div([
            dcc.Dropdown(id=ids.RUNS_COMPARE_A, options=options,
                         value=names[1] if len(names) > 1 else None, placeholder="baseline run",
                         clearable=False, className="picker"),
            dcc.Dropdown(id=ids.RUNS_COMPARE_B, options=options,
                         value=names[0] if names else None, placeholder="candidate run",
                         clearable=False, className="picker"),
            dcc.Link("Compare →", id=ids.RUNS_COMPARE_LINK, href="/compare", className="button"),
        ], className="row"),
        # A hidden, empty graph: the browser fetches and compiles plotly.js (4.8 MB) while the
        # user reads this list, not when they open their first run.
        dcc.Graph(id=ids.RUNS_PRELOAD, figure={"data": [], "layout": {}},
                  style={"display": "none"}),
    )


def top_findings_text(found: Any) -> str:
    items = found.findings()[:TOP_FINDINGS]
    if not items:
        return "none" if not found.errors else f"analyzers failed: {', '.join(found.errors)}"
    return "; ".join(f"{str(f.severity).upper()} {f.code}" for f in items)


def fill_findings(data: dict[str, Any] | None) -> Any:
    """Analyze the runs on the page (cached afterwards) and redraw the table with findings."""
    number = int((data or {}).get("page", 1))
    try:
        with db.cursor() as cur:
            p = runs_page(cur, number, PAGE_ROWS)
            found = {r["name"]: top_findings_text(db.analysis(cur, int(r["run_id"])))
                     for r in p.rows}
        return runs_table(p, found)
    except Exception as exc:  # noqa: BLE001 - keep the page, say what failed
        title, message, _ = describe(exc)
        return html.P(f"{title}: {message}", className="error-message")


def compare_href(a: str | None, b: str | None) -> str:
    return href("/compare", a=a, b=b)


callback(Output(ids.RUNS_TABLE, "children"), Input(ids.RUNS_TRIGGER, "data"))(fill_findings)
callback(Output(ids.RUNS_COMPARE_LINK, "href"),
         Input(ids.RUNS_COMPARE_A, "value"), Input(ids.RUNS_COMPARE_B, "value"))(compare_href)

__all__ = ["compare_href", "fill_findings", "fmt", "layout"]

# Registered last: Dash Pages needs the layout function at registration.
dash.register_page(__name__, path="/", name="Runs", title="tracelab: runs", order=0, layout=layout)
