"""All-to-all: uneven data or a slow participant (docs/metrics.md, "All-to-all").

DLRM moves pooled embeddings and MoE layers dispatch tokens with all-to-alls; when one rank holds
the heavy tables or the popular experts it sends or receives more than the others, does that
much more work, and everyone waits for it at the next all-to-all. Two causes look the same
from the waiting ranks: the data is unbalanced (uneven splits: fix the sharding plan or the
routing), or the splits are even and one rank is slow (a straggler: its device, host or link).

The rank blamed is the one with the largest what-if saving (tracelab.analyzers._replay, as for
stragglers) among those that arrived last at steady all-to-alls; its cost is that saving. Two
things decide the cause: its bytes per steady step over its peers' in the same calls (the
call's other ranks: its own group's, never another group's of a mesh; all_to_all_ranks, sent
and received apart, the larger), and its extra compute over its peers' median. Unbalanced data
is both: at least `min_bytes_ratio` times the bytes, and extra compute of at least
`min_compute_share` of the saving (the work the extra data brings). That is
ALL_TO_ALL_IMBALANCE, which claims the waiting it causes at all-to-alls and its own excess
compute before any straggler finding can (ROOT_CAUSE). Otherwise ALL_TO_ALL_SLOW_RANK names the
rank and leaves the time to its straggler finding: even splits, or uneven ones with the
waiting not spent on them (a rank that slept 50 ms and received 4x was read as unbalanced data
computing "0 ms more per step"). The embedding lookups' time per rank is evidence either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import duckdb

from tracelab.analyzers._common import RunContext, merge_params, ms, rows, size_str
from tracelab.analyzers._replay import GAPS_SQL, columns, matches, whatif, whatif_key
from tracelab.derived.sqlrows import first
from tracelab.results import Claim, Evidence, Finding, Result, Severity
from tracelab.vocabulary import Code

NAME = "alltoall"
TITLE = "All-to-all balance"
VIEW = "stragglers"
DEFAULTS: dict[str, Any] = {
    # Blame a rank whose what-if saving is at least this share of the mean steady step.
    "min_saving_share": 0.05,
    # Uneven data when the blamed rank moves at least this many times its peers' mean bytes,
    "min_bytes_ratio": 1.25,
    # and computes more than its peers by at least this share of its saving.
    "min_compute_share": 0.5,
}

#: Per rank over the steady steps: all-to-all calls, mean bytes sent and received per step,
#: times last, and the median skew of its calls.
_RANKS_SQL = """
WITH a AS (
    SELECT * FROM all_to_all_ranks
    WHERE run_id = $run AND step IN (SELECT step FROM step_spans
                                     WHERE run_id = $run AND ordinal >= $min_ordinal)
),
n AS (SELECT count(DISTINCT step) AS steps FROM a),
-- Per matched call and rank: the mean bytes of the call's other ranks (its group's).
c AS (
    SELECT rank, sent_bytes, recv_bytes,
           (sum(sent_bytes) OVER w - sent_bytes) / nullif(count(sent_bytes) OVER w - 1, 0)
               AS peers_sent,
           (sum(recv_bytes) OVER w - recv_bytes) / nullif(count(recv_bytes) OVER w - 1, 0)
               AS peers_recv
    FROM a WHERE match_key IS NOT NULL
    WINDOW w AS (PARTITION BY match_key)
),
pc AS (
    SELECT rank, sum(sent_bytes) FILTER (WHERE peers_sent IS NOT NULL) AS own_sent,
           sum(peers_sent) AS peers_sent,
           sum(recv_bytes) FILTER (WHERE peers_recv IS NOT NULL) AS own_recv,
           sum(peers_recv) AS peers_recv
    FROM c GROUP BY rank
)
SELECT rank, count(*) AS calls, sum(sent_bytes) / any_value(n.steps) AS sent_bytes_per_step,
       sum(recv_bytes) / any_value(n.steps) AS recv_bytes_per_step,
       any_value(pc.own_sent) / any_value(n.steps) AS matched_sent_bytes_per_step,
       any_value(pc.peers_sent) / any_value(n.steps) AS peers_sent_bytes_per_step,
       any_value(pc.own_recv) / any_value(n.steps) AS matched_recv_bytes_per_step,
       any_value(pc.peers_recv) / any_value(n.steps) AS peers_recv_bytes_per_step,
       count(*) FILTER (WHERE last_rank = rank) AS times_last,
       count(*) FILTER (WHERE top_sender = rank AND sent_skew > 1) AS times_top_sender,
       count(*) FILTER (WHERE top_receiver = rank AND recv_skew > 1) AS times_top_receiver,
       median(sent_skew) AS sent_skew_median, median(recv_skew) AS recv_skew_median,
       max(busbw_gbps) AS busbw_gbps_max, any_value(bytes_from) AS bytes_from
