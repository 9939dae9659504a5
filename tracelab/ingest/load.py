"""The SQL that loads converted ranks (Parquet) into the store, inside the ingest transaction
(the events themselves stay Parquet files, listed by the store: tracelab.store.files).

Everything derived is computed here, once, in DuckDB: the category of each event (from
tracelab.ingest.classify's rules), correlation/stream ids from the args JSON, the profiler step of each
event (host events by time, device events through their launch's correlation), the steps table,
and the collectives read from NCCL kernels, `record_param_comms` and gloo annotations.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from tracelab.derived.sqlfiles import registered
from tracelab.vocabulary import DTYPE_BYTES, OP_RULES

if TYPE_CHECKING:
    import duckdb

__all__ = ["DTYPE_BYTES", "OP_RULES", "dtype_bytes_sql", "op_sql"]


def op_sql(expr: str) -> tuple[str, list[str]]:
    """SQL normalizing a collective name expression to tracelab's op vocabulary."""
    norm = f"replace(lower({expr}), '_', '')"
    parts, params = [], []
    for pattern, op in OP_RULES:
        parts.append(f"WHEN regexp_matches({norm}, ?) THEN ?")
        params += [pattern, op]
    return f"CASE {' '.join(parts)} ELSE 'unknown' END", params


def dtype_bytes_sql(expr: str) -> tuple[str, list[object]]:
    parts, params = [], []
    for name, size in DTYPE_BYTES.items():
        parts.append("WHEN ? THEN ?")
        params += [name, size]
    return f"(CASE lower({expr}) {' '.join(parts)} ELSE NULL END)", params


#: How the load reads a kind of converted file: the files as they were converted, each with
#: its rank and its offset of `idx` from the registered table `_tl_part_files` (filename,
#: rank, off; part_files()). Only the path counts: the user's folders above it never do (hive
#: partitioning is off). Binds the paths. (They were symlinked as `rR-oK.KIND.parquet` and
#: both numbers read from the name: 8,000 symlinks took 2.7 s of a 2,000-rank ingest.)
PARTS = """(SELECT p.*, m.rank, m.off
    FROM read_parquet(?, filename = true, hive_partitioning = false) p
    JOIN _tl_part_files m ON m.filename = p.filename)"""


@contextmanager
def part_files(
    con: duckdb.DuckDBPyConnection, entries: list[tuple[str, int, int]]
) -> Iterator[None]:
    """Register the converted files' (path, rank, offset of idx) for PARTS while inside."""
    import pyarrow as pa

    table = pa.table(
        {
            "filename": pa.array([e[0] for e in entries], pa.string()),
            "rank": pa.array([e[1] for e in entries], pa.int32()),
            "off": pa.array([e[2] for e in entries], pa.int64()),
        }
    )
    with registered(con, {"_tl_part_files": table}):
        yield


def load_steps(con: duckdb.DuckDBPyConnection, run_id: int, steps: list[str]) -> None:
    """Copy the converted steps into the store (files named as PARTS says). The events stay in
    their Parquet files (tracelab.store.files): the store lists them, it does not copy them."""
    con.execute(
        f"""
        INSERT INTO steps
        SELECT ?, rank, step, min(start_ns), max(end_ns), max(device_end_ns)
        FROM {PARTS}
        GROUP BY rank, step
        """,
        [run_id, steps],
    )


#: Kernel/record_param_comms args read for each collective, each args parsed once; not
#: `Process Group Ranks`, read for the calls that keep it only (_load_group_ranks).
COLLECTIVE_ARGS = (
    "Collective name",
    "Process Group Name",
    "Process Group Description",
    "Group size",
    "Seq",
    "seq",
    "In msg nelems",
    "Out msg nelems",
    "dtype",
    "Comms Id",
    "Src Rank",
    "Dst Rank",
)


