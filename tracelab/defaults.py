"""Defaults shared by the CLI and the library, importable without loading DuckDB."""

from __future__ import annotations

#: The store file used when no --db is given.
DEFAULT_DB = "tracelab.duckdb"
