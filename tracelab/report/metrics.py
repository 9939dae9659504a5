"""What a report compares, read from one run in the store.

Every figure is the derived layer's (docs/metrics.md) over the steady steps that every surface
uses (the first `warmup_steps` steps of the run are warm-up): the report shows the same step
time, shares and findings as `tracelab analyze` and the app. Per step (its samples, for the
bootstrap and the rank test; the report shows and compares their median, the robust figure a
gate needs, which `tracelab analyze` shows as steps' `step_ns_median`):

- step_time: job_steps.dur_ns, the mean over ranks of each rank's (tiled) step.
- exposed_comm_share: over ranks, communication not under compute / step time (step_parts).
- comm_overlap: over ranks, communication under compute / communication.
- dim_comm_share[dim]: over ranks, the transfer and wait of one parallel dimension / step time
  (job_step_dim_shares); only for runs with two or more known dimensions.
- straggler_wait: over ranks, the wait part / step time (time waiting for the last arriver).
- bubble_share[stage=s]: the rank holding stage s, (bubble + stall) / its step time.
- collective_bandwidth[op]: matched collectives of at least 256 KiB: sum(bytes x bus factor)
  / sum(transfer time), in GB/s (nccl-tests busbw). Shown but not gated for host-timed (gloo)
  collectives.
- op_time[name]: time inside ops (CPU runs) or kernels (GPU runs) of that name per step,
  averaged over ranks.

peak_memory and memory_imbalance come from the memory analyzer (one value per run). The
findings are the runner's (tracelab.analyzers.run), in its order. A metric the run cannot
measure (no pipeline, no collectives) is absent rather than misleading.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np

from tracelab.derived import sqlfiles
from tracelab.derived.batches import ALL_RANKS
from tracelab.errors import InputError
from tracelab.measures import COLLECTIVE_BANDWIDTH_SQL, DIM_COMM_SHARES_SQL
from tracelab.report.compare import MetricValue, RunMetrics, RunSummary
from tracelab.report.thresholds import ReportSettings
from tracelab.vocabulary import P2P_OPS

if TYPE_CHECKING:
    from tracelab.analyzers import Analysis

NS_PER_MS = 1e6
#: Op/kernel names longer than this are shortened in labels (the row key keeps the full name).
LABEL_CHARS = 90
#: Device categories whose per-name totals make the op/kernel table on GPU runs.
DEVICE_OP_CATEGORIES = ("compute", "communication", "memcpy", "memset")
#: Collectives smaller than this measure latency, not bandwidth; they are left out.
MIN_BANDWIDTH_BYTES = 256 << 10
HOST_TIMED_NOTE = (
    "host-timed collectives (gloo): the transfer time includes host "
    "scheduling, so it is no measure of link bandwidth"
)

#: The steady (rank, step) pairs: the same selection as the analyzers' (step_spans.ordinal).
_KEPT_STEPS_SQL = """
    SELECT rank, step, dur_ns FROM step_spans WHERE run_id = $run AND ordinal >= $warmup
