"""Report metrics read from the analyzers' results (tracelab.analyzers.run_all).

Each gate family maps to one analyzer's output, read here and nowhere else:

- exposed_comm_share, comm_overlap: `breakdown`, table "steps" (per rank and step); per step,
  summed over ranks: exposed comm / window, overlapped comm / comm.
- collective_bandwidth: matched group collectives of at least 256 KiB (the analyzers'
  `matched_sql`), per step and op: sum(bytes x bus factor) / sum(transfer time), in GB/s
  (nccl-tests busbw). Shown but not gated for host-timed (gloo) collectives.
- step_time: `steps`, table "steps" (per rank and step); a step's time is its slowest rank's.
- straggler_wait: `stragglers`, tables "waits" and "steps": per step, the mean over ranks of
  each rank's total wait for the last arriver, as a share of the step.
- bubble_share: `pipeline`, table "steps" (bubble_share per rank and step), keyed by the stage
  the rank holds.
- peak_memory, memory_imbalance: `memory`, tables "stages" (pipelines) or "ranks"; one value per
  run (threshold only), max/mean over stages or ranks.

Warm-up steps are dropped from every per-step table, as for step time. A metric an analyzer
cannot measure on this run (no pipeline, no collectives) is simply absent; the report then
shows nothing for it rather than a misleading number.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import duckdb
import numpy as np

from tracelab.report.compare import MetricValue
from tracelab.report.metrics import kept_steps
from tracelab.report.thresholds import ReportSettings
from tracelab.results import Finding, Result

GIB = float(1 << 30)
#: Collectives smaller than this measure latency, not bandwidth; they are left out.
MIN_BANDWIDTH_BYTES = 256 << 10
HOST_TIMED_NOTE = ("host-timed collectives (gloo): the transfer time includes host "
                   "scheduling, so it is no measure of link bandwidth")
#: Sources of collective timings for bandwidth, most precise first.
BANDWIDTH_SOURCES = ("collector", "kernel", "flight_recorder", "host")


@dataclass(kw_only=True)
class AnalyzerMetrics:
    """What the analyzers contribute to one run's RunMetrics."""

    values: dict[str, MetricValue] = field(default_factory=dict)
    #: Rows {rank, <part>_ms, ...} merged into the per-rank figure.
    per_rank: list[dict[str, Any]] = field(default_factory=list)
    findings: tuple[Finding, ...] = ()
    notes: list[str] = field(default_factory=list)


def _sampled(key: str, gate: str, label: str, by_step: dict[int, float]) -> MetricValue:
    samples = tuple(by_step[s] for s in sorted(by_step))
    return MetricValue(key=key, gate=gate, label=label,
                       value=float(np.median(samples)) if samples else None, samples=samples)


def _kept_rows(rows: Iterable[dict[str, Any]], kept: set[tuple[int, int]]) -> list[dict[str, Any]]:
    return [x for x in rows if (int(x["rank"]), int(x["step"])) in kept]


def _by_step(rows: list[dict[str, Any]], field_: str, agg: Callable[[list[float]], float]
             ) -> dict[int, float]:
    per: dict[int, list[float]] = defaultdict(list)
    for x in rows:
        if x.get(field_) is not None:
            per[int(x["step"])].append(float(x[field_]))
    return {s: agg(v) for s, v in per.items()}


def _steps(res: Result, kept: set[tuple[int, int]], out: AnalyzerMetrics) -> None:
    """Step time of a step = the slowest rank's (the steps analyzer's definition, which counts
    device work launched in the step)."""
    rows = _kept_rows(res.tables.get("steps", []), kept)
    by_step = _by_step(rows, "step_ms", max)
    value = _sampled("step_time", "step_time", "Step time", by_step)
    if not by_step:
        total = int(res.metrics.get("steps") or 0)
        value = MetricValue(key="step_time", gate="step_time", label="Step time", value=None,
                            note=f"no ProfilerStep spans left after dropping warm-up steps "
                                 f"({total} step(s) in the run): profile more steps or lower "
                                 "warmup_steps")
        out.notes.append(value.note)
    out.values["step_time"] = value
    per_rank: dict[int, list[float]] = defaultdict(list)
    for x in rows:
        if x.get("step_ms") is not None:
            per_rank[int(x["rank"])].append(float(x["step_ms"]))
    out.per_rank += [{"rank": r, "step_time_ms": float(np.median(v))}
                     for r, v in sorted(per_rank.items())]


