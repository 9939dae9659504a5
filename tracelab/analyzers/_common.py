"""Small helpers shared by the analyzers: parameters, run facts, units, rounding."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import duckdb

from tracelab.errors import RunNotFoundError, UsageError

NS_PER_MS = 1_000_000


def merge_params(name: str, defaults: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults overridden by `given`; an unknown key is a usage error naming the known ones."""
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise UsageError(
            f"analyzer {name!r} has no parameter(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(defaults))}."
        )
    return {**defaults, **given}


def run_info(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[str, Any]:
    """name, world_size, rank_count and metadata (parsed) of a run."""
    row = con.execute(
        "SELECT name, world_size, rank_count, metadata FROM runs WHERE run_id = ?", [run_id]
    ).fetchone()
    if row is None:
        raise RunNotFoundError(f"no run with id {run_id} in the store.")
    meta = json.loads(row[3]) if row[3] else {}
    return {"name": row[0], "world_size": row[1], "rank_count": row[2], "metadata": meta}


def ms(ns: float | None, digits: int = 4) -> float | None:
    """Nanoseconds to milliseconds, rounded; None stays None."""
    return None if ns is None else round(float(ns) / NS_PER_MS, digits)


def r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(float(x), digits)


def median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def rows(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
    """Run a query and return its rows as dicts."""
    cur = con.execute(sql, list(params))
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]


def temp_table_exists(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether the connection holds a temporary table `name` (the analyzers' per-run caches)."""
    got = con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = 'temp' "
                      "AND table_name = ?", [name]).fetchall()
    return bool(got[0][0])


def ranks_str(ranks: Sequence[int]) -> str:
    """'rank 3' or 'ranks 1, 2 and 5'."""
    rs = sorted(ranks)
    if len(rs) == 1:
        return f"rank {rs[0]}"
    return "ranks " + ", ".join(map(str, rs[:-1])) + f" and {rs[-1]}"
