"""Issue 15 items 2 and 3: `tracelab sql` cannot write or read files; `export --overwrite`
replaces only a previous export of tracelab's own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .hostile import cli, snapshot, still_works, store  # noqa: F401 (fixture)


@pytest.mark.parametrize(
    "query, words",
    [
        ("", "no SQL statement"),
        ("SELECT 1; DELETE FROM runs", "one statement"),
        ("COPY events TO '{tmp}/leak.csv'", "COPY statements are refused"),
        ("EXPORT DATABASE '{tmp}/leak'", "EXPORT statements are refused"),
        ("ATTACH '{db}' AS again (READ_ONLY false)", "ATTACH statements are refused"),
        ("SET enable_external_access = true", "SET statements are refused"),
        ("CHECKPOINT", "refused"),
        ("INSTALL httpfs", "refused"),
        ("LOAD httpfs", "refused"),
        ("PRAGMA show_tables", "PRAGMA statements are refused"),
        ("DELETE FROM runs", "DELETE statements are refused"),
        ("SELECT * FROM read_text('/etc/passwd')", "disabled by configuration"),
        ("SELECT * FROM read_json('{tmp}/good/rank-0.json')", "disabled by configuration"),
        ("SELECT * FROM glob('/etc/*')", "disabled by configuration"),
    ],
)
def test_sql_refuses_writes_and_file_access(
    query: str, words: str, store: Path, tmp_path: Path
) -> None:
    before = snapshot(store)
    res = cli("sql", query.format(tmp=tmp_path, db=store), "--db", str(store))
    assert res.code == 2, res.err
    assert words in res.err
    assert "Traceback" not in res.err
    assert snapshot(store) == before
    assert not (tmp_path / "leak.csv").exists() and not (tmp_path / "leak").exists()
    still_works(store)


@pytest.mark.parametrize(
    "query",
    [
        "SELECT count(*) FROM events",
        "SHOW TABLES",
        "DESCRIBE events",
        "FROM runs",
        "SUMMARIZE runs",
        "WITH a AS (SELECT 1 AS x) SELECT * FROM a",
        "EXPLAIN SELECT 1",
    ],
)
def test_sql_runs_queries(query: str, store: Path) -> None:
    assert cli("sql", query, "--db", str(store)).code == 0


def test_export_overwrite_never_deletes_the_store_or_other_files(
    store: Path, tmp_path: Path
) -> None:
    before = snapshot(store)
    res = cli("export", "--db", str(store), "--out", str(tmp_path), "--overwrite")
    assert res.code == 2 and "holds the store" in res.err
    assert store.exists() and snapshot(store) == before
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert cli("export", "--db", str(store), "--out", ".", "--overwrite").code == 2
    finally:
        os.chdir(cwd)
    assert store.exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    res = cli("export", "--db", str(store), "--out", str(mine), "--overwrite")
    assert res.code == 2 and "not a tracelab export" in res.err
    assert (mine / "notes.txt").read_text() == "keep me"
    assert cli("export", "--db", str(store), "--out", str(store), "--overwrite").code == 2
    still_works(store)


def test_export_overwrite_replaces_its_own_export(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "ex"
    assert cli("export", "--db", str(store), "--out", str(out)).code == 0
    assert (out / ".tracelab-export").is_file()
    assert cli("export", "--db", str(store), "--out", str(out)).code == 2
    assert cli("export", "--db", str(store), "--out", str(out), "--overwrite").code == 0
    (out / "extra.txt").write_text("a user's file inside the export")
    res = cli("export", "--db", str(store), "--out", str(out), "--overwrite")
    assert res.code == 2 and (out / "extra.txt").exists()


def test_export_to_an_unwritable_place_is_a_usage_error(store: Path) -> None:
    res = cli("export", "--db", str(store), "--out", "/proc/x")
    assert res.code == 2 and "/proc/x" in res.err and "Traceback" not in res.err


def test_a_store_file_removed_behind_its_back_is_a_store_error(tmp_path: Path) -> None:
    from tracelab.ingest import ingest
    from tracelab.store.files import parquet_root

    from .kineto import run_set

    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "t", ranks=2)], db=db, run="a", progress=False)
    for parts in (parquet_root(db) / "run=1" / "parts").iterdir():
        parts.unlink()
    res = cli("sql", "--db", str(db), "SELECT count(*) FROM time_parts")
    assert res.code == 3 and "is not there" in res.err and "Traceback" not in res.err, res.err
    res = cli("sql", "--db", str(db), "SELECT * FROM no_such_table")
    assert res.code == 2 and "the query failed" in res.err  # a bad query stays a usage error
