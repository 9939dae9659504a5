"""The overview of a run: where the time goes (the lost-time parts per rank, root cause first),
the headline numbers, and the step time per rank x step.

Every number comes from the derived layer or the runner's Analysis (docs/metrics.md): the step
time is the steps analyzer's `step_ns` (= the budget's), the parts are the breakdown analyzer's
per-rank `<part>_ns` over the steady steps (step_parts), the overlap is `overlap_share_mean`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import duckdb

from tracelab.render.text import duration, int_runs, one_line
from tracelab.results import Finding
from tracelab.views.analysis import Analysis
from tracelab.views.context import RunContext
from tracelab.views.ranksummary import MATERIAL_SHARE, PICKED_RANKS, drawn_ranks
from tracelab.vocabulary import DIM_LABELS, PART_LABELS, PART_WORDS, STEP_PARTS, Dim

#: Most ranks and steps in the heatmap (the rest is summarized in the title).
MAX_HEAT_RANKS = 256
MAX_HEAT_STEPS = 200
#: Runs of up to this many ranks draw every rank in "where the time goes"; larger ones draw a
#: typical rank and the ranks that stand out (STANDOUT_RANKS at most), and the heatmap of
#: more than MAX_HEAT_RANKS holds those and the ranks of the slowest steps.
MAX_PART_RANKS = 32
STANDOUT_RANKS = 16
#: A finding singles out ranks when it names fewer than this share of the run's ranks (a
#: finding that names them all points at no rank); its first SINGLED_OUT of them are drawn.
SINGLES_OUT_SHARE = 0.5
SINGLED_OUT = 4


@dataclass(frozen=True, kw_only=True)
class StepMatrix:
    """Step time (ns) per rank (rows) and step (columns) from step_spans; None where a rank
    lacks the step. `reference_ns` is the run's step time (the colour scale's zero)."""

    ranks: list[int]
    steps: list[int]
    ns: list[list[int | None]]
    steady: list[bool]
    total_ranks: int
    total_steps: int
    reference_ns: float | None = None
    #: With more ranks than drawn: the drawn ones were picked (the Overview's own ranks, then
    #: the slowest steps), not the first.
    picked: bool = False
    #: The ranks given first (the Overview's chart above) are among them.
    with_first: bool = False


#: The heatmap's ranks: all of them when they fit; else the ranks given first (those the
#: Overview draws on their own), then those whose slowest steady step (of the steps drawn) is
#: slowest.
STEP_MATRIX_SQL = """
WITH s AS (SELECT step, bool_and(steady) AS steady FROM step_spans WHERE run_id = $run
           GROUP BY step ORDER BY step LIMIT $ns),
