"""Matched collectives and point-to-point operations: who took part, who waited, how long the
data movement itself took (docs/metrics.md, "Collectives").

Matching key (docs/metrics.md, "Matched collectives"): (process group, seq) when every row of the chosen source has
a sequence number; else (process group, op, step, occurrence within that step), which stays
right when ranks' profiling windows start at different collectives. One source per run: the one
with the most timed group collectives on the most ranks, the most precise on a tie. Times are
aligned with the run's clock offsets (tracelab.derived.clocks), computed before this.
"""

from __future__ import annotations

import duckdb

from tracelab.derived import sqlfiles
from tracelab.vocabulary import DTYPE_BYTES, SOURCES

#: busbw / algbw per op (nccl-tests' PERFORMANCE.md); n = ranks in the group.
BUS_FACTOR_SQL = """CASE op WHEN 'all_reduce' THEN 2.0 * (n - 1) / n
    WHEN 'all_gather' THEN (n - 1) * 1.0 / n WHEN 'reduce_scatter' THEN (n - 1) * 1.0 / n
    WHEN 'all_to_all' THEN (n - 1) * 1.0 / n ELSE 1.0 END"""
#: Message size as nccl-tests counts it, from a collectives row's in/out bytes and the group
#: size `n`: the whole buffer, i.e. the gathered output of an all-gather and the whole input of
#: a reduce-scatter (never one rank's shard).
NCCL_TESTS_BYTES_SQL = """CASE op
    WHEN 'all_gather' THEN coalesce(out_bytes, in_bytes * n)
    WHEN 'reduce_scatter' THEN coalesce(in_bytes, out_bytes * n)
    ELSE coalesce(in_bytes, out_bytes) END"""
#: Bytes per element of the `Input type` names host ops write (PyTorch's C++ type names, as
#: the TensorBoard plugin reads them: 'float', 'long int', 'c10::Half', ...), lower-cased with
#: any `c10::` prefix removed; on top of tracelab.vocabulary.DTYPE_BYTES.
HOST_DTYPE_BYTES = {
    **DTYPE_BYTES,
    "long int": 8,
    "unsigned char": 1,
    "signed char": 1,
    "short int": 2,
    "unsigned short": 2,
    "unsigned int": 4,
    "unsigned long": 8,
    "complex<float>": 8,
    "complex<double>": 16,
    "complex<c10::half>": 4,
}


def _host_dtype_case(expr: str) -> str:
    """SQL CASE: bytes per element of an Input type name; NULL when unknown. The names are
    constants of this module, inlined as literals."""
    norm = f"regexp_replace(lower({expr}), '^c10::', '')"
    whens = " ".join(f"WHEN '{k}' THEN {v}" for k, v in HOST_DTYPE_BYTES.items() if "'" not in k)
    return f"(CASE {norm} {whens} ELSE NULL END)"


def host_op_bytes_sql(args: str) -> str:
    """SQL: the bytes of every tensor a host op (`nccl:*`, `gloo:*`) took, from its args'
    `Input Dims` and `Input type` (sum over the inputs of the product of the dims times the
    element size, as the TensorBoard plugin's communication view counts them); NULL when a
    dims entry or a type is missing or unknown."""
    dims = f"TRY_CAST(json_extract({args}, '$.\"Input Dims\"') AS BIGINT[][])"
    types = f"TRY_CAST(json_extract({args}, '$.\"Input type\"') AS VARCHAR[])"
    per = (
        f"list_transform(range(1, len(_d) + 1), "
        f"lambda _i: CASE WHEN len(_d[_i]) = 0 THEN NULL "
        f"ELSE list_product(_d[_i])::BIGINT * {_host_dtype_case('_t[_i]')} END)"
    )
    return f"""(SELECT CASE WHEN len(_d) > 0 AND len(_t) >= len(_d)
                          AND list_count({per}) = len(_d)
                     THEN list_sum({per})::BIGINT END
               FROM (SELECT {dims} AS _d, {types} AS _t))"""


#: A collectives row (`c0`) whose sizes come from its host op (HOST_OP_IN_BYTES_SQL).
LACKS_SIZES = (
    "c0.source = 'kernel' AND c0.in_bytes IS NULL AND c0.out_bytes IS NULL "
    "AND c0.event_idx IS NOT NULL"
)


