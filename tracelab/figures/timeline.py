"""The timeline figure: per rank a "time" lane (what its time was: the lost-time model's parts)
above its thread and stream lanes; ms since run start on x.

- The time lane draws time_parts: each segment a bar coloured by its part (compute, transfer,
  wait, pipeline, host, idle) when few are visible; otherwise per bin a stacked column of the
  parts' shares (a heatmap of PART_SUBROWS sub-rows, so it costs one image whatever the zoom).
- Event lanes, zoomed in: one bar per event, named, nested host ops in sub-rows tall enough to
  read. Zoomed out: per bin, the colour of what the lane was busiest with, shaded by how busy.
- Collective matches are a line through each rank's arrival.

Only SVG/canvas traces (no WebGL), so the figure draws in any browser, headless ones included.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from tracelab.figures import CATEGORY_COLORS, Figure, base_layout, empty_figure, esc, ms
from tracelab.views.timeline import EVENT_GROUPS, PART_SUBROWS, TIME_PARTS, TimelineData
from tracelab.vocabulary import PART_COLORS, PART_LABELS

#: Sub-rows a lane is split into for nested events; deeper events share the last one.
MAX_DEPTH_ROWS = 6
#: Pixels per y unit (one event lane without nesting).
LANE_PX = 26
#: Height (y units) of one nested row, and of a rank's time lane.
ROW_UNITS = 0.72
TIME_LANE_UNITS = 1.5

#: Colours and names of the lost-time parts (tracelab.vocabulary), shared with the Overview
#: and the Pipeline.
PART_NAMES = {p: PART_LABELS[p] for p in TIME_PARTS}
GROUP_COLORS = {
    "compute": "#4C78A8",
    "communication": "#F58518",
    "memcpy": "#54A24B",
    "host ops": "#72B7B2",
    "annotations": "#9D9D9D",
}
#: Left and right margins of the plot, px (the lane labels need the left one).
MARGIN_L_PX, MARGIN_R_PX = 250, 20
#: Height of plotly's toolbar (the modebar, top right of the figure), px: the legend starts
#: below it (a legend of six entries ran under it at 1600 px), in a top margin with room for
#: a second row of entries above the step labels.
MODEBAR_PX, MARGIN_T_PX = 32, 100
#: Width of one character of a bar's 10 px name, px (Open Sans averages 0.55 em), and the
#: padding plotly keeps inside a bar. A bar gets as much of its name as fits, cut with "…", or
#: none below MIN_LABEL_CHARS: plotly measures every label it is given (a zoom to 800 events
#: spent 0.4 s of its 1 s there), and hides the ones that do not fit anyway.
CHAR_PX, LABEL_PAD_PX, MIN_LABEL_CHARS = 5.5, 6.0, 4
#: Categories whose bars are dark enough for white names.
_DARK = {"compute", "communication", "memcpy", "sync", "runtime"}


@dataclass(frozen=True)
class _Row:
    """A lane's place on the y axis: [y0, y0 + h), and its label."""

    y0: float
    h: float
    label: str
    bold: bool = False


def _tint(hex_color: str, amount: float) -> str:
    """The colour mixed with white (amount 0: white, 1: the colour)."""
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    mix = [round(255 - (255 - c) * amount) for c in (r, g, b)]
    return f"rgb({mix[0]},{mix[1]},{mix[2]})"


