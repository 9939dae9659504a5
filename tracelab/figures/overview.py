"""Overview figures: where the time goes (per rank, the step split into the lost-time parts,
root cause first) and the step-time heatmap."""

from __future__ import annotations

from typing import Any

from tracelab.figures import Figure, base_layout, empty_figure, esc, ms
from tracelab.views.overview import StepMatrix, TimeSplit
from tracelab.vocabulary import PART_COLORS

#: The heatmap's colour scale: white at the run's step time, dark red at +HEAT_SPAN or more.
#: Steps faster than the step time are white too: the colour only ever says "slower".
HEAT_SCALE = [
    [0.0, "#ffffff"],
    [0.1, "#fee8d8"],
    [0.35, "#fcae91"],
    [0.7, "#fb6a4a"],
    [1.0, "#a50f15"],
]
#: The share over the step time at which the colour saturates; noise of a few percent stays
#: pale. Widened when the worst step is slower still.
HEAT_SPAN = 0.5


def step_heatmap(m: StepMatrix) -> Figure:
    """Step time per rank (y) and step (x), coloured by how much slower than the run's step time
    (white = at or below it, dark red = 50% slower or more); hover gives the exact time."""
    if not m.ranks or not m.steps:
        return empty_figure("No profiler steps in this run (ProfilerStep#N spans are missing).")
    vals = [v for row in m.ns for v in row if v is not None]
    ref = m.reference_ns or (sorted(vals)[len(vals) // 2] if vals else 1.0)
    excess = [[None if v is None else max(v / ref - 1.0, 0.0) for v in row] for row in m.ns]
    worst = max((x for row in excess for x in row if x is not None), default=0.0)
    span = max(HEAT_SPAN, min(worst, 3.0))
    title = f"Step time per rank and step: white = at the step time ({ms(ref / 1e6)}), red = slower"
    cut = []
    if m.picked:
        cut.append(
            f"the {len(m.ranks)} of {m.total_ranks:,} ranks with the slowest steps"
            + (" and those drawn above" if m.with_first else "")
        )
    if len(m.steps) < m.total_steps:
        cut.append(f"the first {len(m.steps)} of {m.total_steps:,} steps")
    if cut:
        title += f" ({'; '.join(cut)})"
    labels = [
        f"{s}" + ("" if st else " (warm-up)") for s, st in zip(m.steps, m.steady, strict=True)
    ]
    text = [[None if v is None else ms(v / 1e6) for v in row] for row in m.ns]
    return {
        "data": [
            {
                "type": "heatmap",
                "x": labels,
                "y": [f"rank {r}" for r in m.ranks],
                "z": excess,
                "zmin": 0,
                "zmax": span,
                "colorscale": HEAT_SCALE,
                "hoverongaps": False,
                "text": text,
                "texttemplate": "%{text}" if len(m.ranks) * len(m.steps) <= 400 else "",
                "textfont": {"size": 11},
                "colorbar": {
                    "title": {"text": "slower than<br>the step time"},
                    "tickformat": "+.0%",
                    "thickness": 12,
                },
                "hovertemplate": "%{y}, step %{x}: %{text} (%{z:+.1%} over the step time)"
                "<extra></extra>",
                "xgap": 1,
                "ygap": 1,
            }
        ],
        "layout": base_layout(
            title=title,
            height=min(640, 150 + 26 * len(m.ranks)),
            xaxis={"title": {"text": "step"}, "type": "category"},
            yaxis={"type": "category", "autorange": "reversed", "automargin": True},
        ),
    }


def time_split_figure(t: TimeSplit | None, links: dict[str, str] | None = None) -> Figure:
    """Where the time goes: per rank (and the job), the mean steady step as stacked bars of the
    lost-time parts, root cause first (leftmost). Clicking a part opens its evidence (`links`:
    part -> URL, carried in customdata)."""
    if t is None or not t.parts:
        return empty_figure("No lost-time model for this run (no steps could be split).")
    ylabels = ["all ranks (mean)"] + [
        esc(f"rank {r} · {why}") if why else f"rank {r}"
        for r, why in zip(t.ranks, t.reasons or [""] * len(t.ranks), strict=True)
    ]
    traces: list[dict[str, Any]] = []
    for p in t.parts:
        xs = [p.job_ns / 1e6] + [v / 1e6 for v in p.rank_ns]
        steps = [t.step_ns] + t.rank_step_ns
        by = f" ← {p.finding.code}" if p.finding is not None else ""
        url = (links or {}).get(p.part, "")
        traces.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": esc(f"{p.label}{by}"),
                "y": ylabels,
                "x": [round(x, 6) for x in xs],
                "marker": {
                    "color": PART_COLORS.get(p.part, "#999"),
                    "line": {"color": "white", "width": 1},
                },
                "text": [
                    f"{ms(x)}" if s and x / (s / 1e6) >= 0.06 else ""
                    for x, s in zip(xs, steps, strict=True)
                ],
                "textposition": "inside",
                "insidetextanchor": "middle",
                "textfont": {"color": "#111" if p.part in ("host", "idle", "bubble") else "white"},
                "customdata": [
                    [url, 100 * x / (s / 1e6) if s else 0] for x, s in zip(xs, steps, strict=True)
                ],
                "hovertemplate": f"%{{y}}: <b>{esc(p.label)}</b> %{{x:.3f}} ms per step "
                f"(%{{customdata[1]:.1f}}% of its step){esc(by)}"
                "<br>click: open the evidence<extra></extra>",
            }
        )
    n = len(ylabels)
    return {
        "data": traces,
        "layout": base_layout(
            title=f"Where the time goes: the step ({ms(t.step_ns / 1e6)}) split into its parts, "
            "root cause first" + _drawn_ranks(t),
            height=min(900, 170 + 30 * n),
            barmode="stack",
            xaxis={"title": {"text": "ms per steady step"}, "rangemode": "tozero"},
            yaxis={"autorange": "reversed", "type": "category", "automargin": True},
            legend={
                "orientation": "h",
                "yref": "container",
                "y": 0,
                "yanchor": "bottom",
                "traceorder": "normal",
            },
            margin={"l": 60, "r": 20, "t": 40, "b": 86},
            shapes=[
                {
                    "type": "line",
                    "xref": "paper",
                    "x0": 0,
                    "x1": 1,
                    "y0": 0.5,
                    "y1": 0.5,
                    "line": {"color": "#888", "width": 1},
                }
            ],
        ),
    }


def _drawn_ranks(t: TimeSplit) -> str:
    """Which ranks the chart draws, where it cannot draw them all."""
    if not t.reasons:
        return ""
    if len(t.reasons) == 1:
        return f"; of {t.total_ranks:,} ranks, a typical one (none stands out)"
    return f"; of {t.total_ranks:,} ranks, a typical one and those that stand out"