def load_trace_collectives(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    """Collectives from NCCL/RCCL kernels (with record_param_comms metadata) and gloo annotations."""
    paths = "[" + ", ".join(f"'$.\"{k}\"'" for k in COLLECTIVE_ARGS) + "]"

    def arg(key: str) -> str:
        i = COLLECTIVE_ARGS.index(key) + 1
        return f"coalesce(ka[{i}], ra[{i}])"

    # The op: the kernel's `Collective name`; else the `nccl:<op>` host annotation around its
    # launch (older traces: an all-to-all runs as SendRecv kernels, named only by
    # `nccl:all_to_all`); else the kernel's own name.
    op_case, op_params = op_sql(
        f"coalesce({arg('Collective name')}, regexp_extract(host_op, '^(nccl|rccl):(.+)$', 2), "
        "regexp_extract(name, '^(nccl|rccl)(Dev)?Kernel_([A-Za-z]+)', 3), name)"
    )
    size_case, size_params = dtype_bytes_sql(arg("dtype"))
    con.execute(
        f"""
        INSERT INTO collectives
        SELECT ?, rank, 'kernel', {op_case},
               {arg("Process Group Name")}, {arg("Process Group Description")},
               NULL,  -- pg_ranks: _load_group_ranks
               TRY_CAST({arg("Group size")} AS INTEGER),
               -- PyTorch 2026 also names each call (`Comms Id`, equal on every rank).
               TRY_CAST(coalesce({arg("Seq")}, {arg("seq")}, {arg("Comms Id")}) AS BIGINT),
               TRY_CAST({arg("In msg nelems")} AS BIGINT) * {size_case},
               TRY_CAST({arg("Out msg nelems")} AS BIGINT) * {size_case},
               {arg("dtype")},
               -- The peer of a send/recv: `Dst Rank` / `Src Rank` (PyTorch 2026).
               TRY_CAST(CASE WHEN lower({arg("Collective name")}) LIKE '%send%'
                             THEN {arg("Dst Rank")} ELSE {arg("Src Rank")} END AS INTEGER),
               launch_ns, ts_ns, ts_ns + dur_ns, step, idx, NULL, NULL
        FROM (
            SELECT k.rank, k.name, k.ts_ns, k.dur_ns, k.step, k.idx, launch.ts_ns AS launch_ns,
                   k.ka, r.ra,
                   (SELECT arg_max(a.name, a.ts_ns) FROM events a
                    WHERE a.run_id = k.run_id AND a.rank = k.rank AND NOT a.on_device
                      AND a.tid = launch.tid AND (a.name LIKE 'nccl:%' OR a.name LIKE 'rccl:%')
                      AND launch.ts_ns BETWEEN a.ts_ns AND a.ts_ns + a.dur_ns) AS host_op
            -- The args parsed before the joins: only the fields read travel through them (the
            -- host_op subquery materializes its outer rows), not the whole args, which hold a
            -- 10,000-rank group's rank list in every call.
            FROM (SELECT run_id, rank, name, ts_ns, dur_ns, step, idx, external_id, correlation,
                         json_extract_string(args, {paths}) AS ka
                  FROM events
                  WHERE run_id = ? AND on_device AND category = 'communication') k
            LEFT JOIN (SELECT rank, external_id, json_extract_string(args, {paths}) AS ra
                       FROM events
                       WHERE run_id = ? AND name = 'record_param_comms' AND NOT on_device) r
              ON r.rank = k.rank AND r.external_id = k.external_id
            -- The launches of communication kernels only (a semi join on their correlation
            -- ids): joined whole, every kernel launch of the run was held in the join's hash
            -- table (565 MiB at 1,000 ranks x 12.8k events).
            LEFT JOIN (SELECT l.rank, l.correlation, l.ts_ns, l.tid FROM events l
                       WHERE l.run_id = ? AND l.category = 'runtime'
                         AND (l.rank, l.correlation) IN (
                             SELECT rank, correlation FROM events
                             WHERE run_id = ? AND on_device AND category = 'communication')) launch
              ON launch.rank = k.rank AND launch.correlation = k.correlation
        )
        """,
        [run_id, *op_params, *size_params, *size_params, run_id, run_id, run_id, run_id],
    )
    _load_group_ranks(con, run_id)
    gop_case, gop_params = op_sql("substr(g.name, 6)")
    gsize_case, gsize_params = dtype_bytes_sql("json_extract_string(g.args, '$.\"Input type\"[0]')")
    con.execute(
        f"""
        INSERT INTO collectives
        SELECT ?, g.rank, 'host', {gop_case}, NULL, NULL, NULL, NULL, NULL,
               CAST(list_aggregate(TRY_CAST(json_extract(g.args, '$."Input Dims"[0]') AS BIGINT[]),
                                   'product') AS BIGINT) * {gsize_case},
               NULL, json_extract_string(g.args, '$."Input type"[0]'), NULL,
               NULL, g.ts_ns, g.ts_ns + g.dur_ns, g.step, g.idx, NULL, NULL
        FROM events g
        WHERE g.run_id = ? AND NOT g.on_device AND g.name LIKE 'gloo:%'
          AND g.category = 'communication'
        """,
        [run_id, *gop_params, *gsize_params, run_id],
    )


def _load_group_ranks(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    """`Process Group Ranks` of the trace's kernel collectives: of each named group on its first
    call in the run only (every call of a group has the same ranks; a 10,000-rank group's list
    on every call of every rank grows as ranks x calls x group size: 3.6 GB of JSON at 10,000
    ranks x 6 calls), and of every call that names no group (its ranks are its group)."""
    key = "'$.\"Process Group Ranks\"'"
    con.execute(
        f"""
        WITH f AS (
            SELECT rank, event_idx FROM collectives
            WHERE run_id = ? AND source = 'kernel' AND event_idx IS NOT NULL
            QUALIFY pg_name IS NULL
                 OR row_number() OVER (PARTITION BY pg_name ORDER BY rank, start_ns, event_idx) = 1
        ),
        fk AS (
            SELECT f.rank, f.event_idx, k.external_id, json_extract_string(k.args, {key}) AS km
            FROM f JOIN events k ON k.run_id = ? AND k.rank = f.rank AND k.idx = f.event_idx
            -- (the kernels only: joined on every event, all the run's events were read)
            WHERE k.on_device AND k.category = 'communication'
        ),
        -- The record_param_comms of the calls whose kernel does not say, its list read there.
        fr AS (
            SELECT r.rank, r.external_id, any_value(json_extract_string(r.args, {key})) AS rm
            FROM events r
            WHERE r.run_id = ? AND r.name = 'record_param_comms' AND NOT r.on_device
              AND (r.rank, r.external_id) IN (SELECT (rank, external_id) FROM fk WHERE km IS NULL)
            GROUP BY r.rank, r.external_id
        ),
        x AS (
            SELECT fk.rank, fk.event_idx, TRY_CAST(coalesce(fk.km, fr.rm) AS JSON) AS members
            FROM fk LEFT JOIN fr ON fr.rank = fk.rank AND fr.external_id = fk.external_id
        )
        UPDATE collectives c SET pg_ranks = x.members FROM x
        WHERE c.run_id = ? AND c.source = 'kernel' AND c.rank = x.rank
          AND c.event_idx = x.event_idx
        """,
        [run_id, run_id, run_id, run_id],
    )


def load_trace_memory(con: duckdb.DuckDBPyConnection, run_id: int, files: list[str]) -> None:
    """The trace's [memory] instants; their numeric fields were read from args at conversion."""
    con.execute(
        f"""
        INSERT INTO memory
        SELECT ?, rank, 'trace', ts_ns, step, TRY_CAST(device_type AS INTEGER),
               TRY_CAST(device_id AS INTEGER), bytes, total_allocated, total_reserved
        FROM {PARTS}
        """,
        [run_id, files],
    )


def load_lanes(con: duckdb.DuckDBPyConnection, run_id: int, files: list[str]) -> None:
    con.execute(
        f"""
        INSERT INTO lanes
        SELECT DISTINCT ?, rank, pid, tid, kind, value, sort_index
        FROM {PARTS}
        """,
        [run_id, files],
    )
