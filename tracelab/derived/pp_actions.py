"""Reconstructing pipeline actions (stage, F/I/B/W, microbatch) and their compute from a trace.

Sources, first found wins per run:
- `pp`: the runtime schedules' `PP:{stage}{F|I|B|W}{mb}` record_function spans, and
  DualPipeV's `PP:({stage}F{mb};{stage}B{mb})OVERLAP_F_B` (split into its forward and backward);
  SEND/RECV, UNSHARD/RESHARD and REDUCE_GRAD actions are communication, timed by their ops;
- `gpipe`: ScheduleGPipe's `Forward i` / `Backward i` spans (stage = the rank's pp_stage);
- `host_ops`: Schedule1F1B, which names nothing: runs of top-level operators on the step's thread
  between communication ops, backward runs being `autograd::engine::evaluate_function:` ops. The
  m backward runs are the microbatches' backwards; the m longest other runs are the forwards (the
  rest is input splitting, loss bookkeeping, the optimizer).

A span's compute is measured, not its span: on device ranks, the kernels launched inside it; on
host ranks, operator time inside it minus the thread's communication waits (a PP span includes
the wait for its input on a blocking backend, docs/metrics.md).
"""

from __future__ import annotations

from typing import Any

import duckdb

from tracelab.derived import intervals as iv
from tracelab.derived import sqlfiles
from tracelab.derived.intervals import HOST_OPS_SQL
from tracelab.derived.sqlrows import first, rows

PP_RE = r"^PP:(\d+)(F|I|B|W)(\d+)$"
#: DualPipeV's overlapped forward and backward: `PP:({stage}F{mb};{stage}B{mb})OVERLAP_F_B`.
OVERLAP_RE = r"^PP:\((\d+)F(\d+);(\d+)B(\d+)\)OVERLAP_F_B$"
GPIPE_RE = r"^(Forward|Backward) (\d+)$"


#: The spans a schedule names (PP_RE, OVERLAP_RE, GPIPE_RE), of every rank, in one read of the
#: events (their files are opened once: at 2,000 small ranks each read took 0.3-0.4 s).
_SPANS_SQL = """
    SELECT rank, step, tid, ts_ns, dur_ns, name FROM events
    WHERE run_id = $run AND NOT on_device AND category = 'annotation' AND step IS NOT NULL
      AND (regexp_matches(name, $pp) OR regexp_matches(name, $overlap)
           OR regexp_matches(name, $gpipe))
"""


