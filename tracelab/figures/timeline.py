"""The timeline figure: lanes on y (numeric, labelled by ticks), ms since run start on x.

Raw mode draws one horizontal bar per event (one trace per category, nested host ops in sub-rows);
aggregate mode draws one heatmap of busy share per lane and time bin. Collective matches are a
line through each rank's arrival. Only SVG/canvas traces are used (no WebGL), so the figure draws
in any browser, headless ones included.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from tracelab.figures import CATEGORY_COLORS, Figure, base_layout, empty_figure, esc, ms
from tracelab.views.timeline import TimelineData

#: Sub-rows a lane is split into for nested events; deeper events share the last one.
MAX_DEPTH_ROWS = 4
LANE_PX = 28


def timeline_figure(data: TimelineData, title: str = "") -> Figure:
    """The figure for `data` (see tracelab.views.timeline.timeline)."""
    if data.mode == "empty":
        return empty_figure("No events in this window with these filters. Zoom out or clear filters.")
    n = len(data.lanes)
    traces: list[dict[str, Any]] = []
    if data.mode == "raw" and data.raw is not None:
        traces += _raw_traces(data)
    elif data.aggregate is not None:
        traces.append(_heatmap(data))
    separators = [{
        "type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": i + 0.5, "y1": i + 0.5,
        "line": {"color": "#e3e3e3", "width": 1}, "layer": "above",
    } for i in range(n - 1)] if data.mode == "aggregate" else []
    if data.links:
        traces.append(_links_trace(data))
    shapes, notes = [], []
    for step, start, _end in data.steps:
        if data.t0_ms <= start <= data.t1_ms:
            shapes.append({
                "type": "line", "x0": start, "x1": start, "y0": 0, "y1": 1, "yref": "paper",
                "line": {"color": "#999", "width": 1, "dash": "dot"}, "layer": "below",
            })
            notes.append({
                "x": start, "y": 1, "yref": "paper", "yanchor": "bottom", "xanchor": "left",
                "text": f"step {int(step)}", "showarrow": False, "font": {"size": 10, "color": "#777"},
            })
    layout = base_layout(
        title=title,
        height=max(260, 90 + LANE_PX * n),
        xaxis={
            "title": {"text": "time since run start (ms, aligned clock)"},
            "range": [data.t0_ms, data.t1_ms], "showgrid": True, "gridcolor": "#eee",
            "zeroline": False,
        },
        yaxis={
            "tickmode": "array", "tickvals": list(range(n)),
            "ticktext": [esc(lane.label, 60) for lane in data.lanes],
            "range": [n - 0.5, -0.5], "fixedrange": True, "showgrid": False, "zeroline": False,
            "automargin": True,
        },
        barmode="overlay", bargap=0, shapes=separators + shapes, annotations=notes,
        legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1, "yanchor": "bottom",
                "font": {"size": 11}},
        hovermode="closest", dragmode="zoom", uirevision=None,
    )
    layout["margin"].update(l=240, t=max(layout["margin"]["t"], 56))
    return {"data": traces, "layout": layout}


def _raw_traces(data: TimelineData) -> list[dict[str, Any]]:
    raw = data.raw
    assert raw is not None
    depth_rows: dict[int, int] = defaultdict(lambda: 1)
    for lane, depth in zip(raw.lane, raw.depth, strict=True):
        depth_rows[lane] = max(depth_rows[lane], min(depth + 1, MAX_DEPTH_ROWS))
    by_cat: dict[str, dict[str, list[Any]]] = {}
    for i, cat in enumerate(raw.category):
        t = by_cat.setdefault(cat, {"base": [], "x": [], "y": [], "width": [], "text": [], "cd": []})
        lane = raw.lane[i]
        rows = depth_rows[lane]
        row = min(raw.depth[i], rows - 1)
        height = 0.84 / rows
        t["base"].append(raw.start_ms[i])
        t["x"].append(max(raw.dur_ms[i], 0.0))
        t["y"].append(round(lane - 0.42 + (row + 0.5) * height, 4))
        t["width"].append(round(height * 0.92, 4))
        args = raw.args[i]
        args = f"<br>{esc(args, 80)}" if args and args != "{}" else ""
        step = f", step {raw.step[i]}" if raw.step[i] is not None else ""
        t["text"].append(
            f"<b>{esc(raw.name[i], 80)}</b><br>{ms(raw.dur_ms[i])}, {esc(cat)}{step}, "
            f"at {raw.start_ms[i]:.3f}{args}"
        )
        t["cd"].append([raw.rank[i], raw.idx[i]])
    traces = []
    for cat, t in sorted(by_cat.items()):
        traces.append({
            "type": "bar", "orientation": "h", "name": esc(cat),
            "base": t["base"], "x": t["x"], "y": t["y"], "width": t["width"],
            "marker": {"color": CATEGORY_COLORS.get(cat, "#999"), "line": {"width": 0}},
            "hovertext": t["text"], "hoverinfo": "text", "customdata": t["cd"],
        })
    return traces


def _heatmap(data: TimelineData) -> dict[str, Any]:
    agg = data.aggregate
    assert agg is not None
    x0 = agg.centers_ms[0] if agg.centers_ms else data.t0_ms
    return {
        "type": "heatmap", "name": "busy share",
        "x0": x0, "dx": agg.bin_ms, "y": list(range(len(data.lanes))),
        "z": agg.busy, "customdata": agg.count,
        "zmin": 0, "zmax": 1, "hoverongaps": False,
        "colorscale": [[0, "#dbe7f3"], [0.5, "#6b9bd1"], [1, "#08306b"]],
        "colorbar": {"title": {"text": "busy"}, "tickformat": ".0%", "thickness": 12, "len": 0.6},
        "hovertemplate": (
            "t ≈ %{x:.3f} ms<br>busy %{z:.0%} of the bin<br>%{customdata} events start here"
            "<extra>lane %{y}</extra>"
        ),
    }


def _links_trace(data: TimelineData) -> dict[str, Any]:
    xs: list[float | None] = []
    ys: list[float | None] = []
    text: list[str | None] = []
    for link in data.links:
        first = min(link.start_ms)
        for lane, start, rank in zip(link.lanes, link.start_ms, link.ranks, strict=True):
            xs.append(start)
            ys.append(lane)
            text.append(f"{esc(link.label)}<br>rank {rank} arrives {ms(start - first)} after the first")
        xs.append(None)
        ys.append(None)
        text.append(None)
    return {
        "type": "scatter", "mode": "lines+markers", "name": "collective matches",
        "x": xs, "y": ys, "hovertext": text, "hoverinfo": "text",
        "line": {"color": "rgba(200,60,60,0.55)", "width": 1},
        "marker": {"size": 4, "color": "rgba(200,60,60,0.8)"},
    }


def timeline_status(data: TimelineData) -> str:
    """One line saying what the figure shows: raw events or aggregates, and how to get more."""
    from tracelab.views.timeline import RAW_EVENT_LIMIT

    window = f"{ms(data.t1_ms - data.t0_ms)} window"
    if data.mode == "empty":
        return f"No events in this {window}."
    if data.mode == "raw":
        s = f"Showing all {data.visible_events:,} events in this {window}."
    else:
        agg = data.aggregate
        assert agg is not None
        s = (
            f"Showing aggregates: {data.visible_events:,} events in this {window} are binned "
            f"into {len(agg.centers_ms)} bins of {ms(agg.bin_ms)} per lane (color = busy share). "
            f"Zoom in below {RAW_EVENT_LIMIT:,} events to see individual events."
        )
    if data.links_cut:
        s += " Zoom in to see collectives matched across ranks."
    elif data.links:
        s += f" {len(data.links)} collectives matched across ranks (red lines)."
    if data.offset_source == "none" and len({lane.rank for lane in data.lanes}) > 1:
        s += " Clocks are not aligned (no offsets measured or estimated)."
    return s
