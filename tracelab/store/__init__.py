"""The DuckDB store: opening it safely (open), its versions (versions), its schema (schema and
the documented DDL in schema/), run bookkeeping (runs) and exports (export)."""

from tracelab.store.open import (
    DEFAULT_LOCK_TIMEOUT_S,
    WRITER_MEMORY_LIMIT,
    open_store,
    store_cursor,
)
from tracelab.store.runs import RUN_TABLES, delete_run, list_runs, resolve_run, run_id
from tracelab.store.schema import (
    SCHEMA_FILES,
    ensure_schema,
    mark_derived_current,
    rederive_schema,
    schema_sql,
)
from tracelab.store.versions import (
    DERIVED_VERSION,
    SCHEMA_VERSION,
    duckdb_storage_version,
    stored_derived_version,
)

__all__ = [
    "DEFAULT_LOCK_TIMEOUT_S",
    "DERIVED_VERSION",
    "RUN_TABLES",
    "SCHEMA_FILES",
    "SCHEMA_VERSION",
    "WRITER_MEMORY_LIMIT",
    "delete_run",
    "duckdb_storage_version",
    "ensure_schema",
    "list_runs",
    "open_store",
    "mark_derived_current",
    "rederive_schema",
    "resolve_run",
    "run_id",
    "schema_sql",
    "store_cursor",
    "stored_derived_version",
]
