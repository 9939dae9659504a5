"""Straggler figures: who waits for whom per rank, arrival skew per collective, arrival heatmap."""

from __future__ import annotations

from typing import Any

from tracelab.figures import Figure, base_layout, empty_figure, esc, ms
from tracelab.views.stragglers import StragglerView
from tracelab.vocabulary import PART_COLORS


def skew_figure(v: StragglerView) -> Figure:
    """Arrival skew (last minus first arrival) of each collective over time, coloured by whether
    the lateness exceeds the clock uncertainty (only then is the last arriver blamed)."""
    if not v.available or not v.skew:
        return empty_figure(v.note or "No matched collectives.")
    pts = [x for x in v.skew if x["at_ms"] is not None and x["skew_ns"] is not None]
    groups: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for x in pts:
        groups[x["blameable"]].append(x)
    traces = []
    for blame, xs in groups.items():
        if not xs:
            continue
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "late beyond clock uncertainty" if blame else "within clock uncertainty",
                "x": [x["at_ms"] for x in xs],
                "y": [x["skew_ns"] / 1e6 for x in xs],
                "marker": {"color": "#E45756" if blame else "#9aa7b5", "size": 7},
                "hovertext": [
                    f"{esc(x['label'])}<br>skew {ms(x['skew_ns'] / 1e6)}, last: rank "
                    f"{x['last_rank']}"
                    for x in xs
                ],
                "hoverinfo": "text",
            }
        )
    title = "Arrival skew per collective (last minus first arrival)"
    if v.skew_cut:
        title += f" (the {len(v.skew)} largest)"
    return {
        "data": traces,
        "layout": base_layout(
            title=title,
            height=320,
            xaxis={"title": {"text": "time since run start (ms)"}},
            yaxis={"title": {"text": "skew (ms)"}, "rangemode": "tozero"},
            legend={"orientation": "h", "y": -0.3},
        ),
    }


def arrival_heatmap(v: StragglerView) -> Figure:
    if not v.available or not v.heat_labels:
        return empty_figure(v.note or "No matched collectives.")
    z = [[None if x is None else x / 1e6 for x in row] for row in v.heat_ns]
    return {
        "data": [
            {
                "type": "heatmap",
                "x": [esc(x, 40) for x in v.heat_labels],
                "y": [f"rank {r}" for r in v.heat_ranks],
                "z": z,
                "zmin": 0,
                "hoverongaps": False,
                "colorscale": [[0, "#ffffff"], [0.3, "#fcae91"], [1, "#a50f15"]],
                "colorbar": {"title": {"text": "ms after<br>the first"}, "thickness": 12},
                "hovertemplate": "%{y} arrives %{z:.3f} ms after the first at %{x}<extra></extra>",
                "xgap": 1,
                "ygap": 1,
            }
        ],
        "layout": base_layout(
            title=f"Arrival after the first rank, per collective (page {v.page} of {v.pages})"
            + (
                f"; the {len(v.heat_ranks)} of {v.heat_total_ranks:,} ranks that arrive latest"
                if len(v.heat_ranks) < v.heat_total_ranks
                else ""
            ),
            height=min(640, 230 + 24 * len(v.heat_ranks)),
            xaxis={
                "type": "category",
                "tickangle": -40,
                "automargin": True,
                "showticklabels": len(v.heat_labels) <= 40,
            },
            yaxis={"type": "category", "autorange": "reversed", "automargin": True},
        ),
    }


def wait_figure(v: StragglerView) -> Figure:
    """Per rank, per steady step: the time it waited for others, and the waiting it caused in
    others (a straggler waits little and causes much)."""
    if not v.available or not v.ranks:
        return empty_figure(v.note or "No waits.")
    rows = v.wait_ranks or v.ranks
    if v.wait_why:
        labels = [f"rank {r['rank']} · {why}" for r, why in zip(rows, v.wait_why, strict=True)]
    else:
        labels = [
            f"rank {r['rank']}" + (" (blamed)" if r["rank"] in v.blamed else "") for r in rows
        ]
    waited = [float(r.get("wait_ns_per_step") or 0) / 1e6 for r in rows]
    caused = [float(r.get("caused_wait_ns_per_step") or 0) / 1e6 for r in rows]
    return {
        "data": [
            {
                "type": "bar",
                "x": labels,
                "y": waited,
                "name": "waited for others",
                "marker": {"color": PART_COLORS["wait"]},
                "hovertemplate": "%{x}: waited %{y:.3f} ms per step<extra></extra>",
            },
            {
                "type": "bar",
                "x": labels,
                "y": caused,
                "name": "made others wait",
                "marker": {"color": "#6b3a87"},
                "hovertemplate": "%{x}: others waited %{y:.3f} ms per step for it<extra></extra>",
            },
        ],
        "layout": base_layout(
            title="Waiting per rank and steady step: who waited, and who made them wait"
            + (
                f"; of {len(v.ranks):,} ranks, a typical one and those that stand out"
                if v.wait_why
                else ""
            ),
            height=340,
            barmode="group",
            yaxis={"title": {"text": "ms per step"}},
            legend={"orientation": "h", "y": -0.2},
        ),
    }
