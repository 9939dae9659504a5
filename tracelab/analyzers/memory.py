"""Stage memory imbalance: peak memory per rank and per pipeline stage, against the schedule.

Peaks come from the collector's per-step peaks (torch.cuda.max_memory_allocated, the true peak)
when the capture has them; else from the trace's `[memory]` events, which only see allocations
made while profiling, so the peak is then a lower bound and flagged as such. Per stage: max/mean,
max/min and headroom = peak / device capacity (estimates under 80% did not run out of memory in
454 runs, Fujii et al., arXiv 2411.06465). The schedule's activation pattern is the reference:
1F1B stage s holds min(m, p - s) microbatches (max/mean 2p/(p+1)), GPipe holds m on every stage.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

import duckdb

from tracelab.analyzers import _memory_estimate
from tracelab.analyzers._common import RunContext, merge_params, ranks_str, rows, size_str
from tracelab.derived.pipeline import declared_pipeline, schedule_name
from tracelab.derived.sqlrows import scalar
from tracelab.errors import InputError
from tracelab.results import Evidence, Finding, Result, Severity
from tracelab.store.files import run_memory_sql
from tracelab.vocabulary import Code

NAME = "memory"
TITLE = "Memory per rank and stage"
VIEW = "memory"
DEFAULTS: dict[str, Any] = {
    # Report STAGE_MEMORY_IMBALANCE above this max/mean of stage peaks.
    "imbalance_threshold": 1.2,
    # Report MEMORY_HEADROOM above this peak / capacity.
    "headroom_threshold": 0.8,
    # Report MEMORY_ESTIMATE_MISMATCH when a rank's measured peak departs from its estimate
    # by more than this share of the estimate (docs/metrics.md, "Memory estimate").
    "estimate_threshold": 0.15,
    # A `tracelab estimate` config (YAML or JSON path) to compare the run with, or None.
    "prediction": None,
}
#: This analyzer's finding codes beyond the vocabulary's (for the integrator).
ESTIMATE_CODE = Code.MEMORY_ESTIMATE_MISMATCH


def expected_microbatches(schedule: str | None, p: int, m: int) -> list[int] | None:
    """Microbatches of activations each stage holds at its peak, per the schedule."""
    if schedule in ("1f1b", "interleaved_1f1b", "zb_h1"):
        return [min(m, p - s) for s in range(p)]
    if schedule == "gpipe":
        return [m] * p
    return None


_PEAKS_SQL = """
    SELECT m.rank, max(m.allocated_bytes) AS peak_bytes, max(m.reserved_bytes) AS reserved_bytes,
           count(DISTINCT m.step) AS steps,
           any_value(CASE WHEN m.device_type >= 1 THEN k.device_memory_bytes END) AS capacity_bytes,
           any_value(k.pp_stage) AS pp_stage
    FROM {memory} m JOIN ranks k ON k.run_id = m.run_id AND k.rank = m.rank
    WHERE m.run_id = ? AND m.allocated_bytes IS NOT NULL AND {where}
    GROUP BY m.rank ORDER BY m.rank
