"""A rank summary for runs with many ranks: one row per rank, outliers picked out.

Hundreds of lanes help nobody; the timeline first shows per-rank step time and communication
time, flags ranks that sit far from the others (robust z-score over the median absolute
deviation), and lets the user open the lanes of the outliers next to a typical rank.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import duckdb

#: Above this many ranks (and without a rank filter) the timeline shows the summary first.
MANY_RANKS = 32
#: |x - median| / (1.4826 * MAD) above this marks an outlier.
OUTLIER_Z = 3.5
#: Most outliers listed (the worst first).
MAX_OUTLIERS = 16

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


def _robust_z(values: dict[int, float]) -> dict[int, tuple[float, float]]:
    """rank -> (z, median) with z = (x - median) / (1.4826 MAD); empty when MAD is 0."""
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
        for r, (z, med) in _robust_z(vals).items():
            if abs(z) > OUTLIER_Z:
                outliers.append(
                    Outlier(rank=r, metric=metric, value=vals[r], median=med, z=round(z, 2))
                )
    outliers.sort(key=lambda o: -abs(o.z))
    unique = list({o.rank: o for o in reversed(outliers)}.values())
    unique.sort(key=lambda o: -abs(o.z))
    unique = unique[:MAX_OUTLIERS]
    valid = [
        (abs(v - statistics.median([x for x in step if x is not None])), r)
        for r, v in zip(ranks, step, strict=True)
        if v is not None
    ]
    typical = min(valid)[1] if valid else (ranks[0] if ranks else None)
    return RankSummary(
        ranks=ranks,
        step_ms=step,
        comm_ms_per_step=comm,
        events=events,
        outliers=unique,
        typical_rank=typical,
    )