FROM a CROSS JOIN n LEFT JOIN pc USING (rank) GROUP BY rank ORDER BY rank
"""

#: Per rank: mean per steady step of its compute, host and transfer, of the waiting it caused
#: at all-to-alls (per rank and step of the run, as the budget counts it), and of its
#: embedding lookups (host operators aten::embedding_bag / aten::embedding).
_PARTS_SQL = """
WITH p AS (SELECT * FROM step_parts WHERE run_id = $run AND ordinal >= $min_ordinal),
rs AS (SELECT count(*) AS rs FROM p),
caused AS (
    SELECT culprit_rank AS rank, sum(exposed_ns) AS ns FROM comm_attribution
    WHERE run_id = $run AND part = 'wait' AND op = 'all_to_all'
      AND step IN (SELECT DISTINCT step FROM p) GROUP BY culprit_rank
),
emb AS (
    SELECT e.rank, sum(e.dur_ns) AS ns FROM events e
    WHERE e.run_id = $run AND NOT e.on_device
      AND e.name IN ('aten::embedding_bag', 'aten::embedding')
      AND e.step IN (SELECT DISTINCT step FROM p) GROUP BY e.rank
)
SELECT p.rank, avg(p.compute_ns) AS compute_ns, avg(p.host_ns) AS host_ns,
       avg(p.transfer_ns) AS transfer_ns,
       coalesce(any_value(caused.ns), 0) / any_value(rs.rs) AS caused_ns,
       any_value(emb.ns) / count(*) AS embedding_ns