def _annotated(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[str, list[dict[str, Any]]]:
    named = con.sql(
        _SPANS_SQL,
        params={"run": run_id, "pp": PP_RE, "overlap": OVERLAP_RE, "gpipe": GPIPE_RE},
    ).to_arrow_table()
    with sqlfiles.registered(con, {"_tl_pp_spans": named}):
        return _sources(con)


def _sources(con: duckdb.DuckDBPyConnection) -> tuple[str, list[dict[str, Any]]]:
    """The `pp` spans (with the overlapped ones split), else the `gpipe` ones, of _tl_pp_spans."""
    spans = rows(
        con,
        """
        SELECT rank, step, tid, ts_ns AS a0, ts_ns + dur_ns AS a1,
               TRY_CAST(regexp_extract(name, $pp, 1) AS INTEGER) AS stage,
               coalesce(nullif(regexp_extract(name, $pp, 2), ''),
                        CASE WHEN name LIKE 'Forward %' THEN 'F' ELSE 'B' END) AS kind,
               TRY_CAST(coalesce(nullif(regexp_extract(name, $pp, 3), ''),
                                 regexp_extract(name, $gpipe, 2)) AS INTEGER) AS mb,
               name LIKE 'PP:%' AS is_pp
        FROM _tl_pp_spans
        WHERE regexp_matches(name, $pp) OR regexp_matches(name, $gpipe)
        ORDER BY rank, ts_ns
        """,
        {"pp": PP_RE, "gpipe": GPIPE_RE},
    )
    pp = [s for s in spans if s["is_pp"]] + _overlapped(con)
    if pp:
        return "pp", sorted(pp, key=lambda s: (s["rank"], s["a0"]))
    return ("gpipe", spans) if spans else ("", [])


def _overlapped(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """DualPipeV's OVERLAP_F_B spans as two actions, the forward in the first half of the span
    and the backward in the second: the trace does not say which compute belongs to which, so
    each is given the compute inside its half (their sum is the span's compute)."""
    out = []
    for x in rows(
        con,
        """
        SELECT rank, step, tid, ts_ns AS a0, ts_ns + dur_ns AS a1,
               regexp_extract(name, $overlap, ['fs', 'fm', 'bs', 'bm']) AS g
        FROM _tl_pp_spans WHERE regexp_matches(name, $overlap)
        """,
        {"overlap": OVERLAP_RE},
    ):
        g, mid = x["g"], (x["a0"] + x["a1"]) // 2
        base = {"rank": x["rank"], "step": x["step"], "tid": x["tid"], "is_pp": True}
        out.append(
            {
                **base,
                "a0": x["a0"],
                "a1": mid,
                "stage": int(g["fs"]),
                "kind": "F",
                "mb": int(g["fm"]),
            }
        )
        out.append(
            {
                **base,
                "a0": mid,
                "a1": x["a1"],
                "stage": int(g["bs"]),
                "kind": "B",
                "mb": int(g["bm"]),
            }
        )
    return out


def _forwards(segs: list[dict[str, Any]], m: int) -> list[dict[str, Any]]:
    """The m forward runs among operator runs before the last backward: those ending with the
    most common operator sequence (the stage's module), trimmed to it, so that input splitting
    before the first forward, loss bookkeeping and the optimizer are left out. Falls back to
    the m longest runs."""
    counts: dict[tuple[str, ...], int] = {}
    for s in segs:
        counts[tuple(s["names"])] = counts.get(tuple(s["names"]), 0) + 1
    if counts:
        sig = max(counts, key=lambda k: (counts[k], len(k)))
        n = len(sig)
        hits = [s for s in segs if tuple(s["names"][-n:]) == sig]
        if len(hits) == m:
            for s in hits:
                s["a0"] = s["starts"][-n]
                s["ops_ns"] = sum(s["durs"][-n:])
            return sorted(hits, key=lambda s: s["a0"])
    longest = sorted(segs, key=lambda s: -s["ops_ns"])[:m]
    return sorted(longest, key=lambda s: s["a0"])


def _host_op_segments(
    con: duckdb.DuckDBPyConnection, run_id: int, microbatches: int | None
) -> list[dict[str, Any]]:
    segs = rows(
        con,
        """
        WITH main AS (SELECT DISTINCT rank, tid FROM events
                      WHERE run_id = $run AND NOT on_device AND name LIKE 'ProfilerStep#%'),
        ops AS (SELECT e.rank, e.step, e.tid, e.name, e.ts_ns AS t0, e.ts_ns + e.dur_ns AS t1,
                       CASE WHEN e.category = 'communication' THEN 'C'
                            WHEN e.name LIKE 'autograd::engine::evaluate_function:%' THEN 'B'
                            WHEN e.name LIKE '%detach%' THEN 'N'
                            ELSE 'F' END AS kind
                FROM events e JOIN main USING (rank, tid)
                WHERE e.run_id = $run AND NOT e.on_device AND lower(e.cat) IN ('cpu_op', 'operator')
                  AND e.step IS NOT NULL),
        top AS (SELECT *, coalesce(max(t1) OVER (PARTITION BY rank, step
                         ORDER BY t0, kind = 'C' DESC, t1 DESC
                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS prev_end
                FROM ops),
        t AS (SELECT * FROM top WHERE t0 >= prev_end),
        -- Bookkeeping ops (detach) take the kind of the op before them, so a backward that
        -- ends in detach_ stays one run.
        e AS (SELECT *, coalesce(last_value(CASE WHEN kind <> 'N' THEN kind END IGNORE NULLS)
                          OVER (PARTITION BY rank, step ORDER BY t0, kind = 'C' DESC, t1 DESC
                                ROWS UNBOUNDED PRECEDING), 'F') AS k FROM t),
        c AS (SELECT *, CASE WHEN k IS DISTINCT FROM lag(k) OVER w THEN 1 ELSE 0 END AS chg
              FROM e WINDOW w AS (PARTITION BY rank, step ORDER BY t0, kind = 'C' DESC, t1 DESC)),
        g AS (SELECT *, sum(chg) OVER (PARTITION BY rank, step
                                       ORDER BY t0, kind = 'C' DESC, t1 DESC
                                       ROWS UNBOUNDED PRECEDING) AS seg FROM c)
        SELECT rank, step, any_value(tid) AS tid, any_value(k) AS kind, min(t0) AS a0,
               max(t1) AS a1, sum(t1 - t0) AS ops_ns,
               list(name ORDER BY t0) AS names, list(t0 ORDER BY t0) AS starts,
               list(t1 - t0 ORDER BY t0) AS durs
        FROM g WHERE k <> 'C' GROUP BY rank, step, seg ORDER BY rank, step, a0
        """,
        {"run": run_id},
    )
    out: list[dict[str, Any]] = []
    by: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for s in segs:
        by.setdefault((s["rank"], s["step"]), []).append(s)
    for (rank, step), ss in sorted(by.items()):
        bwd = [s for s in ss if s["kind"] == "B"]
        m = microbatches or len(bwd)
        if not bwd or len(bwd) != m:
            continue
        fwd = _forwards([s for s in ss if s["kind"] == "F" and s["a0"] < bwd[-1]["a0"]], m)
        if len(fwd) != m:
            continue
        for kind, group in (("F", fwd), ("B", bwd)):
            for mb, s in enumerate(group):
                out.append(
                    {
                        "rank": rank,
                        "step": step,
                        "tid": s["tid"],
                        "a0": s["a0"],
                        "a1": s["a1"],
                        "stage": None,
                        "kind": kind,
                        "mb": mb,
                    }
                )
    return out


def _has_p2p(con: duckdb.DuckDBPyConnection, run_id: int) -> bool:
    row = first(
        con.execute(
            "SELECT count(DISTINCT rank) FROM collectives WHERE run_id = $run "
            "AND op IN ('send', 'recv', 'send_recv')",
            {"run": run_id},
        )
    )
    return bool(row and row[0] >= 2)


def actions(
    con: duckdb.DuckDBPyConnection,
    run_id: int,
    microbatches: int | None,
    stage_of: dict[int, int],
    declared: bool | None,
) -> tuple[str, list[dict[str, Any]]]:
    """(source, actions) with each action's compute: busy_ns, c0/c1 (first/last compute, raw
    clock). Empty when the run shows no pipeline schedule. `declared`: the capture says the run
    is (True) or is not (False) pipelined, None without a capture. Unnamed schedules (host_ops)
    are only reconstructed when declared, or without a capture when ranks exchange send/recv:
    a data-parallel run's forward and backward would otherwise look like one microbatch."""
    source, spans = _annotated(con, run_id)
    if not spans and (declared or (declared is None and _has_p2p(con, run_id))):
        source, spans = "host_ops", _host_op_segments(con, run_id, microbatches)
    if not spans:
        return "", []
    for s in spans:
        if s["stage"] is None:
            s["stage"] = stage_of.get(s["rank"], s["rank"])
    keys = ["rank", "step", "tid", "a0", "a1", "stage", "kind", "mb"]
    cols = {k: [s[k] for s in spans] for k in keys}
    rel = (
        "(SELECT unnest($rank::INTEGER[]) AS rank, unnest($step::INTEGER[]) AS step, "
        "unnest($tid::BIGINT[]) AS tid, unnest($a0::BIGINT[]) AS a0, "
        "unnest($a1::BIGINT[]) AS a1, unnest($stage::INTEGER[]) AS stage, "
        "unnest($kind::VARCHAR[]) AS kind, unnest($mb::INTEGER[]) AS mb)"
    )
    host_compute = iv.host_compute_sql("SELECT * FROM _hs", "rank, step, tid")
    measured = rows(
        con,
        f"""
        WITH a AS {rel},
        _dev AS (SELECT DISTINCT rank FROM events WHERE run_id = $run AND on_device
                 AND category = 'compute'),
        _hs AS ({HOST_OPS_SQL} AND rank NOT IN (SELECT rank FROM _dev)),
        dk AS (SELECT a.rank, a.step, a.stage, a.kind, a.mb, k.ts_ns AS t0,
                      k.ts_ns + k.dur_ns AS t1
               FROM a JOIN events l ON l.run_id = $run AND l.rank = a.rank AND l.tid = a.tid
                    AND NOT l.on_device AND l.correlation IS NOT NULL
                    AND l.ts_ns >= a.a0 AND l.ts_ns < a.a1
               JOIN events k ON k.run_id = l.run_id AND k.rank = l.rank
                    AND k.correlation = l.correlation AND k.on_device AND k.category = 'compute'),
        hk AS (SELECT a.rank, a.step, a.stage, a.kind, a.mb, greatest(h.t0, a.a0) AS t0,
                      least(h.t1, a.a1) AS t1
               FROM a JOIN ({host_compute}) h ON h.rank = a.rank AND h.tid = a.tid
                    AND h.t0 < a.a1 AND h.t1 > a.a0),
        busy AS (SELECT {{'rank': rank, 'step': step, 'stage': stage, 'kind': kind, 'mb': mb}}
                        AS k, t0, t1
                 FROM (SELECT * FROM dk UNION ALL SELECT * FROM hk)),
        u AS (SELECT unnest(k), t0, t1 FROM interval_union(busy))
        SELECT a.rank, a.step, a.stage, a.kind, a.mb, a.a0, a.a1,
               coalesce(sum(u.t1 - u.t0), 0) AS busy_ns, min(u.t0) AS c0, max(u.t1) AS c1
        FROM a LEFT JOIN u USING (rank, step, stage, kind, mb)
        GROUP BY ALL ORDER BY a.rank, a.step, c0
        """,
        {**cols, "run": run_id},
    )
    for x in measured:
        # An action that computed nothing (e.g. the first stage's input-grad backward) keeps its
        # place in the order as an empty interval at the end of its span.
        if x["c0"] is None:
            x["c0"] = x["c1"] = x["a1"]
    return source, measured
