"""A pipelined run's memory estimate per rank, against its measured peak (docs/metrics.md,
"Memory estimate"). The formulas are tracelab.memory_model's; this module gathers their inputs
from the store and splits the difference.

Inputs: the collector's model-state bytes per rank (the manifest's `model_states`); one
microbatch's activation bytes per stage, measured as the allocator's net growth over each
forward action (the median over microbatches and steps); the schedule, ranks, stages per rank
and microbatches from pipeline_runs. Measured peak: the device allocator's peak per step on GPU;
on CPU the allocator events' peak of the first window plus the model-state bytes already live
when it opened (allocations made before profiling are invisible to the events).

Split of measured - estimate: model states (bytes counted by the collector minus the estimate's),
activations (the microbatches in flight at the measured peak's instant, each at its stage's
measured bytes, minus the estimate's activations) and the unexplained rest.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

import duckdb

from tracelab import memory_model as mm
from tracelab.analyzers._common import rows
from tracelab.store.files import run_memory_sql

#: Each pipeline action with the allocator's growth over it: allocated bytes after the last
#: event at or before its end, minus after the last event before its start (the rank's events
#: in the trace's order: of events at the same instant, the last one written). One sort of
#: the rank's events and the actions' two ends, a running last value: two correlated
#: subqueries per action took 1.05, 2.50 and 14.1 s at 800, 1,600 and 3,200 actions of 25k,
#: 50k and 100k events each (0.03, 0.05 and 0.13 s so, the same values; events at the
#: actions' ends included). Named parameters: $run, $device (memory.device_type, NULL as 0).
_FORWARD_SQL = """
WITH a AS (
    SELECT row_number() OVER () AS id, p.rank, p.stage, p.kind, p.step, p.mb,
           p.span_start_ns + coalesce(o.offset_ns, 0) AS s0,
           p.span_end_ns + coalesce(o.offset_ns, 0) AS s1
    FROM pipeline_actions p
    LEFT JOIN clock_offsets o ON o.run_id = p.run_id AND o.rank = p.rank
    WHERE p.run_id = $run
),
-- An action's start sorts before the events of its instant (side -1), its end after them
-- (side 1); events keep their traces' order (memory.idx).
points AS (
    SELECT rank, ts_ns AS t, 0 AS side, idx AS ord, allocated_bytes AS bytes, NULL AS id
    FROM {memory}
    WHERE run_id = $run AND source = 'trace' AND allocated_bytes IS NOT NULL
      AND coalesce(device_type, 0) = $device
    UNION ALL SELECT rank, s0, -1, 0, NULL, id FROM a
    UNION ALL SELECT rank, s1, 1, 0, NULL, id FROM a
),
state AS (
    SELECT id, side, last_value(bytes IGNORE NULLS) OVER (
               PARTITION BY rank ORDER BY t, side, ord
               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS bytes
    FROM points
)
SELECT a.rank, a.stage, a.kind, a.step, a.s0, a.s1, e.bytes - s.bytes AS grown_bytes
FROM a
JOIN state s ON s.id = a.id AND s.side = -1
JOIN state e ON e.id = a.id AND e.side = 1
ORDER BY a.rank, a.s0
"""

_TRACE_PEAK_SQL = """
SELECT rank, max(allocated_bytes) AS peak_bytes, arg_max(ts_ns, allocated_bytes) AS peak_ts,
       arg_max(step, allocated_bytes) AS peak_step
FROM {memory}
WHERE run_id = ? AND source = 'trace' AND allocated_bytes IS NOT NULL
  AND step BETWEEN ? AND ? AND coalesce(device_type, 0) = ?
GROUP BY rank
"""


def forward_growth(
    con: duckdb.DuckDBPyConnection, run_id: int, device: int
) -> list[dict[str, Any]]:
    """Each pipeline action of the run (rank, stage, kind, step, s0, s1 on the rank's own
    clock, where its allocator events are) with the device allocator's growth over it,
    grown_bytes (None without an event before it); in order of rank and start (_FORWARD_SQL)."""
    sql = _FORWARD_SQL.format(memory=run_memory_sql(con, run_id))
    return rows(con, sql, {"run": run_id, "device": device})


def _ms(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A rank's `model_states` (docs/capture-format.md), or {} when absent or malformed."""
    ms = entry.get("model_states")
    return ms if isinstance(ms, dict) else {}


def _stage_entries(entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    stages = _ms(entry).get("stages")
    return [s for s in stages if isinstance(s, dict)] if isinstance(stages, list) else []


def _manifest_ranks(metadata: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    entries = ((metadata or {}).get("manifest") or {}).get("ranks") or []
    return {int(e["rank"]): e for e in entries if isinstance(e, dict) and "rank" in e}


def _window0(metadata: Mapping[str, Any]) -> tuple[int, int] | None:
    windows = ((metadata or {}).get("manifest") or {}).get("windows") or []
    for w in windows:
        if isinstance(w, dict) and w.get("first_step") is not None:
            return int(w["first_step"]), int(w.get("last_step") or w["first_step"])
    return None


def model_state_bytes(metadata: Mapping[str, Any]) -> dict[int, float | None]:
    """Per rank, the model-state bytes the collector counted (None where it counted none)."""
    return {r: _states(e) for r, e in _manifest_ranks(metadata).items()}


def _states(entry: Mapping[str, Any]) -> float | None:
    ms = entry.get("model_states")
    if not isinstance(ms, dict):
        return None
    parts = [ms.get(k) for k in ("param_bytes", "grad_bytes", "optimizer_bytes")]
    return float(sum(x for x in parts if isinstance(x, int | float)))


def estimate(
    con: duckdb.DuckDBPyConnection,
    run_id: int,
    metadata: Mapping[str, Any],
    pipeline: Mapping[str, Any] | None,
    device_peaks: Mapping[int, int],
) -> tuple[list[dict[str, Any]], list[str]]:
    """(per-rank rows, what is missing). Rows hold estimate_bytes and its parts, measured_bytes,
    the split of the difference, and the microbatches held per stage. `device_peaks` are the
    collector's device allocator peaks per rank (empty on CPU)."""
    missing: list[str] = []
    entries = _manifest_ranks(metadata)
    states = model_state_bytes(metadata)
    if not entries or all(v is None for v in states.values()):
        missing.append(
            "model-state bytes: capture with tracelab.profile(..., optimizer=opt) and the "
            "pipeline schedule (or model=), which counts them per rank"
        )
    if pipeline is None:
        missing.append("a pipeline (pipeline_runs is empty): the estimate is per stage")
    # The compute device's allocator: CUDA events on GPU ranks, CPU events on host-only ranks.
    device = 1 if device_peaks else 0
    acts = forward_growth(con, run_id, device) if pipeline else []
    grown: dict[int, list[float]] = {}
    for a in acts:
        if a["kind"] == "F" and a["grown_bytes"] is not None:
            grown.setdefault(a["stage"], []).append(float(a["grown_bytes"]))
    if pipeline and not grown:
        missing.append(
            "activation bytes of one microbatch: the trace has no allocator events inside the "
            "forward actions (capture with profile_memory=True)"
        )
    if missing:
        return [], missing
    assert pipeline is not None
    stage_bytes = {k: max(0.0, statistics.median(v)) for k, v in grown.items()}
    rank_of_stage = {a["stage"]: a["rank"] for a in acts}
    pp_rank = {k % pipeline["ranks"]: rank_of_stage[k] for k in rank_of_stage}
    if pipeline["schedule"] in ("zbv", "dualpipev"):
        p = pipeline["ranks"]
        pp_rank = {k if k < p else 2 * p - 1 - k: r for k, r in rank_of_stage.items()}
    by_pp = {i: states.get(r) or 0.0 for i, r in pp_rank.items()}
    bw = {i: _largest_param(entries.get(r, {})) for i, r in pp_rank.items()}
    ow = {i: _optimizer_ws(entries.get(r, {})) for i, r in pp_rank.items()}
    kept = _kept_sends(entries, pipeline) if pipeline.get("source") == "pp" else {}
    est = mm.estimate_ranks(
        schedule=pipeline["schedule"],
        p=pipeline["ranks"],
        m=pipeline["microbatches"],
        v=pipeline["stages_per_rank"],
        stage_activation_bytes=stage_bytes,
        rank_state_bytes=by_pp,
        rank_backward_workspace=bw,
        rank_optimizer_workspace=ow,
        kept_after_backward=kept,
    )
    measured = _measured(con, run_id, metadata, entries, device_peaks)
    out = []
    for e in est:
        rank = pp_rank.get(e.rank)
        if rank is None:
            continue
        peak, peak_ts, peak_step = measured.get(rank, (None, None, None))
        row: dict[str, Any] = {
            "rank": rank,
            "stages": list(e.stages),
            "in_flight": {str(k): n for k, n in e.in_flight.items()},
            "model_states_bytes": e.model_states_bytes,
            "activations_bytes": e.activations_bytes,
            "backward_workspace_bytes": e.backward_workspace_bytes,
            "optimizer_workspace_bytes": e.optimizer_workspace_bytes,
            "phase": e.phase,
            "allowance_bytes": e.allowance_bytes,
            "estimate_bytes": e.total_bytes,
            "measured_bytes": peak,
            "stage_activation_bytes": {str(k): stage_bytes[k] for k in e.stages},
        }
        if peak is not None:
            held, done = _held_at(acts, rank, peak_ts, peak_step) if peak_ts else (None, {})
            act_meas = (
                sum(stage_bytes.get(k, 0.0) * n for k, n in held.items())
                + sum(kept.get(k, 0.0) * n for k, n in done.items())
                if held is not None
                else None
            )
            diff = peak - e.total_bytes
            d_states = (states.get(rank) or 0.0) - e.model_states_bytes
            d_acts = act_meas - e.activations_bytes if act_meas is not None else None
            row.update(
                error=diff / e.total_bytes if e.total_bytes else None,
                diff_bytes=diff,
                diff_model_states_bytes=d_states,
                diff_activations_bytes=d_acts,
                diff_rest_bytes=diff - d_states - (d_acts or 0.0),
                held_at_peak={str(k): n for k, n in (held or {}).items()},
            )
        out.append(row)
    caveats = []
    if any(not _ms(e).get("optimizers") for e in entries.values() if _ms(e)):
        caveats.append(
            "the optimizer's states (tracelab.profile got no optimizer=, so none were counted)"
        )
    return out, caveats


def _kept_sends(
    entries: Mapping[int, Mapping[str, Any]], pipeline: Mapping[str, Any]
) -> dict[int, float]:
    """Per stage: bytes its sends keep alive until the step's end under the runtime schedules
    (those that annotate PP: actions): its output (unless last) and its input's gradient
    (unless first), one microbatch each, from the collector's stage metadata."""
    last = pipeline["ranks"] * pipeline["stages_per_rank"] - 1
    out: dict[int, float] = {}
    for entry in entries.values():
        for st in _stage_entries(entry):
            k = st.get("stage")
            if not isinstance(k, int):
                continue
            kept = (st.get("output_bytes") or 0) if k != last else 0
            kept += (st.get("input_bytes") or 0) if k != 0 else 0
            out[k] = float(kept)
    return out


def _largest_param(entry: Mapping[str, Any]) -> float:
    """The backward's weight-gradient temporary: the rank's largest parameter tensor."""
    stages = _stage_entries(entry)
    return float(max((s.get("largest_param_bytes") or 0 for s in stages), default=0))


def _optimizer_ws(entry: Mapping[str, Any]) -> float:
    ms = _ms(entry)
    names = [str(n).lower() for n in ms.get("optimizers") or []]
    kind = "adam" if any(n.startswith("adam") for n in names) else "sgd"
    return mm.optimizer_workspace(float(ms.get("optimizer_bytes") or 0), kind)


def measured_peaks(
    con: duckdb.DuckDBPyConnection, run_id: int, metadata: Mapping[str, Any]
) -> dict[int, float]:
    """Per rank, the CPU peak with the collector's baseline: the highest `Total Allocated` of
    the first window's allocator events plus the model-state bytes live when it opened. Empty
    where a rank lacks either (the memory analyzer then keeps the events' lower bound)."""
    got = _measured(con, run_id, metadata, _manifest_ranks(metadata), {})
    return {rank: peak for rank, (peak, _, _) in got.items()}


def _measured(
    con: duckdb.DuckDBPyConnection,
    run_id: int,
    metadata: Mapping[str, Any],
    entries: Mapping[int, Mapping[str, Any]],
    device_peaks: Mapping[int, int],
) -> dict[int, tuple[float, int | None, int | None]]:
    """Per rank: (measured peak bytes, its instant on the rank's clock and its step, when
    known)."""
    window = _window0(metadata)
    lo, hi = window if window else (-(2**31), 2**31 - 1)
    device = 1 if device_peaks else 0
    peaks = _TRACE_PEAK_SQL.format(memory=run_memory_sql(con, run_id))
    trace = {r["rank"]: r for r in rows(con, peaks, [run_id, lo, hi, device])}
    out: dict[int, tuple[float, int | None, int | None]] = {}
    for rank, entry in entries.items():
        t = trace.get(rank)
        if device_peaks:
            if rank in device_peaks:
                out[rank] = (
                    float(device_peaks[rank]),
                    t["peak_ts"] if t else None,
                    t["peak_step"] if t else None,
                )
            continue
        live = _ms(entry).get("live_at_window_start_bytes")
        if t is not None and isinstance(live, int):
            out[rank] = (float(live + t["peak_bytes"]), int(t["peak_ts"]), t["peak_step"])
    return out


def _held_at(
    acts: list[dict[str, Any]], rank: int, ts: int, step: int | None
) -> tuple[dict[int, int], dict[int, int]]:
    """At `ts`, per stage: microbatches whose forward ended and whose backward had not, and
    (in `step`) microbatches whose backward had ended (their sends' tensors may still be kept)."""
    held: dict[int, int] = {}
    done: dict[int, int] = {}
    for a in acts:
        if a["rank"] != rank or a["s1"] > ts:
            continue
        k = a["stage"]
        if a["kind"] == "F":
            held[k] = held.get(k, 0) + 1
        elif a["kind"] in ("B", "I"):
            held[k] = held.get(k, 0) - 1
            if a["step"] == step:
                done[k] = done.get(k, 0) + 1
    return {k: max(0, n) for k, n in held.items()}, done
