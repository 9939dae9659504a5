"""Matching one collective across the ranks that took part, and the clock offsets it implies.

Matching key (FACTS.md section 1): (process group, seq) when every row of the chosen source has a
sequence number; else (process group, op, profiler step, occurrence within that step), which stays
right when ranks' profiling windows start at different collectives. Point-to-point ops are not
matched here (they pair two ranks, not a group).

One source per run, the most precise one available on every rank: the collector's own timings,
then NCCL/RCCL kernels, then host annotations (gloo).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import duckdb

from tracelab.analyzers._common import temp_table_exists

#: Sources in order of preference.
SOURCES = ("collector", "kernel", "host")
#: Ops that are never matched as group collectives.
P2P_OPS = ("send", "recv", "send_recv")
#: busbw/algbw per op (nccl-tests' PERFORMANCE.md); n = ranks in the group.
BUS_FACTOR_SQL = """CASE op WHEN 'all_reduce' THEN 2.0 * (n - 1) / n
    WHEN 'all_gather' THEN (n - 1) * 1.0 / n WHEN 'reduce_scatter' THEN (n - 1) * 1.0 / n
    WHEN 'all_to_all' THEN (n - 1) * 1.0 / n ELSE 1.0 END"""


def choose_source(con: duckdb.DuckDBPyConnection, run_id: int) -> str | None:
    """The collective source to match on: the one with the most timed group collectives on
    the ranks that have any (sources often describe the same operations: gloo annotations, the
    collector's records of Python-issued calls, Flight Recorder's of every call), the most
    precise one on a tie. None when the run has no timed collectives."""
    rows = con.execute(
        """
        SELECT source, count(DISTINCT rank) AS ranks, count(*) AS n FROM collectives
        WHERE run_id = ? AND start_ns IS NOT NULL AND end_ns IS NOT NULL
          AND op NOT IN ('send', 'recv', 'send_recv')
        GROUP BY source
        """,
        [run_id],
    ).fetchall()
    if not rows:
        return None
    pref = {src: i for i, src in enumerate(SOURCES + ("flight_recorder",))}
    return max(rows, key=lambda x: (x[1], x[2], -pref.get(x[0], 99)))[0]


def offsets_relation(offsets: Mapping[int, int]) -> tuple[str, list[object]]:
    """A (rank, off_ns) relation of clock offsets, as SQL plus its two bind parameters."""
    ranks = sorted(offsets)
    return (
        "(SELECT unnest(?::INTEGER[]) AS rank, unnest(?::BIGINT[]) AS off_ns)",
        [ranks, [int(offsets[r]) for r in ranks]],
    )


def keyed_sql() -> str:
    """The clock-free part of matched_sql: rows of matched group collectives, one per (match,
    rank). Binds: run_id, source. Columns: rank, key, op, pg_name, step (the match's), start_ns,
    end_ns (raw), bytes, n (ranks matched), transfer_ns (shortest duration), event_idx.
    Per-match values are a GROUP BY joined back, not windows over the key: DuckDB's partitioned
    windows cost about a microsecond a row, its hash aggregate a fraction of that."""
    return """
    WITH c AS (
        SELECT rank, op, pg_name, step, start_ns, end_ns, seq, event_idx,
               coalesce(in_bytes, out_bytes) AS bytes,
               row_number() OVER (PARTITION BY rank, coalesce(pg_name, ''), op, step
                                  ORDER BY start_ns, seq) - 1 AS occ
        FROM collectives
        WHERE run_id = ? AND source = ? AND start_ns IS NOT NULL AND end_ns IS NOT NULL
          AND op NOT IN ('send', 'recv', 'send_recv')
    ),
    k AS (
        SELECT c.*,
               CASE WHEN (SELECT bool_and(seq IS NOT NULL) FROM c)
                    THEN concat_ws(':', coalesce(pg_name, ''), seq::VARCHAR)
                    ELSE concat_ws(':', coalesce(pg_name, ''), op, coalesce(step, -1)::VARCHAR,
                                   occ::VARCHAR) END AS key
        FROM c
    ),
    g AS (SELECT key, count(*) AS n, min(end_ns - start_ns) AS transfer_ns,
                 min(step) AS match_step
          FROM k GROUP BY key HAVING count(*) >= 2)
    SELECT k.rank, key, k.op, k.pg_name, g.match_step AS step, k.start_ns, k.end_ns, k.bytes,
           g.n, g.transfer_ns, k.event_idx
    FROM k JOIN g USING (key)
    """


def aligned_sql(keyed: str, offsets_rel: str) -> str:
    """matched_sql's rows from `keyed` (a relation of keyed_sql's columns) and an offsets
    relation (offsets_relation; binds its parameters)."""
    return f"""
    WITH m AS (SELECT x.*, x.start_ns - coalesce(o.off_ns, 0) AS a_ns,
                      x.end_ns - coalesce(o.off_ns, 0) AS e_ns
               FROM {keyed} x LEFT JOIN {offsets_rel} o USING (rank)),
    l AS (SELECT key, max(a_ns) AS last_arrival_ns, arg_max(rank, a_ns) AS last_rank
          FROM m GROUP BY key)
    SELECT m.rank, key, m.op, m.pg_name, m.step, m.start_ns, m.end_ns, m.a_ns, m.e_ns, m.bytes,
           m.n, l.last_arrival_ns, l.last_rank, m.transfer_ns,
           l.last_arrival_ns - m.a_ns AS wait_ns, m.event_idx
    FROM m JOIN l USING (key)
    """


def matched_sql(offsets_rel: str) -> str:
    """Rows of matched group collectives, one per (match, rank). Binds: run_id, source, then the
    offsets relation's parameters. Columns: rank, key, op, pg_name, step, start_ns, end_ns (raw),
    a_ns/e_ns (arrival and end on the aligned clock), bytes, n (ranks matched), last_arrival_ns,
    last_rank, transfer_ns (shortest duration, alignment-free), wait_ns, event_idx."""
    return aligned_sql(f"({keyed_sql()})", offsets_rel)


def cached_matched(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[str | None, ClockEstimate]:
    """A temporary table of the run's matched collectives on the clock of its estimate
    (matched_sql's columns), built once per connection and run like the intervals and shared by
    the analyzers, with that estimate; None for the table when the run has no timed collectives."""
    est = estimate_clocks(con, run_id)
    if est.source is None:
        return None, est
    table = f"_tl_cache_mt_{int(run_id)}"
    if not temp_table_exists(con, table):
        rel, rel_params = offsets_relation(est.offsets_ns)
        keyed = _keyed_table(con, run_id, est.source)
        con.execute(f"CREATE TEMP TABLE {table} AS {aligned_sql(keyed, rel)}", rel_params)
    return table, est


def _keyed_table(con: duckdb.DuckDBPyConnection, run_id: int, source: str) -> str:
    """A temporary table of keyed_sql's rows for the run, built once per connection and run."""
    table = f"_tl_cache_mk_{int(run_id)}"
    if not temp_table_exists(con, table):
        con.execute(f"CREATE TEMP TABLE {table} AS {keyed_sql()}", [run_id, source])
    return table


@dataclass(frozen=True, kw_only=True)
class ClockEstimate:
    """Per rank: offset (local minus reference clock) and its uncertainty, with provenance."""

    offsets_ns: dict[int, int]
    uncertainty_ns: dict[int, int]
    #: 'collector' (clock exchange), 'same_host', 'collectives' (estimated), or 'none'.
    method: dict[int, str]
    reference_rank: int | None
    source: str | None


def estimate_clocks(con: duckdb.DuckDBPyConnection, run_id: int) -> ClockEstimate:
    """The run's clock estimate (see _estimate_clocks), computed once per connection and run:
    every analyzer aligns with it, so it is kept in a temporary table like the intervals."""
    table = f"_tl_cache_clk_{int(run_id)}"
    if temp_table_exists(con, table):
        got = con.execute(f"SELECT rank, off, unc, method, ref, source FROM {table}").fetchall()
        return ClockEstimate(
            offsets_ns={int(r[0]): int(r[1]) for r in got},
            uncertainty_ns={int(r[0]): int(r[2]) for r in got},
            method={int(r[0]): str(r[3]) for r in got},
            reference_rank=got[0][4] if got else None, source=got[0][5] if got else None)
    est = _estimate_clocks(con, run_id)
    rks = sorted(est.offsets_ns)
    con.execute(
        f"CREATE TEMP TABLE {table} AS SELECT unnest(?::INTEGER[]) AS rank, "
        "unnest(?::BIGINT[]) AS off, unnest(?::BIGINT[]) AS unc, unnest(?::VARCHAR[]) AS method, "
        "?::INTEGER AS ref, ?::VARCHAR AS source",
        [rks, [est.offsets_ns[rk] for rk in rks], [est.uncertainty_ns[rk] for rk in rks],
         [est.method[rk] for rk in rks], est.reference_rank, est.source])
    return est


def _estimate_clocks(con: duckdb.DuckDBPyConnection, run_id: int,
                     quantile: float = 0.9) -> ClockEstimate:
    """Offsets from the collector's clock exchange when present; ranks on one named host share a
    clock (offset 0); else the median over matched collectives of (end_r - end_ref), ends being
    nearly simultaneous across ranks (FACTS.md section 3). Uncertainty: the collector's, or the
    `quantile` of |residual| of the matched ends after correction."""
    ranks = con.execute(
        "SELECT rank, clock_offset_ns, clock_uncertainty_ns, host FROM ranks WHERE run_id = ? "
        "ORDER BY rank",
        [run_id],
    ).fetchall()
    if not ranks:
        return ClockEstimate(offsets_ns={}, uncertainty_ns={}, method={}, reference_rank=None,
                             source=None)
    ref = int(ranks[0][0])
    source = choose_source(con, run_id)
    est: dict[int, tuple[int, int]] = {}
    if source is not None:
        rows = con.execute(
            f"""
            WITH mt AS (FROM {_keyed_table(con, run_id, source)}),
            d AS (SELECT x.rank, x.end_ns - r.end_ns AS diff
                  FROM mt x JOIN mt r ON r.key = x.key AND r.rank = ?),
            o AS (SELECT rank, median(diff) AS off FROM d GROUP BY rank)
            SELECT d.rank, any_value(o.off)::BIGINT,
                   quantile_cont(abs(d.diff - o.off), ?)::BIGINT, count(*)
            FROM d JOIN o USING (rank) GROUP BY d.rank
            """,
            [ref, quantile],
        ).fetchall()
        est = {int(r): (int(off), int(unc)) for r, off, unc, _ in rows}
    offsets: dict[int, int] = {}
    unc: dict[int, int] = {}
    method: dict[int, str] = {}
    hosts = {h for _, _, _, h in ranks}
    one_host = len(hosts) == 1 and None not in hosts
    for rank, c_off, c_unc, _ in ranks:
        rank = int(rank)
        if c_off is not None:
            offsets[rank], unc[rank], method[rank] = int(c_off), int(c_unc or 0), "collector"
        elif one_host:
            offsets[rank], unc[rank], method[rank] = 0, est.get(rank, (0, 0))[1], "same_host"
        elif rank in est:
            offsets[rank], unc[rank] = est[rank]
            method[rank] = "reference" if rank == ref else "collectives"
        else:
            offsets[rank], unc[rank], method[rank] = 0, 0, "none"
    if method.get(ref) == "reference":
        unc[ref] = max((u for r, u in unc.items() if method[r] == "collectives"), default=0)
    return ClockEstimate(offsets_ns=offsets, uncertainty_ns=unc, method=method,
                         reference_rank=ref, source=source)
