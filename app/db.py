"""The app's only door to the store: a read-only cursor per request, and the shared caches.

Each request opens the store read-only (tracelab.store.open_store retries while an ingest in
another process holds the write lock) and closes it when done, so the app never blocks an ingest
for longer than one request. Within the process, DuckDB shares one database instance between the
connections that are open at the same time; each request works on its own cursor.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import duckdb

from tracelab.errors import RunNotFoundError
from tracelab.store import open_store, store_cursor
from tracelab.views.analysis import Analysis, AnalysisCache, AnalysisKey
from tracelab.views.analysis import run_key as run_key_of
from tracelab.views.context import RunContext, run_context

T = TypeVar("T")

#: How long a request waits for an ingest to release the store, in seconds.
LOCK_TIMEOUT_S = float(os.environ.get("TRACELAB_APP_LOCK_TIMEOUT_S", "30"))

_config: dict[str, str] = {}
ANALYSES = AnalysisCache(max_runs=16)
_contexts: OrderedDict[AnalysisKey, RunContext] = OrderedDict()
_ctx_lock = threading.Lock()


def configure(db: str) -> None:
    """Point the app at a store file (called once by create_app)."""
    _config["db"] = os.path.abspath(db)
    ANALYSES.clear()
    with _ctx_lock:
        _contexts.clear()
    with _memo_lock:
        _memo.clear()


def db_path() -> str:
    if "db" not in _config:
        configure(os.environ.get("TRACELAB_DB", "tracelab.duckdb"))
    return _config["db"]


@contextmanager
def cursor() -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-only cursor on the store, for one request."""
    with open_store(db_path(), read_only=True, timeout_s=LOCK_TIMEOUT_S) as con:
        cur = store_cursor(con)
        try:
            yield cur
        finally:
            cur.close()


def resolve(cur: duckdb.DuckDBPyConnection, name: str | None) -> tuple[int, str]:
    """(run_id, name) of the named run, or of the newest run when no name is given."""
    from tracelab.store import resolve_run

    return resolve_run(cur, name)


def analysis(cur: duckdb.DuckDBPyConnection, run_id: int) -> Analysis:
    """Every analyzer's result for the run (computed once per ingest of the run, then cached)."""
    key = run_key_of(cur, db_path(), run_id)
    if key is None:
        raise RunNotFoundError(f"run {run_id} is no longer in the store.")
    return ANALYSES.get(cur, key)


def run_key(cur: duckdb.DuckDBPyConnection, run_id: int) -> AnalysisKey | None:
    """The run's cache key (store, id, ingest time): changes when the run is re-ingested."""
    return run_key_of(cur, db_path(), run_id)


def peek_analysis(cur: duckdb.DuckDBPyConnection, run_id: int) -> Analysis | None:
    key = run_key_of(cur, db_path(), run_id)
    return ANALYSES.peek(key) if key else None


def context(cur: duckdb.DuckDBPyConnection, run_id: int) -> RunContext:
    """The run's context (ranks, clock offsets, time origin), cached per ingest of the run."""
    key = run_key_of(cur, db_path(), run_id)
    if key is None:
        raise RunNotFoundError(f"run {run_id} is no longer in the store.")
    with _ctx_lock:
        ctx = _contexts.get(key)
    if ctx is None:
        ctx = run_context(cur, run_id)
        with _ctx_lock:
            _contexts[key] = ctx
            while len(_contexts) > 32:
                _contexts.popitem(last=False)
    return ctx


_memo: OrderedDict[tuple[object, ...], object] = OrderedDict()
_memo_lock = threading.Lock()


def memo(
    cur: duckdb.DuckDBPyConnection,
    run_id: int,
    what: str,
    args: tuple[object, ...],
    compute: Callable[[], T],
) -> T:
    """A small LRU for per-run results that do not change until the run is re-ingested (e.g.
    the timeline's lanes under given filters)."""
    key = (run_key_of(cur, db_path(), run_id), what, args)
    with _memo_lock:
        if key in _memo:
            _memo.move_to_end(key)
            return _memo[key]  # type: ignore[return-value]
    value = compute()
    with _memo_lock:
        _memo[key] = value
        while len(_memo) > 64:
            _memo.popitem(last=False)
    return value


def warm_newest(count: int = 3) -> None:
    """Analyze the newest runs in a background thread, so their first views open fast."""

    def work() -> None:
        try:
            from tracelab.views.runs import newest_run_ids

            with cursor() as cur:
                ids = newest_run_ids(cur, count)
            for rid in ids:  # one short connection per run: an ingest can get in between
                with cursor() as cur:
                    analysis(cur, rid)
                    context(cur, rid)
        except Exception:
            import logging

            logging.getLogger("tracelab.app").exception("background analysis failed")

    threading.Thread(target=work, name="tracelab-warm", daemon=True).start()
