"""Where each finding shows: the view named by the analyzer and the time window of its evidence."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tracelab.results import Finding
from tracelab.views._run import RunContext

#: Views a finding may point at; anything else falls back to the overview.
VIEWS = ("overview", "timeline", "pipeline", "stragglers", "memory")
#: Padding around a finding's time ranges, as a share of their span.
PAD = 0.08


@dataclass(frozen=True, kw_only=True)
class FindingTarget:
    """A finding with the view and window that show it (times in ms since the run's start)."""

    finding: Finding
    view: str
    t0_ms: float | None
    t1_ms: float | None
    ranks: tuple[int, ...]
    steps: tuple[int, ...]
    evidence_text: str


def _evidence_text(f: Finding) -> str:
    ev = f.evidence
    parts = []
    if ev.ranks:
        shown = ", ".join(str(r) for r in ev.ranks[:12])
        parts.append(f"rank{'s' if len(ev.ranks) > 1 else ''} {shown}"
                     + (f" (+{len(ev.ranks) - 12} more)" if len(ev.ranks) > 12 else ""))
    if ev.steps:
        steps = sorted(ev.steps)
        parts.append(f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}–{steps[-1]}")
    for key, value in list(ev.numbers.items())[:8]:
        if isinstance(value, float):
            value = f"{value:.4g}"
        parts.append(f"{key} = {value}")
    return " · ".join(parts)


def target(f: Finding, ctx: RunContext) -> FindingTarget:
    """The view and window for one finding. Time ranges are aligned ns; the window covers them
    all, padded, and is left open (None) when the finding has none."""
    view = f.view if f.view in VIEWS else "overview"
    t0 = t1 = None
    if f.evidence.time_ranges_ns:
        lo = min(a for a, _ in f.evidence.time_ranges_ns)
        hi = max(b for _, b in f.evidence.time_ranges_ns)
        pad = max((hi - lo) * PAD, 1_000)
        t0, t1 = ctx.to_ms(lo - pad), ctx.to_ms(hi + pad)
    ranks = tuple(r for r in f.evidence.ranks if r in ctx.ranks)
    return FindingTarget(finding=f, view=view, t0_ms=t0, t1_ms=t1, ranks=ranks,
                         steps=tuple(f.evidence.steps), evidence_text=_evidence_text(f))


def targets(findings: Sequence[Finding], ctx: RunContext) -> list[FindingTarget]:
    return [target(f, ctx) for f in findings]
