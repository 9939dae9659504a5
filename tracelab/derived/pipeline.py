"""The pipeline of a run: its actions, its schedule, and the idle the schedule itself needs.

Actions (stage, F/B/I/W, microbatch) come from tracelab.derived.pp_actions with the compute
measured inside each. The pipeline's window in a step runs from the first compute of any stage
to the last (reference clock). The *inherent* idle of a rank replays the observed order of
actions with the measured median op time of each (stage, kind) and free communication
(tracelab.derived.schedules); a textbook order stands in when the observed one cannot be
replayed. The lost-time model (tracelab.derived.parts) splits each pipeline rank's pipeline
time into bubble (up to the inherent idle) and stall (the rest).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from typing import Any

import duckdb
import pyarrow as pa

from tracelab.derived import pp_actions, schedules, sqlfiles
from tracelab.derived.sqlrows import first, scalar

#: torch.distributed.pipelining class names (and short names) -> tracelab schedule names.
TORCH_SCHEDULES = {
    "schedulegpipe": "gpipe",
    "schedule1f1b": "1f1b",
    "scheduleinterleaved1f1b": "interleaved_1f1b",
    "scheduleloopedbfs": "looped_bfs",
    "scheduleinterleavedzerobubble": "zero_bubble",
    "schedulezbvzerobubble": "zbv",
    "scheduledualpipev": "dualpipev",
    "zbh1": "zb_h1",
    "gpipe": "gpipe",
    "1f1b": "1f1b",
    "interleaved_1f1b": "interleaved_1f1b",
    "zb_h1": "zb_h1",
    "looped_bfs": "looped_bfs",
    "zero_bubble": "zero_bubble",
    "zbv": "zbv",
    "dualpipev": "dualpipev",
}


def declared_pipeline(metadata: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The capture manifest's `pipeline` entry when it is an object, else None (a malformed
    entry is ignored: the trace's own annotations still describe the schedule)."""
    meta = (metadata or {}).get("pipeline")
    return dict(meta) if isinstance(meta, dict) else None


def schedule_name(meta: Mapping[str, Any] | None) -> str | None:
    raw = (meta or {}).get("schedule")
    return TORCH_SCHEDULES.get(str(raw).lower()) if raw is not None else None


