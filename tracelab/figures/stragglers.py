"""Straggler figures: skew per collective, arrival heatmap, wait per rank."""

from __future__ import annotations

from typing import Any

from tracelab.figures import Figure, base_layout, empty_figure, esc
from tracelab.views.stragglers import StragglerView


def skew_figure(v: StragglerView) -> Figure:
    """Arrival skew (last minus first arrival) of each collective over time, colored by whether
    the lateness exceeds the clock uncertainty (only then is the last arriver blamed)."""
    if not v.available or not v.skew:
        return empty_figure(v.note or "No matched collectives.")
    pts = [x for x in v.skew if x["at_ms"] is not None]
    groups: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for x in pts:
        groups[x["blameable"]].append(x)
    traces = []
    for blame, xs in groups.items():
        if not xs:
            continue
        traces.append({
            "type": "scatter", "mode": "markers",
            "name": "late beyond clock uncertainty" if blame else "within clock uncertainty",
            "x": [x["at_ms"] for x in xs], "y": [x["skew_ms"] for x in xs],
            "marker": {"color": "#E45756" if blame else "#9aa7b5", "size": 6},
            "hovertext": [f"{esc(x['label'])} · step {x['step']}<br>skew {x['skew_ms']:.3f} ms, "
                          f"last: rank {x['last_rank']}" for x in xs],
            "hoverinfo": "text",
        })
    title = "Arrival skew per collective (last minus first arrival)"
    if v.skew_cut:
        title += f" — the {len(v.skew)} largest"
    return {"data": traces, "layout": base_layout(
        title=title, height=340, xaxis={"title": {"text": "time since run start (ms)"}},
        yaxis={"title": {"text": "skew (ms)"}, "rangemode": "tozero"},
        legend={"orientation": "h", "y": -0.25})}


def arrival_heatmap(v: StragglerView) -> Figure:
    if not v.available or not v.heat_labels:
        return empty_figure(v.note or "No matched collectives.")
    return {"data": [{
        "type": "heatmap", "x": [esc(x) for x in v.heat_labels], "y": [str(r) for r in v.heat_ranks],
        "z": v.heat_ms, "colorscale": "Reds", "hoverongaps": False,
        "colorbar": {"title": {"text": "ms late"}, "thickness": 12},
        "hovertemplate": "rank %{y} arrives %{z:.3f} ms after the first at %{x}<extra></extra>",
        "xgap": 1, "ygap": 1,
    }], "layout": base_layout(
        title=f"Arrival after the first rank, per collective (page {v.page} of {v.pages})",
        height=min(640, 160 + 20 * len(v.heat_ranks)),
        xaxis={"type": "category", "tickangle": -45, "showticklabels": len(v.heat_labels) <= 40},
        yaxis={"type": "category", "title": {"text": "rank"}, "autorange": "reversed"})}


def wait_figure(v: StragglerView) -> Figure:
    if not v.available or not v.ranks:
        return empty_figure(v.note or "No waits.")
    labels = [f"rank {r['rank']}" for r in v.ranks]
    colors = ["#E45756" if r["rank"] in v.blamed else "#4C78A8" for r in v.ranks]
    return {"data": [{
        "type": "bar", "x": labels, "y": [r.get("wait_ms_total") for r in v.ranks],
        "marker": {"color": colors}, "name": "total wait",
        "hovertemplate": "%{x}: waited %{y:.3f} ms in total for later ranks<extra></extra>",
    }], "layout": base_layout(
        title="Time each rank waited for the last arriver (total; blamed ranks in red)",
        height=320, yaxis={"title": {"text": "ms"}})}
