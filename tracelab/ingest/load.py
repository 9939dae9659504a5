"""The SQL that loads converted ranks (Parquet) into a store, inside the transaction in which
the ingest builds the run (in its staged store, tracelab.ingest.write; the events themselves
stay Parquet files, listed by the store: tracelab.store.files).

Everything per event was computed where each trace was converted (tracelab.ingest.convert: the
category, ids and step of each event; its steps, memory instants, lanes and collectives, each a
file): the load copies the steps, lanes and collectives into the store's tables; the events and
the memory instants, which grow with the events, stay files that the store lists; of the events
files it reads only their row counts (a check).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from tracelab.derived.sqlfiles import registered
from tracelab.ingest.trace_collectives import COLLECTIVE_ARGS
from tracelab.vocabulary import DTYPE_BYTES, OP_RULES

if TYPE_CHECKING:
    import duckdb


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


def load_trace_collectives(con: duckdb.DuckDBPyConnection, run_id: int, files: list[str]) -> None:
    """The collectives the traces show, from the converted files (files named as PARTS says;
    each read from its trace at conversion: tracelab.ingest.trace_collectives), typed here. A
    named group's member list is kept on its first call of the run only (the lowest rank's
    first call; every call that names no group keeps its own): every call of a group has the
    same ranks (schema: collectives.pg_ranks)."""

    def arg(key: str) -> str:
        return f"fields[{COLLECTIVE_ARGS.index(key) + 1}]"

    # The op: the kernel's `Collective name`; else the `nccl:<op>` host annotation around its
    # launch (older traces: an all-to-all runs as SendRecv kernels, named only by
    # `nccl:all_to_all`); else the kernel's own name. A gloo op: its name after `gloo:`.
    op_case, op_params = op_sql(
        f"coalesce({arg('Collective name')}, regexp_extract(host_op, '^(nccl|rccl):(.+)$', 2), "
        "regexp_extract(name, '^(nccl|rccl)(Dev)?Kernel_([A-Za-z]+)', 3), name)"
    )
    gop_case, gop_params = op_sql("substr(name, 6)")
    size_case, size_params = dtype_bytes_sql(arg("dtype"))
    gsize_case, gsize_params = dtype_bytes_sql("input_type")
    con.execute(
        f"""
        INSERT INTO collectives
        SELECT ?, rank, source, op, pg_name, pg_desc,
               CASE WHEN pg_name IS NULL
                      OR rank() OVER (PARTITION BY pg_name ORDER BY rank, start_ns, event_idx) = 1
                    THEN TRY_CAST(pg_ranks AS JSON) END,
               group_size, seq, in_bytes, out_bytes, dtype, peer, enqueue_ns, start_ns, end_ns,
               step, event_idx, NULL, NULL
        FROM (
            SELECT rank, source, pg_ranks, enqueue_ns, start_ns, end_ns, step,
                   event_idx + off AS event_idx,
                   CASE source WHEN 'kernel' THEN {op_case} ELSE {gop_case} END AS op,
                   {arg("Process Group Name")} AS pg_name,
                   {arg("Process Group Description")} AS pg_desc,
                   TRY_CAST({arg("Group size")} AS INTEGER) AS group_size,
                   -- PyTorch 2026 also names each call (`Comms Id`, equal on every rank).
                   TRY_CAST(coalesce({arg("Seq")}, {arg("seq")}, {arg("Comms Id")}) AS BIGINT)
                       AS seq,
                   CASE source
                       WHEN 'kernel' THEN TRY_CAST({arg("In msg nelems")} AS BIGINT) * {size_case}
                       ELSE CAST(list_aggregate(TRY_CAST(TRY_CAST(input_dims AS JSON) AS BIGINT[]),
                                                'product') AS BIGINT) * {gsize_case}
                   END AS in_bytes,
                   TRY_CAST({arg("Out msg nelems")} AS BIGINT) * {size_case} AS out_bytes,
                   CASE source WHEN 'kernel' THEN {arg("dtype")} ELSE input_type END AS dtype,
                   -- The peer of a send/recv: `Dst Rank` / `Src Rank` (PyTorch 2026).
                   TRY_CAST(CASE WHEN lower({arg("Collective name")}) LIKE '%send%'
                                 THEN {arg("Dst Rank")} ELSE {arg("Src Rank")} END AS INTEGER)
                       AS peer
            FROM {PARTS}
        )
        """,
        [
            run_id,
            *op_params,
            *gop_params,
            *size_params,
            *gsize_params,
            *size_params,
            files,
        ],
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
