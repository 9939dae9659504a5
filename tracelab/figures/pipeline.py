"""Pipeline figures: the schedule of one step per rank (each action's span outlined and labelled
with its stage and microbatch, the compute inside it filled in its kind's colour, waiting in
the lost-time model's colours, never an action's), and the pipeline idle split into the bubble
the schedule needs and the stall beyond it."""

from __future__ import annotations

from typing import Any

from tracelab.figures import Figure, base_layout, empty_figure, esc, ms
from tracelab.figures.timeline import PART_NAMES
from tracelab.views.pipeline import PipelineView
from tracelab.vocabulary import PART_COLORS, PART_SHORT_LABELS, STEP_PARTS

#: Action kinds: forward, full backward, input-grad and weight-grad backward. None of these is
#: a lost-time colour (waiting is drawn in PART_COLORS, idle in grey).
KIND_COLORS = {"F": "#1f77b4", "B": "#2ca02c", "I": "#17becf", "W": "#8c564b"}
KIND_NAMES = {"F": "forward", "B": "backward", "I": "input-grad backward", "W": "weight-grad"}
OTHER_COMPUTE = "#7f7f7f"


def _kind_color(kind: str | None) -> str:
    return KIND_COLORS.get(kind or "", OTHER_COMPUTE)


def _action_label(a: dict[str, Any], multi_stage: bool) -> str:
    mb = "" if a.get("mb") is None else str(a["mb"])
    stage = f"s{a['stage']}" if multi_stage and a.get("stage") is not None else ""
    return f"{esc(a['kind'])}{mb}" + (f"·{stage}" if stage else "")


def schedule_figure(v: PipelineView) -> Figure:
    """One lane per rank: waiting (pipeline, transfer, host) as light bars behind, each action's
    span outlined and labelled (kind, microbatch, and the stage when a rank holds several), the
    compute inside it solid in its kind's colour."""
    if not v.available or not v.actions:
        return empty_figure(v.note or "No pipeline actions to draw.")
    ranks = sorted({a["rank"] for a in v.actions})
    stages_per_rank = {r: {a["stage"] for a in v.actions if a["rank"] == r} for r in ranks}
    multi = any(len(s) > 1 for s in stages_per_rank.values())
    ylab = {
        r: f"rank {r} (stage{'s' if len(stages_per_rank[r]) > 1 else ''} "
        f"{', '.join(str(s) for s in sorted(x for x in stages_per_rank[r] if x is not None))})"
        for r in ranks
    }
    cats = [ylab[r] for r in ranks]
    traces: list[dict[str, Any]] = []
    # Waiting, by part: under everything.
    by_part: dict[str, dict[str, list[Any]]] = {}
    for w in v.waiting:
        if w["rank"] not in ylab:
            continue
        t = by_part.setdefault(w["part"], {"base": [], "x": [], "y": [], "hover": []})
        t["base"].append(w["start_ms"])
        t["x"].append(max(w["end_ms"] - w["start_ms"], 0.0))
        t["y"].append(ylab[w["rank"]])
        t["hover"].append(
            f"{esc(PART_NAMES.get(w['part'], w['part']))}: {ms(w['end_ms'] - w['start_ms'])}"
        )
    for part in ("pipeline", "transfer", "wait", "host"):
        t = by_part.get(part)  # type: ignore[assignment]
        if not t:
            continue
        traces.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": esc(PART_NAMES.get(part, part)),
                "base": t["base"],
                "x": t["x"],
                "y": t["y"],
                "width": 0.8,
                "opacity": 0.55,
                "marker": {"color": PART_COLORS[part], "line": {"width": 0}},
                "hovertext": t["hover"],
                "hoverinfo": "text",
                "legendgroup": "wait",
            }
        )
    # Compute segments, by the kind of the action they fall in.
    by_kind: dict[str | None, dict[str, list[Any]]] = {}
    for c in v.compute:
        if c["rank"] not in ylab:
            continue
        t = by_kind.setdefault(c.get("kind"), {"base": [], "x": [], "y": [], "hover": []})
        t["base"].append(c["start_ms"])
        t["x"].append(max(c["end_ms"] - c["start_ms"], 0.0))
        t["y"].append(ylab[c["rank"]])
        t["hover"].append(
            f"compute {ms(c['end_ms'] - c['start_ms'])}"
            + (
                f" in {esc(c['kind'])}{c.get('mb', '')} (stage {c.get('stage')})"
                if c.get("kind")
                else " outside any action"
            )
        )
    for kind, t in sorted(by_kind.items(), key=lambda kv: str(kv[0])):
        traces.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": f"{esc(KIND_NAMES.get(kind or '', kind or 'other'))} compute",
                "base": t["base"],
                "x": t["x"],
                "y": t["y"],
                "width": 0.5,
                "marker": {"color": _kind_color(kind), "line": {"width": 0}},
                "hovertext": t["hover"],
                "hoverinfo": "text",
                "legendgroup": "compute",
            }
        )
    # Action spans: outlines with labels, on top.
    spans: dict[str, dict[str, list[Any]]] = {}
    for a in v.actions:
        t = spans.setdefault(a["kind"], {"base": [], "x": [], "y": [], "text": [], "hover": []})
        t["base"].append(a["start_ms"])
        t["x"].append(max(a["end_ms"] - a["start_ms"], 0.0))
        t["y"].append(ylab[a["rank"]])
        t["text"].append(_action_label(a, multi))
        span_ns = max(a["end_ms"] - a["start_ms"], 0.0) * 1e6
        share = a["busy_ns"] / span_ns if span_ns else 0.0
        t["hover"].append(
            f"<b>{esc(KIND_NAMES.get(a['kind'], a['kind']))}</b> microbatch {a.get('mb')}, "
            f"stage {a.get('stage')}<br>span {ms(span_ns / 1e6)}: compute "
            f"{ms(a['busy_ns'] / 1e6)} ({100 * share:.0f}%), waiting {ms(a['wait_ns'] / 1e6)}"
            f"<br>{a['start_ms']:.3f} → {a['end_ms']:.3f} ms"
        )
    for kind, t in sorted(spans.items()):
        traces.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": f"{esc(KIND_NAMES.get(kind, kind))} span",
                "base": t["base"],
                "x": t["x"],
                "y": t["y"],
                "width": 0.8,
                "text": t["text"],
                "textposition": "inside",
                "insidetextanchor": "middle",
                "textangle": 0,
                "textfont": {"size": 10, "color": "#111"},
                "marker": {
                    "color": "rgba(255,255,255,0)",
                    "line": {"color": _kind_color(kind), "width": 1.5},
                },
                "hovertext": t["hover"],
                "hoverinfo": "text",
                "legendgroup": "span",
                "showlegend": False,
            }
        )
    cut = " (first actions only)" if v.actions_cut else ""
    return {
        "data": traces,
        "layout": base_layout(
            title=f"Schedule of step {v.step}{cut}: outlined = an action's span (kind, "
            "microbatch), solid = compute inside it, shaded = waiting",
            height=170 + 56 * len(ranks),
            barmode="overlay",
            bargap=0.2,
            xaxis={
                "title": {"text": "time since run start (ms, aligned clock)"},
                "range": list(v.window_ms) if v.window_ms else None,
            },
            yaxis={
                "type": "category",
                "categoryorder": "array",
                "categoryarray": cats,
                "autorange": "reversed",
                "automargin": True,
            },
            legend={"orientation": "h", "y": -0.22},
            uniformtext={"minsize": 8, "mode": "hide"},
        ),
    }


