"""The CLI's read-only SQL, runs listing, help on every subcommand, and Parquet export."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb

from tracelab.cli import build_parser
from tracelab.ingest import ingest

from .kineto import run_set


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tracelab.cli", *args], capture_output=True, text=True
    )


def test_every_subcommand_has_help() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert {"ingest", "runs", "sql", "export"} <= set(sub.choices)
    for name in sub.choices:
        res = cli(name, "--help")
        assert res.returncode == 0 and "usage:" in res.stdout, name


def test_sql_is_read_only_and_prints_csv(tmp_path: Path) -> None:
    db = str(tmp_path / "s.duckdb")
    ingest([run_set(tmp_path / "t")], db=db, run="a", progress=False)
    res = cli(
        "sql",
        "SELECT rank, count(*) AS n FROM events GROUP BY rank ORDER BY rank",
        "--db",
        db,
        "--format",
        "csv",
    )
    assert res.returncode == 0
    assert res.stdout.splitlines() == ["rank,n", "0,4", "1,4"]
    res = cli("sql", "DELETE FROM events", "--db", db)
    assert res.returncode == 2 and "read-only" in res.stderr
    runs = cli("runs", "--db", db, "--format", "json")
    assert json.loads(runs.stdout.splitlines()[0])["name"] == "a"


def test_missing_store_says_how_to_create_one(tmp_path: Path) -> None:
    res = cli("runs", "--db", str(tmp_path / "none.duckdb"))
    assert res.returncode == 3 and "tracelab ingest" in res.stderr


def test_export_partitions_by_rank_and_reads_back_in_place(tmp_path: Path) -> None:
    db = str(tmp_path / "s.duckdb")
    ingest([run_set(tmp_path / "t", ranks=3)], db=db, run="a", progress=False)
    out = tmp_path / "export"
    assert cli("export", "--db", db, "--run", "a", "--out", str(out)).returncode == 0
    assert sorted(p.name for p in (out / "events").iterdir()) == ["rank=0", "rank=1", "rank=2"]
    con = duckdb.connect()
    back = con.execute(
        "SELECT rank, count(*), sum(dur_ns) FROM read_parquet(?, hive_partitioning = true) "
        "GROUP BY rank ORDER BY rank",
        [str(out / "events" / "*" / "*.parquet")],
    ).fetchall()
    src = (
        duckdb.connect(db, read_only=True)
        .execute("SELECT rank, count(*), sum(dur_ns) FROM events GROUP BY rank ORDER BY rank")
        .fetchall()
    )
    assert back == src
    assert (
        con.execute(
            "SELECT count(*) FROM read_parquet(?)", [str(out / "steps.parquet")]
        ).fetchone()[0]
        == 3
    )
    # The derived tables too, the same rows as the store's (the lost-time model included).
    store = duckdb.connect(db, read_only=True)
    for table in ("step_parts", "time_parts", "step_spans", "clock_offsets"):
        sql = "SELECT * EXCLUDE (run_id) FROM {} ORDER BY ALL"
        exported = con.execute(sql.format(f"read_parquet('{out / (table + '.parquet')}')"))
        rows = exported.fetchall()
        assert rows and rows == store.execute(sql.format(table)).fetchall(), table
    store.close()
    res = cli("export", "--db", db, "--run", "a", "--out", str(out))
    assert res.returncode == 2 and "--overwrite" in res.stderr