def _geometry(data: TimelineData) -> tuple[dict[int, _Row], dict[int, _Row], dict[int, int], float]:
    """y rows of the time lanes (by rank) and the event lanes (by index), each lane's sub-rows,
    and the total height in y units. Ranks in lane order; a rank's time lane comes first."""
    depth_rows: dict[int, int] = defaultdict(lambda: 1)
    if data.mode == "raw" and data.raw is not None:
        for lane, depth in zip(data.raw.lane, data.raw.depth, strict=True):
            depth_rows[lane] = max(depth_rows[lane], min(depth + 1, MAX_DEPTH_ROWS))
    parts_ranks = set(data.parts.ranks)
    time_rows: dict[int, _Row] = {}
    lane_rows: dict[int, _Row] = {}
    y = 0.0
    order = [ln.rank for ln in data.lanes]
    for r in sorted(parts_ranks - set(order)):
        order.append(r)
    seen: set[int] = set()
    for rank in order:
        if rank in seen:
            continue
        seen.add(rank)
        if rank in parts_ranks:
            time_rows[rank] = _Row(y, TIME_LANE_UNITS, f"r{rank} · where the time went", True)
            y += TIME_LANE_UNITS
        for ln in data.lanes:
            if ln.rank != rank:
                continue
            rows = depth_rows[ln.index] if data.mode == "raw" else 1
            h = max(1.0, ROW_UNITS * rows + 0.28)
            lane_rows[ln.index] = _Row(y, h, ln.label, ln.main)
            y += h
    return time_rows, lane_rows, dict(depth_rows), y


def timeline_figure(data: TimelineData, title: str = "") -> Figure:
    """The figure for `data` (see tracelab.views.timeline.timeline)."""
    if data.mode == "empty" and data.parts.mode == "none":
        return empty_figure(
            "No events in this window with these filters. Zoom out or clear filters."
        )
    time_rows, lane_rows, depth_rows, total = _geometry(data)
    traces: list[dict[str, Any]] = []
    traces += _parts_traces(data, time_rows)
    if data.mode == "raw" and data.raw is not None:
        traces += _raw_traces(data, lane_rows, depth_rows)
    elif data.aggregate is not None:
        traces += _heatmaps(data, lane_rows)
    if data.links:
        traces.append(_links_trace(data, lane_rows))
    rows = sorted([*time_rows.values(), *lane_rows.values()], key=lambda r: r.y0)
    separators = [
        {
            "type": "line",
            "xref": "paper",
            "x0": 0,
            "x1": 1,
            "y0": r.y0,
            "y1": r.y0,
            "line": {"color": "#9aa5b1" if r.bold else "#e3e3e3", "width": 1},
            "layer": "above",
        }
        for r in rows[1:]
    ]
    shapes, notes = [], []
    for step, start, _end in data.steps:
        if data.t0_ms <= start <= data.t1_ms:
            shapes.append(
                {
                    "type": "line",
                    "x0": start,
                    "x1": start,
                    "y0": 0,
                    "y1": 1,
                    "yref": "paper",
                    "line": {"color": "#777", "width": 1, "dash": "dot"},
                    "layer": "above",
                }
            )
            notes.append(
                {
                    "x": start,
                    "y": 1,
                    "yref": "paper",
                    "yanchor": "bottom",
                    "xanchor": "left",
                    "text": f"step {int(step)}",
                    "showarrow": False,
                    "font": {"size": 10, "color": "#555"},
                }
            )
    ticktext = [f"<b>{esc(r.label, 60)}</b>" if r.bold else esc(r.label, 60) for r in rows]
    layout = base_layout(
        title=title,
        height=_height(total),
        xaxis={
            "title": {"text": "time since run start (ms, aligned clock)"},
            "range": [data.t0_ms, data.t1_ms],
            "showgrid": True,
            "gridcolor": "#eee",
            "zeroline": False,
        },
        yaxis={
            "tickmode": "array",
            "tickvals": [round(r.y0 + r.h / 2, 4) for r in rows],
            "ticktext": ticktext,
            "range": [total, 0],
            "fixedrange": True,
            "showgrid": False,
            "zeroline": False,
            "automargin": True,
        },
        barmode="overlay",
        bargap=0,
        shapes=separators + shapes,
        annotations=notes,
        legend={
            "orientation": "h",
            "x": 0,
            "xanchor": "left",
            "yref": "container",
            "y": 1 - MODEBAR_PX / _height(total),
            "yanchor": "top",
            "font": {"size": 11},
            "traceorder": "normal",
        },
        hovermode="closest",
        dragmode="zoom",
        uirevision=None,
        uniformtext={"minsize": 9, "mode": "hide"},
    )
    layout["margin"].update(l=MARGIN_L_PX, r=MARGIN_R_PX, t=max(layout["margin"]["t"], MARGIN_T_PX))
    return {"data": traces, "layout": layout}