"""


def _scalar(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> Any:
    rows = con.execute(sql, params).fetchall()
    return rows[0][0] if rows else None


def _sampled(key: str, gate: str, label: str, by_step: dict[int, float]) -> MetricValue:
    samples = tuple(by_step[s] for s in sorted(by_step))
    return MetricValue(
        key=key,
        gate=gate,
        label=label,
        value=float(np.median(samples)) if samples else None,
        samples=samples,
    )


#: Per op name and kept step: its time summed over the step's kept ranks, divided by their
#: number (op_totals' rows of kind $kind, summed over its batches).
_OP_TOTALS_SQL = f"""
WITH kept AS ({_KEPT_STEPS_SQL}),
per_step AS (SELECT step, count(*) AS ranks FROM kept GROUP BY step),
o AS (
    SELECT step, name, sum(dur_ns) AS dur_ns FROM {{totals}}
    WHERE run_id = $run AND kind = $kind AND ordinal >= $warmup GROUP BY step, name
)
SELECT o.name, o.step, o.dur_ns / p.ranks AS dur_ns FROM o JOIN per_step p USING (step)
"""


def _op_times(
    con: duckdb.DuckDBPyConnection, run_id: int, min_ordinal: int
) -> dict[str, MetricValue]:
    """Time per step of each op (CPU runs) or kernel (GPU runs), averaged over ranks.

    Inclusive time summed per name: nested cpu_ops each count their own span, so values are
    "time spent inside ops of this name", not shares that add up to the step.
    """
    # Stops at the first device op (counting them all read every rank's file: 2.4 s at
    # 10,000 ranks, 0.55 s so).
    on_gpu = _scalar(
        con,
        "SELECT count(*) > 0 FROM (SELECT 1 FROM events WHERE run_id = $run AND on_device "
        "AND list_contains($cats, category) LIMIT 1)",
        {"run": run_id, "cats": list(DEVICE_OP_CATEGORIES)},
    )
    kind = "kernel" if on_gpu else "op"
    params: dict[str, Any] = {"run": run_id, "warmup": min_ordinal, "kind": kind}
    # The derived totals (op_totals); where the run has none (its parts could not be
    # derived), op_totals.sql's own query over every rank's events: the same sums.
    totals = "op_totals"
    if not _scalar(con, "SELECT count(*) FROM op_totals WHERE run_id = $run", {"run": run_id}):
        totals = f"({sqlfiles.query('op_totals')})"
        params.update(lo=ALL_RANKS[0], hi=ALL_RANKS[1])
    rows = con.execute(_OP_TOTALS_SQL.format(totals=totals), params).fetchall()
    steps = sorted({int(step) for _, step, _ in rows})
    col = {step: i for i, step in enumerate(steps)}
    by_name: dict[str, np.ndarray] = {}
    for name, step, dur in rows:
        arr = by_name.setdefault(name, np.zeros(len(steps)))
        arr[col[int(step)]] = float(dur) / NS_PER_MS
    out = {}
    for name, arr in by_name.items():
        label = name if len(name) <= LABEL_CHARS else name[: LABEL_CHARS - 1] + "…"
        key = f"op_time[{name}]"
        out[key] = MetricValue(
            key=key,
            gate="op_time",
            label=f"{kind} {label}",
            value=float(np.median(arr)),
            samples=tuple(arr.tolist()),
        )
    return out


def _summary(
    con: duckdb.DuckDBPyConnection, run_id: int
) -> tuple[str, tuple[str, ...], int, int | None]:
    row = con.execute(
        "SELECT name, source, rank_count, world_size FROM runs WHERE run_id = $run", {"run": run_id}
    ).fetchone()
    if row is None:
        raise InputError(f"run id {run_id} is not in the store")
    source = tuple(str(p) for p in json.loads(row[1] or "[]"))
    return str(row[0]), source, int(row[2]), None if row[3] is None else int(row[3])


#: Per steady step, over ranks: the shares the report gates (the derived view
#: job_step_shares; docs/metrics.md).
_STEP_SHARES_SQL = """
SELECT step, exposed_comm_share, overlap_share, wait_share, ranks FROM job_step_shares
WHERE run_id = $run AND ordinal >= $warmup ORDER BY step
"""

_PER_RANK_SQL = """
SELECT rank, avg(step_ns) / 1e6 AS step_time_ms, avg(compute_ns) / 1e6 AS compute_ms,
       avg(transfer_ns) / 1e6 AS transfer_ms, avg(wait_ns) / 1e6 AS wait_ms,
       avg(bubble_ns + stall_ns) / 1e6 AS pipeline_idle_ms, avg(host_ns) / 1e6 AS host_ms,
       avg(idle_ns) / 1e6 AS idle_ms
