"""Memory figures, one question each: which rank peaks highest against the capacity; is the
stage imbalance what the schedule predicts; how memory moves over time."""

from __future__ import annotations

from typing import Any

from tracelab.figures import Figure, base_layout, empty_figure
from tracelab.render.text import size
from tracelab.views.memory import MemorySeries, MemoryView, unit_for


def peaks_figure(v: MemoryView) -> Figure:
    """Peak per rank (bars, in MiB or GiB by magnitude), the device capacity as a line."""
    if not v.available or not v.ranks:
        return empty_figure(v.note or "No memory peaks per rank.")
    peaks = [r.get("peak_bytes") for r in v.ranks]
    cap = v.capacity_bytes
    unit, div = unit_for(
        max([p for p in peaks if p is not None] + ([cap] if cap else []), default=None)
    )
    labels = [
        f"rank {r['rank']}" + (f" (stage {r['stage']})" if r.get("stage") is not None else "")
        for r in v.ranks
    ]
    traces: list[dict[str, Any]] = [
        {
            "type": "bar",
            "name": f"peak {v.peak_label}",
            "x": labels,
            "y": [None if p is None else p / div for p in peaks],
            "marker": {"color": "#4C78A8"},
            "text": [size(p) for p in peaks],
            "textposition": "outside",
            "hovertemplate": f"%{{x}}: peak %{{text}} ({v.peak_label})<extra></extra>",
        }
    ]
    shapes = _capacity_line(cap, div)
    if cap:
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "x": [None],
                "y": [None],
                "name": f"device capacity {size(cap)}",
                "line": {"color": "#E45756", "dash": "dash"},
            }
        )
    title = f"Peak memory per rank: {v.peak_label}" + (
        " against the device capacity" if cap else " (device capacity unknown)"
    )
    return {
        "data": traces,
        "layout": base_layout(
            title=title,
            height=340,
            shapes=shapes,
            yaxis={"title": {"text": unit}, "rangemode": "tozero"},
            legend={"orientation": "h", "y": -0.25},
        ),
    }


def stages_figure(v: MemoryView) -> Figure:
    """Per stage: peak / mean of the stages, against what the schedule's activation pattern
    predicts (1F1B: the first stage holds the most microbatches)."""
    rows = v.stages
    if not rows:
        return empty_figure("Not a pipeline: no stages to compare.")
    labels = [f"stage {r['stage']}" for r in rows]
    traces: list[dict[str, Any]] = [
        {
            "type": "bar",
            "name": "measured: peak / mean of the stages",
            "x": labels,
            "y": [r.get("over_mean") for r in rows],
            "marker": {"color": "#4C78A8"},
            "customdata": [size(r.get("peak_bytes")) for r in rows],
            "hovertemplate": "%{x}: %{y:.2f}× the mean (peak %{customdata})<extra></extra>",
        }
    ]
    if any(r.get("expected_over_mean") is not None for r in rows):
        traces.append(
            {
                "type": "scatter",
                "mode": "markers+lines",
                "name": f"predicted by the {v.metrics.get('schedule') or 'schedule'}'s activations",
                "x": labels,
                "y": [r.get("expected_over_mean") for r in rows],
                "line": {"dash": "dot", "color": "#333"},
                "hovertemplate": "%{x}: predicted %{y:.2f}× the mean<extra></extra>",
            }
        )
    return {
        "data": traces,
        "layout": base_layout(
            title="Stage imbalance: each stage's peak over the stages' mean, measured and predicted",
            height=320,
            yaxis={"title": {"text": "× mean"}, "rangemode": "tozero"},
            shapes=[
                {
                    "type": "line",
                    "xref": "paper",
                    "x0": 0,
                    "x1": 1,
                    "y0": 1,
                    "y1": 1,
                    "line": {"color": "#999", "width": 1},
                }
            ],
            legend={"orientation": "h", "y": -0.25},
        ),
    }


def series_figure(s: MemorySeries, capacity_bytes: int | None = None) -> Figure:
    if not s.ranks:
        return empty_figure(
            "The trace has no [memory] events (profile with profile_memory=True "
            "to see memory over time)."
        )
    unit, div = unit_for(max(x for x in (s.max_bytes, capacity_bytes) if x is not None))
    traces = []
    for rank in s.ranks:
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": f"rank {rank}",
                "x": s.t_ms[rank],
                "y": [None if v is None else round(v / div, 4) for v in s.allocated_bytes[rank]],
                "line": {"shape": "hv"},
                "hovertemplate": f"rank {rank}: %{{y:.1f}} {unit} at %{{x:.3f}} ms<extra></extra>",
            }
        )
    title = "Allocated memory over time (allocator events in the trace, max per bin)"
    if len(s.ranks) < s.total_ranks:
        title += f": the {len(s.ranks)} ranks with the highest peaks of {s.total_ranks}"
    shapes = []
    if capacity_bytes:
        shapes.append(
            {
                "type": "line",
                "xref": "paper",
                "x0": 0,
                "x1": 1,
                "y0": capacity_bytes / div,
                "y1": capacity_bytes / div,
                "line": {"color": "#E45756", "width": 2, "dash": "dash"},
            }
        )
    return {
        "data": traces,
        "layout": base_layout(
            title=title,
            height=340,
            xaxis={"title": {"text": "time since run start (ms)"}},
            yaxis={"title": {"text": unit}, "rangemode": "tozero"},
            shapes=shapes,
            legend={"orientation": "h", "y": -0.25},
        ),
    }


