"""The derived layer's SQL files (tracelab/derived/sql/): one per definition.

Each file holds its table's DDL (`CREATE TABLE`/`CREATE OR REPLACE VIEW`, every column
commented: the `-- ` lines become DuckDB's comments, see tracelab.store.schema) and, where the
definition is SQL, its `INSERT INTO <table> BY NAME SELECT ...` with named parameters
(`$run`, ...). Where a definition is computed in Python (clock fitting, pipeline recognition,
the parts' sweep) the file's INSERT reads the named columns of an Arrow table the Python
registers, never positions. `_macros.sql` holds the macros the definitions share (the
reference clock, the interval union), created on the deriving connection by create_macros().

The tables are computed once per run, inside the ingest transaction, from the base tables
(tracelab/store/schema/tables.sql, whose conventions hold here); `tracelab rederive`
recomputes them. Unless a column says otherwise, every time in them is on the *reference
clock*: a rank's own time minus its clock_offsets.offset_ns (the macro ref_ns), so times of
different ranks compare. The analyzers, the reports and the app read them and never re-derive
what they hold (docs/metrics.md defines every number).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence
from importlib import resources
from typing import Any

import duckdb
import pyarrow as pa

#: The definitions with a DDL, in the order the schema creates them (views last).
DEFINITIONS = (
    "process_groups",
    "collective_groups",
    "step_spans",
    "clock_offsets",
    "matched_collectives",
    "p2p_ops",
    "all_to_all_ranks",
    "rank_extents",
    "op_totals",
    "time_parts",
    "step_parts",
    "comm_attribution",
    "pipeline_actions",
    "pipeline_runs",
    "pipeline_ranks",
    "derived_errors",
    "job_steps",
    "job_step_shares",
    "job_step_dim_shares",
)
_STATEMENT = re.compile(r"^(?:INSERT INTO|UPDATE) ", re.M)


def text(name: str) -> str:
    """The file tracelab/derived/sql/<name>.sql."""
    return resources.files("tracelab.derived").joinpath(f"sql/{name}.sql").read_text()


def ddl(name: str) -> str:
    """The DDL of a definition: its file up to its INSERT."""
    body = text(name)
    m = _STATEMENT.search(body)
    return (body[: m.start()] if m else body).rstrip() + "\n"


def statement(name: str) -> str:
    """The INSERT (or UPDATE) of a definition: its file from that statement on."""
    body = text(name)
    m = _STATEMENT.search(body)
    if m is None:
        raise KeyError(f"tracelab/derived/sql/{name}.sql has no INSERT INTO or UPDATE statement")
    return body[m.start() :]


_INSERT_BY_NAME = re.compile(r"INSERT INTO \w+ BY NAME\s")


def query(name: str) -> str:
    """The rows of a definition whose statement is `INSERT INTO <table> BY NAME <query>`, as
    that query (its named parameters unbound): to read them where the table has none, without
    inserting them (a read-only store; the report's fallback for a run whose parts could not
    be derived)."""
    body = statement(name)
    m = _INSERT_BY_NAME.match(body)
    if m is None:
        raise KeyError(f"tracelab/derived/sql/{name}.sql has no INSERT INTO ... BY NAME statement")
    return body[m.end() :].strip().removesuffix(";")


def schema_sql() -> str:
    """The derived layer's DDL: every definition's, blank-line separated."""
    return "\n".join(ddl(name) for name in DEFINITIONS)


def create_macros(
    con: duckdb.DuckDBPyConnection, *, store: bool = True, collectives: bool = True
) -> None:
    """Create the shared macros, temporary, on this connection: those of _macros.sql and, with
    `store` (the connection holds a store's tables), those of _store_macros.sql and, with
    `collectives` too (the whole collectives table is there: a batch worker has only the
    columns it reads, tracelab.derived.part_batches), keyed_collectives(_run, _source,
    _host_bytes), the matched group collectives of tracelab.derived.collectives.keyed_sql (its
    size rules are generated from Python tables)."""
    from tracelab.derived.collectives import keyed_sql

    con.execute(text("_macros"))
    if not store:
        return
    con.execute(text("_store_macros"))
    if not collectives:
        return
    con.execute(
        "CREATE OR REPLACE TEMP MACRO keyed_collectives(_run, _source, _host_bytes) AS TABLE "
        + keyed_sql()
    )


@contextlib.contextmanager
def registered(con: duckdb.DuckDBPyConnection, tables: Mapping[str, pa.Table]) -> Iterator[None]:
    """The Arrow `tables` registered on `con` under their names while inside."""
    for key, table in tables.items():
        con.register(key, table)
    ok = False
    try:
        yield
        ok = True
    finally:
        # A failed statement aborts the transaction, so unregistering then fails too ("Current
        # transaction is aborted"): that must not replace the statement's own error, which
        # derived_errors records. The caller rolls back.
        for key in tables:
            with contextlib.nullcontext() if ok else contextlib.suppress(duckdb.Error):
                con.unregister(key)


def run(
    con: duckdb.DuckDBPyConnection,
    name: str,
    params: Mapping[str, Any],
    tables: Mapping[str, pa.Table] | None = None,
) -> None:
    """Execute the statement of `name` with its named parameters, the Arrow `tables`
    registered under their names while it runs."""
    with registered(con, tables or {}):
        con.execute(statement(name), dict(params))


def insert_rows(
    con: duckdb.DuckDBPyConnection,
    table: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
) -> None:
    """INSERT many Python rows into `table` (`columns`, in order) in one statement, through
    Arrow typed as the table's columns. DuckDB's executemany runs one statement a row: 0.6 ms
    each, 1.2 s to list a 2,000-rank run's files."""
    if not rows:
        return
    cols = ", ".join(columns)
    schema = con.sql(f"SELECT {cols} FROM {table} LIMIT 0").to_arrow_table().schema
    arrays = [pa.array([row[i] for row in rows], type=field.type) for i, field in enumerate(schema)]
    with registered(con, {"_tl_rows": pa.Table.from_arrays(arrays, schema=schema)}):
        con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM _tl_rows")


def rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Roll a write back, where a transaction is still open: a signal that lands as the COMMIT
    ends (SIGTERM on the Ray engine) found none, and DuckDB's "cannot rollback - no transaction
    is active" replaced the signal as the error (exit 70, "a bug")."""
    try:
        con.execute("ROLLBACK")
    except duckdb.TransactionException:
        pass
