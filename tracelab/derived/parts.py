"""The lost-time model: every rank's steps cut into disjoint, labelled parts (docs/metrics.md).

Each rank's intervals are put in classes, each class is merged into a union
(tracelab.derived.intervals.union), and one sweep over all the unions' boundaries and the step
boundaries gives elementary segments with the set of classes covering each. A segment's part is
the first that applies:

    compute    a compute interval covers it (device kernels; host-only ranks: cpu_ops minus the
               thread's own communication ops, and a parent op's own time only while no
               collective of the rank is in flight: else the thread is blocked in a wait())
    transfer   the data-movement portion of a communication op (its last transfer_ns)
    memcpy     a device memcpy/memset
    wait       the waiting portion of a matched group collective (its first wait_ns); a wait
               for an async collective (wait_tensor, c10d::wait) linked to that collective
    pipeline   the waiting portion of a send/recv; and the rest of it inside the pipeline's
               window on a pipeline rank (stage-to-stage latency is part of the pipeline's idle
               time, as in the textbook bubble and the schedule replay)
    transfer   the data-movement portion of a send/recv outside a pipeline window; a
               communication op matched to nothing (no peer timing: all of it is counted as
               data movement)
    pipeline   nothing above, inside the pipeline's window, on a pipeline rank
    idle       nothing above, on a device rank whose host is blocked in a synchronization
    host       anything else: the device (or, on host-only ranks, the loop) waits on the host

The segments tile each step exactly, so the parts add up to the step by construction. Step
parts split `pipeline` into bubble (up to the rank's inherent idle) and stall (the rest), and
comm_attribution shares the exposed communication among the operations behind it.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracelab.derived import batches, part_batches, part_files, sqlfiles
from tracelab.derived.batches import ALL_RANKS
from tracelab.derived.intervals import HOST_OPS_SQL, host_compute_sql, int64s, union
from tracelab.vocabulary import OP_RULES, TIME_PARTS

#: Interval classes of the sweep, one bit each.
C, T, Y, W, P, U, PW, S, PT, CN = range(10)
_CLASS_NAMES = (
    "compute",
    "transfer",
    "memcpy",
    "wait",
    "p2p_wait",
    "unmatched_comm",
    "pipeline_window",
    "sync",
    "p2p_transfer",
    "op_self",
)
#: A host op that issues a collective takes the dimension of its op's first host collective
#: on the rank starting at most this long after it (10 ms: gloo's worker picks it up at once
#: unless earlier work of its group is still queued).
ISSUE_WINDOW_NS = 10_000_000
#: Part labels of segments, in time_parts.part and step_parts' columns.
PARTS = TIME_PARTS
#: The communication classes and the part their exposed time is attributed under.
COMM_PART = {
    T: ("transfer",),
    U: ("transfer",),
    W: ("wait",),
    P: ("pipeline",),
    PT: ("pipeline", "transfer"),
}


#: Host compute of host-only ranks' threads: of leaf operators only (see `hp` below), and of
#: every operator (HOST_OPS_SQL's classes; `hs` and `hp` are INTERVALS_SQL's relations).
_LEAF_COMPUTE_SQL = host_compute_sql(
    "SELECT rank, step, tid, t0, t1, cls FROM hp WHERE NOT (parent AND cls = 'compute')",
    "rank, step, tid",
)
_OP_COMPUTE_SQL = host_compute_sql("SELECT * FROM hs", "rank, step, tid")

#: Every interval of the run on the reference clock, classed and keyed: rank, t0, t1, cls,
#: op, pg_name, bytes, culprit, dim (the parallel dimension of a communication interval: its
#: group's, process_groups.dim; send/recv are the pipeline's), of the ranks $lo..$hi (every
#: relation that reads events is filtered on it, so only those ranks' files are read; the rows
#: of the small tables are filtered by intervals()). Named parameters: $run, $lo, $hi,
#: $device_ranks (the ranks with device activity, rank_extents.device: a batch's own, in
#: derive_ranks; asked only about $lo..$hi), $op_patterns and
#: $op_names (OP_RULES), $issue_window_ns (ISSUE_WINDOW_NS).
INTERVALS_SQL = f"""
WITH dev AS (SELECT unnest($device_ranks::INTEGER[]) AS rank),
off AS (FROM run_offsets($run)),
hs AS ({HOST_OPS_SQL} AND rank BETWEEN $lo AND $hi AND rank NOT IN (FROM dev)),
-- Every collectives row with its group's dimension (NULL when no group is known): the trace's
-- pg_name, else the group tracelab.derived.groups assigned it (collective_groups).
kg AS (
    SELECT k.rank, k.event_idx, k.source, k.start_ns, k.op, pg.dim FROM collectives k
    LEFT JOIN collective_groups cg ON cg.run_id = k.run_id AND cg.rank = k.rank
         AND cg.event_idx = k.event_idx
    LEFT JOIN process_groups pg ON pg.run_id = k.run_id
         AND pg.group_key = coalesce(k.pg_name, cg.group_key)
    WHERE k.run_id = $run
),
hostc AS (
    SELECT rank, start_ns, op, dim FROM kg
    WHERE source = 'host' AND start_ns IS NOT NULL AND dim IS NOT NULL
),
-- Per communication event, the op and dimension of its collectives row(s).
kev AS (
    SELECT rank, event_idx, any_value(op) AS op, any_value(dim) AS dim FROM kg
    WHERE event_idx IS NOT NULL GROUP BY rank, event_idx
),
-- An operator with another (non-empty) operator of its thread starting inside it is a
-- parent: its own time between its children may be the thread blocked in an untraced wait (a
-- work's wait() inside an autograd hook: FSDP2's all-gather in backward), not computing.
hp AS (SELECT *, coalesce(lead(t0) OVER (PARTITION BY rank, tid ORDER BY t0, t1 DESC) < t1,
                          false) AS parent
       FROM hs WHERE t1 > t0),
