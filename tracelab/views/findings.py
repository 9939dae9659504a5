"""Where each finding shows: the view named by the analyzer, the time window of its evidence, and
the ranks to show there (the blamed ranks and the ranks that paid for them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import duckdb

from tracelab.render.text import int_ranges, one_line, value
from tracelab.results import Finding
from tracelab.views.context import RunContext

#: Views a finding may point at; anything else falls back to the overview.
VIEWS = ("overview", "timeline", "pipeline", "stragglers", "memory", "operators")
#: Padding around a finding's time ranges, as a share of their span.
PAD = 0.08
#: A finding's ranks are shown as a timeline filter only up to this many (else all ranks).
MAX_FOCUS_RANKS = 16


@dataclass(frozen=True, kw_only=True)
class FindingTarget:
    """A finding with the view and window that show it (times in ms since the run's start)."""

    finding: Finding
    view: str
    t0_ms: float | None
    t1_ms: float | None
    #: The blamed ranks, then the ranks that paid for them (evidence.affected_ranks).
    ranks: tuple[int, ...]
    steps: tuple[int, ...]
    evidence_text: str
    #: Where the window came from: 'evidence' (its time ranges), 'steps' (its steps' spans),
    #: 'steady step' (a representative steady step: the finding names no time) or 'none'.
    window_source: str = "none"


def _ranks_text(label: str, ranks: Sequence[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:12])
    more = f" (+{len(ranks) - 12} more)" if len(ranks) > 12 else ""
    return f"{label}{'s' if len(ranks) > 1 else ''} {shown}{more}"


def _evidence_text(f: Finding) -> str:
    ev = f.evidence
    parts = []
    if ev.ranks:
        parts.append(_ranks_text("rank", ev.ranks))
    affected = [r for r in ev.affected_ranks if r not in ev.ranks]
    if affected:
        parts.append(_ranks_text("paid by rank", affected))
    if ev.steps:
        steps = sorted(ev.steps)
        parts.append(f"step{'s' if len(steps) > 1 else ''} {int_ranges(steps)}")
    for key, v in list(ev.numbers.items())[:8]:
        parts.append(f"{_key_label(key)}: {value(key, v)}")
    return one_line(" · ".join(parts))


def _key_label(key: str) -> str:
    """'saving_ns_per_step' -> 'saving per step': the unit is in the formatted value."""
    words = [w for w in key.split("_") if w not in ("ns", "bytes", "share", "gbps")]
    return " ".join(words) or key


StepWindows = dict[int, tuple[int, int]]


def step_windows(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[StepWindows, int | None]:
    """step -> (start, end) ns over the ranks (job_steps, reference clock), and a steady step to
    show for findings that name no time (the steady step closest to the median)."""
    rows = con.execute(
        "SELECT step, start_ns, end_ns, steady, dur_ns FROM job_steps "
        "WHERE run_id = ? ORDER BY step",
        [run_id],
    ).fetchall()
    windows = {int(s): (int(a), int(b)) for s, a, b, _, _ in rows}
    steady = [(float(d), int(s)) for s, _, _, st, d in rows if st] or [
        (float(d), int(s)) for s, _, _, _, d in rows
    ]
    if not steady:
        return windows, None
    durs = sorted(d for d, _ in steady)
    med = durs[len(durs) // 2]
    return windows, min(steady, key=lambda x: (abs(x[0] - med), x[1]))[1]


def target(
    f: Finding, ctx: RunContext, steps: StepWindows | None = None, typical_step: int | None = None
) -> FindingTarget:
    """The view and window for one finding. Time ranges are aligned ns; the window covers them
    all, padded. Without time ranges: the span of its steps, else the typical steady step
    (`steps` and `typical_step` from step_windows; left open when not given)."""
    view = f.view if f.view in VIEWS else "overview"
    ranges = list(f.evidence.time_ranges_ns)
    source = "evidence" if ranges else "none"
    if not ranges and steps:
        ranges = [steps[s] for s in f.evidence.steps if s in steps]
        source = "steps" if ranges else source
        if not ranges and typical_step is not None and typical_step in steps:
            ranges, source = [steps[typical_step]], "steady step"
    t0 = t1 = None
    if ranges:
        lo = min(a for a, _ in ranges)
        hi = max(b for _, b in ranges)
        pad = max((hi - lo) * PAD, 1_000)
        t0, t1 = ctx.to_ms(lo - pad), ctx.to_ms(hi + pad)
    known = set(ctx.ranks)
    ranks = tuple(
        dict.fromkeys(r for r in (*f.evidence.ranks, *f.evidence.affected_ranks) if r in known)
    )
    return FindingTarget(
        finding=f,
        view=view,
        t0_ms=t0,
        t1_ms=t1,
        ranks=ranks,
        steps=tuple(f.evidence.steps),
        evidence_text=_evidence_text(f),
        window_source=source,
    )


def targets(
    findings: Sequence[Finding],
    ctx: RunContext,
    steps: StepWindows | None = None,
    typical_step: int | None = None,
) -> list[FindingTarget]:
    return [target(f, ctx, steps, typical_step) for f in findings]


def focus_ranks(t: FindingTarget, all_ranks: Sequence[int]) -> tuple[int, ...]:
    """The rank filter of a finding's timeline link: its ranks when they are a handful and not
    every rank (then no filter)."""
    if not t.ranks or len(t.ranks) > MAX_FOCUS_RANKS or set(all_ranks) <= set(t.ranks):
        return ()
    return t.ranks