#: Message sizes of kernel collectives whose trace has no `record_param_comms` (the NCCL
#: kernel's args, e.g. in PyTorch 1.8-2.0 traces, carry no size): the `nccl:*`/`gloo:*` host op
#: with the kernel's External id. Its inputs are what this rank sends: an all-gather's shard, a
#: reduce-scatter's whole input, so they fill in_bytes. Rows are joined on the run of the
#: collectives rows `c0` (columns run_id, rank, event_idx, source, in_bytes, out_bytes); the
#: events are read only where `_host_bytes` is true (host_bytes_needed, given as a value).
HOST_OP_IN_BYTES_SQL = f"""
    SELECT c0.rank, c0.event_idx, max({host_op_bytes_sql("h.args")}) AS host_in_bytes
    FROM c0
    JOIN events d ON d.run_id = c0.run_id AND d.rank = c0.rank AND d.idx = c0.event_idx
     AND d.on_device AND d.category = 'communication'
    JOIN events h ON h.run_id = d.run_id AND h.rank = d.rank AND h.external_id = d.external_id
     AND NOT h.on_device AND (h.name LIKE 'nccl:%' OR h.name LIKE 'gloo:%')
    WHERE _host_bytes AND {LACKS_SIZES} AND d.external_id IS NOT NULL
    GROUP BY ALL
"""


def choose_source(con: duckdb.DuckDBPyConnection, run_id: int) -> str | None:
    """The collective source to match on: the one with the most timed group collectives on
    the ranks that have any (sources often describe the same operations: gloo annotations, the
    collector's records of Python-issued calls, Flight Recorder's of every call), the most
    precise one on a tie. None when the run has no timed group collectives."""
    rows = con.execute(
        """
        SELECT source, count(DISTINCT rank) AS ranks, count(*) AS n FROM collectives
        WHERE run_id = $run AND start_ns IS NOT NULL AND end_ns IS NOT NULL
          AND op NOT IN ('send', 'recv', 'send_recv')
        GROUP BY source
        """,
        {"run": run_id},
    ).fetchall()
    if not rows:
        return None
    pref = {src: i for i, src in enumerate(SOURCES)}
    return str(max(rows, key=lambda x: (x[1], x[2], -pref.get(x[0], 99)))[0])


def keyed_sql() -> str:
    """Matched group collectives on the ranks' own clocks, one row per (match, rank): the body
    of the macro keyed_collectives(_run, _source, _host_bytes)
    (tracelab.derived.sqlfiles.create_macros; _host_bytes: host_bytes_needed).
    Columns: rank, key, op, pg_name, group_key (pg_name, else the group
    tracelab.derived.groups inferred, collective_groups), step (the match's), start_ns, end_ns,
    bytes (nccl-tests size; for kernels without record_param_comms, from the host op's
    inputs, HOST_OP_IN_BYTES_SQL), group_size (the trace's, else the ranks matched), matched
    (ranks matched), transfer_ns (shortest duration: matched_collectives.sql measures the
    data movement within it, on aligned clocks), event_idx.
    Per-match values are a GROUP BY joined back, not windows over the key: DuckDB's
    partitioned windows cost about a microsecond a row, its hash aggregate a fraction."""
    return f"""
    WITH c0 AS (
        -- A collective with no step (a kernel with no launch event, a trace with no
        -- ProfilerStep) takes the rank's last step started before it, step 0 on a rank with
        -- none (the whole trace is one step): so it is matched and keyed like the others.
        SELECT * REPLACE (coalesce(step,
                   (SELECT max(s.step) FROM steps s WHERE s.run_id = _run AND s.rank = cc.rank
                      AND s.start_ns <= cc.start_ns),
                   CASE WHEN NOT EXISTS (SELECT 1 FROM steps s WHERE s.run_id = _run
                                         AND s.rank = cc.rank) THEN 0 END) AS step)
        FROM collectives cc
        WHERE run_id = _run AND source = _source AND start_ns IS NOT NULL AND end_ns IS NOT NULL
          AND op NOT IN ('send', 'recv', 'send_recv')
    ),
    hb AS ({HOST_OP_IN_BYTES_SQL}),
    -- Sizes the chosen source lacks (gloo annotations carry none) from another source's record
    -- of the same call: the same op on the same rank, overlapping it most in time.
    ob AS (
        SELECT c0.rank, c0.start_ns, c0.op,
               arg_max(o.in_bytes, least(c0.end_ns, o.end_ns) - greatest(c0.start_ns, o.start_ns))
                   AS o_in,
               arg_max(o.out_bytes, least(c0.end_ns, o.end_ns) - greatest(c0.start_ns, o.start_ns))
                   AS o_out
        FROM c0 JOIN collectives o ON o.run_id = c0.run_id AND o.rank = c0.rank AND o.op = c0.op
             AND o.source <> c0.source AND o.in_bytes IS NOT NULL
             AND o.start_ns < c0.end_ns AND o.end_ns > c0.start_ns
        WHERE c0.in_bytes IS NULL
        GROUP BY c0.rank, c0.start_ns, c0.op
    ),
    c AS (
        SELECT c0.rank, c0.op, pg_name, coalesce(pg_name, cg.group_key) AS grp, step,
               c0.start_ns, end_ns, seq, c0.event_idx,
               coalesce(in_bytes, hb.host_in_bytes, ob.o_in) AS in_bytes,
               coalesce(out_bytes, CASE WHEN hb.host_in_bytes IS NULL THEN ob.o_out END)
                   AS out_bytes, group_size,
               row_number() OVER (PARTITION BY c0.rank, coalesce(pg_name, cg.group_key, ''),
                                  c0.op, step ORDER BY c0.start_ns, seq) - 1 AS occ
        FROM c0 LEFT JOIN hb ON hb.rank = c0.rank AND hb.event_idx = c0.event_idx
        -- The group of a collective whose trace names none (tracelab.derived.groups).
        LEFT JOIN collective_groups cg ON cg.run_id = _run AND cg.rank = c0.rank
             AND cg.event_idx = c0.event_idx
        LEFT JOIN ob ON ob.rank = c0.rank AND ob.start_ns = c0.start_ns AND ob.op = c0.op
    ),
    k AS (
        SELECT c.*,
               CASE WHEN (SELECT bool_and(seq IS NOT NULL) FROM c)
                    THEN concat_ws(':', coalesce(grp, ''), seq::VARCHAR)
                    ELSE concat_ws(':', coalesce(grp, ''), op, coalesce(step, -1)::VARCHAR,
                                   occ::VARCHAR) END AS key
        FROM c
    ),
    g AS (SELECT key, count(*) AS n, min(end_ns - start_ns) AS transfer_ns,
                 min(step) AS match_step
          FROM k GROUP BY key HAVING count(*) >= 2 AND count(DISTINCT rank) = count(*))
    SELECT rank, key, op, pg_name, grp AS group_key, step, start_ns, end_ns,
           {NCCL_TESTS_BYTES_SQL} AS bytes, n AS group_size, matched, transfer_ns, event_idx
    FROM (SELECT k.rank, key, k.op, k.pg_name, k.grp, g.match_step AS step, k.start_ns, k.end_ns,
                 k.in_bytes, k.out_bytes, coalesce(k.group_size, g.n) AS n, g.n AS matched,
                 g.transfer_ns, k.event_idx
          FROM k JOIN g USING (key))
    """