FROM p CROSS JOIN rs LEFT JOIN caused USING (rank) LEFT JOIN emb USING (rank)
GROUP BY p.rank ORDER BY p.rank
"""


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2 if s else 0.0


def analyze(con: duckdb.DuckDBPyConnection, ctx: RunContext, params: Mapping[str, Any]) -> Result:
    p = merge_params(NAME, DEFAULTS, params)
    ranks = rows(con, _RANKS_SQL, ctx.params)
    if not ranks:
        why = ctx.derived_errors.get("all_to_all", "the run has no timed all-to-all")
        return Result(
            analyzer=NAME,
            run=ctx.name,
            params=p,
            metrics={"calls": 0},
            notes=(f"nothing to compare: {why}.",),
        )
    parts = {x["rank"]: x for x in rows(con, _PARTS_SQL, ctx.params)}
    for x in ranks:
        x.update({k: v for k, v in parts.get(x["rank"], {}).items() if k != "rank"})
    step_row = first(
        con.execute(
            "SELECT avg(step_ns) FROM step_parts WHERE run_id = $run AND ordinal >= $min_ordinal",
            ctx.params,
        )
    )
    step_ns = float(step_row[0]) if step_row and step_row[0] is not None else 0.0
    savings = _savings(con, ctx)
    for x in ranks:
        x["saving_ns_per_step"] = savings.get(x["rank"])
    metrics: dict[str, Any] = {
        "calls": sum(x["calls"] for x in ranks) // max(len(ranks), 1),
        "ranks": len(ranks),
        # None where no call's bytes are known (a trace without record_shapes), not 0: a
        # skew is max / mean, 1 or more.
        **{
            k: _median(known) if (known := [x[k] for x in ranks if x[k]]) else None
            for k in ("sent_skew_median", "recv_skew_median")
        },
        "cause": None,
        "rank": None,
    }
    findings: list[Finding] = []
    unknown: tuple[str, ...] = ()
    # The rank last at steady all-to-alls with the largest what-if saving: the replay sees
    # the waiting even where the parts model files it elsewhere (peers blocked inside an
    # autograd op count as compute on gloo).
    late = [x for x in ranks if x["times_last"] > 0 and x["saving_ns_per_step"] is not None]
    culprit = max(late, key=lambda x: (x["saving_ns_per_step"], -x["rank"]), default=None)
    saving = culprit["saving_ns_per_step"] if culprit else None
    if (
        culprit is not None
        and len(ranks) > 1
        and step_ns
        and saving is not None
        and saving >= p["min_saving_share"] * step_ns
    ):
        heavy = _heavier(culprit)
        excess = _excess_compute(culprit, ranks)
        metrics.update(rank=culprit["rank"], bytes_ratio=heavy.ratio if heavy else None)
        if heavy is None:
            # No sizes to compare (a trace without record_shapes): uneven data and a slow
            # participant look the same here; the stragglers' finding names the rank.
            unknown = (
                f"rank {culprit['rank']} is late at the all-to-alls (the others would save "
                f"{ms(saving)} a step at its speed), but the trace holds no all-to-all sizes, so "
                "uneven splits cannot be told from a slow rank: profile with "
                "record_shapes=True, or with tracelab.profile (it records the split sizes).",
            )
        else:
            data = heavy.ratio >= p["min_bytes_ratio"]
            uneven = data and excess >= p["min_compute_share"] * saving
            metrics.update(cause="unbalanced_data" if uneven else "slow_participant")
            findings.append(_finding(culprit, ranks, heavy, excess, data, uneven, step_ns))
    return Result(
        analyzer=NAME,
        run=ctx.name,
        params=p,
        metrics=metrics,
        tables={"ranks": ranks},
        findings=tuple(findings),
        notes=(
            "bytes per rank from all_to_all_ranks (split sizes, else Input Dims, else the "
            "collector's record); the late rank's bytes against its peers' tell uneven data "
            "from a slow participant.",
            *unknown,
        ),
    )


def _savings(con: duckdb.DuckDBPyConnection, ctx: RunContext) -> dict[int, float]:
    """Per rank, its what-if saving (median over the steady steps; the stragglers' replay)."""
    data = con.sql(GAPS_SQL, params={"run": ctx.run_id}).to_arrow_table()
    if not data.num_rows:
        return {}
    steady = {
        int(s)
        for (s,) in con.execute(
            "SELECT DISTINCT step FROM step_spans WHERE run_id = $run AND ordinal >= $min_ordinal",
            ctx.params,
        ).fetchall()
    }
    steps_out, per_rank = whatif(matches(data, {}), columns(data))
    order = [s["step"] for s in steps_out]
    out = {}
    for rk, xs in per_rank.items():
        mine = [v for s, v in zip(order, xs, strict=False) if s in steady]
        if mine:
            out[rk] = _median(mine)
    return out


def _moved(x: Mapping[str, Any]) -> float | None:
    """A rank's bytes per step: the larger of what it sent and received."""
    vals = [v for v in (x["sent_bytes_per_step"], x["recv_bytes_per_step"]) if v is not None]
    return float(max(vals)) if vals else None


@dataclass(frozen=True)
class Heavier:
    """The direction in which a rank moves the most over its peers in the same calls."""

    verb: str  # "sends" or "receives"
    own_bytes_per_step: float
    peers_mean_bytes_per_step: float

    @property
    def ratio(self) -> float:
        return self.own_bytes_per_step / self.peers_mean_bytes_per_step


def _heavier(x: Mapping[str, Any]) -> Heavier | None:
    """The rank's bytes per step over its peers' mean in the same matched calls (the call's
    other ranks: in a mesh, its own all-to-all group), sent and received apart: the larger."""
    best = None
    for verb, d in (("sends", "sent"), ("receives", "recv")):
        own, peers = x[f"matched_{d}_bytes_per_step"], x[f"peers_{d}_bytes_per_step"]
        if own is None or not peers or peers <= 0:
            continue
        h = Heavier(verb, float(own), float(peers))
        if best is None or h.ratio > best.ratio:
            best = h
    return best


def _excess_compute(c: Mapping[str, Any], ranks: list[dict[str, Any]]) -> float:
    """The rank's compute per step over its peers' median."""
    peers = [x for x in ranks if x["rank"] != c["rank"]]
    return max(
        (c.get("compute_ns") or 0.0) - _median([x.get("compute_ns") or 0.0 for x in peers]), 0.0
    )


def _finding(
    c: dict[str, Any],
    ranks: list[dict[str, Any]],
    heavy: Heavier,
    excess: float,
    data: bool,
    uneven: bool,
    step_ns: float,
) -> Finding:
    """`data`: the rank moves min_bytes_ratio x its peers' bytes or more; `uneven`: and its
    extra compute explains the waiting (ALL_TO_ALL_IMBALANCE)."""
    rk = c["rank"]
    peers = [x for x in ranks if x["rank"] != rk]
    ratio = heavy.ratio
    emb = {x["rank"]: x.get("embedding_ns") for x in ranks}
    numbers: dict[str, float | int | str | None] = {
        "saving_ns_per_step": c["saving_ns_per_step"],
        "step_ns": step_ns,
        "caused_wait_ns_per_step": c.get("caused_ns"),
        "sent_bytes_per_step": c["sent_bytes_per_step"],
        "recv_bytes_per_step": c["recv_bytes_per_step"],
        "peers_mean_bytes_per_step": heavy.peers_mean_bytes_per_step,
        "bytes_ratio": ratio,
        "bytes_from": c["bytes_from"],
        "times_last": c["times_last"],
        "calls": c["calls"],
        "excess_compute_ns_per_step": excess,
    }
    if any(v for v in emb.values()):
        numbers["embedding_ns_per_step"] = c.get("embedding_ns")
        numbers["peers_embedding_ns_per_step_median"] = _median(
            [x.get("embedding_ns") or 0.0 for x in peers]
        )
    moved = size_str(int(m)) if (m := _moved(c)) is not None else size_str(None)
    evidence = Evidence(
        ranks=(rk,),
        affected_ranks=tuple(x["rank"] for x in peers),
        numbers=numbers,
    )
    if uneven:
        n = max(len(ranks), 1)
        claim = Claim(
            parts=(("wait", round(c.get("caused_ns") or 0.0)), ("compute", round(excess / n))),
            cap_ns=round(c["saving_ns_per_step"]),
            cap_key=whatif_key(rk),
        )
        return Finding(
            code=Code.ALL_TO_ALL_IMBALANCE,
            severity=Severity.WARNING,
            title=f"Rank {rk} {heavy.verb} {heavy.ratio:.1f}x its peers' all-to-all bytes and "
            "the others wait for its extra work, costing {impact_ms} per step ({impact_pct})",
            evidence=evidence,
            claim=claim,
            suggestion=f"Unbalanced data, not a slow rank: rank {rk} {heavy.verb} "
            f"{size_str(int(heavy.own_bytes_per_step))} per step in all-to-alls, "
            f"{heavy.ratio:.1f}x its peers' mean in the same calls, and computes {ms(excess)} "
            f"more per step; at the others' speed the step would be "
            f"{ms(c['saving_ns_per_step'])} shorter. Rebalance the work behind the splits: for "
            "embeddings, a sharding plan that spreads the heavy tables (row- or column-wise "
            "sharding, cost-aware placement); for mixture-of-experts, the router's "
            "load-balancing loss, a capacity factor that caps tokens per expert, or "
            "replicating the popular experts.",
            analyzer=NAME,
            view=VIEW,
        )
    if data:
        splits = (
            f"its splits are uneven (it {heavy.verb} {heavy.ratio:.1f}x its peers' mean), but it "
            f"computes only {ms(excess)} more per step than they do, so the extra data is not "
            "what they wait for"
        )
        title = (
            f"Rank {rk} is late at the all-to-alls for a reason other than its data: a slow "
            "participant"
        )
    else:
        splits = (
            f"the splits are even (rank {rk} moves {moved} per step, {ratio:.2f}x its peers' mean)"
        )
        title = (
            f"Rank {rk} is late at the all-to-alls with even splits: a slow participant, not "
            "unbalanced data"
        )
    return Finding(
        code=Code.ALL_TO_ALL_SLOW_RANK,
        severity=Severity.INFO,
        title=title,
        evidence=evidence,
        suggestion=f"The others wait for rank {rk} ({ms(c.get('caused_ns'))} per step) and "
        f"{splits}: the cause is the rank itself. See its straggler finding (compute, host or "
        "communication) for the fix; rebalancing the splits would not help.",
        analyzer=NAME,
        view=VIEW,
    )
