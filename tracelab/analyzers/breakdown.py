"""Where the step goes: the lost-time parts per rank and step, comm/compute overlap, and the
findings for communication that compute does not hide and for host-bound steps.

The parts are the derived layer's (step_parts: compute, transfer, memcpy, wait, bubble, stall,
host, idle; they add up to the step; docs/metrics.md). Overlap is HTA's |C ∩ M| / |M| over the
steady steps. EXPOSED_COMM claims only the transfer part (the data movement compute does not
hide); waiting at collectives is the stragglers' (or SYNC_WAIT's), pipeline waiting the
pipeline's. HOST_BOUND claims the host part.

With `hta_compatible`, the per-rank table is HTA 0.5's temporal breakdown and overlap instead:
device work whose host launch is in the trace and starts before the last ProfilerStep, over
each rank's [first kernel start, last kernel end] (tests/analyzers/test_hta_crosscheck.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

import duckdb

from tracelab.analyzers._common import (
    PARTS,
    SIZE_UNKNOWN_WHY,
    RunContext,
    merge_params,
    ms,
    pct,
    ranks_str,
    rows,
    size_str,
)
from tracelab.analyzers._host import host_activity, host_total
from tracelab.derived.batches import rank_batches
from tracelab.derived.intervals import breakdown_sql
from tracelab.measures import COLLECTIVE_BANDWIDTH_SQL, DIM_COMM_SHARES_SQL
from tracelab.results import Claim, Evidence, Finding, Result, Severity
from tracelab.vocabulary import DIM_LABELS, Code, Dim

NAME = "breakdown"
TITLE = "Where the step goes: lost-time parts and comm/compute overlap"
VIEW = "overview"
DEFAULTS: dict[str, Any] = {
    # Report EXPOSED_COMM when exposed transfer exceeds this share of the mean steady step.
    "exposed_comm_threshold": 0.10,
    # Report HOST_BOUND when host time exceeds this share of the mean steady step.
    "host_bound_threshold": 0.15,
    # The per-rank table as HTA 0.5 computes it (see the module docstring).
    "hta_compatible": False,
}
#: Below this share of communication under compute, EXPOSED_COMM advises overlap first.
LOW_OVERLAP = 0.5
#: HOST_BOUND names the host spans of at most this many ranks, those with the most host time
#: (reading every rank's events grew with the run).
HOST_EVIDENCE_RANKS = 8

#: Device events as HTA's temporal breakdown and overlap select them, of the ranks $lo..$hi.
#: Binds $run, $lo, $hi.
HTA_DEVICE_SQL = """
    SELECT e.rank, e.ts_ns AS t0, e.ts_ns + e.dur_ns AS t1,
           CASE e.category WHEN 'compute' THEN 'compute' WHEN 'communication' THEN 'comm'
                ELSE 'memcpy' END AS cls
    FROM events e
    JOIN (SELECT rank, correlation, min(ts_ns) AS launch_ns FROM events
          WHERE run_id = $run AND rank BETWEEN $lo AND $hi AND NOT on_device
            AND correlation IS NOT NULL
          GROUP BY rank, correlation) l ON l.rank = e.rank AND l.correlation = e.correlation
    JOIN (SELECT rank, max(start_ns) AS last_start FROM steps WHERE run_id = $run GROUP BY rank) s
      ON s.rank = e.rank AND l.launch_ns < s.last_start
    WHERE e.run_id = $run AND e.rank BETWEEN $lo AND $hi AND e.on_device
      AND e.category IN ('compute', 'communication', 'memcpy', 'memset')
"""

_PART_SUMS = ", ".join(f"sum({p}_ns) AS {p}_ns" for p in PARTS)

_STEPS_SQL = f"""
SELECT rank, step, ordinal, steady, step_ns, {", ".join(f"{p}_ns" for p in PARTS)},
       comm_ns, overlapped_comm_ns,
       CASE WHEN comm_ns > 0 THEN overlapped_comm_ns / comm_ns END AS overlap_share
FROM step_parts WHERE run_id = $run ORDER BY step, rank
"""

_RANKS_SQL = f"""
SELECT rank, count(*) AS steps, sum(step_ns) AS window_ns, {_PART_SUMS},
       sum(comm_ns) AS comm_ns, sum(overlapped_comm_ns) AS overlapped_comm_ns,
       CASE WHEN sum(comm_ns) > 0 THEN sum(overlapped_comm_ns) / sum(comm_ns) END
           AS overlap_share,
       bool_or(rank IN (SELECT rank FROM rank_extents WHERE run_id = $run AND device))
           AS device
