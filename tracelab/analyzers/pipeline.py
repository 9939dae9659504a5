"""Pipeline bubbles: the measured bubble per stage, what the schedule alone predicts, the excess.

Per step, the pipeline's window runs from the first compute of any stage to the last (aligned
clocks). A rank's bubble is the window minus the union of its compute, split into leading
(warm-up), internal and trailing (cool-down) idle, and given in both normalizations (FACTS.md
section 3): share of the step ("GPipe form", idle / window) and relative to ideal compute
("Megatron form", idle / busy). The *inherent* bubble replays the reconstructed order of actions
with the measured median op times and free communication (tracelab.analyzers._schedules); the
*excess* is what the trace shows beyond it (stalls: slow p2p, host delays).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from typing import Any

import duckdb

from tracelab.analyzers import _pp_actions, _schedules
from tracelab.analyzers._collectives import estimate_clocks
from tracelab.analyzers._common import NS_PER_MS, merge_params, ms, r, ranks_str, run_info
from tracelab.results import Evidence, Finding, Result, Severity

NAME = "pipeline"
TITLE = "Pipeline bubbles"
VIEW = "pipeline"
DEFAULTS: dict[str, Any] = {
    # Report PIPELINE_BUBBLE when the mean bubble share of the step exceeds this.
    "bubble_threshold": 0.10,
    # Report PIPELINE_STALL when the excess idle exceeds this share of the step...
    "stall_threshold": 0.05,
    # ...and a stage's median busy time exceeds the mean by this factor: imbalance.
    "imbalance_threshold": 1.15,
}
#: torch.distributed.pipelining class names -> tracelab schedule names.
TORCH_SCHEDULES = {
    "schedulegpipe": "gpipe", "schedule1f1b": "1f1b", "scheduleinterleaved1f1b":
    "interleaved_1f1b", "scheduleloopedbfs": "looped_bfs", "scheduleinterleavedzerobubble":
    "zero_bubble", "schedulezbvzerobubble": "zbv", "scheduledualpipev": "dualpipev",
    "zbh1": "zb_h1", "gpipe": "gpipe", "1f1b": "1f1b", "interleaved_1f1b": "interleaved_1f1b",
    "zb_h1": "zb_h1",
}


def _stage_map(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[int, int]:
    got = con.execute("SELECT rank, pp_stage FROM ranks WHERE run_id = ? ORDER BY rank",
                      [run_id]).fetchall()
    return {int(rk): int(st) if st is not None else i for i, (rk, st) in enumerate(got)}


def _detect(meta: Mapping[str, Any] | None, acts: list[dict[str, Any]], source: str) -> dict[str, Any]:
    ranks = sorted({a["rank"] for a in acts})
    stages = sorted({a["stage"] for a in acts})
    kinds = {a["kind"] for a in acts}
    per_step: dict[tuple[int, int, int, str], int] = {}
    for a in acts:
        per_step.setdefault((a["rank"], a["step"], a["stage"], a["kind"]), 0)
        per_step[(a["rank"], a["step"], a["stage"], a["kind"])] += 1
    m_seen = max((n for (_, _, _, k), n in per_step.items() if k == "F"), default=0)
    p, v = len(ranks), max(1, len(stages) // max(1, len(ranks)))
    declared = TORCH_SCHEDULES.get(str((meta or {}).get("schedule") or "").lower())
    if declared:
        schedule = declared
    elif "I" in kinds or "W" in kinds:
        schedule = "zb_h1" if v == 1 else "zero_bubble"
    elif v > 1:
        schedule = "interleaved_1f1b"
    elif source == "gpipe":
        schedule = "gpipe"
    else:
        schedule = "1f1b"
    m = int((meta or {}).get("microbatches") or m_seen)
    return {"schedule": schedule, "p": p, "v": v, "m": m, "ranks": ranks}


def _per_step(acts: list[dict[str, Any]], off: Mapping[int, int]) -> dict[int, dict[str, Any]]:
    """Per step: window and per-rank busy/leading/trailing, on the aligned clock."""
    out: dict[int, dict[str, Any]] = {}
    for a in acts:
        st = out.setdefault(a["step"], {"ranks": {}})
        rk = st["ranks"].setdefault(a["rank"], {"busy": 0, "c0": None, "c1": None})
        c0, c1 = a["c0"] - off.get(a["rank"], 0), a["c1"] - off.get(a["rank"], 0)
        rk["busy"] += a["busy_ns"]
        rk["c0"] = c0 if rk["c0"] is None else min(rk["c0"], c0)
        rk["c1"] = c1 if rk["c1"] is None else max(rk["c1"], c1)
    for st in out.values():
        st["w0"] = min(x["c0"] for x in st["ranks"].values())
        st["w1"] = max(x["c1"] for x in st["ranks"].values())
    return out


def _inherent(acts: list[dict[str, Any]], steps: dict[int, dict[str, Any]],
              info: dict[str, Any]
              ) -> tuple[dict[int, float], float, dict[str, float], str, float] | None:
    """Replay the observed order with median op times: per-rank idle (ns), makespan, op times,
    and the makespan with every stage at the mean op time (balanced stages). None when the
    observed order cannot be replayed and the schedule has no textbook order."""
    med: dict[tuple[int, str], float] = {}
    by: dict[tuple[int, str], list[int]] = {}
    for a in acts:
        by.setdefault((a["stage"], a["kind"]), []).append(a["busy_ns"])
    for k, xs in by.items():
        med[k] = float(statistics.median(xs))
    first = min(steps)
    order: dict[int, list[_schedules.Action]] = {}
    for a in sorted((a for a in acts if a["step"] == first), key=lambda a: a["c0"]):
        order.setdefault(a["rank"], []).append((a["stage"], a["kind"], a["mb"]))
    how = "observed order"
    try:
        rp = _schedules.replay(order, lambda a: med.get((a[0], a[1]), 0.0))
    except ValueError:
        if info["schedule"] not in _schedules.SCHEDULES:
            return None
        order = _schedules.make_order(info["schedule"], info["p"], info["m"], info["v"])
        rp = _schedules.replay(order, lambda a: med.get((a[0], a[1]), 0.0))
        how = "textbook order"
    kinds: dict[str, list[float]] = {}
    for (_, kind), t in med.items():
        kinds.setdefault(kind, []).append(t)
    mean_op = {k: statistics.mean(v) for k, v in kinds.items()}
    balanced = _schedules.replay(order, lambda a: mean_op.get(a[1], 0.0)).makespan
    op_ms = {k: v / NS_PER_MS for k, v in mean_op.items()}
    return {rk: rp.idle(rk) for rk in order}, rp.makespan, op_ms, how, balanced


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, params: Mapping[str, Any]) -> Result:
    p = merge_params(NAME, DEFAULTS, params)
    info_run = run_info(con, run_id)
    meta = info_run["metadata"].get("pipeline") if info_run["metadata"] else None
    has_manifest = "manifest" in (info_run["metadata"] or {})
    declared = bool(meta) if has_manifest else None
    source, acts = _pp_actions.actions(con, run_id, (meta or {}).get("microbatches"),
                                       _stage_map(con, run_id), declared)
    if not acts:
        return Result(analyzer=NAME, run=info_run["name"], params=p,
                      metrics={"pipeline": False},
                      notes=("no pipeline actions in the trace (no PP: or Forward/Backward "
                             "spans, no forward/backward operator runs between send/recv).",))
    clocks = estimate_clocks(con, run_id)
    info = _detect(meta, acts, source)
    steps = _per_step(acts, clocks.offsets_ns)
    inh = _inherent(acts, steps, info)
    if inh is None:
        idle_inh: dict[int, float] = {}
        op_ms: dict[str, float] = {}
        makespan_inh, how, balanced = None, "none", None
    else:
        idle_inh, makespan_inh, op_ms, how, balanced = inh
    step_rows: list[dict[str, Any]] = []
    for step, st in sorted(steps.items()):
        window = st["w1"] - st["w0"]
        for rank, x in sorted(st["ranks"].items()):
            idle = window - x["busy"]
            lead, trail = x["c0"] - st["w0"], st["w1"] - x["c1"]
            step_rows.append({
                "rank": rank, "step": step, "window_ms": ms(window), "busy_ms": ms(x["busy"]),
                "idle_ms": ms(idle), "leading_ms": ms(lead), "trailing_ms": ms(trail),
                "internal_ms": ms(idle - lead - trail),
                "bubble_share": r(idle / window) if window else None,
                "bubble_share_megatron": r(idle / x["busy"]) if x["busy"] else None,
                "inherent_idle_ms": ms(idle_inh.get(rank)),
                "excess_idle_ms": ms(idle - idle_inh[rank]) if rank in idle_inh else None,
                "t0_ns": st["w0"], "t1_ns": st["w1"]})
    stage_rows = []
    for rank in info["ranks"]:
        xs = [x for x in step_rows if x["rank"] == rank]
        row: dict[str, Any] = {"rank": rank, "stages": sorted({a["stage"] for a in acts
                                                               if a["rank"] == rank})}
        for k in ("window_ms", "busy_ms", "idle_ms", "leading_ms", "internal_ms", "trailing_ms",
                  "bubble_share", "bubble_share_megatron", "inherent_idle_ms", "excess_idle_ms"):
            vals = [x[k] for x in xs if x[k] is not None]
            row[k] = r(statistics.median(vals)) if vals else None
        stage_rows.append(row)
    textbook = (_schedules.bubble_formula(info["schedule"], info["p"], info["m"], info["v"])
                if info["schedule"] in _schedules.SCHEDULES else (None, None))
    mean = lambda k: r(statistics.mean([s[k] for s in stage_rows if s[k] is not None]))
    window_ms = mean("window_ms")
    metrics = {
        "pipeline": True, "source": source, "schedule": info["schedule"],
        "schedule_declared": (meta or {}).get("schedule"), "ranks": info["p"],
        "stages_per_rank": info["v"], "microbatches": info["m"], "steps": len(steps),
        "step_window_ms": window_ms, "bubble_share_mean": mean("bubble_share"),
        "bubble_share_max": max((s["bubble_share"] or 0) for s in stage_rows),
        "bubble_share_megatron_mean": mean("bubble_share_megatron"),
        "idle_ms_mean": mean("idle_ms"), "inherent_idle_ms_mean": mean("inherent_idle_ms"),
        "excess_idle_ms_mean": mean("excess_idle_ms"),
        "inherent_makespan_ms": ms(makespan_inh), "inherent_order": how,
        "balanced_makespan_ms": ms(balanced),
        "textbook_bubble_share": r(textbook[0]), "textbook_bubble_share_megatron": r(textbook[1]),
        "op_ms": {k: r(v) for k, v in sorted(op_ms.items())},
    }
    acts_tbl = [{"rank": a["rank"], "step": a["step"], "stage": a["stage"], "kind": a["kind"],
                 "mb": a["mb"], "start_ns": a["c0"] - clocks.offsets_ns.get(a["rank"], 0),
                 "end_ns": a["c1"] - clocks.offsets_ns.get(a["rank"], 0),
                 "busy_ms": ms(a["busy_ns"])} for a in acts]
    findings = _findings(p, metrics, stage_rows, step_rows, info, acts)
    return Result(analyzer=NAME, run=info_run["name"], params=p, metrics=metrics,
                  tables={"stages": stage_rows, "steps": step_rows, "actions": acts_tbl},
                  findings=tuple(findings),
                  notes=(f"actions from {source}; bubble share = idle / step window (GPipe "
                         "form), megatron = idle / compute; inherent = replay of the "
                         f"{how} with median op times and free communication.",))


def _predictions(info: dict[str, Any], acts: list[dict[str, Any]]) -> list[str]:
    """What each remedy would bring, as share of the step (textbook, uniform stages)."""
    p, m, v = info["p"], info["m"], info["v"]
    out = []
    if info["schedule"] in ("gpipe", "1f1b"):
        out.append(f"{2 * m} microbatches: {100 * (p - 1) / (2 * m + p - 1):.1f}%")
        out.append(f"interleaved 1F1B with 2 stages per rank: "
                   f"{100 * _schedules.bubble_formula('interleaved_1f1b', p, m, 2)[0]:.1f}%")
        out.append(f"zero-bubble ZB-H1 (same memory as 1F1B): "
                   f"{100 * _schedules.bubble_formula('zb_h1', p, m)[0]:.1f}%")
    elif info["schedule"] == "interleaved_1f1b":
        out.append(f"{2 * m} microbatches: "
                   f"{100 * _schedules.bubble_formula('interleaved_1f1b', p, 2 * m, v)[0]:.1f}%")
        out.append(f"{2 * v} stages per rank: "
                   f"{100 * _schedules.bubble_formula('interleaved_1f1b', p, m, 2 * v)[0]:.1f}%")
    else:
        out.append(f"{2 * m} microbatches: {100 * (p - 1) / (3 * 2 * m + p - 1):.1f}%")
    return out


def _findings(p: Mapping[str, Any], metrics: dict[str, Any], stage_rows: list[dict[str, Any]],
              step_rows: list[dict[str, Any]], info: dict[str, Any],
              acts: list[dict[str, Any]]) -> list[Finding]:
    out: list[Finding] = []
    window = metrics["step_window_ms"] or 0.0
    share = metrics["bubble_share_mean"] or 0.0
    ranks = tuple(s["rank"] for s in stage_rows)
    t_ranges = tuple({(x["t0_ns"], x["t1_ns"]) for x in step_rows})[:5]
    busy = {s["rank"]: s["busy_ms"] or 0.0 for s in stage_rows}
    mean_busy = statistics.mean(busy.values()) if busy else 0.0
    slow = [rk for rk, b in busy.items() if mean_busy and b > p["imbalance_threshold"] * mean_busy]
    if share > p["bubble_threshold"]:
        preds = _predictions(info, acts)
        out.append(Finding(
            code="PIPELINE_BUBBLE",
            severity=Severity.CRITICAL if share > 2 * p["bubble_threshold"] else Severity.WARNING,
            title=f"Pipeline bubble: stages idle {100 * share:.1f}% of the step "
                  f"({info['schedule']}, {info['p']} ranks, {info['m']} microbatches)",
            evidence=Evidence(ranks=ranks, steps=tuple(sorted({x["step"] for x in step_rows})),
                              time_ranges_ns=t_ranges, numbers={
                                  "bubble_share": r(share),
                                  "bubble_share_megatron": metrics["bubble_share_megatron_mean"],
                                  "idle_ms_per_step": metrics["idle_ms_mean"],
                                  "inherent_idle_ms": metrics["inherent_idle_ms_mean"],
                                  "textbook_bubble_share": metrics["textbook_bubble_share"],
                                  "step_window_ms": window}),
            impact_ms_per_step=metrics["idle_ms_mean"], impact_share=r(share),
            suggestion="Predicted bubble (share of the step) with " + "; ".join(preds) + "."
                       + (f" Rebalance layers away from {ranks_str(slow)} first: its compute "
                          "sets the pace." if slow else ""),
            analyzer=NAME, view="pipeline"))
    excess = metrics["excess_idle_ms_mean"] or 0.0
    if window and excess > p["stall_threshold"] * window:
        worst = sorted(stage_rows, key=lambda s: -(s["excess_idle_ms"] or 0))
        out.append(Finding(
            code="PIPELINE_STALL", severity=Severity.WARNING,
            title=f"Pipeline stalls: {excess:.2f} ms per step of idle beyond what the schedule "
                  f"needs ({100 * excess / window:.1f}% of the step)",
            evidence=Evidence(ranks=tuple(s["rank"] for s in worst[:3]), time_ranges_ns=t_ranges,
                              numbers={"excess_idle_ms": r(excess),
                                       "inherent_idle_ms": metrics["inherent_idle_ms_mean"],
                                       "idle_ms": metrics["idle_ms_mean"]}),
            impact_ms_per_step=r(excess), impact_share=r(excess / window),
            suggestion="Stages wait longer than the schedule requires: look at the send/recv "
                       "and host gaps before the late actions in the timeline (slow p2p links, "
                       "host-side delays, garbage collection, data loading on one stage).",
            analyzer=NAME, view="pipeline"))
    if slow:
        worst = max(slow, key=lambda k: busy[k])
        gain = max(0.0, (metrics["inherent_makespan_ms"] or 0) - (metrics["balanced_makespan_ms"] or 0))
        out.append(Finding(
            code="PIPELINE_STAGE_IMBALANCE", severity=Severity.WARNING,
            title=f"Unbalanced pipeline: {ranks_str(slow)} compute {busy[worst] / mean_busy:.2f}x "
                  "the mean stage",
            evidence=Evidence(ranks=tuple(slow), numbers={
                "busy_ms_slowest": r(busy[worst]), "busy_ms_mean": r(mean_busy),
                "busy_ms_per_rank": json.dumps({str(k): v for k, v in busy.items()})}),
            impact_ms_per_step=r(gain), impact_share=r(gain / window) if window else None,
            suggestion=f"Move layers off {ranks_str(slow)} (or give the first/last stage fewer "
                       "layers to offset embedding and loss): with every stage at the mean op "
                       f"time the schedule replays {gain:.2f} ms shorter "
                       f"({metrics['balanced_makespan_ms']} ms instead of "
                       f"{metrics['inherent_makespan_ms']} ms).",
            analyzer=NAME, view="pipeline"))
    return out
