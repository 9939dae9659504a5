"""Operators & kernels figures: the top rows by time per rank and step, with their share of the
step. Operators show their self time over their total (inclusive) time, so that nested operators
are not read as additive."""

from __future__ import annotations

from typing import Any

from tracelab.figures import CATEGORY_COLORS, Figure, base_layout, empty_figure, esc
from tracelab.views.operators import OperatorsView

#: Bars in the chart of each table.
CHART_ROWS = 15
#: The total (inclusive) bar behind an operator's self-time bar.
TOTAL_COLOR = "#C9E3E1"


def _label(r: dict[str, Any]) -> str:
    text = esc(str(r["name"]), 70)
    if r.get("shape"):
        text += f" {esc(str(r['shape']), 40)}"
    if r.get("op"):
        text += f"  ← {esc(str(r['op']), 30)}"
    return text


def _pct(share: float | None) -> str:
    return f"{100 * share:.1f}%" if share is not None else ""


def top_figure(v: OperatorsView, rows: list[dict[str, Any]], what: str) -> Figure:
    """The top CHART_ROWS `rows` (operators: self time and total; kernels: time) in ms per rank
    and step; `what` names them ("host operators", "device kernels")."""
    if not rows:
        return empty_figure(f"No {what} in the selected steps.")
    top = rows[:CHART_ROWS]
    labels = [_label(r) for r in top]
    per_ms = v.per_step * 1e6
    hover = "%{y}<br>%{x:.3f} ms per rank and step (%{text} of the step)"
    has_self = "self_ns" in top[0]
    traces: list[dict[str, Any]] = [
        {
            "type": "bar",
            "orientation": "h",
            "name": "total (inclusive)" if has_self else "time",
            "y": labels,
            "x": [r["total_ns"] / per_ms for r in top],
            "marker": {"color": TOTAL_COLOR if has_self else CATEGORY_COLORS["compute"]},
            "text": [_pct(r["share"]) for r in top],
            "textposition": "none" if has_self else "outside",
            "hovertemplate": hover
            + ("<br>total, with the operators it calls" if has_self else "")
            + "<extra></extra>",
        }
    ]
    if has_self:
        traces.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": "self",
                "y": labels,
                "x": [r["self_ns"] / per_ms for r in top],
                "marker": {"color": CATEGORY_COLORS["cpu_op"]},
                "text": [_pct(r["self_share"]) for r in top],
                "textposition": "outside",
                "hovertemplate": hover + "<br>self: without its direct children<extra></extra>",
            }
        )
    title = (
        f"Top {what} by self time per rank and step (bar: self, behind it: total)"
        if has_self
        else f"Top {what} by time per rank and step (share of the step)"
    )
    return {
        "data": traces,
        "layout": base_layout(
            title=title,
            height=140 + 24 * len(top),
            barmode="overlay",
            showlegend=has_self,
            legend={"orientation": "h", "y": -0.15},
            xaxis={"title": {"text": "ms per rank and step"}},
            yaxis={"autorange": "reversed", "automargin": True, "type": "category"},
        ),
    }