#: The step's lost-time parts (step_parts, averaged over the steady steps by the pipeline
#: analyzer's stage rows) in stacking order: they tile the step, so each bar reaches 100%.
STEP_PART_BARS = tuple(
    ("sync_idle_ns" if p == "idle" else f"{p}_ns", p, PART_SHORT_LABELS[p]) for p in STEP_PARTS
)


def bubble_figure(v: PipelineView) -> Figure:
    """Per rank (steady steps): the step split into the lost-time parts (the Overview's), the
    bubble the schedule needs apart from the stall beyond it, with the schedule's textbook
    bubble as a line."""
    if not v.available or not v.stages:
        return empty_figure(v.note or "No pipeline stages.")
    labels = [f"rank {s['rank']}" for s in v.stages]
    traces: list[dict[str, Any]] = []
    for key, part, name in STEP_PART_BARS:
        ns = [float(s.get(key) or 0) for s in v.stages]
        if not any(ns):
            continue
        steps = [float(s.get("step_ns") or 0) for s in v.stages]
        traces.append(
            {
                "type": "bar",
                "name": name,
                "x": labels,
                "y": [n / d if d else None for n, d in zip(ns, steps, strict=True)],
                "customdata": [n / 1e6 for n in ns],
                "marker": {"color": PART_COLORS[part]},
                "hovertemplate": f"%{{x}}: {esc(name)} %{{customdata:.3g}} ms, %{{y:.1%}} of the "
                "step<extra></extra>",
            }
        )
    textbook = v.metrics.get("textbook_bubble_share")
    shapes = []
    if isinstance(textbook, (int, float)):
        shapes.append(
            {
                "type": "line",
                "xref": "paper",
                "x0": 0,
                "x1": 1,
                "y0": textbook,
                "y1": textbook,
                "line": {"color": "#333", "dash": "dash", "width": 2},
            }
        )
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": f"textbook bubble {textbook:.1%} ({esc(v.metrics.get('schedule'))})",
                "x": [None],
                "y": [None],
                "line": {"color": "#333", "dash": "dash"},
            }
        )
    return {
        "data": traces,
        "layout": base_layout(
            title="Per rank: the step split into its parts (steady steps); the pipeline idle is "
            "the bubble the schedule needs and the stall beyond it",
            height=360,
            barmode="stack",
            shapes=shapes,
            yaxis={
                "tickformat": ".0%",
                "title": {"text": "share of the step"},
                "range": [0, 1.02],
            },
            legend={"orientation": "h", "y": -0.25},
        ),
    }