FROM step_parts WHERE run_id = $run AND ordinal >= $min_ordinal
GROUP BY rank ORDER BY rank
"""

#: Per kind of call (op, group, size): the median call's bandwidths (tracelab.measures).
_BANDWIDTH_SQL = f"""
SELECT op, pg_name, bytes, n AS ranks, source, count(*) AS count,
       median(transfer_ns) AS transfer_ns, median(algbw_gbps) AS algbw_gbps,
       median(busbw_gbps) AS busbw_gbps
FROM {COLLECTIVE_BANDWIDTH_SQL} WHERE transfer_ns > 0 AND bytes IS NOT NULL
GROUP BY op, pg_name, bytes, n, source ORDER BY count(*) * median(transfer_ns) DESC
"""

#: Exposed transfer per collective, per steady step and rank (they add up to the transfer
#: part of the budget: every transfer segment lies under a communication interval).
_EXPOSED_BY_SQL = """
WITH n AS (SELECT count(*) AS rs FROM step_parts WHERE run_id = $run AND ordinal >= $min_ordinal)
SELECT op, dim, pg_name, bytes, sum(exposed_ns) / any_value(n.rs) AS exposed_ns_per_step,
       list(DISTINCT rank ORDER BY rank) AS ranks
FROM comm_attribution, n
WHERE run_id = $run AND part = 'transfer'
  AND step IN (SELECT step FROM step_spans WHERE run_id = $run AND ordinal >= $min_ordinal)
GROUP BY op, dim, pg_name, bytes ORDER BY exposed_ns_per_step DESC, op, dim
"""


#: Per parallel dimension: its transfer and wait per steady step (the mean over ranks and
#: steady steps, as the budget's parts) and as shares of the step; over the dims they add up to
#: the budget's transfer and wait (comm_attribution; docs/metrics.md).
_BY_DIM_SQL = """
WITH n AS (SELECT count(*) AS rs, sum(step_ns) AS st FROM step_parts
           WHERE run_id = $run AND ordinal >= $min_ordinal)
SELECT dim, sum(transfer_ns) / any_value(n.rs) AS transfer_ns,
       sum(wait_ns) / any_value(n.rs) AS wait_ns,
       sum(transfer_ns) / any_value(n.st) AS transfer_share,
       sum(wait_ns) / any_value(n.st) AS wait_share,
       (SELECT list(DISTINCT g.group_key ORDER BY g.group_key) FROM process_groups g
        WHERE g.run_id = $run AND g.dim = d.dim) AS groups,
       (SELECT list(DISTINCT g.source ORDER BY g.source) FROM process_groups g
        WHERE g.run_id = $run AND g.dim = d.dim) AS sources
FROM job_step_dim_shares d, n
WHERE run_id = $run AND ordinal >= $min_ordinal
GROUP BY dim ORDER BY sum(transfer_ns + wait_ns) DESC, dim
"""

#: What to do about exposed transfer of each dimension.
DIM_FIXES = {
    Dim.TP.value: "Tensor-parallel all-reduces sit inside every layer's forward and backward, "
    "on the critical path: overlap them with compute (async tensor parallelism / "
    "micro-pipelined TP), use sequence parallelism (reduce-scatter + all-gather instead of "
    "all-reduce, smaller messages), or keep the TP group inside one node's fast links.",
    Dim.DP_SHARD.value: "FSDP's parameter all-gathers and gradient reduce-scatters are not "
    "hidden: prefetch the next layer's all-gather (forward_prefetch / "
    "set_modules_to_forward_prefetch, backward prefetch), wrap fewer, larger units, or "
    "reshard_after_forward=False for the last blocks.",
    Dim.DP.value: "Data-parallel gradient all-reduces are not hidden: tune the bucket size "
    "(DDP bucket_cap_mb: smaller buckets start during backward, larger ones cost fewer "
    "calls), reduce in bf16, or accumulate gradients over more microbatches per all-reduce.",
    Dim.PP.value: "Pipeline send/recv are exposed: pick a schedule that overlaps them "
    "(interleaved 1F1B, zero-bubble), use more microbatches, or balance the stages.",
    Dim.EP.value: "Expert-parallel all-to-alls are exposed: overlap dispatch/combine with "
    "expert compute, balance the routing, or shrink the EP group to a node.",
    Dim.CP.value: "Context-parallel exchanges are exposed: overlap the ring's KV exchange "
    "with attention compute, or shrink the CP degree.",
}


def _hta_ranks(con: duckdb.DuckDBPyConnection, run_id: int) -> list[dict[str, Any]]:
    """HTA's figures per rank, a batch of ranks at a time (their memory grows with events)."""
    sql = f"SELECT * FROM ({breakdown_sql(HTA_DEVICE_SQL, 'rank')}) ORDER BY rank"
    got = [
        x
        for lo, hi in rank_batches(con, run_id)
        for x in rows(con, sql, {"run": run_id, "lo": lo, "hi": hi})
    ]
    out = []
    for x in got:
        w = x["window_ns"]
        out.append(
            {
                "rank": x["rank"],
                "window_ns": w,
                "compute_ns": x["compute_ns"],
                "exposed_comm_ns": x["exposed_comm_ns"],
                "overlapped_comm_ns": x["overlapped_comm_ns"],
                "comm_ns": x["comm_ns"],
                "exposed_memcpy_ns": x["exposed_memcpy_ns"],
                "idle_ns": x["idle_ns"],
                "overlap_share": x["overlapped_comm_ns"] / x["comm_ns"] if x["comm_ns"] else None,
                "compute_share": x["compute_ns"] / w if w else None,
                "idle_share": x["idle_ns"] / w if w else None,
                "non_compute_share": (x["exposed_comm_ns"] + x["exposed_memcpy_ns"]) / w
                if w
                else None,
            }
        )
    return out