comm AS (
    SELECT e.rank, e.idx, e.name, e.ts_ns AS ts, ref_ns(e.ts_ns, off.o) AS a,
           ref_ns(e.ts_ns + e.dur_ns, off.o) AS b
    FROM events e JOIN off USING (rank)
    WHERE e.run_id = $run AND e.rank BETWEEN $lo AND $hi AND e.category = 'communication'
      AND e.on_device = (e.rank IN (FROM dev))
),
-- A wait for an async collective (`_c10d_functional::wait_tensor`, a work's `c10d::wait`)
-- waits for the collective that releases it: of the rank's matched collectives in flight
-- during the wait, the one whose end is nearest the wait's end; with none in flight (a wait
-- for a collective already done, a few us), the last one to end before it
-- (docs/metrics.md, "Waits").
waits AS (
    SELECT c.rank, c.idx, c.a, c.b FROM comm c
    WHERE c.name ILIKE '%wait_tensor%' OR c.name ILIKE 'c10d::wait%'
),
-- The matched collectives, an all-to-all's size the call's (all_to_all_ranks.call_bytes, the
-- size its bandwidth is measured at), not each rank's own share: one uneven call was listed
-- as 40 KiB on three ranks and 120 KiB on the fourth, and found no bandwidth.
-- `culprit`: whom the rank waits for, its last rank; none on the last rank itself, whose own
-- wait is its transfer (below).
matched AS (
    SELECT m.* REPLACE (coalesce(a.call_bytes, m.bytes) AS bytes),
           nullif(m.last_rank, m.rank) AS culprit
    FROM matched_collectives m
    LEFT JOIN all_to_all_ranks a ON m.op = 'all_to_all' AND a.run_id = m.run_id
         AND a.match_key = m.match_key AND a.rank = m.rank
    WHERE m.run_id = $run
),
mc AS (
    SELECT rank, start_ns, end_ns,
           {{'op': op, 'pg_name': pg_name, 'bytes': bytes, 'culprit': culprit,
             'dim': dim}} AS m
    FROM matched
),
in_flight AS (
    SELECT w.rank, w.idx, arg_min(mc.m, abs(mc.end_ns - w.b)) AS m
    FROM waits w JOIN mc ON mc.rank = w.rank AND mc.start_ns < w.b AND mc.end_ns > w.a
    GROUP BY w.rank, w.idx
),
linked AS (
    SELECT w.rank, w.idx, w.a, w.b, coalesce(f.m, d.m) AS m
    FROM waits w LEFT JOIN in_flight f ON f.rank = w.rank AND f.idx = w.idx
    ASOF LEFT JOIN mc d ON d.rank = w.rank AND w.a >= d.end_ns
    WHERE f.m IS NOT NULL OR d.m IS NOT NULL
)
SELECT e.rank, ref_ns(e.ts_ns, off.o) AS t0, ref_ns(e.ts_ns + e.dur_ns, off.o) AS t1,
       CASE e.category WHEN 'compute' THEN {C} ELSE {Y} END AS cls,
       NULL::VARCHAR AS op, NULL::VARCHAR AS pg_name, NULL::BIGINT AS bytes,
       NULL::INTEGER AS culprit, NULL::VARCHAR AS dim
