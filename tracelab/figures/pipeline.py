"""Pipeline figures: the schedule per rank/stage (F/B/W by microbatch, bubbles shaded) and the
bubble shares against what the schedule predicts."""

from __future__ import annotations

from typing import Any

from tracelab.figures import Figure, base_layout, empty_figure, esc
from tracelab.views.pipeline import PipelineView

KIND_COLORS = {
    "F": "#4C78A8", "B": "#E45756", "I": "#F58518", "W": "#54A24B",
    "SEND_F": "#BAB0AC", "RECV_F": "#BAB0AC", "SEND_B": "#9D755D", "RECV_B": "#9D755D",
}
KIND_NAMES = {"F": "forward", "B": "backward", "I": "input-grad backward", "W": "weight-grad"}


def schedule_figure(v: PipelineView) -> Figure:
    """One lane per rank: each action a bar labelled with its microbatch; idle time shaded."""
    if not v.available or not v.actions:
        return empty_figure(v.note or "No pipeline actions to draw.")
    ranks = sorted({a["rank"] for a in v.actions})
    by_kind: dict[str, dict[str, list[Any]]] = {}
    for a in v.actions:
        t = by_kind.setdefault(a["kind"], {"base": [], "x": [], "y": [], "text": [], "hover": []})
        t["base"].append(a["start_ms"])
        t["x"].append(max(a["end_ms"] - a["start_ms"], 0.0))
        t["y"].append(f"rank {a['rank']}")
        mb = "" if a["mb"] is None else str(a["mb"])
        t["text"].append(f"{esc(a['kind'])}{mb}")
        t["hover"].append(
            f"{esc(KIND_NAMES.get(a['kind'], a['kind']))} mb {mb or '?'} · stage {a['stage']}"
            f"<br>{a['start_ms']:.3f} → {a['end_ms']:.3f} ms"
            + (f"<br>compute {a['busy_ms']:.3f} ms" if isinstance(a["busy_ms"], (int, float)) else ""))
    traces: list[dict[str, Any]] = []
    if v.window_ms:
        traces.append(_bubbles(v, ranks))
    for kind, t in sorted(by_kind.items()):
        traces.append({
            "type": "bar", "orientation": "h", "name": esc(KIND_NAMES.get(kind, kind)),
            "base": t["base"], "x": t["x"], "y": t["y"], "text": t["text"],
            "textposition": "inside", "insidetextanchor": "middle",
            "marker": {"color": KIND_COLORS.get(kind, "#72B7B2"),
                       "line": {"color": "white", "width": 1}},
            "hovertext": t["hover"], "hoverinfo": "text",
        })
    return {
        "data": traces,
        "layout": base_layout(
            title=f"Schedule of step {v.step} (bubbles shaded)", height=140 + 48 * len(ranks),
            barmode="overlay", bargap=0.25,
            xaxis={"title": {"text": "time since run start (ms, aligned clock)"},
                   "range": list(v.window_ms) if v.window_ms else None},
            yaxis={"type": "category", "categoryorder": "array",
                   "categoryarray": [f"rank {r}" for r in ranks], "autorange": "reversed"},
            legend={"orientation": "h", "y": -0.25}, uniformtext={"minsize": 8, "mode": "hide"},
        ),
    }


def _bubbles(v: PipelineView, ranks: list[int]) -> dict[str, Any]:
    """Idle gaps of each rank inside the step window, as light bars behind the actions."""
    assert v.window_ms is not None
    w0, w1 = v.window_ms
    base, xs, ys, hover = [], [], [], []
    for rank in ranks:
        spans = sorted((a["start_ms"], a["end_ms"]) for a in v.actions if a["rank"] == rank)
        cursor = w0
        for s, e in spans + [(w1, w1)]:
            if s > cursor:
                base.append(cursor)
                xs.append(s - cursor)
                ys.append(f"rank {rank}")
                hover.append(f"bubble: {s - cursor:.3f} ms idle")
            cursor = max(cursor, e)
    return {"type": "bar", "orientation": "h", "name": "bubble (idle)", "base": base, "x": xs,
            "y": ys, "marker": {"color": "rgba(228,87,86,0.15)", "line": {"width": 0}},
            "hovertext": hover, "hoverinfo": "text", "width": 0.9}


def bubble_figure(v: PipelineView) -> Figure:
    """Per rank: measured bubble share split into leading/internal/trailing, with the schedule's
    textbook prediction and the inherent share (replay with the measured op times) as lines."""
    if not v.available or not v.stages:
        return empty_figure(v.note or "No pipeline stages.")
    labels = [f"rank {s['rank']}" for s in v.stages]
    traces: list[dict[str, Any]] = []
    for part, color in (("leading", "#F58518"), ("internal", "#E45756"), ("trailing", "#B279A2")):
        ys = [(s.get(f"{part}_ms") or 0) / s["window_ms"] if s.get("window_ms") else None
              for s in v.stages]
        traces.append({"type": "bar", "name": f"{part} idle", "x": labels, "y": ys,
                       "marker": {"color": color},
                       "hovertemplate": f"%{{x}}: {part} idle %{{y:.1%}} of the step<extra></extra>"})
    inherent = [(s.get("inherent_idle_ms") or 0) / s["window_ms"] if s.get("window_ms") else None
                for s in v.stages]
    traces.append({"type": "scatter", "mode": "markers+lines", "name": "inherent (replay)",
                   "x": labels, "y": inherent, "line": {"dash": "dot", "color": "#333"},
                   "hovertemplate": "%{x}: inherent bubble %{y:.1%}<extra></extra>"})
    textbook = v.metrics.get("textbook_bubble_share")
    shapes = []
    if isinstance(textbook, (int, float)):
        shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": textbook,
                       "y1": textbook, "line": {"color": "#4C78A8", "dash": "dash", "width": 2}})
        traces.append({"type": "scatter", "mode": "lines", "name":
                       f"schedule prediction {textbook:.1%} ({esc(v.metrics.get('schedule'))})",
                       "x": [None], "y": [None], "line": {"color": "#4C78A8", "dash": "dash"}})
    return {
        "data": traces,
        "layout": base_layout(
            title="Bubble share per rank (idle / step window, median over steps)",
            height=360, barmode="stack", shapes=shapes,
            yaxis={"tickformat": ".0%", "title": {"text": "share of the step"}},
            legend={"orientation": "h", "y": -0.25},
        ),
    }
