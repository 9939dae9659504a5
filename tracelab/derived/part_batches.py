"""The lost-time parts of one batch of ranks, computed wherever its inputs can be read: in a
thread of this process (local_runner: two batches at once on two cores; the 8-rank set's
parts 0.59-0.60 s -> 0.48-0.53 s), in a local worker process, or as a Ray task on another
node of the cluster.

The parts are the derived work that grows with events (tracelab.derived.parts). A batch's
inputs are its ranks' events files, in the folder of the store it is derived in (the ingest's
staged store, tracelab.store.staged, beside the store: on a shared filesystem for Ray, as the
traces are), and the rows of the small cross-rank tables its intervals read, of its ranks only
(sized by ranks x steps x collectives, never by events), which travel with the job. A worker
opens an in-memory DuckDB, names those inputs as the store names them, derives the batch
(parts.derive_ranks), writes its time_parts file into that folder, and sends back that
file's catalog entry with the batch's step_parts and comm_attribution rows. Only the driver
touches the store it derives in: it inserts what comes back in its transaction (store()).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa

from tracelab.connections import connect
from tracelab.derived import batches, sqlfiles
from tracelab.interrupts import interruptible
from tracelab.store_folder import events_select_sql, make_root

#: The small tables a batch's intervals and parts read, with the columns they need (of the
#: batch's ranks; process_groups is the run's, keyed by group).
INPUTS = {
    "collectives": "run_id, rank, event_idx, source, start_ns, op, pg_name",
    "collective_groups": "*",
    "matched_collectives": "*",
    "all_to_all_ranks": "run_id, rank, match_key, call_bytes",
    "p2p_ops": "*",
    "pipeline_ranks": "*",
    "step_spans": "*",
    "clock_offsets": "*",
}
RUN_INPUTS = {"process_groups": "*"}
#: What a batch sends back, besides its file.
OUTPUTS = ("step_parts", "comm_attribution", "rank_extents", "op_totals")

#: map(fn, jobs) -> results, in the jobs' order: the builtin map (this process, one batch in
#: memory at a time), a process pool's, Ray's (tracelab.ingest.ray_engine.batch_runner).
BatchMap = Callable[
    [Callable[["BatchJob"], "BatchResult"], Iterable["BatchJob"]], Iterable["BatchResult"]
]


@dataclass(frozen=True, kw_only=True)
class Runner:
    """Where a run's batches are derived: `map` over the jobs, with `workers` of them at once
    (the ranks are split into at least that many batches, each worker's DuckDB given its share
    of this machine's cores)."""

    map: BatchMap = map
    workers: int = 1
    #: The workers are on other machines (Ray): leave DuckDB's threads at its default.
    remote: bool = False
    #: The fewest events worth a batch of their own when the run is shared among the workers
    #: (rank_batches' `least`).
    least: int = 1

    def threads(self) -> int | None:
        if self.remote or self.workers <= 1:
            return None
        return max(1, (os.cpu_count() or 1) // self.workers)

    def batch_events(self) -> int:
        """The most events of one batch: BATCH_EVENTS, shared by the batches that run at once
        in this process (so the memory bound is one batch's, however many run at once)."""
        budget = batches.BATCH_EVENTS
        return budget if self.remote else max(1, budget // self.workers)


#: The fewest events a local batch of its own holds (local_runner).
LEAST_SHARED = 250_000
#: A batch whose events files hold fewer events than this on average, and MEMORY_EVENTS at
#: most in all, is read into memory once (Arrow, EVENT_COLUMNS) before its parts are derived;
#: other batches read their files through a view. INTERVALS_SQL reads the events four times,
#: and on small files opening each file costs more than its rows: a batch of 5,000 ranks of 39
#: events took 5.8 s as a view and 1.4 s read once; 16 ranks of 333 events 0.14 s and 0.13 s;
#: but 156 ranks of 12,836 events 1.5 s and 2.0 s, and 4 ranks of 123k events 0.39 s and
#: 0.45 s (one run each).
SMALL_FILES_EVENTS = 2_000
#: The most events a batch reads into memory: Arrow outside DuckDB's memory limit, about 100-125
#: bytes an event with EVENT_COLUMNS (measured on the 10,000-rank and the 8-rank sets).
MEMORY_EVENTS = 1_000_000
#: The events columns a batch's queries read (INTERVALS_SQL with HOST_OPS_SQL, the device
#: ranks): what a batch read into memory holds.
EVENT_COLUMNS = "run_id, rank, idx, cat, name, tid, ts_ns, dur_ns, category, on_device, step"


def local_runner(workers: int | None = None) -> Runner:
    """The batches derived in this process, `workers` at a time (default: 2 on a machine of 2
    cores or more), each in a thread with its own DuckDB connection: DuckDB, Arrow and numpy's
    sorts release the GIL, and no input is copied to another process."""
    n = workers if workers is not None else min(2, os.cpu_count() or 1)
    if n <= 1:
        return Runner()

    def map_threads(
        fn: Callable[[BatchJob], BatchResult], jobs: Iterable[BatchJob]
    ) -> Iterator[BatchResult]:
        pool = ThreadPoolExecutor(n)
        try:
            yield from pool.map(fn, jobs)
        finally:
            _wait_for(pool)

    # A batch costs about 0.1 s besides its events (its DuckDB connection, the small tables,
    # its queries: 3 batches of a 12-event run took 0.34 s, one 0.13 s), the parts about 0.05 s
    # per 100k events: runs of fewer than twice LEAST_SHARED events stay one batch.
    return Runner(map=map_threads, workers=n, least=LEAST_SHARED)


def _wait_for(pool: ThreadPoolExecutor) -> None:
    """Shut the pool down once its running batches end, the batches not started dropped, even
    through another Ctrl-C meanwhile (the first stops their queries: tracelab.interrupts): a
    batch that outlived the command wrote its file into the staging folder after its removal,
    and made the folder again."""
    stopped: BaseException | None = None
    while True:
        try:
            pool.shutdown(wait=True, cancel_futures=True)
            break
        except BaseException as exc:  # noqa: BLE001 - a signal while waiting: wait on
            stopped = stopped or exc
    if stopped is not None:
        raise stopped


@dataclass(frozen=True, kw_only=True)
class BatchJob:
    """Everything one batch's derivation reads (picklable: it travels to the worker)."""

    run_id: int
    ranks: tuple[int, int]
    token: str
    root: str
    event_files: tuple[str, ...]
    tables: dict[str, pa.Table] = field(repr=False)
    #: DuckDB threads in the worker (None: DuckDB's default, all cores).
    threads: int | None = None
    #: DuckDB's memory limit in the worker: the driver's store connection's (None: DuckDB's).
    memory_limit: str | None = None
    #: Read the events files into memory once (_in_memory) rather than through a view.
    events_in_memory: bool = False


@dataclass(frozen=True, kw_only=True)
class BatchResult:
    """One batch's time_parts file entry (first rank, path in the store folder, rows, bytes;
    None without segments) and its rows of OUTPUTS."""

    file: tuple[int, str, int, int] | None
    rows: dict[str, pa.Table] = field(repr=False)


def jobs(
    con: duckdb.DuckDBPyConnection,
    run_id: int,
    batches: list[tuple[int, int]],
    token: str,
    threads: int | None = None,
) -> Iterable[BatchJob]:
    """The batches' jobs, made one at a time from the store (in the caller's transaction)."""
    root = make_root(con)
    run_tables = {
        name: con.sql(
            f"SELECT {cols} FROM {name} WHERE run_id = $run", params={"run": run_id}
        ).to_arrow_table()
        for name, cols in RUN_INPUTS.items()
    }
    # The events view's columns, for a batch without files (a capture of collector records).
    no_events = con.sql("SELECT * FROM events LIMIT 0").to_arrow_table()
    limit = con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
    for lo, hi in batches:
        params = {"run": run_id, "lo": lo, "hi": hi}
        tables = {
            name: con.sql(
                f"SELECT {cols} FROM {name} WHERE run_id = $run AND rank BETWEEN $lo AND $hi",
                params=params,
            ).to_arrow_table()
            for name, cols in INPUTS.items()
        }
        listed = con.execute(
            "SELECT path, row_count FROM parquet_files WHERE run_id = $run AND kind = 'events' "
            "AND rank BETWEEN $lo AND $hi ORDER BY path",
            params,
        ).fetchall()
        files = tuple(str(p) for p, _ in listed)
        if not files:
            tables["events"] = no_events
        yield BatchJob(
            run_id=run_id,
            ranks=(lo, hi),
            token=token,
            root=str(root),
            event_files=files,
            tables={**tables, **run_tables},
            threads=threads,
            memory_limit=str(limit) if limit else None,
            events_in_memory=_in_memory([int(n) for _, n in listed]),
        )


def _in_memory(rows: list[int]) -> bool:
    """Whether a batch of events files of these row counts is read into memory once
    (SMALL_FILES_EVENTS, MEMORY_EVENTS)."""
    return sum(rows) < SMALL_FILES_EVENTS * len(rows) and sum(rows) <= MEMORY_EVENTS


def run(job: BatchJob) -> BatchResult:
    """Derive one batch from its job alone (no store connection): the worker's side."""
    from tracelab.derived import parts

    con = connect()
    try:
        with interruptible(con):
            if job.threads:
                con.execute(f"SET threads = {int(job.threads)}")
            if job.memory_limit:
                con.execute("SET memory_limit = ?", [job.memory_limit])
            for name, table in job.tables.items():
                con.register(name, table)
            if job.event_files:
                select = events_select_sql(Path(job.root), list(job.event_files))
                if job.events_in_memory:
                    events = con.sql(f"SELECT {EVENT_COLUMNS} FROM ({select})").to_arrow_table()
                    con.register("events", events)
                else:
                    con.execute(f"CREATE TEMP VIEW events AS {select}")
            for name in OUTPUTS:
                con.execute(sqlfiles.ddl(name))
            sqlfiles.create_macros(con, collectives=False)
            file = parts.derive_ranks(con, job.run_id, job.ranks, job.token, Path(job.root))
            rows = {name: con.sql(f"FROM {name}").to_arrow_table() for name in OUTPUTS}
            return BatchResult(file=file, rows=rows)
    finally:
        con.close()


def store(con: duckdb.DuckDBPyConnection, result: BatchResult) -> None:
    """Insert a batch's rows into the store (in the caller's transaction)."""
    for name, table in result.rows.items():
        if not len(table):
            continue
        with sqlfiles.registered(con, {"_tl_batch_rows": table}):
            con.execute(f"INSERT INTO {name} BY NAME SELECT * FROM _tl_batch_rows")
