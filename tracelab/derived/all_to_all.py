"""All-to-all calls per rank: bytes sent and received, and each call's skew (docs/metrics.md,
"All-to-all"; tracelab/derived/sql/all_to_all_ranks.sql).

DLRM-style embedding exchanges and MoE token dispatch are all-to-alls whose splits can differ
from rank to rank: a rank that holds the heavy tables or the popular experts sends or receives
more than the others, and the others wait for it. The table is what tells uneven data from a
slow participant (tracelab.analyzers.alltoall).
"""

from __future__ import annotations

import duckdb
import pyarrow as pa

from tracelab.derived import sqlfiles
from tracelab.derived.collectives import HOST_DTYPE_BYTES


def dtype_bytes_table() -> pa.Table:
    """Bytes per element of the type names traces write (lower-cased, no `c10d::`)."""
    return pa.table(
        {
            "name": pa.array(list(HOST_DTYPE_BYTES), pa.string()),
            "bytes": pa.array(list(HOST_DTYPE_BYTES.values()), pa.int64()),
        }
    )


def derive(con: duckdb.DuckDBPyConnection, run_id: int, source: str | None) -> None:
    """Fill all_to_all_ranks for the run from its all-to-alls of `source` (the matched
    collectives' source; nothing when the run has no timed collective)."""
    if source is None:
        return
    # Most runs have none: then the statement's scans of the run's events (its host size
    # events, its kernels' launches) are not run at all (4.4 s and 0.8 GB at 12.8M events).
    has = con.execute(
        "SELECT count(*) FROM collectives WHERE run_id = $run AND source = $source "
        "AND op = 'all_to_all'",
        {"run": run_id, "source": source},
    ).fetchall()[0][0]
    if not has:
        return
    sqlfiles.run(
        con,
        "all_to_all_ranks",
        {"run": run_id, "source": source},
        {"_tl_dtype_bytes": dtype_bytes_table()},
    )
