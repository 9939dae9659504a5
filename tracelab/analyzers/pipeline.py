"""Pipeline bubbles: the idle of each stage, what the schedule alone needs, the stalls beyond it.

Everything here is the derived layer's (docs/metrics.md, "Pipeline"): the actions and the
pipeline's window per step (pipeline_actions, pipeline_ranks), the inherent idle of each rank
(the replay of the observed order with median op times and free communication), and each rank's
pipeline time split into bubble (up to the inherent idle) and stall (the rest) in step_parts.
Shares are given in both normalizations (docs/metrics.md, "Pipeline"): of the step ("GPipe
form", idle / step; the step is the pipeline's window plus what runs outside it) and of the
rank's compute ("Megatron form", idle / busy).

Findings, root cause first: PIPELINE_STAGE_IMBALANCE claims the bubble that balancing the stages
would remove (the replay with every stage at the mean op time), PIPELINE_BUBBLE the rest of the
bubble, PIPELINE_STALL the stall.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import duckdb

from tracelab.analyzers._common import RunContext, merge_params, ms, pct, ranks_str, rows
from tracelab.derived import schedules
from tracelab.derived.sqlrows import first
from tracelab.measures import STEP_TIME_SQL
from tracelab.results import Claim, Evidence, Finding, Result, Severity
from tracelab.vocabulary import Code

NAME = "pipeline"
TITLE = "Pipeline bubbles"
VIEW = "pipeline"
DEFAULTS: dict[str, Any] = {
    # Report PIPELINE_BUBBLE when the bubble exceeds this share of the mean steady step.
    "bubble_threshold": 0.10,
    # Report PIPELINE_STALL when the stall exceeds this share of the mean steady step.
    "stall_threshold": 0.05,
    # Report PIPELINE_STAGE_IMBALANCE when a rank's compute exceeds the mean by this factor.
    "imbalance_threshold": 1.15,
}

_STEPS_SQL = """
SELECT r.rank, r.step, sp.ordinal, sp.steady, r.window_start_ns, r.window_end_ns,
       r.window_end_ns - r.window_start_ns AS window_ns, r.busy_ns, r.leading_ns, r.trailing_ns,
       sp.bubble_ns + sp.stall_ns AS idle_ns, sp.bubble_ns, sp.stall_ns, r.inherent_idle_ns
FROM pipeline_ranks r JOIN step_parts sp USING (run_id, rank, step)
WHERE r.run_id = $run ORDER BY r.step, r.rank
"""

_STAGES_SQL = """
WITH s AS (SELECT * FROM pipeline_ranks r JOIN step_parts sp USING (run_id, rank, step)
           WHERE r.run_id = $run AND sp.ordinal >= $min_ordinal),
st AS (SELECT rank, list(DISTINCT stage ORDER BY stage) AS stages FROM pipeline_actions
       WHERE run_id = $run GROUP BY rank)
SELECT s.rank, any_value(st.stages) AS stages, count(*) AS steps,
       avg(window_end_ns - window_start_ns) AS window_ns, avg(busy_ns) AS busy_ns,
       avg(bubble_ns + stall_ns) AS idle_ns, avg(bubble_ns) AS bubble_ns,
       avg(stall_ns) AS stall_ns, avg(leading_ns) AS leading_ns, avg(trailing_ns) AS trailing_ns,
       avg(step_ns) AS step_ns, avg(compute_ns) AS compute_ns, avg(transfer_ns) AS transfer_ns,
       avg(memcpy_ns) AS memcpy_ns, avg(wait_ns) AS wait_ns, avg(host_ns) AS host_ns,
       avg(s.idle_ns) AS sync_idle_ns,
       any_value(inherent_idle_ns) AS inherent_idle_ns,
       sum(bubble_ns + stall_ns) / nullif(sum(step_ns), 0) AS bubble_share,
       sum(bubble_ns + stall_ns) / nullif(sum(busy_ns), 0) AS bubble_share_megatron,
       median((bubble_ns + stall_ns) / nullif(step_ns, 0)) AS bubble_share_median
