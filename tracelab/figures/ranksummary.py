"""The rank summary figure: median step time and communication per step, outliers in red."""

from __future__ import annotations

from tracelab.figures import Figure, base_layout, empty_figure
from tracelab.views.ranksummary import RankSummary


def rank_summary_figure(s: RankSummary) -> Figure:
    if not s.ranks:
        return empty_figure("No ranks in this run.")
    out = {o.rank for o in s.outliers}
    colors = ["#E45756" if r in out else "#4C78A8" for r in s.ranks]
    return {
        "data": [
            {
                "type": "scatter",
                "mode": "markers",
                "name": "median step (ms)",
                "x": s.ranks,
                "y": s.step_ms,
                "marker": {"color": colors, "size": 6},
                "hovertemplate": "rank %{x}: median step %{y:.3f} ms<extra></extra>",
            },
            {
                "type": "scatter",
                "mode": "markers",
                "name": "communication per step (ms)",
                "x": s.ranks,
                "y": s.comm_ms_per_step,
                "yaxis": "y2",
                "marker": {"color": colors, "size": 5, "symbol": "diamond-open"},
                "hovertemplate": "rank %{x}: comm %{y:.3f} ms per step<extra></extra>",
            },
        ],
        "layout": base_layout(
            title=(
                f"Rank summary: {len(s.ranks):,} ranks, {len(s.outliers)} "
                f"outlier{'' if len(s.outliers) == 1 else 's'} (red)"
            ),
            height=420,
            # The shared rank axis under the lower plot: anchored to the upper one (the
            # default), its ticks and title sat between the two, over the lower one's points.
            xaxis={"title": {"text": "rank"}, "anchor": "y2"},
            yaxis={"title": {"text": "median step (ms)"}, "domain": [0.55, 1]},
            yaxis2={"title": {"text": "comm per step (ms)"}, "domain": [0, 0.45], "anchor": "x"},
            legend={"orientation": "h", "y": -0.2},
        ),
    }