def _breakdown(res: Result, kept: set[tuple[int, int]], out: AnalyzerMetrics) -> None:
    rows = _kept_rows(res.tables.get("steps", []), kept)
    sums: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for x in rows:
        acc = sums[int(x["step"])]
        for part in ("window_ms", "exposed_comm_ms", "overlapped_comm_ms", "comm_ms"):
            acc[part] += float(x.get(part) or 0.0)
    exposed = {s: a["exposed_comm_ms"] / a["window_ms"] for s, a in sums.items()
               if a["window_ms"] > 0}
    overlap = {s: a["overlapped_comm_ms"] / a["comm_ms"] for s, a in sums.items()
               if a["comm_ms"] > 0}
    if exposed:
        out.values["exposed_comm_share"] = _sampled(
            "exposed_comm_share", "exposed_comm_share", "Exposed communication (share of step)",
            exposed)
    if overlap:
        out.values["comm_overlap"] = _sampled(
            "comm_overlap", "comm_overlap", "Comm/compute overlap (share of comm)", overlap)
    per_rank: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for x in rows:
        for part in ("compute_ms", "exposed_comm_ms", "idle_ms"):
            if x.get(part) is not None:
                per_rank[int(x["rank"])][part].append(float(x[part]))
    out.per_rank += [{"rank": r, **{k: float(np.median(v)) for k, v in parts.items()}}
                     for r, parts in sorted(per_rank.items())]


def _bandwidth(con: duckdb.DuckDBPyConnection, run_id: int, kept: set[tuple[int, int]],
               out: AnalyzerMetrics) -> None:
    """Bus bandwidth per op over bandwidth-bound messages (>= MIN_BANDWIDTH_BYTES): small
    messages measure latency, and a 4-byte loss all-reduce would otherwise set the number.
    Uses the first source (collector, kernel, flight recorder, host) that timed such messages
    on two or more ranks."""
    from tracelab.analyzers._collectives import BUS_FACTOR_SQL, matched_sql, offsets_relation

    found = dict(con.execute(
        """SELECT source, count(DISTINCT rank) FROM collectives
           WHERE run_id = ? AND start_ns IS NOT NULL AND end_ns IS NOT NULL AND step IS NOT NULL
             AND coalesce(in_bytes, out_bytes) >= ? AND op NOT IN ('send', 'recv', 'send_recv')
           GROUP BY source""", [run_id, MIN_BANDWIDTH_BYTES]).fetchall())
    source = next((s for s in BANDWIDTH_SOURCES if found.get(s, 0) >= 2), None)
    if source is None:
        return
    ranks = con.execute("SELECT rank, backend FROM ranks WHERE run_id = ?", [run_id]).fetchall()
    host_timed = source == "host" or any(str(b).lower() == "gloo" for _, b in ranks)
    # Transfer time is the shortest duration across the ranks: no clock alignment needed.
    rel, rel_params = offsets_relation({int(r): 0 for r, _ in ranks})
    rows = con.execute(
        f"""
        WITH mt AS ({matched_sql(rel)}),
        per AS (SELECT key, any_value(op) AS op, any_value(step) AS step,
                       any_value(bytes) AS bytes, any_value(n) AS n,
                       any_value(transfer_ns) AS transfer_ns, list(rank) AS ranks
                FROM mt GROUP BY key)
        SELECT op, step, ranks, sum(bytes * {BUS_FACTOR_SQL}) AS bus_bytes,
               sum(transfer_ns) AS transfer_ns
        FROM per WHERE transfer_ns > 0 AND bytes >= ? AND step IS NOT NULL
        GROUP BY op, step, ranks
        """,
        [run_id, source, *rel_params, MIN_BANDWIDTH_BYTES],
    ).fetchall()
    acc: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for op, step, members, bus_bytes, transfer_ns in rows:
        if not any((int(r), int(step)) in kept for r in members):
            continue
        cell = acc[str(op)][int(step)]
        cell[0] += float(bus_bytes)
        cell[1] += float(transfer_ns)
    for op, by_step in sorted(acc.items()):
        gbps = {s: b / t for s, (b, t) in by_step.items() if t > 0}  # bytes/ns = GB/s
        key = f"collective_bandwidth[{op}]"
        mv = _sampled(key, "collective_bandwidth", f"Collective bandwidth, {op} (busbw)", gbps)
        if host_timed:  # shown, never gated
            mv = replace(mv, gateable=False, note=HOST_TIMED_NOTE)
        out.values[key] = mv


def _union_ms(spans: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) spans (ns in, ms out)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total / 1e6