def analyze(con: duckdb.DuckDBPyConnection, ctx: RunContext, params: Mapping[str, Any]) -> Result:
    p = merge_params(NAME, DEFAULTS, params)
    steps_tbl = rows(con, _STEPS_SQL, {"run": ctx.run_id})
    ranks_tbl = rows(con, _RANKS_SQL, ctx.params)
    for x in ranks_tbl:
        w = x["window_ns"]
        x["mode"] = "device" if x.pop("device") else "host"
        for part in PARTS:
            x[f"{part}_share"] = x[f"{part}_ns"] / w if w else None
        # HTA's idle: nothing runs on the device (host, idle and pipeline time).
        x["device_idle_share"] = (
            (x["host_ns"] + x["idle_ns"] + x["bubble_ns"] + x["stall_ns"]) / w if w else None
        )
    if p["hta_compatible"]:
        ranks_tbl = _hta_ranks(con, ctx.run_id)
    if not steps_tbl:
        why = ctx.derived_errors.get("parts", "the run has no steps")
        return Result(
            analyzer=NAME,
            run=ctx.name,
            params=p,
            metrics={"ranks": 0},
            tables={"ranks": ranks_tbl},
            notes=(f"no lost-time parts: {why}.",),
        )
    bud = rows(
        con,
        f"""SELECT avg(step_ns) AS step_ns, {", ".join(f"avg({x}_ns) AS {x}_ns" for x in PARTS)},
                               sum(overlapped_comm_ns) / nullif(sum(comm_ns), 0) AS overlap,
                               avg(comm_ns - overlapped_comm_ns) AS exposed_comm_ns
                        FROM step_parts WHERE run_id = $run AND ordinal >= $min_ordinal""",
        ctx.params,
    )[0]
    step_ns = bud["step_ns"] or 0.0
    overlaps = [x["overlap_share"] for x in ranks_tbl if x.get("overlap_share") is not None]
    metrics: dict[str, Any] = {
        "ranks": len(ranks_tbl),
        "steps": len({x["step"] for x in steps_tbl}),
        "step_ns_mean": step_ns,
        **{f"{part}_share": (bud[f"{part}_ns"] / step_ns if step_ns else None) for part in PARTS},
        "overlap_share_mean": sum(overlaps) / len(overlaps) if overlaps else None,
        "exposed_comm_share": bud["exposed_comm_ns"] / step_ns if step_ns else None,
    }
    medians = rows(
        con,
        """SELECT median(exposed_comm_share) AS e, median(overlap_share) AS o,
                                  median(wait_share) AS w
                           FROM job_step_shares WHERE run_id = $run AND ordinal >= $min_ordinal""",
        ctx.params,
    )[0]
    metrics.update(
        {
            "exposed_comm_share_median": medians["e"],
            "overlap_share_median": medians["o"],
            "wait_share_median": medians["w"],
        }
    )
    by_dim = rows(con, _BY_DIM_SQL, ctx.params)
    for x in by_dim:
        metrics[f"transfer_share[{x['dim']}]"] = x["transfer_share"]
        metrics[f"wait_share[{x['dim']}]"] = x["wait_share"]
    dim_steps: dict[str, list[float]] = {}
    for _step, dim, share in con.execute(DIM_COMM_SHARES_SQL, ctx.params).fetchall():
        dim_steps.setdefault(str(dim), []).append(float(share))
    for dim, shares in sorted(dim_steps.items()):
        # The report's dim_comm_share[dim] (its median over steady steps).
        metrics[f"dim_comm_share_median[{dim}]"] = float(statistics.median(shares))
    bandwidth = rows(con, _BANDWIDTH_SQL, {"run": ctx.run_id})
    exposed_by = rows(con, _EXPOSED_BY_SQL, ctx.params)
    findings = []
    transfer = bud["transfer_ns"] or 0.0
    if step_ns and transfer > p["exposed_comm_threshold"] * step_ns:
        findings.append(
            _exposed_comm(ctx, transfer, step_ns, metrics, exposed_by, bandwidth, ranks_tbl, by_dim)
        )
    host = bud["host_ns"] or 0.0
    if step_ns and host > p["host_bound_threshold"] * step_ns:
        findings.append(_host_bound(con, ctx, host, host / step_ns, ranks_tbl))
    notes = []
    if any(x.get("mode") == "host" for x in ranks_tbl):
        notes.append(
            "host-only ranks: compute is operator time minus the thread's own "
            "communication waits; communication is gloo/c10d spans on any thread; "
            "'host' is time no operator or communication covers (Python, sleeps, "
            "data loading)."
        )
    return Result(
        analyzer=NAME,
        run=ctx.name,
        params=p,
        metrics=metrics,
        tables={
            "ranks": ranks_tbl,
            "steps": steps_tbl,
            "exposed_by_collective": exposed_by,
            "by_dim": by_dim,
            "bandwidth": bandwidth,
        },
        findings=tuple(findings),
        notes=tuple(notes),
    )


