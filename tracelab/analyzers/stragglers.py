"""Stragglers: who makes the others wait at collectives, why, and what it costs per step.

Collectives are the derived layer's matched ones (matched_collectives, aligned clocks). A rank
is blamed by its what-if saving (Lin et al., OSDI 2025; tracelab.analyzers._replay): per step,
each rank's time before each collective (its "gap") is replayed through the step's matched
collectives, and the saving of a rank is how much shorter the step would be had that rank alone
run at its peers' median speed. A rank is a straggler when its saving (median over the steady steps)
is at least `min_saving_share` of the mean steady step and it arrived last, later than the
clocks' uncertainty allows, at one or more steady collectives. Its kind is the part of its own
step (compute, host, or communication transfer) that exceeds its peers' median the most:
compute-bound (slower device, more work), host-bound (sleep, data loading, GC) or
communication-bound (a slower link).

Its claim on the lost-time budget: the waiting it causes (the other ranks' wait attributed to
it, comm_attribution) plus its own excess in that part, capped by its saving. Waiting that no
straggler explains (a different rank last each time: jitter, uneven inputs) is SYNC_WAIT's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import duckdb
import numpy as np

from tracelab.analyzers._common import (
    RunContext,
    merge_params,
    ms,
    pct,
    ranks_str,
    rows,
)
from tracelab.analyzers._host import host_activity, host_total
from tracelab.analyzers._replay import GAPS_SQL as _GAPS_SQL
from tracelab.analyzers._replay import columns as replay_columns
from tracelab.analyzers._replay import matches as _matches
from tracelab.analyzers._replay import median_of_peers, whatif, whatif_key
from tracelab.derived.sqlrows import first
from tracelab.results import Claim, Evidence, Finding, Result, Severity
from tracelab.vocabulary import Code

NAME = "stragglers"
TITLE = "Stragglers at collectives"
VIEW = "stragglers"
DEFAULTS: dict[str, Any] = {
    # Blame a rank whose what-if saving is at least this share of the mean steady step.
    "min_saving_share": 0.05,
    # ...and above this many times the run's step-to-step jitter (1.4826 x MAD of the steady
    # job steps): on a noisy machine a rank can be slowest by chance in most steps.
    "min_saving_over_jitter": 1.0,
    # Report SYNC_WAIT when waiting no straggler explains exceeds this share of the step.
    "sync_wait_threshold": 0.10,
}
#: Kind of straggler by the part of its step that exceeds its peers' the most.
KINDS = {
    "compute": (Code.STRAGGLER_COMPUTE, ("compute",)),
    "host": (Code.STRAGGLER_HOST, ("host",)),
    "communication": (Code.STRAGGLER_COMM, ("transfer", "memcpy")),
}


#: Per rank, mean per steady step of each part, and of the wait it caused in others.
_RANK_PARTS_SQL = """
WITH p AS (SELECT * FROM step_parts WHERE run_id = $run AND ordinal >= $min_ordinal),
n AS (SELECT count(*) AS rs FROM p),
caused AS (
    SELECT culprit_rank AS rank, sum(exposed_ns) AS caused_ns FROM comm_attribution
    WHERE run_id = $run AND part = 'wait' AND step IN (SELECT DISTINCT step FROM p)
    GROUP BY culprit_rank
)
SELECT p.rank, avg(compute_ns) AS compute_ns, avg(host_ns) AS host_ns,
       avg(transfer_ns) AS transfer_ns, avg(memcpy_ns) AS memcpy_ns, avg(wait_ns) AS wait_ns,
       coalesce(any_value(caused.caused_ns), 0) / any_value(n.rs) AS caused_ns
