"""Runs: every run in the store with its step time and where its time goes, open or compare.

The columns come from the derived layer (job_steps, step_parts): a visit runs no analyzer, so a
store with many big runs lists as fast as a small one (issue 15). Findings are shown for the runs
already analyzed (cached) and say "open to analyze" otherwise."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, callback, dcc, html

from tracelab.app import db, ids
from tracelab.app.components import fmt, page, pager, table
from tracelab.app.guard import safe_layout
from tracelab.app.state import href, integer
from tracelab.render.text import duration
from tracelab.views.runs import RunsPage, run_names, runs_page
from tracelab.vocabulary import PART_LABELS

COLUMNS = (
    ("name", "run"),
    ("ranks", "ranks"),
    ("steps", "steps (steady)"),
    ("step", "step time"),
    ("loss", "largest lost-time part"),
    ("compute", "compute share"),
    ("events", "events"),
    ("backend", "backend"),
    ("created_at", "ingested (UTC)"),
    ("findings", "top findings"),
)
TOP_FINDINGS = 3


def _row(r: dict[str, Any], findings: dict[str, str]) -> dict[str, Any]:
    loss = "-"
    if r.get("loss_part"):
        loss = f"{PART_LABELS.get(r['loss_part'], r['loss_part'])} {100 * r['loss_share']:.1f}%"
    world = (
        f" of {r['world_size']}" if r.get("world_size") and r["world_size"] != r["ranks"] else ""
    )
    return {
        **r,
        "ranks": f"{r['ranks']}{world}",
        "steps": f"{r['steps']} ({r['steady_steps'] or 0})",
        "step": duration(r["step_ns"]) if r.get("step_ns") is not None else "-",
        "loss": loss,
        "compute": "-" if r.get("compute_share") is None else f"{100 * r['compute_share']:.0f}%",
        "findings": findings.get(r["name"], "open the run to analyze it"),
    }


def runs_table(p: RunsPage, findings: dict[str, str]) -> html.Div:
    rows = [_row(r, findings) for r in p.rows]
    return table(
        COLUMNS,
        rows,
        links={"name": lambda r: href("/overview", run=r["name"])},
        empty="The store holds no runs yet. Ingest traces with `tracelab ingest`.",
    )


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
        None,
        "/",
        "Runs",
        html.Div(runs_table(p, cached), id=ids.RUNS_TABLE),
        pager(p.page, p.total, p.page_rows, lambda n: href("/", page=n)),
        html.H2("Compare two runs"),
        html.Div(
            [
                dcc.Dropdown(
                    id=ids.RUNS_COMPARE_A,
                    options=options,
                    value=names[1] if len(names) > 1 else None,
                    placeholder="baseline run",
                    clearable=False,
                    className="picker",
                ),
                dcc.Dropdown(
                    id=ids.RUNS_COMPARE_B,
                    options=options,
                    value=names[0] if names else None,
                    placeholder="candidate run",
                    clearable=False,
                    className="picker",
                ),
                dcc.Link(
                    "Compare →", id=ids.RUNS_COMPARE_LINK, href="/compare", className="button"
                ),
            ],
            className="row",
        ),
        # A hidden, empty graph: the browser fetches and compiles plotly.js (4.8 MB) while the
        # user reads this list, not when they open their first run.
        dcc.Graph(
            id=ids.RUNS_PRELOAD, figure={"data": [], "layout": {}}, style={"display": "none"}
        ),
    )


def top_findings_text(found: Any) -> str:
    items = found.findings[:TOP_FINDINGS]
    if not items:
        return "none" if not found.errors else f"analyzers failed: {', '.join(found.errors)}"
    return "; ".join(f"{str(f.severity).upper()} {f.code}" for f in items)


def compare_href(a: str | None, b: str | None) -> str:
    return href("/compare", a=a, b=b)


callback(
    Output(ids.RUNS_COMPARE_LINK, "href"),
    Input(ids.RUNS_COMPARE_A, "value"),
    Input(ids.RUNS_COMPARE_B, "value"),
)(compare_href)

__all__ = ["compare_href", "fmt", "layout"]

# Registered last: Dash Pages needs the layout function at registration.
dash.register_page(__name__, path="/", name="Runs", title="tracelab: runs", order=0, layout=layout)