def _height(total: float) -> int:
    """The figure's height, px, for `total` y units of lanes (the margins included)."""
    return max(300, 136 + int(LANE_PX * total))


def _px_per_ms(data: TimelineData) -> float:
    return max(data.width_px - MARGIN_L_PX - MARGIN_R_PX, 100) / max(data.t1_ms - data.t0_ms, 1e-9)


def fitted_label(text: str, bar_px: float, limit: int = 48) -> str:
    """As much of `text` as fits a bar `bar_px` wide (escaped, cut with "…"), or ""."""
    chars = min(limit, int((bar_px - LABEL_PAD_PX) / CHAR_PX))
    return esc(text, chars) if chars >= min(MIN_LABEL_CHARS, len(text)) and chars > 0 else ""


def _legend(name: str, color: str, group: str) -> dict[str, Any]:
    """A legend entry alone (heatmaps have none)."""
    return {
        "type": "scatter",
        "mode": "markers",
        "x": [None],
        "y": [None],
        "name": name,
        "legendgroup": group,
        "marker": {"color": color, "size": 11, "symbol": "square"},
        "hoverinfo": "skip",
    }


def _parts_traces(data: TimelineData, rows: dict[int, _Row]) -> list[dict[str, Any]]:
    parts = data.parts
    px = _px_per_ms(data)
    if parts.mode == "segments":
        by_part: dict[str, dict[str, list[Any]]] = {}
        for rank, s, e, part in parts.segments:
            row = rows.get(rank)
            if row is None:
                continue
            t = by_part.setdefault(part, {"base": [], "x": [], "y": [], "text": [], "hover": []})
            lo, hi = max(s, data.t0_ms), min(e, data.t1_ms)
            t["base"].append(lo)
            t["x"].append(max(hi - lo, 0.0))
            t["y"].append(round(row.y0 + row.h / 2, 4))
            t["text"].append(fitted_label(f"{part} {ms(e - s)}", (hi - lo) * px))
            t["hover"].append(
                f"rank {rank}: <b>{esc(PART_NAMES.get(part, part))}</b> "
                f"{ms(e - s)}<br>{s:.3f} → {e:.3f} ms"
            )
        out = []
        for part in TIME_PARTS:
            t = by_part.get(part)  # type: ignore[assignment]
            if t is None:
                continue
            out.append(
                {
                    "type": "bar",
                    "orientation": "h",
                    "name": f"time: {esc(PART_NAMES.get(part, part))}",
                    "legendgroup": "time",
                    "base": t["base"],
                    "x": t["x"],
                    "y": t["y"],
                    "width": TIME_LANE_UNITS * 0.86,
                    "text": t["text"],
                    "textposition": "inside",
                    "insidetextanchor": "middle",
                    "textangle": 0,
                    "textfont": {
                        "size": 10,
                        "color": "#111" if part in ("host", "idle") else "white",
                    },
                    "marker": {"color": PART_COLORS[part], "line": {"width": 0}},
                    "hovertext": t["hover"],
                    "hoverinfo": "text",
                }
            )
        return out
    if parts.mode != "bins":
        return []
    n = len(TIME_PARTS)
    scale: list[list[Any]] = []
    for k, part in enumerate(TIME_PARTS):
        scale += [[k / n, PART_COLORS[part]], [(k + 1) / n, PART_COLORS[part]]]
    out = []
    present: set[int] = set()
    for rank, grid in parts.stack.items():
        row = rows.get(rank)
        if row is None:
            continue
        sub = row.h * 0.9 / PART_SUBROWS
        ys = [round(row.y0 + row.h * 0.95 - (j + 0.5) * sub, 4) for j in range(PART_SUBROWS)]
        z = [[None if v is None else v + 0.5 for v in line] for line in grid]
        present |= {v for line in grid for v in line if v is not None}
        shares = parts.window_share.get(rank, {})
        summary = ", ".join(
            f"{p} {100 * v:.0f}%"
            for p, v in sorted(shares.items(), key=lambda kv: -kv[1])
            if v >= 0.01
        )
        out.append(
            {
                "type": "heatmap",
                "name": f"rank {rank} time",
                "x0": parts.centers_ms[0] if parts.centers_ms else data.t0_ms,
                "dx": parts.bin_ms,
                "y": ys,
                "z": z,
                "zmin": 0,
                "zmax": n,
                "colorscale": scale,
                "showscale": False,
                "hoverongaps": False,
                "hovertemplate": f"rank {rank}, t ≈ %{{x:.3f}} ms<br>in this window: "
                f"{esc(summary)}<extra></extra>",
            }
        )
    out += [
        _legend(f"time: {PART_NAMES[p]}", PART_COLORS[p], "time")
        for k, p in enumerate(TIME_PARTS)
        if k in present
    ]
    return out