FROM p CROSS JOIN n LEFT JOIN caused USING (rank) GROUP BY p.rank ORDER BY p.rank
"""


def _median(xs: list[float]) -> float:
    """Median of a short Python list (per-rank figures already aggregated in SQL)."""
    s = sorted(xs)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2


def analyze(con: duckdb.DuckDBPyConnection, ctx: RunContext, params: Mapping[str, Any]) -> Result:
    p = merge_params(NAME, DEFAULTS, params)
    data = con.sql(_GAPS_SQL, params={"run": ctx.run_id}).to_arrow_table()
    if not data.num_rows:
        why = ctx.derived_errors.get(
            "collectives",
            "no collective is matched across two or "
            "more ranks (single-rank trace, or no timed collectives)",
        )
        return Result(
            analyzer=NAME,
            run=ctx.name,
            params=p,
            metrics={"matched": 0},
            notes=(f"nothing to compare: {why}.",),
        )
    unc = dict(
        con.execute(
            "SELECT rank, coalesce(uncertainty_ns, 0) FROM clock_offsets WHERE run_id = ?",
            [ctx.run_id],
        ).fetchall()
    )
    steady = {
        int(s)
        for (s,) in con.execute(
            "SELECT DISTINCT step FROM step_spans WHERE run_id = $run AND ordinal >= $min_ordinal",
            ctx.params,
        ).fetchall()
    }
    per_match = _matches(data, unc)
    steps_out, savings = whatif(per_match, replay_columns(data))
    step_ns = _mean_step(con, ctx)
    parts = {x["rank"]: x for x in rows(con, _RANK_PARTS_SQL, ctx.params)}
    rank_rows = _rank_table(per_match, savings, parts, steady, steps_out)
    jitter = _jitter(con, ctx)
    floor = max(p["min_saving_share"] * step_ns, p["min_saving_over_jitter"] * jitter)
    blamed = [
        x
        for x in rank_rows
        if x["saving_ns_per_step"] is not None
        and step_ns
        and x["saving_ns_per_step"] >= floor
        and x["times_last_steady"] > 0
    ]
    findings = [_straggler(con, ctx, x, per_match, rank_rows, step_ns) for x in blamed]
    total_wait = sum(x["wait_ns"] for x in parts.values()) / max(len(parts), 1)
    explained = sum(x["caused_wait_ns_per_step"] for x in blamed)
    if step_ns and total_wait - explained > p["sync_wait_threshold"] * step_ns:
        findings.append(_sync_wait(total_wait, parts, per_match, steady))
    slow = [s["slowdown"] for s in steps_out if s["slowdown"] is not None and s["step"] in steady]
    metrics = {
        "matched": len(per_match),
        "ranks": len(rank_rows),
        "clock_uncertainty_ns_max": max(unc.values(), default=0),
        "blameable_share": sum(m["blameable"] for m in per_match) / len(per_match),
        "transfer_ns_median": _median([m["transfer"] for m in per_match]),
        "slowdown_median": _median(slow) if slow else None,
        "stragglers": [x["rank"] for x in blamed],
        "wait_share": total_wait / step_ns if step_ns else None,
        "step_jitter_ns": jitter,
        "blame_floor_ns": floor,
    }
    coll_rows = [
        {
            "key": m["key"],
            "op": m["op"],
            "step": m["step"],
            "last_rank": m["last_rank"],
            "lateness_ns": m["lateness_ns"],
            "transfer_ns": m["transfer"],
            "blameable": m["blameable"],
            "last_arrival_ns": m["A"],
        }
        for m in per_match
    ]
    return Result(
        analyzer=NAME,
        run=ctx.name,
        params=p,
        metrics=metrics,
        tables={"ranks": rank_rows, "steps": steps_out, "collectives": coll_rows},
        findings=tuple(findings),
        notes=(
            "lateness within the clocks' uncertainty is never blamed; a rank is "
            "blamed by how much shorter the step would be had it run at the median "
            "speed (what-if replay).",
        ),
    )


def _jitter(con: duckdb.DuckDBPyConnection, ctx: RunContext) -> float:
    """1.4826 x MAD of the steady job steps: the run's step-to-step noise (0 below 3 steps)."""
    row = first(
        con.execute(
            "SELECT CASE WHEN count(*) >= 3 THEN 1.4826 * mad(dur_ns) END "
            "FROM job_steps WHERE run_id = $run AND ordinal >= $min_ordinal",
            ctx.params,
        )
    )
    return float(row[0]) if row and row[0] is not None else 0.0


