"""Fixtures for the analyzer tests: synthetic runs (tracelab.testing.synth) ingested into stores.

`analyzed(scenario, **params)` builds the scenario, ingests it into its own store and returns
(run, results by analyzer name); results are cached per session, so each constructed run is
ingested and analyzed once however many tests read it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tracelab.analyzers import run_all
from tracelab.ingest import ingest
from tracelab.results import Result
from tracelab.store import open_store, resolve_run
from tracelab.testing.synth import SynthRun, build_run

Analyzed = tuple[SynthRun, dict[str, Result]]


@pytest.fixture(scope="session")
def analyzed(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Analyzed]:
    cache: dict[str, Analyzed] = {}
    dbs: dict[str, Path] = {}

    def make(
        scenario: str, analyzer_params: dict[str, dict[str, Any]] | None = None, **params: Any
    ) -> Analyzed:
        key = repr((scenario, sorted(params.items()), sorted((analyzer_params or {}).items())))
        if key not in cache:
            root = tmp_path_factory.mktemp(scenario)
            run = build_run(root, scenario, **params)
            db = root / "store.duckdb"
            ingest(run.paths, db=db, run=run.name, workers=1, progress=False)
            with open_store(db) as con:
                rid, _ = resolve_run(con, run.name)
                results = run_all(con, rid, params=analyzer_params)
            cache[key] = (run, {r.analyzer: r for r in results})
            dbs[run.name] = db
        return cache[key]

    def query(run: SynthRun, sql: str, params: Any = None) -> list[dict[str, Any]]:
        """Rows (as dicts) of a query on the run's store; $run is bound to the run's id."""
        with open_store(dbs[run.name], read_only=True) as con:
            rid, _ = resolve_run(con, run.name)
            cur = con.execute(sql, {"run": rid, **(params or {})})
            cols = [d[0] for d in cur.description]
            return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    make.query = query  # type: ignore[attr-defined]
    return make


def store_of(tmp: Path, run: SynthRun) -> Path:
    """Ingest a synthetic run into tmp/store.duckdb; returns the store path."""
    db = tmp / "store.duckdb"
    ingest(run.paths, db=db, run=run.name, workers=1, progress=False)
    return db
