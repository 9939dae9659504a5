"""`tracelab rederive`: a store whose derived tables another tracelab computed is refused with
the command to run; rederive recomputes them from the stored events, the same numbers as at
ingest, every event kept."""

from __future__ import annotations

from pathlib import Path

import duckdb

from tracelab.cli import main
from tracelab.ingest import ingest
from tracelab.testing.synth import build_run

PARTS_SQL = "SELECT rank, step, step_ns, compute_ns, wait_ns FROM step_parts ORDER BY ALL"


def test_stale_derived_tables_are_refused_then_rederived(tmp_path: Path, capsys) -> None:
    run = build_run(tmp_path, "stragglers")
    db = tmp_path / "s.duckdb"
    ingest(run.paths, db=db, run=run.name, workers=1, progress=False)
    with duckdb.connect(str(db)) as con:
        before = con.execute(PARTS_SQL).fetchall()
        events = con.execute("SELECT count(*) FROM events").fetchall()[0][0]
        # An older tracelab's store: another derived version, a derived table emptied.
        con.execute("UPDATE tracelab_meta SET value = '0' WHERE key = 'derived_version'")
        con.execute("DELETE FROM step_parts")
    assert main(["analyze", "--db", str(db)]) == 3
    err = capsys.readouterr().err
    assert "derived version 0" in err and f"tracelab rederive --db {db}" in err
    assert main(["rederive", "--db", str(db)]) == 0
    assert "rederived 1 run(s)" in capsys.readouterr().err
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute(PARTS_SQL).fetchall() == before
        assert con.execute("SELECT count(*) FROM events").fetchall()[0][0] == events
        comment = con.execute(
            "SELECT comment FROM duckdb_columns() WHERE table_name = "
            "'step_parts' AND column_name = 'wait_ns'"
        ).fetchall()[0][0]
        assert comment and "wait" in comment.lower()
    assert main(["analyze", "--db", str(db), "--format", "json"]) == 0
