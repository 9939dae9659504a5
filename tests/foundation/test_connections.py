"""Every DuckDB connection tracelab opens carries the planner settings of tracelab.connections:
the store's (reader, its cursors, writer), a staged store's and a batch's in-memory one."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from tracelab.connections import SETTINGS
from tracelab.derived import part_batches
from tracelab.ingest import ingest
from tracelab.store import open_store
from tracelab.store.open import store_cursor
from tracelab.store.staged import staged_store
from tracelab.testing.synth import build_run


def _settings(con: duckdb.DuckDBPyConnection) -> dict[str, object]:
    return {
        name: con.execute(f"SELECT current_setting('{name}')").fetchall()[0][0]
        for name, _ in SETTINGS
    }


#: Written out, not read from SETTINGS: emptying SETTINGS must fail these tests.
WANTED = {"asof_loop_join_threshold": 0}


def test_the_settings_are_the_wanted_ones() -> None:
    assert dict(SETTINGS) == WANTED


def test_the_store_its_cursors_and_a_staged_store(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    with open_store(db, read_only=False) as con:
        assert _settings(con) == WANTED
    with open_store(db, read_only=True) as con:
        assert _settings(con) == WANTED
        cur = store_cursor(con)
        try:
            assert _settings(cur) == WANTED
        finally:
            cur.close()
    with staged_store(tmp_path / "staged.duckdb") as con:
        assert _settings(con) == WANTED


def test_a_batch_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """part_batches.run's own in-memory database, seen as an ingest's batches open it."""
    seen: list[dict[str, object]] = []
    real = part_batches.connect

    def spy(*args: str, **kwargs: bool) -> duckdb.DuckDBPyConnection:
        con = real(*args, **kwargs)
        seen.append(_settings(con))
        return con

    monkeypatch.setattr(part_batches, "connect", spy)
    paths = build_run(tmp_path, "stragglers").paths
    ingest(paths, db=str(tmp_path / "s.duckdb"), run="r", workers=1, progress=False)
    assert seen and all(s == WANTED for s in seen)


def test_a_store_whose_configuration_another_connection_locked(tmp_path: Path) -> None:
    """`tracelab sql` locks its connection's configuration; the same file opened again in the
    process (its database is shared) must still open, not fail on a SET it does not need."""
    db = tmp_path / "s.duckdb"
    with open_store(db, read_only=False):
        pass
    with open_store(db, read_only=True) as con:
        con.execute("SET lock_configuration = true")
        with open_store(db, read_only=True) as again:
            assert _settings(again) == WANTED
