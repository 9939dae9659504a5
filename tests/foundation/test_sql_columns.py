"""`tracelab sql` labels repeated column names as DuckDB does, one value under each header."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import duckdb
import pytest

from tracelab.cli import main
from tracelab.commands.sql import unique_names
from tracelab.ingest import ingest

from .kineto import run_set


def test_unique_names_match_duckdbs_own_deduplication() -> None:
    names = ["name", "name", "name_1", "NAME", "x", "name"]
    select = ", ".join(f"{i} AS {n}" for i, n in enumerate(names))
    con = duckdb.connect()
    deduped = [d[0] for d in con.execute(f"SELECT * FROM (SELECT {select})").description]
    assert unique_names(names) == deduped == ["name", "name_1", "name_1_1", "NAME_2", "x", "name_3"]


def test_repeated_names_print_both_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "t", ranks=1)], db=db, run="runA", progress=False)
    query = "SELECT r.name, e.name FROM runs r JOIN events e USING (run_id) ORDER BY e.name LIMIT 1"
    assert main(["sql", query, "--db", str(db), "--format", "csv"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0] == ["name", "name_1"]
    assert rows[1][0] == "runA" and rows[1][1] != "runA"
    assert main(["sql", query, "--db", str(db)]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header == ["name", "name_1"]
