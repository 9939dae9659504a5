"""Analyzer results for the views: run once per run, shared, and never allowed to take a view down.

Analyses of a big run take seconds, and several views and visitors need the same results, so they
are cached per (store file, run id, ingest time): a re-ingested run (new id or time) is analyzed
afresh. One analyzer that fails does not hide the others: its error is kept and shown.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections import OrderedDict
from concurrent.futures import Future

import duckdb

from tracelab.analyzers import Analysis

__all__ = ["Analysis", "AnalysisCache", "AnalysisKey", "analyze_run", "run_key"]

AnalysisKey = tuple[str, int, str]


def analyze_run(con: duckdb.DuckDBPyConnection, run_id: int) -> Analysis:
    """The one runner (tracelab.analyzers.run), failures isolated: what `tracelab analyze` and
    the reports show. Even a failure outside any analyzer (a broken store) is kept as an error
    rather than taking a view down."""
    from tracelab.analyzers import run

    start = time.perf_counter()
    try:
        return run(con, run_id)
    except Exception as exc:  # noqa: BLE001 - a view shows the error instead of a 500
        last = traceback.extract_tb(exc.__traceback__)[-1:]
        where = f" ({last[0].filename.rsplit('/', 1)[-1]}:{last[0].lineno})" if last else ""
        return Analysis(
            context=None,
            errors={"analyzers": f"{type(exc).__name__}: {exc}{where}"},
            elapsed_s=time.perf_counter() - start,
        )


def run_key(con: duckdb.DuckDBPyConnection, db_path: str, run_id: int) -> AnalysisKey | None:
    """The cache key of a run, or None when the run is gone."""
    rows = con.execute("SELECT created_at FROM runs WHERE run_id = ?", [run_id]).fetchall()
    row = rows[0] if rows else None
    if row is None:
        return None
    return (os.path.realpath(db_path), run_id, str(row[0]))


class AnalysisCache:
    """A small LRU of Analysis per run, safe to share between request threads.

    `get` computes on the caller's connection when nothing is cached or running; concurrent
    callers for the same run wait for the one computation. `peek` never computes.
    """

    def __init__(self, max_runs: int = 8) -> None:
        self.max_runs = max_runs
        self._lock = threading.Lock()
        self._items: OrderedDict[AnalysisKey, Future[Analysis]] = OrderedDict()

    def peek(self, key: AnalysisKey) -> Analysis | None:
        with self._lock:
            fut = self._items.get(key)
        if fut is not None and fut.done() and fut.exception() is None:
            return fut.result()
        return None

    def get(self, con: duckdb.DuckDBPyConnection, key: AnalysisKey) -> Analysis:
        with self._lock:
            fut = self._items.get(key)
            owner = fut is None
            if owner:
                fut = Future()
                self._items[key] = fut
                while len(self._items) > self.max_runs:
                    self._items.popitem(last=False)
            else:
                self._items.move_to_end(key)
        assert fut is not None
        if owner:
            try:
                fut.set_result(analyze_run(con, key[1]))
            except BaseException as exc:
                fut.set_exception(exc)
                with self._lock:
                    self._items.pop(key, None)
                raise
        return fut.result()

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
