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
from dataclasses import dataclass, field
from typing import Any

import duckdb

from tracelab.results import Finding, Result

AnalysisKey = tuple[str, int, str]


@dataclass(frozen=True, kw_only=True)
class Analysis:
    """Every analyzer's result for one run, and the analyzers that failed (name -> message)."""

    results: tuple[Result, ...] = ()
    errors: dict[str, str] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def get(self, name: str) -> Result | None:
        return next((r for r in self.results if r.analyzer == name), None)

    def findings(self) -> list[Finding]:
        """All findings, worst first: severity, then time lost per step."""
        found = [f for r in self.results for f in r.findings]
        return sorted(
            found,
            key=lambda f: (-int(f.severity), -(f.impact_ms_per_step or 0.0), f.code),
        )

    def table(self, analyzer: str, name: str) -> list[dict[str, Any]]:
        result = self.get(analyzer)
        return list(result.tables.get(name, [])) if result else []

    def metric(self, analyzer: str, name: str) -> Any:
        result = self.get(analyzer)
        return result.metrics.get(name) if result else None


def analyze_run(con: duckdb.DuckDBPyConnection, run_id: int) -> Analysis:
    """Run every registered analyzer on the run, each on its own cursor, keeping failures apart."""
    start = time.perf_counter()
    try:
        from tracelab.analyzers import REGISTRY
    except ImportError as exc:  # the analyzers package is broken: say so, keep serving
        return Analysis(errors={"analyzers": f"cannot load the analyzers: {exc}"})
    results: list[Result] = []
    errors: dict[str, str] = {}
    for name, analyzer in REGISTRY.items():
        cur = con.cursor()
        try:
            results.append(analyzer.analyze(cur, run_id, dict(analyzer.defaults)))
        except Exception as exc:  # noqa: BLE001 - one broken analyzer must not hide the rest
            last = traceback.extract_tb(exc.__traceback__)[-1:]
            where = f" ({last[0].filename.rsplit('/', 1)[-1]}:{last[0].lineno})" if last else ""
            errors[name] = f"{type(exc).__name__}: {exc}{where}"
        finally:
            cur.close()
    return Analysis(results=tuple(results), errors=errors, elapsed_s=time.perf_counter() - start)


def run_key(con: duckdb.DuckDBPyConnection, db_path: str, run_id: int) -> AnalysisKey | None:
    """The cache key of a run, or None when the run is gone."""
    row = con.execute("SELECT created_at FROM runs WHERE run_id = ?", [run_id]).fetchone()
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
