"""A rank summary for runs with many ranks: one row per rank, outliers picked out.

Hundreds of lanes help nobody; the timeline first shows per-rank step time and communication
time, flags ranks that sit far from the others (robust z-score over the median absolute
deviation), and lets the user open the lanes of the outliers next to a typical rank.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import duckdb

#: Above this many ranks (and without a rank filter) the timeline shows the summary first.
MANY_RANKS = 32
#: |x - median| / (1.4826 * MAD) above this marks an outlier.
OUTLIER_Z = 3.5
#: Most outliers listed (the worst first).
MAX_OUTLIERS = 16
#: A rank stands out on a chart of a run's step only by at least this share of the median step.
MATERIAL_SHARE = 0.02
#: Rows of a chart that picks among more ranks than it can draw (heatmaps): few enough that
#: each is labelled and visible.
PICKED_RANKS = 32

#: Per rank: median steady step (step_spans) and exposed communication per steady step
#: (step_parts transfer + wait: the lost-time model's communication), events.
SUMMARY_SQL = """
WITH st AS (
    SELECT rank, median(step_ns) / 1e6 AS step_ms, avg(transfer_ns + wait_ns) / 1e6 AS comm_ms
    FROM step_parts WHERE run_id = $run AND steady GROUP BY rank
)
SELECT k.rank, st.step_ms, st.comm_ms, k.event_count
FROM ranks k LEFT JOIN st USING (rank)
WHERE k.run_id = $run
ORDER BY k.rank
"""


#: Outlier.metric in words.
METRIC_WORDS = {"step_ms": "median step", "comm_ms_per_step": "communication per step"}


@dataclass(frozen=True, kw_only=True)
class Outlier:
    rank: int
    metric: str
    value: float
    median: float
    z: float


@dataclass(frozen=True, kw_only=True)
class RankSummary:
    ranks: list[int]
    step_ms: list[float | None]
    comm_ms_per_step: list[float | None]
    events: list[int]
    outliers: list[Outlier]
    #: A rank close to the median step time, to compare the outliers with.
    typical_rank: int | None


def robust_z(values: Mapping[int, float]) -> dict[int, tuple[float, float]]:
    """rank -> (z, median) with z = (x - median) / (1.4826 MAD); empty when every value is
    the median's (with a MAD of 0 but some spread, the spread stands in for it)."""
    if len(values) < 3:
        return {}
    med = statistics.median(values.values())
    mad = statistics.median(abs(v - med) for v in values.values())
    if mad == 0:
        spread = max(abs(v - med) for v in values.values())
        if spread == 0:
            return {}
        mad = max(spread * 1e-3, 1e-9)
    return {r: ((v - med) / (1.4826 * mad), med) for r, v in values.items()}


def rank_summary(con: duckdb.DuckDBPyConnection, run_id: int) -> RankSummary:
    rows = con.execute(SUMMARY_SQL, {"run": run_id}).fetchall()
    ranks = [int(r[0]) for r in rows]
    step = [None if r[1] is None else round(float(r[1]), 4) for r in rows]
    comm = [None if r[2] is None else round(float(r[2]), 4) for r in rows]
    events = [int(r[3]) for r in rows]
    outliers: list[Outlier] = []
    for metric, series in (("step_ms", step), ("comm_ms_per_step", comm)):
        vals = {r: v for r, v in zip(ranks, series, strict=True) if v is not None}
        for r, (z, med) in robust_z(vals).items():
            if abs(z) > OUTLIER_Z:
                outliers.append(
                    Outlier(rank=r, metric=metric, value=vals[r], median=med, z=round(z, 2))
                )
    outliers.sort(key=lambda o: -abs(o.z))
    unique = list({o.rank: o for o in reversed(outliers)}.values())
    unique.sort(key=lambda o: -abs(o.z))
    unique = unique[:MAX_OUTLIERS]
    typical = typical_rank({r: v for r, v in zip(ranks, step, strict=True) if v is not None})
    if typical is None and ranks:
        typical = ranks[0]
    return RankSummary(
        ranks=ranks,
        step_ms=step,
        comm_ms_per_step=comm,
        events=events,
        outliers=unique,
        typical_rank=typical,
    )


def typical_rank(values: Mapping[int, float]) -> int | None:
    """The rank whose value is closest to the median (the lowest such rank); None if none."""
    if not values:
        return None
    med = statistics.median(values.values())
    return min((abs(v - med), r) for r, v in values.items())[1]


def standouts(
    metrics: Mapping[str, Mapping[int, float]],
    singled_out: Sequence[tuple[str, Sequence[int]]] = (),
    limit: int = MAX_OUTLIERS,
    material: float = 0.0,
) -> list[tuple[int, str]]:
    """The ranks worth drawing on their own when a run has too many to draw them all, each
    with why, at most `limit`: first the ranks findings single out (`singled_out`: (the
    finding's code, its ranks), worst finding first), then each metric's outliers: robust z
    above OUTLIER_Z and at least `material` from the median, the farthest first ("+35%
    host" against the median; "host, median 0" where the median is 0). `metrics`: a label ->
    value per rank, all in one unit (ns per step), so that distances compare across metrics:
    ranked by z alone, a part that is 0 on most ranks (200 ns of memcpy on 20 ranks) and steps
    within noise ("+0% step") took every slot from a rank 20% slower."""
    picked: dict[int, str] = {}
    for code, ranks in singled_out:
        for r in ranks:
            if len(picked) < limit:
                picked.setdefault(int(r), code)
    far: list[tuple[float, int, str]] = []
    for label, values in metrics.items():
        for r, (z, med) in robust_z(values).items():
            v = values[r]
            if abs(z) > OUTLIER_Z and abs(v - med) >= material:
                why = f"{100 * (v / med - 1):+.0f}% {label}" if med else f"{label}, median 0"
                far.append((-abs(v - med), r, why))
    for _, r, why in sorted(far):
        if len(picked) >= limit:
            break
        picked.setdefault(r, why)
    return list(picked.items())


def drawn_ranks(
    metrics: Mapping[str, Mapping[int, float]],
    typical_of: Mapping[int, float],
    singled_out: Sequence[tuple[str, Sequence[int]]] = (),
    limit: int = MAX_OUTLIERS,
    material: float = 0.0,
) -> list[tuple[int, str]]:
    """What a per-rank chart of more ranks than it can draw draws, with why: a typical rank
    (typical_rank of `typical_of` among the ranks not picked), then the standouts() among the
    ranks of `typical_of` (the ranks the chart has rows for)."""
    picked = [
        (r, why) for r, why in standouts(metrics, singled_out, limit, material) if r in typical_of
    ]
    taken = {r for r, _ in picked}
    typical = typical_rank({r: v for r, v in typical_of.items() if r not in taken})
    return ([(typical, "typical")] if typical is not None else []) + picked
