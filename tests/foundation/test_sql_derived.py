"""The derived layer through `tracelab sql`: every derived table and view can be queried, and
DESCRIBE shows each column's definition (the schema files' comments, as in Perfetto's SQL
standard library)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracelab.cli import main
from tracelab.derived import TABLES
from tracelab.ingest import ingest
from tracelab.testing.synth import build_run

VIEWS = ("job_steps", "job_step_shares")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("sql")
    r = build_run(tmp, "pipeline", schedule="1f1b")
    path = tmp / "s.duckdb"
    ingest(r.paths, db=path, run=r.name, workers=1, progress=False)
    return path


@pytest.mark.parametrize("table", [*TABLES, *VIEWS])
def test_each_derived_table_is_queryable_and_described(table: str, db: Path, capsys) -> None:
    assert main(["sql", "--db", str(db), f"SELECT * FROM {table} LIMIT 1"]) == 0
    capsys.readouterr()
    assert main(["sql", "--db", str(db), "--format", "json", f"DESCRIBE {table}"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert rows and all(r["comment"] for r in rows), [
        r["column_name"] for r in rows if not r["comment"]
    ]