def _stage_map(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[int, int]:
    got = con.execute(
        "SELECT rank, pp_stage FROM ranks WHERE run_id = $run ORDER BY rank", {"run": run_id}
    ).fetchall()
    return {int(rk): int(st) if st is not None else i for i, (rk, st) in enumerate(got)}


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _breadth_first(acts: list[dict[str, Any]], m: int) -> bool:
    """Whether the first rank runs all m forwards of its first stage before any forward of its
    next stage (ScheduleLoopedBFS), rather than a round of them (interleaved 1F1B)."""
    rank = min(a["rank"] for a in acts)
    step = min(a["step"] for a in acts if a["rank"] == rank)
    fwd = sorted(
        (a for a in acts if a["rank"] == rank and a["step"] == step and a["kind"] == "F"),
        key=lambda a: a["c0"],
    )
    if not fwd:
        return False
    first = fwd[0]["stage"]
    lead = next((i for i, a in enumerate(fwd) if a["stage"] != first), len(fwd))
    return lead >= m > 0


def _detect(
    meta: Mapping[str, Any] | None, acts: list[dict[str, Any]], source: str, overlap: bool = False
) -> dict[str, Any]:
    ranks = sorted({a["rank"] for a in acts})
    stages = sorted({a["stage"] for a in acts})
    kinds = {a["kind"] for a in acts}
    per_step: dict[tuple[int, int, int, str], int] = {}
    for a in acts:
        key = (a["rank"], a["step"], a["stage"], a["kind"])
        per_step[key] = per_step.get(key, 0) + 1
    m_seen = max((n for (_, _, _, k), n in per_step.items() if k == "F"), default=0)
    p, v = len(ranks), max(1, len(stages) // max(1, len(ranks)))
    declared = schedule_name(meta)
    held: dict[int, set[int]] = {}
    for a in acts:
        held.setdefault(a["rank"], set()).add(a["stage"])
    # Stage placement: looped (rank r holds r, r + p, ...) or V-shaped (r and 2p - 1 - r).
    v_shape = v == 2 and all(held.get(r, set()) == {i, 2 * p - 1 - i} for i, r in enumerate(ranks))
    if declared:
        schedule = declared
    elif v_shape:
        schedule = "dualpipev" if overlap else "zbv"
    elif "I" in kinds or "W" in kinds:
        schedule = "zb_h1" if v == 1 else "zero_bubble"
    elif v > 1:
        schedule = "looped_bfs" if _breadth_first(acts, m_seen) else "interleaved_1f1b"
    elif source == "gpipe":
        schedule = "gpipe"
    else:
        schedule = "1f1b"
    m = _positive_int((meta or {}).get("microbatches")) or m_seen
    return {"schedule": schedule, "p": p, "v": v, "m": m, "ranks": ranks}


def _inherent(
    acts: list[dict[str, Any]], info: dict[str, Any]
) -> tuple[dict[int, float], float, dict[str, float], str, float] | None:
    """Replay the observed order with median op times: per-rank idle (ns), makespan, mean op
    time per kind, how the order was obtained, and the makespan with every stage at the mean op
    time (balanced stages). None when no order can be replayed."""
    by: dict[tuple[int, str], list[int]] = {}
    for a in acts:
        by.setdefault((a["stage"], a["kind"]), []).append(a["busy_ns"])
    med = {k: float(statistics.median(xs)) for k, xs in by.items()}
    first = min(a["step"] for a in acts)
    order: dict[int, list[schedules.Action]] = {}
    for a in sorted((a for a in acts if a["step"] == first), key=lambda a: a["c0"]):
        order.setdefault(a["rank"], []).append((a["stage"], a["kind"], a["mb"]))
    how = "observed order"
    try:
        rp = schedules.replay(order, lambda a: med.get((a[0], a[1]), 0.0))
    except ValueError:
        if info["schedule"] not in schedules.SCHEDULES:
            return None
        try:
            order = schedules.make_order(info["schedule"], info["p"], info["m"], info["v"])
            rp = schedules.replay(order, lambda a: med.get((a[0], a[1]), 0.0))
        except ValueError:
            return None
        how = "textbook order"
    kinds: dict[str, list[float]] = {}
    for (_, kind), t in med.items():
        kinds.setdefault(kind, []).append(t)
    mean_op = {k: statistics.mean(v) for k, v in kinds.items()}
    balanced = schedules.replay(order, lambda a: mean_op.get(a[1], 0.0)).makespan
    return {rk: rp.idle(rk) for rk in order}, rp.makespan, mean_op, how, balanced


def derive(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    """Fill pipeline_actions, pipeline_runs and pipeline_ranks for a pipelined run."""
    row = first(con.execute("SELECT metadata FROM runs WHERE run_id = $run", {"run": run_id}))
    metadata = json.loads(row[0]) if row and row[0] else {}
    meta = declared_pipeline(metadata)
    declared = bool(meta) if "manifest" in metadata else None
    source, acts = pp_actions.actions(
        con,
        run_id,
        _positive_int((meta or {}).get("microbatches")),
        _stage_map(con, run_id),
        declared,
    )
    if not acts:
        return
    off = dict(con.execute("SELECT rank, o FROM run_offsets($run)", {"run": run_id}).fetchall())
    # On the reference clock (ref_ns of tracelab/derived/sql/_macros.sql: own time - offset):
    # the schedule's recognition and the windows compare ranks.
    for a in acts:
        o = off.get(a["rank"], 0)
        a["a0"], a["a1"], a["c0"], a["c1"] = a["a0"] - o, a["a1"] - o, a["c0"] - o, a["c1"] - o
    overlap = bool(
        scalar(
            con.execute(
                "SELECT count(*) FROM events WHERE run_id = $run AND category = 'annotation' "
                "AND regexp_matches(name, $overlap)",
                {"run": run_id, "overlap": pp_actions.OVERLAP_RE},
            )
        )
    )
    info = _detect(meta, acts, source, overlap)
    inh = _inherent(acts, info)
    idle_inh, makespan, mean_op, how, balanced = inh if inh else ({}, None, {}, "none", None)
    params = {"run": run_id}
    actions_table = pa.table(
        {
            "rank": pa.array([a["rank"] for a in acts], pa.int32()),
            "step": pa.array([a["step"] for a in acts], pa.int32()),
            "stage": pa.array([a["stage"] for a in acts], pa.int32()),
            "kind": pa.array([a["kind"] for a in acts], pa.string()),
            "mb": pa.array([a["mb"] for a in acts], pa.int32()),
            "span_start_ns": pa.array([a["a0"] for a in acts], pa.int64()),
            "span_end_ns": pa.array([a["a1"] for a in acts], pa.int64()),
            "start_ns": pa.array([a["c0"] for a in acts], pa.int64()),
            "end_ns": pa.array([a["c1"] for a in acts], pa.int64()),
            "busy_ns": pa.array([a["busy_ns"] for a in acts], pa.int64()),
        }
    )
    sqlfiles.run(con, "pipeline_actions", params, {"_tl_actions": actions_table})
    run_row = {
        "source": source,
        "schedule": info["schedule"],
        "schedule_declared": None
        if meta is None or meta.get("schedule") is None
        else str(meta.get("schedule")),
        "ranks": info["p"],
        "stages_per_rank": info["v"],
        "microbatches": info["m"],
        "inherent_makespan_ns": None if makespan is None else round(makespan),
        "balanced_makespan_ns": None if balanced is None else round(balanced),
        "inherent_order": how,
        "op_ns": json.dumps({k: round(v) for k, v in sorted(mean_op.items())}),
    }
    run_types = {
        "ranks": pa.int32(),
        "stages_per_rank": pa.int32(),
        "microbatches": pa.int32(),
        "inherent_makespan_ns": pa.int64(),
        "balanced_makespan_ns": pa.int64(),
    }
    run_table = pa.table(
        {k: pa.array([v], run_types.get(k, pa.string())) for k, v in run_row.items()}
    )
    sqlfiles.run(con, "pipeline_runs", params, {"_tl_pipeline_run": run_table})
    steps: dict[int, dict[int, list[dict[str, Any]]]] = {}
    for a in acts:
        steps.setdefault(a["step"], {}).setdefault(a["rank"], []).append(a)
    out: dict[str, list[Any]] = {k: [] for k in _RANK_COLUMNS}
    for step, by_rank in sorted(steps.items()):
        w0 = min(a["c0"] for xs in by_rank.values() for a in xs)
        w1 = max(a["c1"] for xs in by_rank.values() for a in xs)
        for rank, xs in sorted(by_rank.items()):
            c0, c1 = min(a["c0"] for a in xs), max(a["c1"] for a in xs)
            inherent = idle_inh.get(rank)
            per_rank: dict[str, Any] = {
                "rank": rank,
                "step": step,
                "window_start_ns": w0,
                "window_end_ns": w1,
                "busy_ns": sum(a["busy_ns"] for a in xs),
                "leading_ns": c0 - w0,
                "trailing_ns": w1 - c1,
                "inherent_idle_ns": None if inherent is None else round(inherent),
            }
            for k, v in per_rank.items():
                out[k].append(v)
    ranks_table = pa.table({k: pa.array(v, _RANK_COLUMNS[k]) for k, v in out.items()})
    sqlfiles.run(con, "pipeline_ranks", params, {"_tl_pipeline_ranks": ranks_table})


#: pipeline_ranks' columns as the Python computes them (tracelab/derived/sql/pipeline_ranks.sql).
_RANK_COLUMNS = {
    "rank": pa.int32(),
    "step": pa.int32(),
    "window_start_ns": pa.int64(),
    "window_end_ns": pa.int64(),
    "busy_ns": pa.int64(),
    "leading_ns": pa.int64(),
    "trailing_ns": pa.int64(),
    "inherent_idle_ns": pa.int64(),
}
