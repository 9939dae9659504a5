"""Overview figures: the step-time heatmap and the per-rank time breakdown."""

from __future__ import annotations

from tracelab.figures import BREAKDOWN_COLORS, Figure, base_layout, empty_figure
from tracelab.views.overview import BREAKDOWN_PARTS, Breakdown, StepMatrix

PART_LABELS = {
    "compute_only": "compute",
    "overlapped_comm": "compute + overlapped comm",
    "exposed_comm": "exposed comm",
    "exposed_memcpy": "memcpy (exposed)",
    "idle": "idle",
}


def step_heatmap(m: StepMatrix) -> Figure:
    """Step time per rank (y) and step (x); hover gives the exact ms."""
    if not m.ranks or not m.steps:
        return empty_figure("No profiler steps in this run (ProfilerStep#N spans are missing).")
    title = "Step time per rank and step (ms)"
    if m.truncated:
        title += f" — first {len(m.ranks)} of {m.total_ranks} ranks, {len(m.steps)} of {m.total_steps} steps"
    return {
        "data": [{
            "type": "heatmap", "x": [str(s) for s in m.steps], "y": [str(r) for r in m.ranks],
            "z": m.ms, "colorscale": "YlOrRd", "hoverongaps": False,
            "colorbar": {"title": {"text": "ms"}, "thickness": 12},
            "hovertemplate": "rank %{y}, step %{x}: %{z:.3f} ms<extra></extra>",
            "xgap": 1, "ygap": 1,
        }],
        "layout": base_layout(
            title=title, height=min(640, 140 + 22 * len(m.ranks)),
            xaxis={"title": {"text": "step"}, "type": "category"},
            yaxis={"title": {"text": "rank"}, "type": "category", "autorange": "reversed"},
        ),
    }


def breakdown_bars(b: Breakdown | None) -> Figure:
    """Stacked bars per rank: compute, exposed comm, overlapped comm, memcpy, idle (ms)."""
    if b is None:
        return empty_figure("No time breakdown: the breakdown analyzer found no steps to split.")
    traces = []
    for part in BREAKDOWN_PARTS:
        values = b.parts.get(part)
        if not values or all(v is None for v in values):
            continue
        traces.append({
            "type": "bar", "orientation": "h", "name": PART_LABELS[part],
            "y": [f"rank {r}" for r in b.ranks], "x": values,
            "marker": {"color": BREAKDOWN_COLORS.get(part.replace("_only", ""), "#999")},
            "hovertemplate": f"%{{y}}: {PART_LABELS[part]} %{{x:.3f}} ms<extra></extra>",
        })
    return {
        "data": traces,
        "layout": base_layout(
            title="Time breakdown per rank (ms over the profiled steps; the parts add up to "
                  "each rank's window)",
            height=min(700, 160 + 26 * len(b.ranks)), barmode="stack",
            xaxis={"title": {"text": "ms"}}, yaxis={"autorange": "reversed", "type": "category"},
            legend={"orientation": "h", "y": -0.2},
        ),
    }