#: The temp table of keyed_collectives' rows for the run being derived (keyed()).
KEYED = "_tl_keyed"


def keyed(con: duckdb.DuckDBPyConnection, run_id: int, source: str) -> str:
    """The name of a temp table holding keyed_collectives(run_id, source) (KEYED), made on
    the first call of a derive pass: the clocks' bounds and the matches both read it (each
    made the rows itself, 0.07-0.10 s apiece on the 8-rank set). tracelab.derived.derive drops
    it before and after each pass, within which the run and its chosen source are fixed."""
    made = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE temporary AND table_name = $name",
        {"name": KEYED},
    ).fetchall()[0][0]
    if not made:
        con.execute(
            f"CREATE TEMP TABLE {KEYED} AS FROM keyed_collectives($run, $source, $host_bytes)",
            {"run": run_id, "source": source, "host_bytes": host_bytes_needed(con, run_id, source)},
        )
    return KEYED


def drop_keyed(con: duckdb.DuckDBPyConnection) -> None:
    """Drop keyed()'s temp table, if made."""
    con.execute(f"DROP TABLE IF EXISTS temp.{KEYED}")


def derive_matched(con: duckdb.DuckDBPyConnection, run_id: int, source: str | None) -> None:
    """Fill matched_collectives for the run (aligned with clock_offsets):
    tracelab/derived/sql/matched_collectives.sql, over keyed()'s rows."""
    if source is None:
        return
    keyed(con, run_id, source)
    sqlfiles.run(con, "matched_collectives", {"run": run_id, "source": source})


def host_bytes_needed(con: duckdb.DuckDBPyConnection, run_id: int, source: str) -> bool:
    """Whether a collectives row of the run's `source` may take its sizes from its host op
    (HOST_OP_IN_BYTES_SQL): keyed_collectives' `_host_bytes`. Given as a value, false lets
    DuckDB drop that statement's two reads of the events (each opened every rank's file:
    0.2-0.4 s at 2,000 ranks), where no kernel lacks its sizes. (Looser than the macro's own
    rows, which also need both times and no send/recv: true where they would find none only
    costs the reads.)"""
    row = con.execute(
        "SELECT count(*) > 0 FROM collectives c0 "
        f"WHERE c0.run_id = $run AND c0.source = $source AND {LACKS_SIZES}",
        {"run": run_id, "source": source},
    ).fetchall()
    return bool(row[0][0])


def derive_p2p(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    """Fill p2p_ops: send/recv from device kernels where a rank has them, else from host
    annotations; transfer = the shortest op of the same kind and size in the run
    (tracelab/derived/sql/p2p_ops.sql)."""
    sqlfiles.run(con, "p2p_ops", {"run": run_id})


def count_violations(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    """clock_offsets.causality_violations: matches that, aligned, end on the rank before the
    last rank arrived by more than both ranks' uncertainties
    (tracelab/derived/sql/causality_violations.sql)."""
    sqlfiles.run(con, "causality_violations", {"run": run_id})
