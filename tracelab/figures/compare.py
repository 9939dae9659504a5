"""Compare figures: step time distributions of two runs (box summaries and a shared histogram)."""

from __future__ import annotations

from tracelab.figures import Figure, base_layout, empty_figure, esc
from tracelab.views.compare import StepComparison

COLORS = ("#4C78A8", "#F58518")


def step_distributions(c: StepComparison, a_name: str, b_name: str) -> Figure:
    if not c.a.count and not c.b.count:
        return empty_figure("Neither run has profiler steps to compare.")
    traces = []
    centers = [e + c.width / 2 for e in c.edges]
    for dist, name, color in ((c.a, a_name, COLORS[0]), (c.b, b_name, COLORS[1])):
        if not dist.count:
            continue
        label = esc(name, 60)
        traces.append(
            {
                "type": "bar",
                "name": f"{label} (n={dist.count})",
                "x": centers,
                "y": dist.hist,
                "width": c.width * 0.95,
                "marker": {"color": color},
                "opacity": 0.6,
                "hovertemplate": f"{label}: %{{y}} steps around %{{x:.3f}} ms<extra></extra>",
            }
        )
        traces.append(
            {
                "type": "box",
                "name": label,
                "orientation": "h",
                "xaxis": "x",
                "yaxis": "y2",
                "q1": [dist.q1],
                "median": [dist.median],
                "q3": [dist.q3],
                "lowerfence": [dist.min],
                "upperfence": [dist.max],
                "mean": [dist.mean],
                "y": [label],
                "marker": {"color": color},
                "showlegend": False,
            }
        )
    return {
        "data": traces,
        "layout": base_layout(
            title="Step time distribution (every rank × step)",
            height=460,
            barmode="overlay",
            xaxis={"title": {"text": "step time (ms)"}},
            yaxis={"title": {"text": "steps"}, "domain": [0, 0.68]},
            # automargin: the run names are the box plots' labels ("ddp_slow_rank" was clipped to
            # "slow_rank" by the 60 px margin)
            yaxis2={"domain": [0.75, 1], "anchor": "x", "type": "category", "automargin": True},
            legend={"orientation": "h", "y": -0.2},
        ),
    }