FROM events e JOIN off USING (rank)
WHERE e.run_id = $run AND e.rank BETWEEN $lo AND $hi AND e.on_device
  AND e.category IN ('compute', 'memcpy', 'memset')
UNION ALL
-- Host-only ranks: leaf operators compute (minus the thread's communication ops); a parent's
-- own time computes unless a collective of the rank is in flight (op_self, see sweep()).
SELECT h.rank, ref_ns(h.t0, off.o), ref_ns(h.t1, off.o), {C}, NULL, NULL, NULL, NULL, NULL
FROM ({_LEAF_COMPUTE_SQL}) h JOIN off USING (rank)
UNION ALL
SELECT h.rank, ref_ns(h.t0, off.o), ref_ns(h.t1, off.o), {CN}, NULL, NULL, NULL, NULL, NULL
FROM ({_OP_COMPUTE_SQL}) h JOIN off USING (rank)
UNION ALL
SELECT e.rank, ref_ns(e.ts_ns, off.o), ref_ns(e.ts_ns + e.dur_ns, off.o), {S}, NULL, NULL, NULL, NULL,
       NULL
FROM events e JOIN off USING (rank)
WHERE e.run_id = $run AND e.rank BETWEEN $lo AND $hi AND NOT e.on_device AND e.category = 'sync'
  AND e.rank IN (FROM dev)
UNION ALL
-- Matched group collectives (from events or the collector's records): wait, then transfer.
-- The last rank to arrive waits for no one: the rest of its own duration (behind its earlier
-- collectives of the group, or past the others' first end) is its transfer; it was filed as
-- waiting for itself, 7 ms a step of a late rank's all-to-alls on gloo.
SELECT rank, start_ns, start_ns + wait_ns, CASE WHEN culprit IS NULL THEN {T} ELSE {W} END,
       op, pg_name, bytes, culprit, dim
FROM matched WHERE wait_ns > 0
UNION ALL
SELECT rank, start_ns + wait_ns, end_ns, {T}, op, pg_name, bytes, NULL, dim
FROM matched
UNION ALL
-- Waits for async collectives: waiting, for the collective's last rank, except where that
-- collective's own transfer covers them (transfer comes first); the last rank's, transfer
-- (as above).
SELECT rank, a, b, CASE WHEN m.culprit IS NULL THEN {T} ELSE {W} END, m.op, m.pg_name,
       m.bytes, m.culprit, m.dim
FROM linked
UNION ALL
SELECT rank, start_ns, start_ns + wait_ns, {P}, op, NULL, bytes, peer, 'pp'
FROM p2p_ops WHERE run_id = $run AND wait_ns > 0
UNION ALL
SELECT rank, start_ns + wait_ns, end_ns, {PT}, op, NULL, bytes, peer, 'pp'
FROM p2p_ops WHERE run_id = $run
UNION ALL
-- Communication events that neither table explains; the op is the collectives row's (an
-- all-to-all's SendRecv kernels are named by their host op), else the event name's. The dim
-- is its group's; a host op issuing a collective (c10d::allreduce_ on the main thread) takes
-- the group of the first host collective of its op on its rank that starts after it (FSDP2 on
-- gloo runs a reduce-scatter as an all-reduce).
SELECT u.rank, u.a, u.b, {U}, u.op, NULL, NULL, NULL,
       coalesce(u.dim, (SELECT arg_min(h.dim, h.start_ns) FROM hostc h
                        WHERE h.rank = u.rank AND h.start_ns >= u.ts
                          AND h.start_ns <= u.ts + $issue_window_ns
                          AND (h.op = u.op OR (u.op = 'reduce_scatter' AND h.op = 'all_reduce'))),
                'unknown')
FROM (
    SELECT c.rank, c.a, c.b, c.ts,
           CASE WHEN c.name ILIKE '%wait_tensor%' OR c.name ILIKE 'c10d::wait%'
                THEN 'wait_tensor'
                ELSE coalesce(kev.op, collective_op(c.name, $op_patterns, $op_names)) END AS op,
           kev.dim
    FROM comm c LEFT JOIN kev ON kev.rank = c.rank AND kev.event_idx = c.idx
    WHERE NOT EXISTS (SELECT 1 FROM matched_collectives m WHERE m.run_id = $run
                      AND m.rank = c.rank AND m.event_idx = c.idx)
      AND NOT EXISTS (SELECT 1 FROM p2p_ops p WHERE p.run_id = $run AND p.rank = c.rank
                      AND p.event_idx = c.idx)
      AND NOT EXISTS (SELECT 1 FROM linked l WHERE l.rank = c.rank AND l.idx = c.idx)
) u
UNION ALL
SELECT rank, window_start_ns, window_end_ns, {PW}, NULL, NULL, NULL, NULL, NULL
FROM pipeline_ranks WHERE run_id = $run
"""


def intervals(
    con: duckdb.DuckDBPyConnection,
    run_id: int,
    ranks: tuple[int, int] = ALL_RANKS,
    device_ranks: set[int] | None = None,
) -> pa.Table:
    """INTERVALS_SQL's rows for the run's ranks in `ranks` (lo, hi), as Arrow (needs
    sqlfiles.create_macros), `device_ranks` among them (default: rank_extents')."""
    if device_ranks is None:
        device_ranks = _device_ranks(con, run_id)
    params = {
        "run": run_id,
        "lo": ranks[0],
        "hi": ranks[1],
        "device_ranks": sorted(device_ranks),
        "op_patterns": [pattern for pattern, _ in OP_RULES],
        "op_names": [op for _, op in OP_RULES],
        "issue_window_ns": ISSUE_WINDOW_NS,
    }
    return con.sql(
        f"SELECT * FROM ({INTERVALS_SQL}) WHERE rank BETWEEN $lo AND $hi", params=params
    ).to_arrow_table()


def _device_ranks(con: duckdb.DuckDBPyConnection, run_id: int) -> set[int]:
    """The run's device ranks as rank_extents holds them (rank_extents.device)."""
    return {
        int(r)
        for (r,) in con.execute(
            "SELECT rank FROM rank_extents WHERE run_id = $run AND device", {"run": run_id}
        ).fetchall()
    }


def sweep(iv: pa.Table, spans: pa.Table, device_ranks: set[int]) -> dict[str, np.ndarray]:
    """The labelled segments of every step: arrays rank, step, t0, t1, part (index into
    PARTS), comm (covered by communication), overlapped (communication under compute).
    `spans`: step_spans' rank, step, start_ns, end_ns."""
    rank, t0, t1 = int64s(iv, "rank"), int64s(iv, "t0"), int64s(iv, "t1")
    cls = int64s(iv, "cls")
    k, a, b = union(rank * 16 + cls, t0, t1)
    ur, bit = k // 16, np.left_shift(1, k % 16)
    srank, sstep = int64s(spans, "rank"), int64s(spans, "step")
    s0, s1 = int64s(spans, "start_ns"), int64s(spans, "end_ns")
    br = np.concatenate([ur, ur, srank, srank])
    bt = np.concatenate([a, b, s0, s1])
    bd = np.concatenate([bit, -bit, np.zeros(2 * len(srank), dtype=np.int64)])
    order = np.lexsort((bt, br))
    br, bt = br[order], bt[order]
    # Each rank's deltas sum to zero, so one running sum over all ranks is each rank's own.
    state = np.cumsum(bd[order])
    last = np.ones(len(bt), dtype=bool)
    last[:-1] = (bt[1:] != bt[:-1]) | (br[1:] != br[:-1])
    br, bt, state = br[last], bt[last], state[last]
    same = br[1:] == br[:-1]
    seg_r, seg_a, seg_b, mask = br[:-1][same], bt[:-1][same], bt[1:][same], state[:-1][same]
    step_of = _step_index(seg_r, seg_a, srank, s0, s1)
    inside = step_of >= 0
    seg_r, seg_a, seg_b, mask, step_of = (x[inside] for x in (seg_r, seg_a, seg_b, mask, step_of))

    def has(c: int) -> np.ndarray:
        return (mask & (1 << c)) != 0

    dev = np.isin(seg_r, np.fromiter(device_ranks, dtype=np.int64, count=len(device_ranks)))
    # A parent operator's own time while a collective of the rank is in flight is the thread
    # blocked in that collective's wait, not compute: the collective's wait or transfer.
    compute = has(C) | (has(CN) & ~has(T) & ~has(W))
    part = np.select(
        [
            compute,
            has(T),
            has(Y),
            has(W),
            has(P),
            has(PT) & has(PW),
            has(PT),
            has(U),
            has(PW),
            has(S) & dev,
        ],
        [
            PARTS.index(x)
            for x in (
                "compute",
                "transfer",
                "memcpy",
                "wait",
                "pipeline",
                "pipeline",
                "transfer",
                "transfer",
                "pipeline",
                "idle",
            )
        ],
        default=PARTS.index("host"),
    )
    comm = has(T) | has(W) | has(P) | has(U) | has(PT)
    return {
        "rank": seg_r,
        "step": sstep[step_of],
        "t0": seg_a,
        "t1": seg_b,
        "part": part,
        "comm": comm,
        "overlapped": comm & compute,
    }


def _step_index(
    seg_r: np.ndarray, seg_a: np.ndarray, srank: np.ndarray, s0: np.ndarray, s1: np.ndarray
) -> np.ndarray:
    """For each segment (rank, start), the index of the step span holding it, or -1. Steps of
    one rank do not overlap (they tile), and segments were split at every step boundary."""
    # One sort of steps and segments together by (rank, start), a step before a segment that
    # starts with it; each segment then takes the last step before it, if of its own rank.
    # (A scan of every row per rank made this 0.54 s at 1,024 ranks.)
    n_steps = len(srank)
    out = np.full(len(seg_r), -1, dtype=np.int64)
    if not n_steps or not len(seg_r):
        return out
    rank = np.concatenate([srank, seg_r])
    start = np.concatenate([s0, seg_a])
    is_seg = np.concatenate([np.zeros(n_steps, bool), np.ones(len(seg_r), bool)])
    order = np.lexsort((is_seg, start, rank))
    pos = np.where(is_seg[order], -1, np.arange(len(order)))
    seg_at = is_seg[order]
    cand = np.maximum.accumulate(pos)[seg_at]
    seg = order[seg_at] - n_steps
    has = cand >= 0
    seg, step = seg[has], order[cand[has]]  # a step's index (steps come first in `rank`)
    ok = (srank[step] == seg_r[seg]) & (seg_a[seg] < s1[step])
    out[seg[ok]] = step[ok]
    return out


def _merged(seg: dict[str, np.ndarray]) -> pa.Table:
    """time_parts rows: consecutive segments of one rank, step and part merged."""
    r, st, a, b, p = seg["rank"], seg["step"], seg["t0"], seg["t1"], seg["part"]
    new = np.ones(len(r), dtype=bool)
    new[1:] = (r[1:] != r[:-1]) | (st[1:] != st[:-1]) | (p[1:] != p[:-1]) | (a[1:] != b[:-1])
    starts = np.flatnonzero(new)
    ends = np.concatenate([starts[1:], [len(r)]]) - 1
    return pa.table(
        {
            "rank": pa.array(r[starts].astype(np.int32)),
            "step": pa.array(st[starts].astype(np.int32)),
            "start_ns": pa.array(a[starts]),
            "end_ns": pa.array(b[ends]),
            # (a take in Arrow: a Python string per segment took 10 ms per 215k segments)
            "part": pc.take(pa.array(PARTS, pa.string()), pa.array(p[starts])),
        }
    )


def _measures(seg: dict[str, np.ndarray]) -> pa.Table:
    """Per (rank, step): comm_ns and overlapped_comm_ns. The segments come in (rank, time)
    order and a rank's steps tile its time, so each (rank, step) is one run of rows: a sum per
    run (np.add.reduceat), where np.unique over row pairs sorted them all again (0.44 s of
    the 8-rank set's 1.0 s of parts). Runs of one key, should there be several, are added."""
    r, st = seg["rank"].astype(np.int64), seg["step"].astype(np.int64)
    new = np.ones(len(r), dtype=bool)
    new[1:] = (r[1:] != r[:-1]) | (st[1:] != st[:-1])
    starts = np.flatnonzero(new)
    length = seg["t1"] - seg["t0"]
    comm = np.add.reduceat(np.where(seg["comm"], length, 0), starts) if len(r) else length
    over = np.add.reduceat(np.where(seg["overlapped"], length, 0), starts) if len(r) else length
    key_r, key_s = r[starts], st[starts]
    key = key_r << 32 | (key_s & 0xFFFFFFFF)
    if len(key) > 1 and not (key[1:] > key[:-1]).all():
        uniq, first, inv = np.unique(key, return_index=True, return_inverse=True)
        comm = np.bincount(inv, weights=comm, minlength=len(uniq)).astype(np.int64)
        over = np.bincount(inv, weights=over, minlength=len(uniq)).astype(np.int64)
        key_r, key_s = key_r[first], key_s[first]
    return pa.table(
        {
            "rank": pa.array(key_r.astype(np.int32)),
            "step": pa.array(key_s.astype(np.int32)),
            "comm_ns": pa.array(np.asarray(comm, dtype=np.int64)),
            "overlapped_comm_ns": pa.array(np.asarray(over, dtype=np.int64)),
        }
    )


def derive(
    con: duckdb.DuckDBPyConnection, run_id: int, runner: part_batches.Runner | None = None
) -> None:
    """Fill time_parts (its files, tracelab.derived.part_files), step_parts,
    comm_attribution, rank_extents and op_totals for the run (tracelab/derived/sql/: one file
    each), a batch of ranks at a time (rank_batches), each batch derived where `runner` runs
    it (default: in threads of this process, part_batches.local_runner)."""
    runner = runner or part_batches.local_runner()
    token = part_files.new_token()
    ranks = batches.rank_batches(
        con, run_id, batch_events=runner.batch_events(), parts=runner.workers, least=runner.least
    )
    jobs = part_batches.jobs(con, run_id, ranks, token, runner.threads())
    files = []
    results = runner.map(part_batches.run, jobs)
    try:
        for result in results:
            part_batches.store(con, result)
            if result.file is not None:
                files.append(result.file)
    finally:
        # A generator's (local threads: the wait for its batches) is closed here, not by the
        # garbage collector, where a signal during that wait printed as "Exception ignored".
        close = getattr(results, "close", None)
        if close is not None:
            close()
    part_files.register(con, run_id, files)
    _merge_op_totals(con, run_id)


def _merge_op_totals(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    """op_totals' rows of the run merged to one per (step, ordinal, kind, name), after each
    batch of ranks inserted its own: the rows must not depend on how the ranks were batched
    (Ray's tasks or local threads; tests/foundation/test_ray_engine.py compares them)."""
    params = {"run": run_id}
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _tl_op_totals AS "
        "SELECT run_id, step, ordinal, kind, name, sum(dur_ns)::HUGEINT AS dur_ns, "
        "sum(calls)::BIGINT AS calls FROM op_totals WHERE run_id = $run GROUP BY ALL",
        params,
    )
    con.execute("DELETE FROM op_totals WHERE run_id = $run", params)
    con.execute("INSERT INTO op_totals BY NAME SELECT * FROM _tl_op_totals")
    con.execute("DROP TABLE _tl_op_totals")


def derive_ranks(
    con: duckdb.DuckDBPyConnection,
    run_id: int,
    ranks: tuple[int, int],
    token: str,
    root: Path,
) -> tuple[int, str, int, int] | None:
    """The parts of the ranks `ranks` (lo, hi): their segments written to a time_parts file in
    the store folder `root` (returned as its catalog entry, None without segments), their
    step_parts, comm_attribution, rank_extents and op_totals rows inserted on `con`
    (part_batches.run's connection, whose events are the batch's: which of its ranks have
    device activity is read there, not from every rank's file by the driver, 0.5 s at 2,000
    ranks)."""
    batch = {"run": run_id, "lo": ranks[0], "hi": ranks[1]}
    sqlfiles.run(con, "rank_extents", batch)
    sqlfiles.run(con, "op_totals", batch)
    device = _device_ranks(con, run_id)
    iv = intervals(con, run_id, ranks, device)
    spans = con.sql(
        "SELECT rank, step, start_ns, end_ns FROM step_spans WHERE run_id = $run "
        "AND rank BETWEEN $lo AND $hi ORDER BY rank, start_ns",
        params={"run": run_id, "lo": ranks[0], "hi": ranks[1]},
    ).to_arrow_table()
    seg = sweep(iv, spans, device)
    cls = iv.column("cls").to_numpy()
    pieces = []
    for c, parts in COMM_PART.items():
        rows = iv.filter(pa.array(cls == c))
        for name in parts:
            pieces.append(rows.append_column("part", pa.array([name] * len(rows), pa.string())))
    comm = pa.concat_tables(pieces)
    merged = _merged(seg)
    written = part_files.write_batch(root, run_id, merged, token)
    sqlfiles.run(
        con,
        "step_parts",
        {"run": run_id, "lo": ranks[0], "hi": ranks[1]},
        {"_tl_parts": merged, "_tl_measures": _measures(seg)},
    )
    sqlfiles.run(con, "comm_attribution", {"run": run_id}, {"_tl_parts": merged, "_tl_comm": comm})
    return written