def _exposed_comm(
    ctx: RunContext,
    transfer: float,
    step_ns: float,
    metrics: dict[str, Any],
    exposed_by: list[dict[str, Any]],
    bandwidth: list[dict[str, Any]],
    ranks_tbl: list[dict[str, Any]],
    by_dim: list[dict[str, Any]],
) -> Finding:
    bw = {(b["op"], b["pg_name"], b["bytes"]): b for b in bandwidth}
    numbers: dict[str, float | int | str | None] = {
        "transfer_ns_per_step": transfer,
        "step_ns": step_ns,
        "overlap_share": metrics["overlap_share_mean"],
    }
    names = []
    for i, x in enumerate(exposed_by[:3], 1):
        b = bw.get((x["op"], x["pg_name"], x["bytes"]))
        group = f" on process group {x['pg_name']}" if x["pg_name"] is not None else ""
        op = {
            "unknown": "communication ops the trace does not name",
            "wait_tensor": "waits for async collectives (wait_tensor)",
        }.get(x["op"], x["op"])
        on = f" ({x['dim']})" if x["dim"] != Dim.UNKNOWN.value else ""
        text = (
            f"{op}{on} {size_str(x['bytes'])}{group}: "
            f"{ms(x['exposed_ns_per_step'])} exposed per step"
        )
        if b is not None and b["busbw_gbps"] is not None:
            text += f", bus bandwidth {b['busbw_gbps']:.3g} GB/s" + (
                " (host-timed: includes host scheduling)" if b["source"] == "host" else ""
            )
        numbers[f"collective_{i}"] = text
        names.append(op if x["bytes"] is None else f"{op} {size_str(x['bytes'])}")
    overlap = metrics["overlap_share_mean"]
    what = ", ".join(names) or "communication"
    low_overlap = overlap is None or overlap < LOW_OVERLAP
    ranks = tuple(x["rank"] for x in ranks_tbl if (x.get("transfer_ns") or 0) > 0)
    if low_overlap:
        fix = f"Not overlapped: only {pct(overlap)} of communication runs under compute. " + (
            "Start gradient all-reduces during backward (DDP: smaller bucket_cap_mb so the "
            "first buckets go early; FSDP: backward_prefetch, forward_prefetch), prefetch "
            "parameters a layer ahead, and keep collectives on their own stream."
        )
    else:
        fix = (
            f"Already {pct(overlap)} overlapped: what is left is too slow to hide. Compare "
            "the bus bandwidth above with your interconnect (NVLink hundreds of GB/s, "
            "InfiniBand/RoCE 25-50 GB/s per link); if far below, check NCCL's transport "
            "and topology settings; otherwise move fewer bytes (bf16 gradients, fewer "
            "sharded parameters, larger buckets)."
        )
    # The known dimension whose transfer is most exposed names the finding and its own fix.
    known = [x for x in by_dim if x["dim"] != Dim.UNKNOWN.value]
    top = max(known, key=lambda x: x["transfer_ns"] or 0.0, default=None)
    dim = top["dim"] if top is not None and (top["transfer_ns"] or 0) > 0 else None
    if dim is not None:
        numbers["dim"] = dim
        for x in by_dim:
            if x["transfer_ns"]:
                numbers[f"transfer_ns_per_step[{x['dim']}]"] = x["transfer_ns"]
    if dim in DIM_FIXES and low_overlap:
        fix = f"Not overlapped: only {pct(overlap)} of communication runs under compute. "
        fix += DIM_FIXES[dim]
    elif dim in DIM_FIXES:
        fix = DIM_FIXES[dim] + " " + fix
    label = DIM_LABELS.get(Dim(dim), dim) if dim in {d.value for d in Dim} else None
    return Finding(
        code=Code.EXPOSED_COMM,
        severity=Severity.WARNING,
        title="Communication transfer not hidden by compute costs {impact_pct} of the step "
        + (f"(most on {label}: {what})" if label and dim != Dim.UNKNOWN.value else f"({what})"),
        evidence=Evidence(ranks=ranks, numbers=numbers),
        claim=Claim(parts=(("transfer", round(transfer)),)),
        suggestion=fix
        + " Waiting for late ranks is not counted here (see the stragglers)."
        + (" " + SIZE_UNKNOWN_WHY if any(x["bytes"] is None for x in exposed_by[:3]) else ""),
        analyzer=NAME,
        view="timeline",
    )