#: Colours of the estimate's parts (model states, activations, workspace and allowance).
ESTIMATE_PARTS = (
    ("model_states_bytes", "estimate: model states", "#4C78A8"),
    ("activations_bytes", "estimate: activations in flight", "#F58518"),
    ("workspace_bytes", "estimate: workspace + allowance", "#BAB0AC"),
)


def estimate_figure(v: MemoryView) -> Figure:
    """Per pipeline rank: the estimate (stacked: model states, activations in flight, workspace
    and allowance) beside the measured peak, a `tracelab estimate` prediction when given, and
    the device capacity."""
    rows = v.estimate
    if not rows:
        return empty_figure(v.estimate_note or "No memory estimate for this run.")
    cap = v.capacity_bytes
    top = [r.get("measured_bytes") or 0 for r in rows] + [r["estimate_bytes"] for r in rows]
    top += [r.get("predicted_bytes") or 0 for r in rows] + ([cap] if cap else [])
    unit, div = unit_for(max(top))
    labels = [
        f"rank {r['rank']} (stage{'s' if len(r['stages']) > 1 else ''} "
        f"{', '.join(str(s) for s in r['stages'])})"
        for r in rows
    ]
    parts = {
        "model_states_bytes": [r["model_states_bytes"] for r in rows],
        "activations_bytes": [r["activations_bytes"] for r in rows],
        "workspace_bytes": [
            r["estimate_bytes"] - r["model_states_bytes"] - r["activations_bytes"] for r in rows
        ],
    }
    # Grouped bars, the estimate's parts stacked through explicit bases (barmode "group").
    base = [0.0] * len(rows)
    bases = {}
    for key, _, _ in ESTIMATE_PARTS:
        bases[key] = list(base)
        base = [b + x / div for b, x in zip(base, parts[key])]
    traces: list[dict[str, Any]] = [
        {
            "type": "bar",
            "name": name,
            "x": labels,
            "y": [b / div for b in parts[key]],
            "base": bases[key],
            "offsetgroup": "estimate",
            "marker": {"color": color},
            "customdata": [size(b) for b in parts[key]],
            "hovertemplate": f"%{{x}}: {name} %{{customdata}}<extra></extra>",
        }
        for key, name, color in ESTIMATE_PARTS
    ]
    traces.append(
        {
            "type": "bar",
            "name": f"measured peak: {v.peak_label}",
            "x": labels,
            "y": [
                None if r.get("measured_bytes") is None else r["measured_bytes"] / div for r in rows
            ],
            "offsetgroup": "measured",
            "marker": {"color": "#54A24B"},
            "customdata": [
                f"{size(r.get('measured_bytes'))}, "
                + ("-" if r.get("error") is None else f"{100 * r['error']:+.1f}% vs the estimate")
                for r in rows
            ],
            "hovertemplate": "%{x}: measured %{customdata}<extra></extra>",
        }
    )
    if any(r.get("predicted_bytes") for r in rows):
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "predicted before the run (tracelab estimate)",
                "x": labels,
                "y": [
                    None if r.get("predicted_bytes") is None else r["predicted_bytes"] / div
                    for r in rows
                ],
                "marker": {"symbol": "diamond", "size": 11, "color": "#333"},
            }
        )
    shapes = _capacity_line(cap, div)
    return {
        "data": traces,
        "layout": base_layout(
            title="Memory per pipeline rank: the estimate's parts beside the measured peak",
            height=360,
            barmode="group",
            shapes=shapes,
            yaxis={"title": {"text": unit}, "rangemode": "tozero"},
            legend={"orientation": "h", "y": -0.25},
        ),
    }


def _capacity_line(cap: float | None, div: float) -> list[dict[str, Any]]:
    """The device capacity as a dashed red line across the plot (none when unknown)."""
    if not cap:
        return []
    return [
        {
            "type": "line",
            "xref": "paper",
            "x0": 0,
            "x1": 1,
            "y0": cap / div,
            "y1": cap / div,
            "line": {"color": "#E45756", "width": 2, "dash": "dash"},
        }
    ]
