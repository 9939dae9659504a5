"""The derived layer: one definition for every number, computed once per run, stored, read by all.

`derive(con, run_id)` fills the derived tables (process groups and their dimensions, step spans, clock offsets, matched collectives, p2p ops, all-to-all bytes, pipeline actions, the lost-time parts and the
attribution of exposed communication) from the base tables, inside the transaction in which
the ingest builds the run (in its staged store: tracelab.ingest.write);
`tracelab rederive` runs it again on stored runs. Every analyzer, the reports and the app read
these tables (through `tracelab sql` too) and never recompute what they hold. docs/metrics.md
defines each number; tracelab/derived/sql/ holds one file per table or view, its documented DDL
(which the store's schema takes from schema_sql()) and, where the definition is SQL, its
`INSERT ... BY NAME` (tracelab.derived.sqlfiles).

Components run in dependency order, each isolated: one that fails on a run is recorded in
`derived_errors` (component and reason), its tables stay empty for that run, and the rest is
derived without it (clock offsets fall back to 0, the parts to no matched collectives or no
pipeline), so one odd trace never blocks an ingest or hides the other results. A failure inside
DuckDB aborts the caller's transaction, so it is raised as ComponentFailed: the caller rolls
back and derives again with that component in `skip` (tracelab.ingest does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import duckdb
import pyarrow as pa

from tracelab.derived import part_batches, sqlfiles
from tracelab.errors import failure_reason, raise_if_interrupted

T = TypeVar("T")

#: Derived tables per component, in the order derive() fills them.
COMPONENT_TABLES: dict[str, tuple[str, ...]] = {
    "groups": ("process_groups", "collective_groups"),
    "clocks": ("clock_offsets",),
    "steps": ("step_spans",),
    "collectives": ("matched_collectives", "p2p_ops"),
    "all_to_all": ("all_to_all_ranks",),
    "pipeline": ("pipeline_actions", "pipeline_runs", "pipeline_ranks"),
    "parts": ("time_parts", "step_parts", "comm_attribution", "rank_extents", "op_totals"),
}
#: Every derived table (their rows are per run; see tracelab.store.RUN_TABLES).
TABLES = tuple(t for ts in COMPONENT_TABLES.values() for t in ts) + ("derived_errors",)


class ComponentFailed(Exception):
    """A component failed inside DuckDB, which aborted the transaction: roll back and call
    derive() again with `skip={component: reason}` added."""

    def __init__(self, component: str, reason: str) -> None:
        super().__init__(f"derived component {component!r} failed: {reason}")
        self.component = component
        self.reason = reason


@dataclass(frozen=True, kw_only=True)
class DeriveReport:
    """What derive() did: the components that failed on the run (component -> reason)."""

    errors: dict[str, str]


def _groups(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    from tracelab.derived import groups

    groups.derive(con, run_id)


def _clocks(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    from tracelab.derived import clocks, collectives

    clocks.derive(con, run_id, collectives.choose_source(con, run_id))


def _clocks_fallback(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    """Offsets of 0 for every rank (method 'none'), so that the rest can still be derived."""
    sqlfiles.run(con, "clock_offsets_none", {"run": run_id})


def _steps(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    from tracelab.derived import steps

    steps.derive(con, run_id)


def _collectives(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    from tracelab.derived import collectives

    collectives.derive_matched(con, run_id, collectives.choose_source(con, run_id))
    collectives.derive_p2p(con, run_id)
    collectives.count_violations(con, run_id)


def _all_to_all(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    from tracelab.derived import all_to_all, collectives

    all_to_all.derive(con, run_id, collectives.choose_source(con, run_id))


def _pipeline(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    from tracelab.derived import pipeline

    pipeline.derive(con, run_id)


def _parts(
    con: duckdb.DuckDBPyConnection, run_id: int, runner: part_batches.Runner | None = None
) -> None:
    from tracelab.derived import parts

    parts.derive(con, run_id, runner)


_STEPS: tuple[
    tuple[str, Callable[[duckdb.DuckDBPyConnection, int], None], tuple[str, ...]], ...
] = (
    ("groups", _groups, ()),
    ("clocks", _clocks, ()),
    ("steps", _steps, ("clocks",)),
    ("collectives", _collectives, ("clocks",)),
    ("all_to_all", _all_to_all, ("clocks", "collectives")),
    ("pipeline", _pipeline, ("clocks",)),
    ("parts", _parts, ("clocks", "steps")),
)


def derive(
    con: duckdb.DuckDBPyConnection,
    run_id: int,
    skip: dict[str, str] | None = None,
    runner: part_batches.Runner | None = None,
) -> DeriveReport:
    """Compute every derived table of one run (whose base rows are in place), replacing what
    was derived for it before. Call inside the caller's transaction. Components in `skip`
    (name -> reason) are recorded as failed without running. `runner`: where the per-rank
    work that grows with events runs (tracelab.derived.part_batches; default this process)."""
    from tracelab.derived.collectives import drop_keyed

    clear(con, run_id)
    sqlfiles.create_macros(con)
    # keyed_collectives' rows, made once in a pass by the first component that reads them
    # (collectives.keyed); a failed pass is rolled back with them.
    drop_keyed(con)
    errors: dict[str, str] = {}
    for name, fn, needs in _STEPS:
        missing = [n for n in needs if n in errors and n != "clocks"]
        if missing:
            errors[name] = f"not derived: needs {', '.join(missing)}, which failed"
            continue
        try:
            if skip and name in skip:
                raise _Skipped(skip[name])
            if name == "parts":
                _parts(con, run_id, runner)
            else:
                fn(con, run_id)
        except ComponentFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - the failure policy: isolate, name, go on
            raise_if_interrupted(exc)  # a signal during a query stops the command
            if isinstance(exc, duckdb.Error):
                raise ComponentFailed(name, failure_reason(exc)) from exc
            for table in COMPONENT_TABLES[name]:
                _delete(con, table, run_id)
            errors[name] = str(exc) if isinstance(exc, _Skipped) else failure_reason(exc)
            if name == "clocks":
                _clocks_fallback(con, run_id)
    drop_keyed(con)
    if errors:
        table = pa.table(
            {
                "component": pa.array(list(errors), pa.string()),
                "message": pa.array(list(errors.values()), pa.string()),
            }
        )
        sqlfiles.run(con, "derived_errors", {"run": run_id}, {"_tl_errors": table})
    return DeriveReport(errors=errors)


class _Skipped(Exception):
    """A component the caller asked to skip (it failed in an earlier attempt)."""


def schema_sql() -> str:
    """The derived layer's DDL (tracelab/derived/sql/), for the store's schema."""
    return sqlfiles.schema_sql()


def clear(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    """Delete every derived row of one run."""
    for table in TABLES:
        _delete(con, table, run_id)


#: Derived tables kept as Parquet files, views over the files the catalog lists
#: (tracelab.derived.part_files).
FILE_TABLES = ("time_parts",)


def _delete(con: duckdb.DuckDBPyConnection, table: str, run_id: int) -> None:
    if table in FILE_TABLES:
        from tracelab.derived import part_files

        part_files.unlist(con, run_id)
    else:
        con.execute(f"DELETE FROM {table} WHERE run_id = $run", {"run": run_id})


def errors(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[str, str]:
    """The derived components that failed on the run: component -> reason."""
    return dict(
        con.execute(
            "SELECT component, message FROM derived_errors WHERE run_id = $run", {"run": run_id}
        ).fetchall()
    )


def in_transaction(con: duckdb.DuckDBPyConnection, work: Callable[[dict[str, str]], T]) -> T:
    """`work(skip)` in one transaction of `con`, retried without each derived component that
    fails inside DuckDB (which aborts the transaction: ComponentFailed, added to `skip`) until
    it commits: an ingest's whole build of a run (tracelab.ingest.write), a rederive's run."""
    skip: dict[str, str] = {}
    while True:
        con.execute("BEGIN TRANSACTION")
        try:
            result = work(skip)
            con.execute("COMMIT")
            return result
        except ComponentFailed as exc:
            sqlfiles.rollback(con)
            skip[exc.component] = exc.reason
        except BaseException:
            sqlfiles.rollback(con)
            raise


def derive_in_transaction(
    con: duckdb.DuckDBPyConnection, run_id: int, runner: part_batches.Runner | None = None
) -> DeriveReport:
    """derive() in its own transaction (in_transaction), until the run's derived rows are
    consistent."""
    return in_transaction(con, lambda skip: derive(con, run_id, skip, runner))