def _mean_step(con: duckdb.DuckDBPyConnection, ctx: RunContext) -> float:
    row = first(
        con.execute(
            "SELECT avg(step_ns) FROM step_parts WHERE run_id = $run AND ordinal >= $min_ordinal",
            ctx.params,
        )
    )
    return float(row[0]) if row and row[0] is not None else 0.0


def _medians_without(values: dict[int, float]) -> dict[int, float]:
    """Per key, the median of the other keys' values (0 when alone): median_of_peers over one
    row, linear after one sort, where a median per key would be quadratic in ranks."""
    if len(values) < 2:
        return {k: 0.0 for k in values}
    keys = list(values)
    peers = median_of_peers(np.array([[float(values[k]) for k in keys]]))[0]
    return {k: float(v) for k, v in zip(keys, peers, strict=True)}


def _rank_table(
    per_match: list[dict[str, Any]],
    savings: dict[int, list[float]],
    parts: dict[int, dict[str, Any]],
    steady: set[int],
    steps_out: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    steady_steps = [s["step"] for s in steps_out if s["step"] in steady]
    peer_med = {
        k: _medians_without({rk: x[k] for rk, x in parts.items()})
        for k in ("compute_ns", "host_ns", "transfer_ns", "memcpy_ns")
    }
    of_rank: dict[int, list[dict[str, Any]]] = {}
    for m in per_match:
        for r in m["ranks"]:
            of_rank.setdefault(r, []).append(m)
    out = []
    for rk in sorted(of_rank):
        mine = of_rank[rk]
        last = [m for m in mine if m["last_rank"] == rk and m["blameable"]]
        by_step = dict(zip([s["step"] for s in steps_out], savings.get(rk, []), strict=False))
        save = [by_step[s] for s in steady_steps if s in by_step]
        x = parts.get(rk, {})
        excess = {
            kind: sum(
                x.get(f"{part}_ns", 0.0) - peer_med[f"{part}_ns"].get(rk, 0.0) for part in kinds
            )
            for kind, (_, kinds) in KINDS.items()
        }
        kind = max(excess, key=lambda k: excess[k])
        out.append(
            {
                "rank": rk,
                "matches": len(mine),
                "times_last": len(last),
                "times_last_steady": sum(1 for m in last if m["step"] in steady),
                "share_last": len(last) / len(mine) if mine else 0.0,
                "lateness_ns_median": _median([m["lateness_ns"] for m in last]) if last else None,
                "saving_ns_per_step": _median(save) if save else None,
                "wait_ns_per_step": x.get("wait_ns"),
                "caused_wait_ns_per_step": x.get("caused_ns", 0.0),
                "excess_compute_ns": excess["compute"],
                "excess_host_ns": excess["host"],
                "excess_transfer_ns": excess["communication"],
                "kind": kind,
            }
        )
    return out


def _straggler(
    con: duckdb.DuckDBPyConnection,
    ctx: RunContext,
    row: dict[str, Any],
    per_match: list[dict[str, Any]],
    rank_rows: list[dict[str, Any]],
    step_ns: float,
) -> Finding:
    rk, kind = row["rank"], row["kind"]
    code, kind_parts = KINDS[kind]
    excess = row[f"excess_{'transfer' if kind == 'communication' else kind}_ns"]
    n = max(len(rank_rows), 1)
    late = sorted(
        (m for m in per_match if m["last_rank"] == rk and m["blameable"]),
        key=lambda m: -m["lateness_ns"],
    )
    victims = tuple(sorted({r for m in late for r in m["ranks"] if r != rk}))
    numbers: dict[str, float | int | str | None] = {
        "saving_ns_per_step": row["saving_ns_per_step"],
        "step_ns": step_ns,
        "caused_wait_ns_per_step": row["caused_wait_ns_per_step"],
        f"excess_{kind}_ns_per_step": excess,
        "times_last": row["times_last"],
        "matches": row["matches"],
        "lateness_ns_median": row["lateness_ns_median"],
    }
    why = {
        "compute": f"it computes {ms(excess)} more per step than its peers' median",
        "host": f"it spends {ms(excess)} more per step than its peers on the host "
        "(outside operators and communication)",
        "communication": f"its own transfers take {ms(excess)} more per step than its peers'",
    }[kind]
    if kind == "host":
        total = host_total(con, ctx, [rk]) or 1
        for i, x in enumerate(host_activity(con, ctx, [rk], top=3), 1):
            numbers[f"host_span_{i}"] = (
                f"{x['name']}: overlaps {100 * x['ns'] / total:.0f}% of rank {rk}'s host time"
            )
    fix = {
        "compute": "Check its device (clocks, thermals, a slower or shared GPU) and its "
        "share of the work (data sharding, sequence lengths, an extra layer).",
        "host": "Look at its host timeline in the late steps: data loading, logging or "
        "checkpointing on that rank only, garbage collection, a sleep, CPU "
        "contention from other processes on its host.",
        "communication": "Check its links (a slower NIC or PCIe path, a congested switch "
        "port) and NCCL's topology detection on its host.",
    }[kind]
    claim_parts = [("wait", round(row["caused_wait_ns_per_step"]))]
    claim_parts += [(part, round(max(excess, 0.0) / n)) for part in kind_parts]
    return Finding(
        code=code,
        severity=Severity.WARNING,
        title=f"Rank {rk} is a {kind}-bound straggler: the others wait for it, costing "
        "{impact_ms} per step ({impact_pct})",
        evidence=Evidence(
            ranks=(rk,),
            affected_ranks=victims,
            steps=tuple(sorted({m["step"] for m in late if m["step"] is not None})),
            time_ranges_ns=tuple((m["A"] - m["lateness_ns"], m["A"]) for m in late[:5]),
            numbers=numbers,
        ),
        claim=Claim(
            parts=tuple(claim_parts),
            cap_ns=round(row["saving_ns_per_step"]),
            cap_key=whatif_key(rk),
        ),
        suggestion=f"Rank {rk}: {why}; at its peers' median speed the step would be "
        f"{ms(row['saving_ns_per_step'])} shorter. {fix}",
        analyzer=NAME,
        view="stragglers",
    )


def _sync_wait(
    total_wait: float,
    parts: dict[int, dict[str, Any]],
    per_match: list[dict[str, Any]],
    steady: set[int],
) -> Finding:
    lasts: dict[int, int] = {}
    for m in per_match:
        if m["step"] in steady:
            lasts[m["last_rank"]] = lasts.get(m["last_rank"], 0) + 1
    n = sum(lasts.values()) or 1
    top = sorted(lasts.items(), key=lambda kv: -kv[1])[:3]
    return Finding(
        code=Code.SYNC_WAIT,
        severity=Severity.WARNING,
        title="Ranks wait {impact_pct} of the step at collectives for whichever rank arrives "
        "last (no single straggler)",
        evidence=Evidence(
            ranks=tuple(sorted(parts)),
            numbers={
                "wait_ns_per_step": total_wait,
                "last_arrivers": ", ".join(f"rank {r} {pct(c / n)}" for r, c in top),
            },
        ),
        claim=Claim(parts=(("wait", round(total_wait)),)),
        suggestion="The last rank changes from collective to collective: uneven work per step "
        "(variable sequence lengths, data-dependent compute), or noise (other "
        "processes, CPU frequency). Balance the work per rank (pack sequences, bucket "
        f"by length) across {ranks_str(sorted(parts))}.",
        analyzer=NAME,
        view="stragglers",
    )
