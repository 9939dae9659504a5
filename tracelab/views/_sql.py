"""Binding named parameters: DuckDB rejects a dict holding names a query does not use, so each
query gets exactly the names it mentions."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import duckdb

_NAME = re.compile(r"\$([A-Za-z_]\w*)")

#: A relation (rank, off_ns) from two bound lists: each rank's clock offset.
OFFSETS = "(SELECT unnest($off_ranks::INTEGER[]) AS rank, unnest($off_ns::BIGINT[]) AS off_ns)"


def bind(sql: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of `params` that `sql` uses; a KeyError names any it needs but lacks."""
    names = set(_NAME.findall(sql))
    missing = names - params.keys()
    if missing:
        raise KeyError(f"query parameters not provided: {sorted(missing)}")
    return {k: params[k] for k in names}


def query(
    con: duckdb.DuckDBPyConnection, sql: str, params: Mapping[str, Any]
) -> list[tuple[Any, ...]]:
    """Run `sql` with the named parameters it uses; all rows."""
    return con.execute(sql, bind(sql, params)).fetchall()