#: Ranks whose host shares are this close (0.1 percentage point) are alike.
ALIKE_SHARE = 0.001


def _where_most(shares: dict[int, float], worst: list[int]) -> str:
    """' (most on rank 3)'; ranks tied at the top are named together (up to 3), and a run whose
    ranks are all alike says so: "most on rank 0" named a rank no worse than any other."""
    if len(worst) < 2:
        return ""
    top = [r for r in worst if shares[r] >= shares[worst[0]] - ALIKE_SHARE]
    if len(top) == len(worst):
        return " (every rank alike)"
    if len(top) <= 3:
        return f" (most on {ranks_str(top)})"
    return f" (most on {len(top)} ranks alike)"


def _host_bound(
    con: duckdb.DuckDBPyConnection,
    ctx: RunContext,
    host: float,
    share: float,
    ranks_tbl: list[dict[str, Any]],
) -> Finding:
    """The title states the host part of the step as measured (`share`), as the breakdown
    does; the finding's impact, beside it, is the part of it no finding above explains (a
    straggler's sleep is its own): a title of "{impact_pct}" read 6.4% where the host was 43.5%
    of the step."""
    shares = {x["rank"]: x.get("host_share") or 0.0 for x in ranks_tbl}
    worst = sorted(shares, key=lambda r: -shares[r])
    # What the host did, read from the events of the ranks with the most host time only: of
    # every rank, the reads grew with the run (10,000 ranks: 9.3 s of a 16.9 s analysis).
    sample = worst[:HOST_EVIDENCE_RANKS] if len(worst) > HOST_EVIDENCE_RANKS else None
    top = host_activity(con, ctx, sample)
    total = host_total(con, ctx, sample) or 1
    whose = "the host time" if sample is None else f"the host time of these {len(sample)} ranks"
    numbers: dict[str, float | int | str | None] = {"host_ns_per_step": host}
    if sample is not None:
        numbers["host_spans_of_ranks"] = (
            f"{ranks_str(sample)}: the {len(sample)} with the most host time "
            "(of ranks alike, the lowest)"
        )
    for i, x in enumerate(top[:3], 1):
        numbers[f"host_span_{i}"] = f"{x['name']}: overlaps {100 * x['ns'] / total:.0f}% of {whose}"
    device = any(x.get("mode") == "device" for x in ranks_tbl)
    return Finding(
        code=Code.HOST_BOUND,
        severity=Severity.WARNING,
        title=f"The {'device' if device else 'training loop'} waits on the host "
        f"{pct(share)} of the step" + _where_most(shares, worst),
        evidence=Evidence(ranks=tuple(worst), numbers=numbers),
        claim=Claim(parts=(("host", round(host)),)),
        suggestion=(
            "Find what the host does in those gaps (the spans above): data loading "
            "(more DataLoader workers, pin_memory, prefetching), Python overhead "
            "between kernels (CUDA graphs, torch.compile, larger kernels), "
            "synchronizing calls (.item(), printing losses), or sleeps and garbage "
            "collection in the loop."
        ),
        analyzer=NAME,
        view="timeline",
    )
