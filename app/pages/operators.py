"""Operators & kernels: the top host operators and device kernels by time, per rank or over
ranks, in the chosen steps (default: the steady steps), like the TensorBoard plugin's Operator
and Kernel views. Bounded: the top TOP_ROWS of each."""

from __future__ import annotations

from typing import Any

import dash
from dash import dcc, html

from tracelab.app import db, ids
from tracelab.app.components import graph, page, table
from tracelab.app.guard import safe_layout
from tracelab.app.state import BadParam, compact_ints, href, int_list, text
from tracelab.figures import Figure, base_layout, empty_figure, esc
from tracelab.render.text import duration
from tracelab.views.operators import OperatorsView, operators_view

OP_COLUMNS = (
    ("name", "operator"),
    ("n", "calls"),
    ("total", "total"),
    ("mean", "mean"),
    ("per_step", "per rank and step"),
    ("share", "share of step"),
)
KERNEL_COLUMNS = (
    ("name", "kernel"),
    ("category", "category"),
    ("op", "launched by"),
    ("n", "launches"),
    ("total", "total"),
    ("mean", "mean"),
    ("per_step", "per rank and step"),
    ("share", "share of step"),
)
#: Bars in the chart of each table.
CHART_ROWS = 15


def _rows(v: OperatorsView, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            **r,
            "name": str(r["name"])[:160],
            "total": duration(r["total_ns"]),
            "mean": duration(r["mean_ns"]),
            "per_step": duration(r["total_ns"] / v.per_step),
            "share": "-" if r["share"] is None else f"{100 * r['share']:.1f}%",
        }
        for r in rows
    ]


def top_figure(v: OperatorsView, rows: list[dict[str, Any]], what: str, color: str) -> Figure:
    if not rows:
        return empty_figure(f"No {what} in the selected steps.")
    top = rows[:CHART_ROWS]
    labels = [
        esc(str(r["name"]), 70) + (f"  ← {esc(str(r['op']), 30)}" if r.get("op") else "")
        for r in top
    ]
    return {
        "data": [
            {
                "type": "bar",
                "orientation": "h",
                "y": labels,
                "x": [r["total_ns"] / v.per_step / 1e6 for r in top],
                "marker": {"color": color},
                "text": [f"{100 * r['share']:.1f}%" if r["share"] is not None else "" for r in top],
                "textposition": "outside",
                "hovertemplate": "%{y}<br>%{x:.3f} ms per rank and step (%{text} of the step)"
                "<extra></extra>",
            }
        ],
        "layout": base_layout(
            title=f"Top {what} by time per rank and step (share of the step)",
            height=140 + 24 * len(top),
            xaxis={"title": {"text": "ms per rank and step"}},
            yaxis={"autorange": "reversed", "automargin": True, "type": "category"},
        ),
    }


@safe_layout("/operators")
def layout(**kwargs: Any) -> html.Div:
    ranks, steps = int_list(kwargs, "ranks"), int_list(kwargs, "steps")
    with db.cursor() as cur:
        run_id, run = db.resolve(cur, text(kwargs, "run"))
        ctx = db.context(cur, run_id)
        missing = [r for r in ranks if r not in ctx.ranks]
        if missing:
            raise BadParam(
                f"URL parameter 'ranks': run {run} has ranks "
                f"{compact_ints(ctx.ranks)}; {compact_ints(missing)} not among them."
            )
        known = [
            int(r[0])
            for r in cur.execute(
                "SELECT DISTINCT step FROM step_spans WHERE run_id = ? ORDER BY step", [run_id]
            ).fetchall()
        ]
        gone = [s for s in steps if s not in known]
        if gone:
            raise BadParam(
                f"URL parameter 'steps': run {run} has steps "
                f"{compact_ints(known) or 'none'}; {compact_ints(gone)} not among them."
            )
        v = db.memo(
            cur,
            run_id,
            "operators",
            (ranks, steps),
            lambda: operators_view(cur, run_id, ranks, steps),
        )
    which = (
        f"rank{'s' if len(ranks) != 1 else ''} {compact_ints(ranks)}"
        if ranks
        else f"all {v.ranks} ranks"
    )
    st = f"steps {compact_ints(v.steps)}" + ("" if steps else " (the steady steps)")
    rank_links = [
        dcc.Link(
            "all",
            href=href("/operators", run=run, steps=steps),
            className="active" if not ranks else "",
        )
    ] + [
        dcc.Link(
            str(r),
            href=href("/operators", run=run, ranks=(r,), steps=steps),
            className="active" if ranks == (r,) else "",
        )
        for r in ctx.ranks[:64]
    ]
    step_links = [
        dcc.Link(
            "steady",
            href=href("/operators", run=run, ranks=ranks),
            className="active" if not steps else "",
        )
    ] + [
        dcc.Link(
            str(s),
            href=href("/operators", run=run, ranks=ranks, steps=(s,)),
            className="active" if steps == (s,) else "",
        )
        for s in known[:100]
    ]
    return page(
        run,
        "/operators",
        f"Operators & kernels of {run}",
        html.P(
            f"{which}, {st}: {duration(v.step_ns / v.per_step)} per rank and step. Times are "
            "inclusive (an operator counts the operators it calls).",
            className="status",
            id=ids.OP_SUMMARY,
        ),
        html.Div(["Rank: ", *rank_links], className="steps-picker"),
        html.Div(["Step: ", *step_links], className="steps-picker"),
        graph("operators-ops-chart", top_figure(v, v.operators, "host operators", "#72B7B2")),
        table(
            OP_COLUMNS,
            _rows(v, v.operators),
            id=ids.OP_OPS,
            empty="No host operators in the selected steps.",
        ),
        graph("operators-kernels-chart", top_figure(v, v.kernels, "device kernels", "#4C78A8")),
        table(
            KERNEL_COLUMNS,
            _rows(v, v.kernels),
            id=ids.OP_KERNELS,
            empty="No device kernels in the selected steps (a CPU-only run has none).",
        ),
    )


dash.register_page(
    __name__,
    path="/operators",
    name="Operators & kernels",
    title="tracelab: operators and kernels",
    order=6,
    layout=layout,
)
