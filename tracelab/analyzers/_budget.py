"""The lost-time budget of a run and the allocation of every lost nanosecond to one finding.

The budget is the lost-time model (step_parts) averaged over the run's ranks and steady steps:
the mean steady step, split into its parts. Findings are served root cause first (ROOT_CAUSE
order, then the larger estimate first); each takes, part by part, what it claims and what is
still left, then, when it has a cap, more of the same parts up to that cap (a cap shared by findings with the same cap_key: one rank's what-if
saving is given once, whichever finding names its cause). So a straggler takes the waiting it causes before exposed
communication could, an unbalanced stage takes the bubble it causes before the bubble finding,
and the impacts of a run's findings never add up to more than its mean steady step
(docs/metrics.md, "Findings").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import duckdb

from tracelab.analyzers._common import PARTS, RunContext
from tracelab.derived.sqlrows import first
from tracelab.results import Finding, Severity
from tracelab.vocabulary import BLOCKING, ROOT_CAUSE

#: Severity of a time-costing finding by the share of the step it was given.
CRITICAL_SHARE = 0.20
WARNING_SHARE = 0.05


@dataclass(frozen=True, kw_only=True)
class Budget:
    """The mean steady step (ns) and its parts (ns), over ranks and steady steps."""

    step_ns: float
    parts: dict[str, float]
    steps: int
    ranks: int


def budget(con: duckdb.DuckDBPyConnection, ctx: RunContext) -> Budget | None:
    """The run's budget, or None when it has no step parts (derivation failed or no steps)."""
    cols = ", ".join(f"avg({p}_ns)" for p in PARTS)
    row = first(
        con.execute(
            f"SELECT avg(step_ns), {cols}, count(DISTINCT step), count(DISTINCT rank) "
            "FROM step_parts WHERE run_id = $run AND ordinal >= $min_ordinal",
            ctx.params,
        )
    )
    if row is None or row[0] is None:
        return None
    return Budget(
        step_ns=float(row[0]),
        parts=dict(zip(PARTS, map(float, row[1:-2]), strict=True)),
        steps=int(row[-2]),
        ranks=int(row[-1]),
    )


def _order(f: Finding) -> tuple[int, float]:
    prio = ROOT_CAUSE.index(f.code) if f.code in ROOT_CAUSE else len(ROOT_CAUSE)
    claim = f.claim
    est = (
        claim.cap_ns
        if claim and claim.cap_ns is not None
        else sum(v for _, v in claim.parts)
        if claim
        else 0
    )
    return prio, -float(est)


def _fill(text: str, impact_ns: int | None, share: float | None) -> str:
    if impact_ns is None:
        return text.replace("{impact_ms}", "unknown").replace("{impact_pct}", "unknown")
    return text.replace("{impact_ms}", f"{impact_ns / 1e6:,.3g} ms").replace(
        "{impact_pct}", f"{100 * (share or 0):.1f}%"
    )


def allocate(findings: Iterable[Finding], bud: Budget | None) -> list[Finding]:
    """Every finding with its impact set (claimed time per steady step, ns and share) and its
    severity set from that share; findings that cost no time keep theirs. Ordered worst
    impact first, root cause first on a tie."""
    left = dict(bud.parts) if bud else {}
    #: Per cap_key, what the findings sharing it were given so far.
    given: dict[str, float] = {}
    out: list[Finding] = []
    for f in sorted(findings, key=_order):
        if f.claim is None or bud is None or bud.step_ns <= 0:
            out.append(
                replace(
                    f, title=_fill(f.title, None, None), suggestion=_fill(f.suggestion, None, None)
                )
            )
            continue
        room = float("inf") if f.claim.cap_ns is None else float(max(f.claim.cap_ns, 0))
        if f.claim.cap_key is not None:
            room = max(room - given.get(f.claim.cap_key, 0.0), 0.0)
        taken = 0.0
        gave: dict[str, float] = {}
        for part, want in f.claim.parts:
            got = min(float(max(want, 0)), left.get(part, 0.0), room - taken)
            if got > 0:
                left[part] -= got
                taken += got
                gave[part] = gave.get(part, 0.0) + got
        if f.claim.cap_ns is not None:
            # The cap is the finding's own estimate (a what-if saving, measured by replay);
            # the amounts only say where its time shows first. Time the parts model files
            # elsewhere (on gloo, peers blocked inside an autograd op wait as "compute") is
            # taken from the same parts, in order, up to the cap.
            for part, _ in f.claim.parts:
                got = min(left.get(part, 0.0), room - taken)
                if got > 0:
                    left[part] -= got
                    taken += got
                    gave[part] = gave.get(part, 0.0) + got
        if f.claim.cap_key is not None:
            given[f.claim.cap_key] = given.get(f.claim.cap_key, 0.0) + taken
        impact = int(round(taken))
        share = impact / bud.step_ns
        sev = (
            Severity.CRITICAL
            if share >= CRITICAL_SHARE
            else Severity.WARNING
            if share >= WARNING_SHARE
            else Severity.INFO
        )
        out.append(
            replace(
                f,
                impact_ns_per_step=impact,
                impact_share=share,
                impact_parts=_whole(gave, impact),
                severity=sev,
                title=_fill(f.title, impact, share),
                suggestion=_fill(f.suggestion, impact, share),
            )
        )
    return ordered(out)


def _whole(gave: dict[str, float], total: int) -> tuple[tuple[str, int], ...]:
    """The parts given, in whole ns that add up to `total` (the impact, rounded once): largest
    remainder first. Rounded each on its own, 2.5 + 2.5 made 2 + 2 beside an impact of 5."""
    floors = {p: int(v // 1) for p, v in gave.items()}
    short = total - sum(floors.values())
    for p in sorted(gave, key=lambda p: -(gave[p] - floors[p]))[: max(short, 0)]:
        floors[p] += 1
    return tuple((p, n) for p, n in floors.items() if n > 0)


def ordered(findings: Sequence[Finding]) -> list[Finding]:
    """The one ordering of findings: the ones that stop the job first (BLOCKING: a hang), then
    largest impact first, then severity, then root-cause order, then code."""
    return sorted(
        findings,
        key=lambda f: (
            f.code not in BLOCKING,
            -(f.impact_ns_per_step or 0),
            -int(f.severity),
            _order(f)[0],
            f.code,
        ),
    )