FROM s LEFT JOIN st USING (rank) GROUP BY s.rank ORDER BY s.rank
"""


def analyze(con: duckdb.DuckDBPyConnection, ctx: RunContext, params: Mapping[str, Any]) -> Result:
    p = merge_params(NAME, DEFAULTS, params)
    info = rows(con, "SELECT * FROM pipeline_runs WHERE run_id = $run", {"run": ctx.run_id})
    if not info:
        why = ctx.derived_errors.get("pipeline")
        return Result(
            analyzer=NAME,
            run=ctx.name,
            params=p,
            metrics={"pipeline": False},
            notes=(
                f"pipeline not derived: {why}."
                if why
                else "no pipeline actions in the trace (no PP: or Forward/Backward "
                "spans, no forward/backward operator runs between send/recv).",
            ),
        )
    run = info[0]
    stage_rows = rows(con, _STAGES_SQL, ctx.params)
    for x in stage_rows:
        x["internal_ns"] = (x["idle_ns"] or 0) - (x["leading_ns"] or 0) - (x["trailing_ns"] or 0)
    step_rows = rows(con, _STEPS_SQL, {"run": ctx.run_id})
    acts = rows(
        con,
        """SELECT rank, step, stage, kind, mb, span_start_ns, span_end_ns, start_ns,
                               end_ns, busy_ns FROM pipeline_actions WHERE run_id = $run
                        ORDER BY rank, step, start_ns""",
        {"run": ctx.run_id},
    )
    sched, np_, v, m = run["schedule"], run["ranks"], run["stages_per_rank"], run["microbatches"]
    textbook = (
        schedules.bubble_formula(sched, np_, m, v)
        if sched in schedules.SCHEDULES and m
        else (None, None)
    )

    def mean(key: str) -> float | None:
        vals = [x[key] for x in stage_rows if x[key] is not None]
        return sum(vals) / len(vals) if vals else None

    step_ns = _mean_step(con, ctx)
    metrics = {
        "pipeline": True,
        "source": run["source"],
        "schedule": sched,
        "schedule_declared": run["schedule_declared"],
        "ranks": np_,
        "stages_per_rank": v,
        "microbatches": m,
        "steps": len({x["step"] for x in step_rows}),
        "window_ns_mean": mean("window_ns"),
        "bubble_share_mean": mean("bubble_share"),
        "bubble_share_max": max((x["bubble_share"] or 0 for x in stage_rows), default=None),
        "bubble_share_megatron_mean": mean("bubble_share_megatron"),
        "idle_ns_mean": mean("idle_ns"),
        "inherent_idle_ns_mean": mean("inherent_idle_ns"),
        "stall_ns_mean": mean("stall_ns"),
        "bubble_ns_mean": mean("bubble_ns"),
        "inherent_makespan_ns": run["inherent_makespan_ns"],
        "balanced_makespan_ns": run["balanced_makespan_ns"],
        "inherent_order": run["inherent_order"],
        "textbook_bubble_share": textbook[0],
        "textbook_bubble_share_megatron": textbook[1],
        "op_ns": json.loads(run["op_ns"]) if isinstance(run["op_ns"], str) else run["op_ns"],
    }
    findings = _findings(p, metrics, stage_rows, step_rows, step_ns)
    return Result(
        analyzer=NAME,
        run=ctx.name,
        params=p,
        metrics=metrics,
        tables={"stages": stage_rows, "steps": step_rows, "actions": acts},
        findings=tuple(findings),
        notes=(
            f"actions from {run['source']}; bubble share = pipeline idle / the step "
            "(GPipe form), megatron = idle / compute; inherent = replay of "
            f"the {run['inherent_order']} with median op times and free "
            "communication.",
        ),
    )


def _mean_step(con: duckdb.DuckDBPyConnection, ctx: RunContext) -> float:
    row = first(
        con.execute(
            f"SELECT {STEP_TIME_SQL}",
            ctx.params,
        )
    )
    return float(row[0]) if row and row[0] is not None else 0.0


def _predictions(schedule: str, p: int, m: int, v: int) -> list[str]:
    """What each remedy would bring, as share of the window (textbook, uniform stages)."""
    if not m:
        return []
    f = schedules.bubble_formula
    if schedule in ("gpipe", "1f1b"):
        return [
            f"{2 * m} microbatches: {pct(f(schedule, p, 2 * m)[0])}",
            f"interleaved 1F1B with 2 stages per rank: {pct(f('interleaved_1f1b', p, m, 2)[0])}",
            f"zero-bubble ZB-H1 (same memory as 1F1B): {pct(f('zb_h1', p, m)[0])}",
        ]
    if schedule == "interleaved_1f1b":
        return [
            f"{2 * m} microbatches: {pct(f('interleaved_1f1b', p, 2 * m, v)[0])}",
            f"{2 * v} stages per rank: {pct(f('interleaved_1f1b', p, m, 2 * v)[0])}",
        ]
    if schedule == "zb_h1":
        return [f"{2 * m} microbatches: {pct(f('zb_h1', p, 2 * m)[0])}"]
    return [f"{2 * m} microbatches (about halves the warm-up and cool-down share)"]


def _findings(
    p: Mapping[str, Any],
    metrics: dict[str, Any],
    stage_rows: list[dict[str, Any]],
    step_rows: list[dict[str, Any]],
    step_ns: float,
) -> list[Finding]:
    out: list[Finding] = []
    ranks = tuple(s["rank"] for s in stage_rows)
    t_ranges = tuple(
        sorted({(x["window_start_ns"], x["window_end_ns"]) for x in step_rows if x["steady"]})
    )[:5]
    steps = tuple(sorted({x["step"] for x in step_rows if x["steady"]}))
    busy = {s["rank"]: s["busy_ns"] or 0.0 for s in stage_rows}
    mean_busy = sum(busy.values()) / len(busy) if busy else 0.0
    slow = [rk for rk, b in busy.items() if mean_busy and b > p["imbalance_threshold"] * mean_busy]
    bubble = metrics["bubble_ns_mean"] or 0.0
    stall = metrics["stall_ns_mean"] or 0.0
    desc = (
        f"{metrics['schedule']}, {metrics['ranks']} ranks, {metrics['microbatches']} microbatches"
    )
    if slow and metrics["inherent_makespan_ns"] and metrics["balanced_makespan_ns"] is not None:
        worst = max(slow, key=lambda k: busy[k])
        gain = max(0.0, metrics["inherent_makespan_ns"] - metrics["balanced_makespan_ns"])
        out.append(
            Finding(
                code=Code.PIPELINE_STAGE_IMBALANCE,
                severity=Severity.WARNING,
                title=f"Unbalanced pipeline: {ranks_str(slow)} compute {busy[worst] / mean_busy:.2f}x "
                "the mean stage, costing {impact_ms} per step ({impact_pct})",
                evidence=Evidence(
                    ranks=tuple(slow),
                    affected_ranks=ranks,
                    steps=steps,
                    time_ranges_ns=t_ranges,
                    numbers={
                        "busy_ns_slowest": busy[worst],
                        "busy_ns_mean": mean_busy,
                        "balanced_gain_ns": gain,
                        "busy_ns_per_rank": ", ".join(
                            f"rank {k}: {ms(v)}" for k, v in busy.items()
                        ),
                    },
                ),
                claim=Claim(
                    parts=(("bubble", round(gain)), ("stall", round(gain))), cap_ns=round(gain)
                ),
                suggestion=f"Move layers off {ranks_str(slow)} (or give the first/last stage fewer "
                "layers to offset embedding and loss): with every stage at the mean op "
                f"time the schedule replays {ms(gain)} shorter.",
                analyzer=NAME,
                view="pipeline",
            )
        )
    if step_ns and bubble > p["bubble_threshold"] * step_ns:
        preds = _predictions(
            metrics["schedule"],
            metrics["ranks"],
            metrics["microbatches"],
            metrics["stages_per_rank"],
        )
        out.append(
            Finding(
                code=Code.PIPELINE_BUBBLE,
                severity=Severity.WARNING,
                # The bubble as measured (the breakdown's and the Pipeline page's figure); the
                # impact beside it is what no finding above explains (stage imbalance takes
                # its share first): "{impact_pct}" here read 9.6% of a 44.7% bubble.
                title=f"Pipeline bubble: the schedule leaves stages idle {pct(bubble / step_ns)} "
                f"of the step ({desc})",
                evidence=Evidence(
                    ranks=ranks,
                    steps=steps,
                    time_ranges_ns=t_ranges,
                    numbers={
                        "bubble_share": metrics["bubble_share_mean"],
                        "bubble_share_megatron": metrics["bubble_share_megatron_mean"],
                        "bubble_ns_per_step": bubble,
                        "inherent_idle_ns": metrics["inherent_idle_ns_mean"],
                        "textbook_bubble_share": metrics["textbook_bubble_share"],
                        "window_ns": metrics["window_ns_mean"],
                    },
                ),
                claim=Claim(parts=(("bubble", round(bubble)),)),
                suggestion=(
                    "Predicted bubble (share of the pipeline's window): " + "; ".join(preds) + "."
                    if preds
                    else "More microbatches per step shrink the warm-up and cool-down share."
                ),
                analyzer=NAME,
                view="pipeline",
            )
        )
    if step_ns and stall > p["stall_threshold"] * step_ns:
        worst_rows = sorted(stage_rows, key=lambda s: -(s["stall_ns"] or 0))
        out.append(
            Finding(
                code=Code.PIPELINE_STALL,
                severity=Severity.WARNING,
                title="Pipeline stalls: stages wait {impact_ms} per step beyond what the schedule "
                "needs ({impact_pct})",
                evidence=Evidence(
                    ranks=tuple(s["rank"] for s in worst_rows[:3]),
                    steps=steps,
                    time_ranges_ns=t_ranges,
                    numbers={
                        "stall_ns_per_step": stall,
                        "inherent_idle_ns": metrics["inherent_idle_ns_mean"],
                        "idle_ns": metrics["idle_ns_mean"],
                    },
                ),
                claim=Claim(parts=(("stall", round(stall)),)),
                suggestion="Stages wait longer than the schedule requires: look at the send/recv "
                "and host gaps before the late actions in the timeline (slow p2p links, "
                "host-side delays, garbage collection, data loading on one stage).",
                analyzer=NAME,
                view="pipeline",
            )
        )
    return out