def _raw_traces(
    data: TimelineData, rows: dict[int, _Row], depth_rows: dict[int, int]
) -> list[dict[str, Any]]:
    raw = data.raw
    assert raw is not None
    by_cat: dict[str, dict[str, list[Any]]] = {}
    px = _px_per_ms(data)
    for i, cat in enumerate(raw.category):
        lane = raw.lane[i]
        row = rows.get(lane)
        if row is None:
            continue
        t = by_cat.setdefault(
            cat, {"base": [], "x": [], "y": [], "width": [], "text": [], "hover": [], "cd": []}
        )
        n = depth_rows.get(lane, 1)
        sub = min(raw.depth[i], n - 1)
        rh = (row.h - 0.2) / n
        # Clipped to the window, so that the name of a long event shows at the window's edge.
        lo = max(raw.start_ms[i], data.t0_ms)
        hi = min(raw.start_ms[i] + raw.dur_ms[i], data.t1_ms)
        t["base"].append(round(lo, 6))
        t["x"].append(max(hi - lo, 0.0))
        t["y"].append(round(row.y0 + 0.1 + (sub + 0.5) * rh, 4))
        t["width"].append(round(rh * 0.9, 4))
        t["text"].append(fitted_label(raw.name[i], (hi - lo) * px))
        args = raw.args[i]
        args = f"<br>{esc(args, 80)}" if args and args != "{}" else ""
        step = f", step {raw.step[i]}" if raw.step[i] is not None else ""
        t["hover"].append(
            f"<b>{esc(raw.name[i], 80)}</b><br>{ms(raw.dur_ms[i])}, {esc(cat)}{step}, "
            f"at {raw.start_ms[i]:.3f}{args}"
        )
        t["cd"].append([raw.rank[i], raw.idx[i]])
    traces = []
    for cat, t in sorted(by_cat.items()):
        traces.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": esc(cat),
                "legendgroup": "events",
                "base": t["base"],
                "x": t["x"],
                "y": t["y"],
                "width": t["width"],
                "text": t["text"],
                "textposition": "inside",
                "insidetextanchor": "start",
                "textangle": 0,
                "textfont": {"size": 10, "color": "white" if cat in _DARK else "#111"},
                "constraintext": "inside",
                "cliponaxis": True,
                "marker": {
                    "color": CATEGORY_COLORS.get(cat, "#999"),
                    "line": {"color": "white", "width": 0.5},
                },
                "hovertext": t["hover"],
                "hoverinfo": "text",
                "customdata": t["cd"],
            }
        )
    return traces


