"""Query helpers shared by the derived layer's modules."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import duckdb


def rows(
    con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] | dict[str, Any]
) -> list[dict[str, Any]]:
    """Run a query and return its rows as dicts."""
    cur = con.execute(sql, params if isinstance(params, dict) else list(params))
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]


def first(cur: duckdb.DuckDBPyConnection) -> tuple[Any, ...] | None:
    """The first row of an executed query, reading the result to its end: DuckDB refuses new
    work on a connection whose previous result was not read through (fetchone does not)."""
    got = cur.fetchall()
    return got[0] if got else None


def scalar(cur: duckdb.DuckDBPyConnection) -> Any:
    """The first column of the first row, or None; reads the result through (see first)."""
    row = first(cur)
    return None if row is None else row[0]
