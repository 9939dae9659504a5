"""Memory figures: peaks per rank and per stage against capacity, and memory over time."""

from __future__ import annotations

from typing import Any

from tracelab.figures import Figure, base_layout, empty_figure
from tracelab.views.memory import MemorySeries, MemoryView

PEAK_KEYS = ("peak_allocated_gib", "peak_gib", "peak_reserved_gib")
CAPACITY_KEYS = ("capacity_gib", "device_memory_gib")


def _first(row: dict[str, Any], keys: tuple[str, ...]) -> Any:
    return next((row[k] for k in keys if row.get(k) is not None), None)


def peaks_figure(v: MemoryView, by: str = "rank") -> Figure:
    """Bars of peak memory per rank (or per stage), capacity as a marker line."""
    rows = v.ranks if by == "rank" else v.stages
    if not v.available or not rows:
        return empty_figure(v.note or f"No memory peaks per {by}.")
    labels = [f"{by} {r.get(by)}" for r in rows]
    peaks = [_first(r, PEAK_KEYS) for r in rows]
    traces: list[dict[str, Any]] = [{
        "type": "bar", "name": "peak allocated (GiB)", "x": labels, "y": peaks,
        "marker": {"color": "#4C78A8"},
        "hovertemplate": "%{x}: peak %{y:.3f} GiB<extra></extra>",
    }]
    expected = [r.get("expected_over_mean") for r in rows]
    known = [p for p in peaks if p is not None]
    if by == "stage" and known and any(e is not None for e in expected):
        mean = sum(known) / len(known)
        traces.append({"type": "scatter", "mode": "markers+lines", "name":
                       "expected from the schedule (same mean)",
                       "x": labels, "y": [None if e is None else e * mean for e in expected],
                       "line": {"dash": "dot", "color": "#333"},
                       "hovertemplate": "%{x}: the schedule predicts %{y:.3f} GiB<extra></extra>"})
    caps = [_first(r, CAPACITY_KEYS) for r in rows]
    if any(c is not None for c in caps):
        traces.append({"type": "scatter", "mode": "markers", "name": "device capacity (GiB)",
                       "x": labels, "y": caps, "marker": {"symbol": "line-ew-open", "size": 28,
                                                         "color": "#E45756", "line": {"width": 3}},
                       "hovertemplate": "%{x}: capacity %{y:.1f} GiB<extra></extra>"})
    return {"data": traces, "layout": base_layout(
        title=f"Peak memory per {by}" + (" against capacity" if len(traces) > 1 else ""),
        height=340, yaxis={"title": {"text": "GiB"}, "rangemode": "tozero"},
        legend={"orientation": "h", "y": -0.25})}


def series_figure(s: MemorySeries) -> Figure:
    if not s.ranks:
        return empty_figure("The trace has no [memory] events (profile with profile_memory=True "
                            "to see memory over time).")
    traces = []
    for rank in s.ranks:
        traces.append({"type": "scatter", "mode": "lines", "name": f"rank {rank} allocated",
                       "x": s.t_ms[rank], "y": s.allocated_gib[rank], "line": {"shape": "hv"},
                       "hovertemplate": f"rank {rank}: %{{y:.3f}} GiB at %{{x:.3f}} ms"
                                        "<extra></extra>"})
    title = "Allocated memory over time (max per bin, from the trace's [memory] events)"
    if len(s.ranks) < s.total_ranks:
        title += f" — the {len(s.ranks)} ranks with the highest peaks of {s.total_ranks}"
    return {"data": traces, "layout": base_layout(
        title=title, height=360, xaxis={"title": {"text": "time since run start (ms)"}},
        yaxis={"title": {"text": "GiB"}}, legend={"orientation": "h", "y": -0.25})}