def _heatmaps(data: TimelineData, rows: dict[int, _Row]) -> list[dict[str, Any]]:
    """Per rank one heatmap of its event lanes: the colour of what each bin was busiest with,
    shaded from light (barely busy) to full (busy the whole bin)."""
    agg = data.aggregate
    assert agg is not None
    g = len(EVENT_GROUPS)
    scale: list[list[Any]] = []
    for k, name in enumerate(EVENT_GROUPS):
        scale += [
            [k / g, _tint(GROUP_COLORS[name], 0.12)],
            [(k + 1) / g - (1e-6 if k + 1 < g else 0), GROUP_COLORS[name]],
        ]
    x0 = agg.centers_ms[0] if agg.centers_ms else data.t0_ms
    by_rank: dict[int, list[int]] = defaultdict(list)
    for ln in data.lanes:
        by_rank[ln.rank].append(ln.index)
    out = []
    present: set[int] = set()
    for rank, idxs in by_rank.items():
        z, cd = [], []
        for i in idxs:
            busy, grp = agg.busy[i], agg.group[i] if agg.group else [None] * len(agg.busy[i])
            z.append(
                [
                    None if b is None or gi is None else round(gi + 0.12 + 0.87 * b, 3)
                    for b, gi in zip(busy, grp, strict=True)
                ]
            )
            present |= {gi for gi in grp if gi is not None}
            cd.append(agg.count[i])
        out.append(
            {
                "type": "heatmap",
                "name": f"rank {rank} events",
                "x0": x0,
                "dx": agg.bin_ms,
                "y": [round(rows[i].y0 + rows[i].h / 2, 4) for i in idxs],
                "z": z,
                "customdata": cd,
                "zmin": 0,
                "zmax": g,
                "colorscale": scale,
                "showscale": False,
                "hoverongaps": False,
                "hovertemplate": (
                    "t ≈ %{x:.3f} ms<br>%{customdata} events start here"
                    "<extra>colour: busiest with · shade: busy share</extra>"
                ),
            }
        )
    out += [
        _legend(f"busy: {name}", GROUP_COLORS[name], "events")
        for k, name in enumerate(EVENT_GROUPS)
        if k in present
    ]
    return out


def _links_trace(data: TimelineData, rows: dict[int, _Row]) -> dict[str, Any]:
    xs: list[float | None] = []
    ys: list[float | None] = []
    text: list[str | None] = []
    for link in data.links:
        first = min(link.start_ms)
        for lane, start, rank in zip(link.lanes, link.start_ms, link.ranks, strict=True):
            row = rows.get(lane)
            if row is None:
                continue
            xs.append(start)
            ys.append(round(row.y0 + row.h / 2, 4))
            text.append(
                f"{esc(link.label)}<br>rank {rank} arrives {ms(start - first)} after the first"
            )
        xs.append(None)
        ys.append(None)
        text.append(None)
    return {
        "type": "scatter",
        "mode": "lines+markers",
        "name": "collective matches",
        "x": xs,
        "y": ys,
        "hovertext": text,
        "hoverinfo": "text",
        "line": {"color": "rgba(160,30,30,0.6)", "width": 1},
        "marker": {"size": 4, "color": "rgba(160,30,30,0.85)"},
    }


def timeline_status(data: TimelineData) -> str:
    """One line saying what the figure shows: raw events or aggregates, and how to get more."""
    from tracelab.views.timeline import RAW_EVENT_LIMIT

    window = f"{ms(data.t1_ms - data.t0_ms)} window"
    if data.mode == "empty":
        s = f"No events in this {window}."
    elif data.mode == "raw":
        s = f"Showing all {data.visible_events:,} events in this {window}, named where they fit."
    else:
        agg = data.aggregate
        assert agg is not None
        s = (
            f"Showing aggregates: {data.visible_events:,} events in this {window} are binned "
            f"into {len(agg.centers_ms)} bins of {ms(agg.bin_ms)} per lane (colour = what the "
            f"lane was busiest with, shade = how busy). Zoom in below {RAW_EVENT_LIMIT:,} events "
            "to see individual events."
        )
    if data.parts.mode != "none":
        s += (
            " Each rank's first lane is where its time went (the lost-time model: compute, "
            "communication, waiting, pipeline, host, idle)"
            + (", stacked shares per bin." if data.parts.mode == "bins" else ".")
        )
    if data.links_cut:
        s += " Zoom in to see collectives matched across ranks."
    elif data.links:
        s += f" {len(data.links)} collectives matched across ranks (red lines)."
    if data.offset_source == "none" and len({lane.rank for lane in data.lanes}) > 1:
        s += " Clocks are not aligned (no offsets measured or estimated)."
    return s