per AS (
    SELECT d.rank, coalesce(max(d.dur_ns) FILTER (WHERE d.steady), max(d.dur_ns)) AS worst
    FROM step_spans d JOIN s USING (step) WHERE d.run_id = $run GROUP BY d.rank
),
r AS (
    SELECT rank FROM per
    ORDER BY rank IN (SELECT unnest($first::BIGINT[])) DESC, worst DESC, rank LIMIT $nr
)
SELECT d.rank, d.step, d.dur_ns, s.steady
FROM step_spans d JOIN r USING (rank) JOIN s USING (step) WHERE d.run_id = $run
"""


def step_matrix(
    con: duckdb.DuckDBPyConnection,
    run_id: int,
    reference_ns: float | None = None,
    first: list[int] | None = None,
) -> StepMatrix:
    """Each rank's step times (step_spans.dur_ns: steps tile the run), bounded: of more than
    MAX_HEAT_RANKS ranks, PICKED_RANKS: the ranks `first`, then those of the slowest steps (in
    rank order), so that a slow rank 700 of 1,000 is drawn."""
    totals = con.execute(
        "SELECT count(DISTINCT rank), count(DISTINCT step) FROM step_spans WHERE run_id = ?",
        [run_id],
    ).fetchone() or (0, 0)
    nr = MAX_HEAT_RANKS if int(totals[0]) <= MAX_HEAT_RANKS else PICKED_RANKS
    rows = con.execute(
        STEP_MATRIX_SQL,
        {"run": run_id, "nr": nr, "ns": MAX_HEAT_STEPS, "first": list(first or [])},
    ).fetchall()
    ranks = sorted({int(r) for r, _, _, _ in rows})
    steady_of = {int(s): bool(st) for _, s, _, st in rows}
    steps = sorted(steady_of)
    ri = {r: i for i, r in enumerate(ranks)}
    si = {s: i for i, s in enumerate(steps)}
    grid: list[list[int | None]] = [[None] * len(steps) for _ in ranks]
    for r, s, v, _ in rows:
        grid[ri[int(r)]][si[int(s)]] = int(v)
    return StepMatrix(
        ranks=ranks,
        steps=steps,
        ns=grid,
        steady=[steady_of[s] for s in steps],
        total_ranks=int(totals[0]),
        total_steps=int(totals[1]),
        reference_ns=reference_ns,
        picked=len(ranks) < int(totals[0]),
        with_first=bool(first),
    )


@dataclass(frozen=True, kw_only=True)
class PartRow:
    """One part of "where the time goes": its mean ns per steady step (the job), per rank, and
    the finding that claims it (root cause first), if any."""

    part: str
    label: str
    job_ns: float
    share: float
    rank_ns: list[float]
    finding: Finding | None = None


@dataclass(frozen=True, kw_only=True)
class TimeSplit:
    """The lost-time model of a run as the Overview draws it: parts in root-cause order (parts
    claimed by the findings, in the findings' order, then the other losses, compute last)."""

    step_ns: float
    ranks: list[int]
    #: Per rank: its own mean steady step.
    rank_step_ns: list[float]
    parts: list[PartRow] = field(default_factory=list)
    total_ranks: int = 0
    #: Why each of `ranks` is drawn, where the run has more than MAX_PART_RANKS ("typical",
    #: a finding's code, "+35% host"); empty where every rank is drawn.
    reasons: list[str] = field(default_factory=list)


def part_order(analysis: Analysis, present: dict[str, float]) -> list[tuple[str, Finding | None]]:
    """(part, the finding given most of it) in the findings' order (worst first). The finding
    named is the one the allocation *gave* the part's time to (Finding.impact_parts), not the
    first to ask for it: the stall was named after PIPELINE_STAGE_IMBALANCE, whose 200 ms all
    came from the bubble, while PIPELINE_STALL had been given the stall's 119 ms."""
    best: dict[str, tuple[int, int, Finding]] = {}
    for i, f in enumerate(analysis.findings):
        for part, ns in f.impact_parts:
            if part in STEP_PARTS and ns > 0 and present.get(part, 0) > 0:
                if part not in best or ns > best[part][0]:
                    best[part] = (ns, i, f)
    out: list[tuple[str, Finding | None]] = []
    seen: set[str] = set()
    for part, (_, _, f) in sorted(best.items(), key=lambda kv: (kv[1][1], -kv[1][0])):
        out.append((part, f))
        seen.add(part)
    rest = sorted(
        (p for p in STEP_PARTS if p not in seen and p != "compute" and present.get(p, 0) > 0),
        key=lambda p: -present[p],
    )
    out += [(p, None) for p in rest]
    if present.get("compute", 0) > 0 and "compute" not in seen:
        out.append(("compute", None))
    return out


def time_split(analysis: Analysis, max_ranks: int = MAX_PART_RANKS) -> TimeSplit | None:
    """Per rank, the mean steady step split into the lost-time parts (breakdown analyzer's
    per-rank table = step_parts over the steady steps); None without a budget. Of more than
    `max_ranks` ranks, a typical one (closest to the median step) and the ranks that stand
    out (tracelab.views.ranksummary.standouts: those the findings single out, then the
    outliers of the step and of each part) are drawn, not the first ranks."""
    bud = analysis.budget
    rows = sorted(analysis.table("breakdown", "ranks"), key=lambda x: int(x.get("rank", 0)))
    if bud is None or not rows or not bud.step_ns:
        return None

    def per_step(x: dict[str, Any], key: str) -> float:
        steps = max(int(x.get("steps") or 0), 1)
        return float(x.get(key) or 0) / steps

    order = part_order(analysis, dict(bud.parts))
    shown, reasons = rows, list[str]()
    if len(rows) > max_ranks:
        shown, reasons = _standout_rows(analysis, rows, [p for p, _ in order], per_step)
    parts = []
    for part, finding in order:
        job = float(bud.parts.get(part, 0.0))
        parts.append(
            PartRow(
                part=part,
                label=PART_LABELS[part],
                job_ns=job,
                share=job / bud.step_ns,
                finding=finding,
                rank_ns=[per_step(x, f"{part}_ns") for x in shown],
            )
        )
    return TimeSplit(
        step_ns=float(bud.step_ns),
        ranks=[int(x["rank"]) for x in shown],
        rank_step_ns=[per_step(x, "window_ns") for x in shown],
        parts=parts,
        total_ranks=len(rows),
        reasons=reasons,
    )


def _standout_rows(
    analysis: Analysis,
    rows: list[dict[str, Any]],
    parts: list[str],
    per_step: Any,
) -> tuple[list[dict[str, Any]], list[str]]:
    """A typical rank's row, then the rows of the ranks that stand out, with why."""
    by_rank = {int(x["rank"]): x for x in rows}
    step = {r: per_step(x, "window_ns") for r, x in by_rank.items()}
    metrics = {"step": step} | {
        PART_WORDS[p]: {r: per_step(x, f"{p}_ns") for r, x in by_rank.items()} for p in parts
    }
    singled = [
        (f.code, f.evidence.ranks[:SINGLED_OUT])
        for f in analysis.findings
        if f.evidence.ranks and len(f.evidence.ranks) < SINGLES_OUT_SHARE * len(rows)
    ]
    material = MATERIAL_SHARE * statistics.median(step.values())
    chosen = drawn_ranks(metrics, step, singled, STANDOUT_RANKS, material)
    return [by_rank[r] for r, _ in chosen], [why for _, why in chosen]


@dataclass(frozen=True, kw_only=True)
class DimRow:
    """Exposed communication of one parallel dimension per steady step (the breakdown's
    `by_dim` table: comm_attribution by process_groups.dim; docs/metrics.md)."""

    dim: str
    label: str
    transfer_ns: float
    wait_ns: float
    transfer_share: float
    wait_share: float
    #: The dimension's process groups (process_groups.group_key) and where its name came from.
    groups: list[str]
    sources: list[str]
    #: Each of `groups` in words, with its ranks: 'group 0 (ranks 0-3)'; an unnamed group
    #: (key 'ranks:...') is 'unnamed group (ranks 0, 2)'. Trace text: render it escaped.
    group_labels: list[str]


#: Each process group's members and description (process_groups).
GROUPS_SQL = "SELECT group_key, pg_desc, ranks FROM process_groups WHERE run_id = $run"


def rank_ranges(ranks: list[int] | tuple[int, ...]) -> str:
    """Ranks compactly: runs of three or more consecutive ranks as 'a-b' ('0-3, 8-11'), a
    long stride as its first two and last ('0, 8, ..., 56')."""
    rs = sorted(set(ranks))
    if len(rs) > 6 and len({b - a for a, b in zip(rs, rs[1:])}) == 1 and rs[1] - rs[0] > 1:
        return f"{rs[0]}, {rs[1]}, ..., {rs[-1]}"
    out: list[str] = []
    for a, b in int_runs(rs):
        out += [f"{a}-{b}"] if b - a >= 2 else [str(r) for r in range(a, b + 1)]
    return ", ".join(out)


def _group_label(key: str, desc: str | None, ranks: list[int] | None) -> str:
    name = "unnamed group" if key.startswith("ranks:") else f"group {key}"
    about = [desc] if desc and not key.startswith("ranks:") else []
    if ranks:
        about.append(f"rank{'s' if len(ranks) > 1 else ''} {rank_ranges(ranks)}")
    return f"{name} ({'; '.join(about)})" if about else name


def dim_split(con: duckdb.DuckDBPyConnection, run_id: int, analysis: Analysis) -> list[DimRow]:
    """The breakdown's per-dimension transfer and wait, largest first, with each dimension's
    groups and their ranks (process_groups); empty without communication."""
    members = {
        str(k): (desc, list(ranks or []))
        for k, desc, ranks in con.execute(GROUPS_SQL, {"run": run_id}).fetchall()
    }
    out = []
    for x in analysis.table("breakdown", "by_dim"):
        dim = str(x["dim"])
        label = DIM_LABELS[Dim(dim)] if dim in {d.value for d in Dim} else dim
        groups = [str(g) for g in x.get("groups") or []]
        out.append(
            DimRow(
                dim=dim,
                label=label,
                transfer_ns=float(x.get("transfer_ns") or 0.0),
                wait_ns=float(x.get("wait_ns") or 0.0),
                transfer_share=float(x.get("transfer_share") or 0.0),
                wait_share=float(x.get("wait_share") or 0.0),
                groups=groups,
                sources=[str(g) for g in x.get("sources") or []],
                group_labels=[_group_label(g, *members.get(g, (None, None))) for g in groups],
            )
        )
    return out


@dataclass(frozen=True, kw_only=True)
class Summary:
    """Headline numbers of a run for the overview's first lines."""

    items: list[tuple[str, str]]
    #: One sentence: the step time and the largest loss with its cause.
    headline: str = ""


CLOCKS = {
    "measured": "aligned (measured offsets)",
    "estimated": "aligned (offsets estimated from collectives)",
    "same_host": "one host, one clock",
    "none": "not aligned",
}


def summary(ctx: RunContext, analysis: Analysis) -> Summary:
    """The run's headline: the step time (steps.step_ns), steady steps, overlap
    (breakdown.overlap_share_mean), clocks, and the worst finding."""
    step_ns = analysis.metric("steps", "step_ns")
    steady = analysis.metric("steps", "steady_steps")
    total = analysis.metric("steps", "steps")
    items = [
        ("ranks", f"{len(ctx.ranks):,}" + (f" of {ctx.world_size:,}" if ctx.world_size else ""))
    ]
    if total is not None:
        items.append(("steps", f"{total} ({steady} steady)"))
    items.append(("step time", duration(step_ns) if step_ns is not None else "-"))
    overlap = analysis.metric("breakdown", "overlap_share_mean")
    if overlap is not None:
        items.append(("comm/compute overlap", f"{100 * overlap:.1f}%"))
    items.append(("events", f"{ctx.event_count:,}"))
    items.append(("clocks", CLOCKS.get(ctx.offset_source, ctx.offset_source)))
    head = ""
    if step_ns is not None:
        head = f"Step time {duration(step_ns)}"
        if steady:
            head += f" (mean of {steady} steady step{'s' if steady != 1 else ''})"
        costly = [f for f in analysis.findings if f.impact_ns_per_step]
        if costly:
            f = costly[0]
            share = f" ({100 * f.impact_share:.1f}% of the step)" if f.impact_share else ""
            head += (
                f". Biggest loss: {duration(f.impact_ns_per_step)} per step{share}, "
                f"{f.code}: {one_line(f.title)}"
            )
        head += "."
    return Summary(items=items, headline=head)
