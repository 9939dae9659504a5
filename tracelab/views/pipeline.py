"""The reconstructed pipeline schedule of one step, and bubble shares against the prediction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tracelab.views._run import RunContext
from tracelab.views.analysis import Analysis

#: Most actions drawn for one step (a step of a huge pipeline is summarized in the status).
MAX_ACTIONS = 5000


@dataclass(frozen=True, kw_only=True)
class PipelineView:
    """What the pipeline page draws. `available` is False when the run has no pipeline."""

    available: bool
    note: str = ""
    steps: list[int] = field(default_factory=list)
    step: int | None = None
    #: Actions of the chosen step: rank, stage, kind (F/B/I/W/...), mb, start_ms, end_ms, busy_ms.
    actions: list[dict[str, Any]] = field(default_factory=list)
    actions_cut: bool = False
    #: The step's window, ms since the run's start.
    window_ms: tuple[float, float] | None = None
    #: Per rank (median over steps): bubble shares and their leading/internal/trailing parts.
    stages: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)


def pipeline_view(analysis: Analysis, ctx: RunContext, step: int | None = None) -> PipelineView:
    """The pipeline analyzer's result, cut to one step (the chosen one, else the median step)."""
    result = analysis.get("pipeline")
    if result is None:
        why = analysis.errors.get("pipeline", "the pipeline analyzer did not run")
        return PipelineView(available=False, note=why)
    if not result.metrics.get("pipeline"):
        return PipelineView(available=False,
                            note=" ".join(result.notes) or "This run has no pipeline schedule.")
    actions = result.tables.get("actions", [])
    steps = sorted({int(a["step"]) for a in actions if a.get("step") is not None})
    if step is None or step not in steps:
        step = steps[len(steps) // 2] if steps else None
    chosen = [a for a in actions if a.get("step") == step]
    chosen.sort(key=lambda a: (a["rank"], a["start_ns"]))
    cut = len(chosen) > MAX_ACTIONS
    out: list[dict[str, Any]] = [{
        "rank": int(a["rank"]), "stage": a.get("stage"), "kind": str(a.get("kind")),
        "mb": a.get("mb"), "start_ms": round(ctx.to_ms(a["start_ns"]), 6),
        "end_ms": round(ctx.to_ms(a["end_ns"]), 6), "busy_ms": a.get("busy_ms"),
    } for a in chosen[:MAX_ACTIONS]]
    window: tuple[float, float] | None = None
    rows = [x for x in result.tables.get("steps", []) if x.get("step") == step]
    if rows and rows[0].get("t0_ns") is not None:
        window = (round(ctx.to_ms(rows[0]["t0_ns"]), 6), round(ctx.to_ms(rows[0]["t1_ns"]), 6))
    elif out:
        window = (min(float(a["start_ms"]) for a in out), max(float(a["end_ms"]) for a in out))
    return PipelineView(
        available=True, steps=steps, step=step, actions=out, actions_cut=cut, window_ms=window,
        stages=list(result.tables.get("stages", [])), metrics=dict(result.metrics),
        note=" ".join(result.notes),
    )