def _stragglers(res: Result, kept: set[tuple[int, int]], out: AnalyzerMetrics) -> None:
    """Per step: the mean over ranks of the time each rank waited for last arrivers, as a
    share of the step (the analyzer's measured step time). A rank's waits are the spans
    [its arrival, the last arrival] of its collectives, merged: gloo runs several bucket
    all-reduces at once, and summing their waits would count the same wait several times."""
    rows = _kept_rows((x for x in res.tables.get("waits", []) if x.get("step") is not None),
                      kept)
    spans: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for x in rows:
        wait_ns = float(x.get("wait_ms") or 0.0) * 1e6
        if wait_ns > 0 and x.get("arrival_ns") is not None:
            a = float(x["arrival_ns"])
            spans[(int(x["rank"]), int(x["step"]))].append((a, a + wait_ns))
        else:
            spans.setdefault((int(x["rank"]), int(x["step"])), [])
    per_rank_step = {k: _union_ms(v) for k, v in spans.items()}
    mean_wait = _by_step([{"step": s, "w": w} for (_, s), w in per_rank_step.items()], "w",
                         lambda v: float(np.mean(v)))
    step_ms = {int(x["step"]): float(x["step_ms"]) for x in res.tables.get("steps", [])
               if x.get("step") is not None and x.get("step_ms")}
    by_step = {s: w / step_ms[s] for s, w in mean_wait.items() if s in step_ms}
    if by_step:
        out.values["straggler_wait"] = _sampled(
            "straggler_wait", "straggler_wait", "Straggler wait (share of step)", by_step)
    per_rank: dict[int, list[float]] = defaultdict(list)
    for (rank, _), w in per_rank_step.items():
        per_rank[rank].append(w)
    out.per_rank += [{"rank": r, "wait_ms": float(np.median(v))}
                     for r, v in sorted(per_rank.items())]


def _pipeline(res: Result, kept: set[tuple[int, int]], out: AnalyzerMetrics) -> None:
    """Bubble share (idle / step window, GPipe form) per stage, per step.

    Only for runs that declare a pipeline (capture manifest or pipeline annotations): the
    analyzer's fallback that infers stages from host ops alone also fires on plain
    data-parallel runs, and a bubble share there would mislead."""
    if not res.metrics.get("pipeline"):
        return
    if res.metrics.get("source") == "host_ops" and not res.metrics.get("schedule_declared"):
        out.notes.append("pipeline bubbles not compared: the run declares no pipeline and the "
                         "stages were only inferred from host ops")
        return
    stages = {int(x["rank"]): list(x.get("stages") or []) for x in res.tables.get("stages", [])}
    rows = _kept_rows(res.tables.get("steps", []), kept)
    for rank in sorted({int(x["rank"]) for x in rows}):
        held = stages.get(rank, [])
        if len(held) == 1:
            key, label = f"bubble_share[stage={held[0]}]", f"Pipeline bubble, stage {held[0]}"
        else:
            key, label = f"bubble_share[rank={rank}]", f"Pipeline bubble, rank {rank}"
        by_step = _by_step([x for x in rows if int(x["rank"]) == rank], "bubble_share", max)
        if by_step:
            out.values[key] = _sampled(key, "bubble_share", label, by_step)


def _memory(res: Result, kept: set[tuple[int, int]], out: AnalyzerMetrics) -> None:
    """Peak allocated memory per stage (pipelines) or the largest over ranks, and max/mean."""
    if not res.metrics.get("source"):
        return
    lower = " (lower bound: trace events)" if res.metrics.get("peak_is_lower_bound") else ""
    stage_rows = res.tables.get("stages") or []
    if stage_rows:
        for x in stage_rows:
            key = f"peak_memory[stage={x['stage']}]"
            out.values[key] = MetricValue(key=key, gate="peak_memory",
                                          label=f"Peak memory, stage {x['stage']}{lower}",
                                          value=float(x["peak_gib"]) * GIB)
        peaks = [float(x["peak_gib"]) for x in stage_rows]
        what = "stages"
    else:
        peaks = [float(x["peak_gib"]) for x in res.tables.get("ranks", [])]
        out.values["peak_memory"] = MetricValue(
            key="peak_memory", gate="peak_memory", label=f"Peak memory, largest rank{lower}",
            value=max(peaks) * GIB if peaks else None)
        what = "ranks"
    if len(peaks) > 1 and np.mean(peaks) > 0:
        out.values["memory_imbalance"] = MetricValue(
            key="memory_imbalance", gate="memory_imbalance",
            label=f"Memory imbalance (max/mean over {what})",
            value=float(max(peaks) / np.mean(peaks)))


#: Analyzer name -> function reading its Result into report metrics.
READERS: dict[str, Callable[[Result, set[tuple[int, int]], AnalyzerMetrics], None]] = {
    "steps": _steps,
    "breakdown": _breakdown,
    "stragglers": _stragglers,
    "pipeline": _pipeline,
    "memory": _memory,
}


def from_analyzers(con: duckdb.DuckDBPyConnection, run_id: int, settings: ReportSettings
                   ) -> AnalyzerMetrics:
    """Run every registered analyzer once and read the report's metrics from the results."""
    from tracelab.analyzers import all_findings, run_all

    kept = kept_steps(con, run_id, settings.warmup_steps)
    results = run_all(con, run_id)
    out = AnalyzerMetrics(findings=tuple(all_findings(results)))
    for res in results:
        reader = READERS.get(res.analyzer)
        if reader is not None:
            reader(res, kept, out)
    _bandwidth(con, run_id, kept, out)
    return out