"""


def _peaks(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[str, list[dict[str, Any]]]:
    """(source, per-rank peaks). Device allocator peaks from the collector first; then the
    trace's [memory] events on the rank's compute device (a lower bound); then the collector's
    CPU figures, which are process RSS (baseline included), last."""
    memory = run_memory_sql(con, run_id)
    got = rows(
        con,
        _PEAKS_SQL.format(memory=memory, where="m.source = 'step_peak' AND m.device_type >= 1"),
        [run_id],
    )
    if got:
        return "step_peak", got
    # Each rank's highest device type, found once per rank (not a correlated subquery per row).
    got = rows(
        con,
        _PEAKS_SQL.format(
            memory=memory,
            where=f"""m.source = 'trace' AND m.device_type IS NOT NULL
        AND (m.rank, m.device_type) IN (
            SELECT (d.rank, max(d.device_type)) FROM {memory} d
            WHERE d.run_id = ? AND d.source = 'trace' GROUP BY d.rank)""",
        ),
        [run_id, run_id],
    )
    if got:
        return "trace", got
    return "rss", rows(
        con, _PEAKS_SQL.format(memory=memory, where="m.source = 'step_peak'"), [run_id]
    )


def _cpu_only(con: duckdb.DuckDBPyConnection, run_id: int) -> bool:
    got = scalar(
        con.execute(
            f"SELECT max(coalesce(device_type, 0)) FROM {run_memory_sql(con, run_id)} "
            "WHERE run_id = ? AND source = 'trace'",
            [run_id],
        )
    )
    return got == 0


def analyze(con: duckdb.DuckDBPyConnection, ctx: RunContext, params: Mapping[str, Any]) -> Result:
    p = merge_params(NAME, DEFAULTS, params)
    source, peaks = _peaks(con, ctx.run_id)
    if source == "trace" and _cpu_only(con, ctx.run_id):
        based = _memory_estimate.measured_peaks(con, ctx.run_id, ctx.metadata)
        if peaks and all(x["rank"] in based for x in peaks):
            for x in peaks:
                x["peak_bytes"] = int(based[x["rank"]])
            source = "trace_baseline"
    if not peaks:
        return Result(
            analyzer=NAME,
            run=ctx.name,
            params=p,
            metrics={"source": None},
            notes=(
                "no memory data: profile with profile_memory=True, or capture with "
                "tracelab.profile, which records per-step peaks.",
            ),
        )
    pipe = declared_pipeline(ctx.metadata) or {}
    schedule = schedule_name(pipe)
    has_pipeline = (
        scalar(con.execute("SELECT count(*) FROM pipeline_runs WHERE run_id = ?", [ctx.run_id]))
        or 0
    ) > 0
    is_pipe = bool(pipe) or has_pipeline or any(x["pp_stage"] is not None for x in peaks)
    rank_tbl = []
    for x in peaks:
        cap = x["capacity_bytes"]
        rank_tbl.append(
            {
                "rank": x["rank"],
                "stage": x["pp_stage"]
                if x["pp_stage"] is not None
                else (x["rank"] if is_pipe else None),
                "peak_bytes": x["peak_bytes"],
                "reserved_bytes": x["reserved_bytes"],
                "capacity_bytes": cap,
                "headroom_used": x["peak_bytes"] / cap if cap else None,
                "lower_bound": source == "trace",
            }
        )
    stage_tbl: list[dict[str, Any]] = []
    metrics: dict[str, Any] = {
        "source": source,
        "peak_is_lower_bound": source == "trace",
        "peak_bytes_max": max(x["peak_bytes"] for x in rank_tbl),
        "capacity_bytes": max((x["capacity_bytes"] or 0 for x in rank_tbl), default=0) or None,
        "pipeline": is_pipe,
    }
    if is_pipe:
        by: dict[int, list[int]] = {}
        for x in rank_tbl:
            by.setdefault(x["stage"], []).append(x["peak_bytes"])
        stages = sorted(by)
        peak = {s: max(by[s]) for s in stages}
        mean = statistics.mean(peak.values())
        m = pipe.get("microbatches")
        m = m if isinstance(m, int) and not isinstance(m, bool) and m > 0 else None
        exp = expected_microbatches(schedule, len(stages), m) if m else None
        exp_mean = statistics.mean(exp) if exp else 1.0
        for i, s in enumerate(stages):
            stage_tbl.append(
                {
                    "stage": s,
                    "peak_bytes": peak[s],
                    "over_mean": peak[s] / mean if mean else None,
                    "expected_microbatches": exp[i] if exp and i < len(exp) else None,
                    "expected_over_mean": exp[i] / exp_mean if exp and i < len(exp) else None,
                }
            )
        lo = min(peak.values())
        metrics.update(
            {
                "schedule": schedule,
                "stages": len(stages),
                "max_over_mean": max(peak.values()) / mean if mean else None,
                "max_over_min": max(peak.values()) / lo if lo else None,
                "expected_max_over_mean": max(exp) / exp_mean if exp else None,
            }
        )
    est_tbl, missing = _estimate(con, ctx, p, source, peaks) if is_pipe else ([], [])
    caps = {x["rank"]: x["capacity_bytes"] for x in rank_tbl}
    for row in est_tbl:
        cap = caps.get(row["rank"])
        row["capacity_bytes"] = cap
        row["headroom_used"] = (
            row["measured_bytes"] / cap if cap and row["measured_bytes"] else None
        )
        row["estimate_headroom_used"] = row["estimate_bytes"] / cap if cap else None
    findings = _findings(p, metrics, stage_tbl, rank_tbl, source)
    findings += _estimate_findings(p, est_tbl)
    if est_tbl:
        errs = [abs(x["error"]) for x in est_tbl if x.get("error") is not None]
        metrics["estimate_max_abs_error"] = max(errs) if errs else None
    notes = {
        "trace": [
            "peaks from the trace's [memory] events: allocations made before "
            "profiling started are missing, so these are lower bounds."
        ],
        "trace_baseline": [
            "peaks from the CPU allocator's events of the first window plus the model-state "
            "bytes the collector found live when it opened (the events miss allocations made "
            "before profiling)."
        ],
        "rss": [
            "peaks are process RSS from the collector (no device allocator, no "
            "[memory] events): they include the interpreter's baseline, which "
            "dilutes imbalance ratios."
        ],
    }.get(source, [])
    if missing:
        lead = "memory estimate without" if est_tbl else "no memory estimate: missing"
        notes.append(f"{lead} " + "; ".join(missing) + ".")
    if not is_pipe:
        notes.append(_no_pipeline_note(ctx, p))
    return Result(
        analyzer=NAME,
        run=ctx.name,
        params=p,
        metrics=metrics,
        tables={"ranks": rank_tbl, "stages": stage_tbl, "estimate": est_tbl},
        findings=tuple(findings),
        notes=tuple(notes),
    )


def _findings(
    p: Mapping[str, Any],
    metrics: dict[str, Any],
    stage_tbl: list[dict[str, Any]],
    rank_tbl: list[dict[str, Any]],
    source: str,
) -> list[Finding]:
    out = []
    mom = metrics.get("max_over_mean")
    if mom is not None and mom > p["imbalance_threshold"]:
        heavy = max(stage_tbl, key=lambda s: s["peak_bytes"])
        light = min(stage_tbl, key=lambda s: s["peak_bytes"])
        exp = metrics.get("expected_max_over_mean")
        beyond = exp is None or mom > 1.1 * exp
        expl = (
            f"the {metrics['schedule']} schedule alone predicts {exp:.2f}x"
            if exp is not None
            else "no schedule to compare with"
        )
        out.append(
            Finding(
                code=Code.STAGE_MEMORY_IMBALANCE,
                severity=Severity.WARNING if beyond else Severity.INFO,
                title=f"Stage memory imbalance: stage {heavy['stage']} peaks at "
                f"{size_str(heavy['peak_bytes'])}, {mom:.2f}x the mean ({expl})",
                evidence=Evidence(
                    ranks=tuple(x["rank"] for x in rank_tbl if x["stage"] == heavy["stage"]),
                    numbers={
                        "max_over_mean": mom,
                        "max_over_min": metrics.get("max_over_min"),
                        "expected_max_over_mean": exp,
                        "heaviest_stage": heavy["stage"],
                        "heaviest_peak_bytes": heavy["peak_bytes"],
                        "lightest_stage": light["stage"],
                        "lightest_peak_bytes": light["peak_bytes"],
                        "source": source,
                    },
                ),
                suggestion=(
                    f"Move layers from stage {heavy['stage']} toward stage {light['stage']}, "
                    "or recompute activations (activation checkpointing) on the early "
                    "stages, which hold the most microbatches under 1F1B; a V-shaped "
                    "schedule (ZBV, DualPipeV) balances activation memory across ranks."
                    if beyond
                    else "This is the schedule's own activation pattern: the first stage holds "
                    "the most microbatches. Balance it with activation checkpointing on early "
                    "stages or a V-shaped schedule (ZBV, DualPipeV) if memory is tight."
                ),
                analyzer=NAME,
                view="memory",
            )
        )
    hot = [x for x in rank_tbl if (x["headroom_used"] or 0) > p["headroom_threshold"]]
    if hot:
        worst = max(hot, key=lambda x: x["headroom_used"])
        out.append(
            Finding(
                code=Code.MEMORY_HEADROOM,
                severity=Severity.WARNING,
                title=f"{ranks_str([x['rank'] for x in hot])} use up to "
                f"{100 * worst['headroom_used']:.0f}% of device memory"
                + (" (a lower bound)" if source == "trace" else ""),
                evidence=Evidence(
                    ranks=tuple(x["rank"] for x in hot),
                    numbers={
                        "peak_bytes": worst["peak_bytes"],
                        "capacity_bytes": worst["capacity_bytes"],
                        "headroom_used": worst["headroom_used"],
                    },
                ),
                suggestion="Above 80% of capacity, fragmentation and spikes risk out-of-memory: "
                "reduce the microbatch size, checkpoint activations, or shard optimizer "
                "state (FSDP/ZeRO) on these ranks.",
                analyzer=NAME,
                view="memory",
            )
        )
    return out


def _no_pipeline_note(ctx: RunContext, p: Mapping[str, Any]) -> str:
    """Why a run without a pipeline has no estimate, with what the collector counted: the
    estimate's activations are one microbatch's bytes per stage times the schedule's
    microbatches in flight, measured over the pipeline's forward actions."""
    states = [v for v in _memory_estimate.model_state_bytes(ctx.metadata).values() if v is not None]
    counted = (
        f" The collector counted model states (parameters, gradients, optimizer states) of "
        f"{size_str(int(min(states)))}"
        + (f" to {size_str(int(max(states)))}" if max(states) != min(states) else "")
        + " per rank."
        if states
        else ""
    )
    said = (
        f" --prediction {p['prediction']} is not compared: its ranks are pipeline ranks."
        if p.get("prediction")
        else ""
    )
    return (
        "no memory estimate: it is made per pipeline stage (one microbatch's activation bytes, "
        "measured over the pipeline's forward actions, times the schedule's microbatches in "
        f"flight), and this run has no pipeline.{counted}{said}"
    )