FROM step_parts WHERE run_id = $run AND ordinal >= $warmup GROUP BY rank ORDER BY rank
"""

#: Per op and steady step: the calls' bus bytes over their transfer time (tracelab.measures).
_BANDWIDTH_SQL = f"""
SELECT op, step, sum(bus_bytes) AS bus_bytes, sum(transfer_ns) AS transfer_ns,
       bool_or(source = 'host') AS host_timed
FROM {COLLECTIVE_BANDWIDTH_SQL}
WHERE transfer_ns > 0 AND bytes >= $min_bytes AND NOT list_contains($p2p_ops, op)
  AND step IN (SELECT step FROM step_spans WHERE run_id = $run AND ordinal >= $warmup)
GROUP BY op, step
"""


def _step_metrics(
    con: duckdb.DuckDBPyConnection, run_id: int, min_ordinal: int, total_steps: int
) -> tuple[dict[str, MetricValue], list[str]]:
    params = {"run": run_id, "warmup": min_ordinal}
    values: dict[str, MetricValue] = {}
    notes: list[str] = []
    job = dict(
        con.execute(
            "SELECT step, dur_ns / 1e6 FROM job_steps WHERE run_id = $run "
            "AND ordinal >= $warmup ORDER BY step",
            params,
        ).fetchall()
    )
    if job:
        values["step_time"] = _sampled("step_time", "step_time", "Step time (median step)", job)
    else:
        note = (
            f"no steps left after dropping warm-up steps ({total_steps} step(s) in the "
            "run): profile more steps or lower warmup_steps"
        )
        values["step_time"] = MetricValue(
            key="step_time", gate="step_time", label="Step time", value=None, note=note
        )
        notes.append(note)
    shares = con.execute(_STEP_SHARES_SQL, params).fetchall()
    exposed = {s: e for s, e, _, _, _ in shares if e is not None}
    overlap = {s: o for s, _, o, _, _ in shares if o is not None}
    wait = {s: w for s, _, _, w, _ in shares if w is not None}
    if exposed:
        values["exposed_comm_share"] = _sampled(
            "exposed_comm_share",
            "exposed_comm_share",
            "Exposed communication incl. waiting (share of step, median)",
            exposed,
        )
    if overlap:
        values["comm_overlap"] = _sampled(
            "comm_overlap", "comm_overlap", "Comm/compute overlap (share of comm, median)", overlap
        )
    if wait and _scalar(
        con, "SELECT count(*) FROM matched_collectives WHERE run_id = $run", {"run": run_id}
    ):
        values["straggler_wait"] = _sampled(
            "straggler_wait",
            "straggler_wait",
            "Waiting for other ranks (share of step, median)",
            wait,
        )
    by_dim: dict[str, dict[int, float]] = defaultdict(dict)
    dim_params = {"run": run_id, "min_ordinal": min_ordinal}
    for step, dim, share in con.execute(DIM_COMM_SHARES_SQL, dim_params).fetchall():
        by_dim[str(dim)][int(step)] = float(share)
    # Per dimension only where the run has several: with one, the figure is exposed
    # communication again, and a regression would be reported twice.
    if len([d for d in by_dim if d != "unknown"]) < 2:
        by_dim.clear()
    for dim, dim_shares in sorted(by_dim.items()):
        key = f"dim_comm_share[{dim}]"
        values[key] = _sampled(
            key,
            "dim_comm_share",
            f"Exposed communication incl. waiting, {dim} (share of step, median)",
            dim_shares,
        )
    acc: dict[str, dict[int, tuple[float, float]]] = defaultdict(dict)
    host_timed: dict[str, bool] = {}
    gloo = bool(
        _scalar(
            con,
            "SELECT count(*) FROM ranks WHERE run_id = $run AND lower(backend) = 'gloo'",
            {"run": run_id},
        )
    )
    for op, step, bus_bytes, transfer_ns, host in con.execute(
        _BANDWIDTH_SQL, {**params, "min_bytes": MIN_BANDWIDTH_BYTES, "p2p_ops": list(P2P_OPS)}
    ).fetchall():
        acc[str(op)][int(step)] = (float(bus_bytes), float(transfer_ns))
        host_timed[str(op)] = host_timed.get(str(op), False) or bool(host) or gloo
    for op, by_step in sorted(acc.items()):
        gbps = {s: b / t for s, (b, t) in by_step.items() if t > 0}  # bytes/ns = GB/s
        key = f"collective_bandwidth[{op}]"
        mv = _sampled(key, "collective_bandwidth", f"Collective bandwidth, {op} (busbw)", gbps)
        if host_timed[op]:  # shown, never gated
            mv = replace(mv, gateable=False, note=HOST_TIMED_NOTE)
        values[key] = mv
    return values, notes


def _pipeline_metrics(
    con: duckdb.DuckDBPyConnection,
    run_id: int,
    min_ordinal: int,
    pipeline: dict[str, Any],
    notes: list[str],
) -> dict[str, MetricValue]:
    """(bubble + stall) / step per stage, per step; only for runs that declare a pipeline
    (capture manifest or pipeline annotations): stages inferred from host ops alone also fit
    plain data-parallel runs, and a bubble share there would mislead."""
    if not pipeline.get("pipeline"):
        return {}
    if pipeline.get("source") == "host_ops" and not pipeline.get("schedule_declared"):
        notes.append(
            "pipeline bubbles not compared: the run declares no pipeline and the "
            "stages were only inferred from host ops"
        )
        return {}
    rows = con.execute(
        """SELECT sp.rank, sp.step, (sp.bubble_ns + sp.stall_ns) / nullif(sp.step_ns, 0),
                  (SELECT list(DISTINCT stage ORDER BY stage) FROM pipeline_actions a
                   WHERE a.run_id = sp.run_id AND a.rank = sp.rank)
           FROM step_parts sp JOIN pipeline_ranks USING (run_id, rank, step)
           WHERE sp.run_id = $run AND sp.ordinal >= $warmup AND sp.step_ns > 0""",
        {"run": run_id, "warmup": min_ordinal},
    ).fetchall()
    by: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for rank, step, share, stages in rows:
        if stages is not None and len(stages) == 1:
            key, label = f"bubble_share[stage={stages[0]}]", f"Pipeline bubble, stage {stages[0]}"
        else:
            key, label = f"bubble_share[rank={rank}]", f"Pipeline bubble, rank {rank}"
        by[(key, label)][int(step)] = float(share)
    return {key: _sampled(key, "bubble_share", label, v) for (key, label), v in by.items()}


#: What a peak was measured from (tracelab.analyzers.memory's source): peaks of different
#: sources are shown side by side, never gated against each other (a capture with and one
#: without [memory] events read as +6,900% peak memory).
_MEMORY_BASIS = {
    "step_peak": "the device allocator's peaks",
    "trace": "the trace's [memory] events",
    "rss": "process RSS",
}


def _memory_metrics(
    memory: dict[str, Any], tables: dict[str, list[dict[str, Any]]]
) -> dict[str, MetricValue]:
    """Peak allocated memory per stage (pipelines) or the largest over ranks, and max/mean."""
    if not memory.get("source"):
        return {}
    out: dict[str, MetricValue] = {}
    lower = " (lower bound: trace events)" if memory.get("peak_is_lower_bound") else ""
    basis = _MEMORY_BASIS.get(str(memory["source"]), str(memory["source"]))
    stage_rows = tables.get("stages") or []
    if stage_rows:
        for x in stage_rows:
            key = f"peak_memory[stage={x['stage']}]"
            out[key] = MetricValue(
                key=key,
                gate="peak_memory",
                label=f"Peak memory, stage {x['stage']}{lower}",
                value=float(x["peak_bytes"]),
                basis=basis,
            )
        peaks = [float(x["peak_bytes"]) for x in stage_rows]
        what = "stages"
    else:
        peaks = [
            float(x["peak_bytes"])
            for x in tables.get("ranks", [])
            if x.get("peak_bytes") is not None
        ]
        out["peak_memory"] = MetricValue(
            key="peak_memory",
            gate="peak_memory",
            label=f"Peak memory, largest rank{lower}",
            value=max(peaks) if peaks else None,
            basis=basis,
        )
        what = "ranks"
    if len(peaks) > 1 and np.mean(peaks) > 0:
        out["memory_imbalance"] = MetricValue(
            key="memory_imbalance",
            gate="memory_imbalance",
            label=f"Memory imbalance (max/mean over {what})",
            value=float(max(peaks) / np.mean(peaks)),
            basis=basis,
        )
    return out


def extract(
    con: duckdb.DuckDBPyConnection,
    run_id: int,
    settings: ReportSettings,
    analysis: Analysis | None = None,
) -> RunMetrics:
    """Every metric of one run that the report compares, and the runner's findings. An
    analyzer that fails is named in `errors` (the report then cannot judge everything).
    `analysis`: the runner's result for this run when the caller has it (the app's cache); it
    must have been made with the settings' warm-up steps."""
    from tracelab.analyzers import run as run_analyzers

    name, source, rank_count, world = _summary(con, run_id)
    if analysis is None or (
        analysis.context is not None and analysis.context.warmup_steps != settings.warmup_steps
    ):
        analysis = run_analyzers(con, run_id, warmup_steps=settings.warmup_steps)
    min_ordinal = analysis.context.min_ordinal if analysis.context else settings.warmup_steps
    total = int(
        _scalar(
            con, "SELECT count(DISTINCT step) FROM step_spans WHERE run_id = $run", {"run": run_id}
        )
        or 0
    )
    kept = int(
        _scalar(
            con,
            "SELECT count(DISTINCT step) FROM step_spans WHERE run_id = $run AND ordinal >= $warmup",
            {"run": run_id, "warmup": min_ordinal},
        )
        or 0
    )
    values, notes = _step_metrics(con, run_id, min_ordinal, total)
    # The analyzers fall back to every step of a run no longer than its warm-up: said here, or
    # a gate on 10 steps with --warmup-steps 20 read "0 warm-up dropped".
    warmup_kept = settings.warmup_steps if min_ordinal < settings.warmup_steps else 0
    if warmup_kept:
        notes.append(
            f"the run has {total} step(s), not more than the {settings.warmup_steps} warm-up "
            "step(s) to drop: every step is compared, warm-up included. Profile more steps or "
            "lower warmup_steps."
        )
    pipe = analysis.get("pipeline")
    values.update(_pipeline_metrics(con, run_id, min_ordinal, pipe.metrics if pipe else {}, notes))
    mem = analysis.get("memory")
    if mem is not None:
        values.update(_memory_metrics(mem.metrics, mem.tables))
    values.update(_op_times(con, run_id, min_ordinal))
    per_rank = [
        dict(
            zip(
                (
                    "rank",
                    "step_time_ms",
                    "compute_ms",
                    "transfer_ms",
                    "wait_ms",
                    "pipeline_idle_ms",
                    "host_ms",
                    "idle_ms",
                ),
                r,
                strict=True,
            )
        )
        for r in con.execute(_PER_RANK_SQL, {"run": run_id, "warmup": min_ordinal}).fetchall()
    ]
    summary = RunSummary(
        name=name,
        run_id=run_id,
        source=source,
        ranks=rank_count,
        world_size=world,
        steps_used=kept,
        steps_dropped=max(total - kept, 0),
        warmup_kept=warmup_kept,
    )
    return RunMetrics(
        run=summary,
        values=values,
        findings=analysis.findings,
        tables={"per_rank": per_rank},
        notes=tuple(notes),
        errors=dict(analysis.errors),
    )