def _estimate(
    con: duckdb.DuckDBPyConnection,
    ctx: RunContext,
    p: Mapping[str, Any],
    source: str,
    peaks: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[str]]:
    got = rows(
        con,
        "SELECT source, schedule, ranks, stages_per_rank, microbatches FROM pipeline_runs "
        "WHERE run_id = ?",
        [ctx.run_id],
    )
    device = {x["rank"]: x["peak_bytes"] for x in peaks} if source == "step_peak" else {}
    try:
        tbl, missing = _memory_estimate.estimate(
            con, ctx.run_id, ctx.metadata, got[0] if got else None, device
        )
    except (ValueError, TypeError) as exc:  # a schedule without a count; a malformed entry
        return [], [f"a usable input ({exc})"]
    if p.get("prediction") and tbl:
        try:
            _add_prediction(tbl, str(p["prediction"]))
        except (OSError, ValueError, TypeError, InputError) as exc:
            missing.append(f"a usable prediction ({p['prediction']}: {exc})")
    return tbl, missing


def _add_prediction(tbl: list[dict[str, Any]], path: str) -> None:
    """Each pipeline rank's predicted peak from a `tracelab estimate` config, beside the run's."""
    from tracelab.memory_model import load_config, predict

    pred = {e.rank: e.total_bytes for e in predict(load_config(path))}
    for i, row in enumerate(sorted(tbl, key=lambda r: min(r["stages"]))):
        row["predicted_bytes"] = pred.get(i)


def _estimate_findings(p: Mapping[str, Any], tbl: list[dict[str, Any]]) -> list[Finding]:
    off = [
        x
        for x in tbl
        if x.get("error") is not None and abs(x["error"]) > float(p["estimate_threshold"])
    ]
    if not off:
        return []
    worst = max(off, key=lambda x: abs(x["error"]))
    over = worst["error"] > 0
    return [
        Finding(
            code=ESTIMATE_CODE,
            severity=Severity.WARNING if over else Severity.INFO,
            title=f"{ranks_str([x['rank'] for x in off])}: measured peak "
            f"{'above' if over else 'below'} the estimate by up to "
            f"{100 * abs(worst['error']):.0f}% (rank {worst['rank']}: "
            f"{size_str(worst['measured_bytes'])} measured, "
            f"{size_str(worst['estimate_bytes'])} estimated)",
            evidence=Evidence(
                ranks=tuple(x["rank"] for x in off),
                numbers={
                    "rank": worst["rank"],
                    "measured_bytes": worst["measured_bytes"],
                    "estimate_bytes": worst["estimate_bytes"],
                    "error": worst["error"],
                    "diff_model_states_bytes": worst.get("diff_model_states_bytes"),
                    "diff_activations_bytes": worst.get("diff_activations_bytes"),
                    "diff_rest_bytes": worst.get("diff_rest_bytes"),
                },
            ),
            suggestion=(
                "The unexplained rest is memory outside model states and the schedule's "
                "activations: communication buffers, allocator fragmentation (try "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), or tensors kept alive across "
                "microbatches (losses, logits); an activation part means more microbatches "
                "in flight than the schedule needs."
                if over
                else "The rank holds less than the model predicts: activation recomputation or "
                "offloading is on, or fewer microbatches are in flight than the schedule's "
                "count; the estimate overstates this rank's needs."
            ),
            analyzer=NAME,
            view="memory",
        )
    ]
