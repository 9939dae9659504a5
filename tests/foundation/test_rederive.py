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


#: Derived rows of a run, per table (time_parts is a view over its Parquet files).
DERIVED_COUNTS = """
SELECT (SELECT count(*) FROM step_parts WHERE run_id = $r),
       (SELECT count(*) FROM time_parts WHERE run_id = $r),
       (SELECT count(*) FROM matched_collectives WHERE run_id = $r),
       (SELECT count(*) FROM step_spans WHERE run_id = $r)
"""


def _two_runs(tmp_path: Path) -> tuple[Path, dict[str, tuple[int, ...]]]:
    db = tmp_path / "s.duckdb"
    for name in ("stragglers", "overlap"):
        run = build_run(tmp_path / name, name)
        ingest(run.paths, db=db, run=name, workers=1, progress=False)
    return db, _counts(db)


def _counts(db: Path) -> dict[str, tuple[int, ...]]:
    with duckdb.connect(str(db), read_only=True) as con:
        runs = con.execute("SELECT run_id, name FROM runs").fetchall()
        return {name: con.execute(DERIVED_COUNTS, {"r": rid}).fetchall()[0] for rid, name in runs}


def test_rederive_of_one_run_keeps_the_others(tmp_path: Path, capsys) -> None:
    db, before = _two_runs(tmp_path)
    assert all(n > 0 for counts in before.values() for n in counts), before
    with duckdb.connect(str(db)) as con:  # the named run's parts lost: rederive restores them
        con.execute(
            "DELETE FROM step_parts WHERE run_id = (SELECT run_id FROM runs WHERE name = 'overlap')"
        )
    assert main(["rederive", "--db", str(db), "--run", "overlap"]) == 0
    assert "rederived 1 run(s)" in capsys.readouterr().err
    assert _counts(db) == before


def test_rederive_of_one_run_on_a_stale_store_rederives_every_run(tmp_path: Path, capsys) -> None:
    db, before = _two_runs(tmp_path)
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE tracelab_meta SET value = '0' WHERE key = 'derived_version'")
    assert main(["rederive", "--db", str(db), "--run", "overlap"]) == 0
    err = capsys.readouterr().err
    assert "every run" in err and "rederived 2 run(s)" in err
    assert _counts(db) == before
    assert main(["analyze", "--db", str(db), "--run", "stragglers", "--format", "json"]) == 0


def test_rederive_of_an_unknown_run_changes_nothing(tmp_path: Path, capsys) -> None:
    db, before = _two_runs(tmp_path)
    assert main(["rederive", "--db", str(db), "--run", "no-such-run"]) in (2, 3)
    assert "no-such-run" in capsys.readouterr().err
    assert _counts(db) == before


def test_a_rederive_stopped_between_runs_leaves_a_store_that_says_so(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    import tracelab.derived as derived

    db, before = _two_runs(tmp_path)
    real = derived.derive_in_transaction
    calls = []

    def stopped(con, rid, runner=None):
        calls.append(rid)
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C after the first run's commit
        return real(con, rid, runner)

    monkeypatch.setattr(derived, "derive_in_transaction", stopped)
    assert main(["rederive", "--db", str(db)]) != 0
    assert "interrupted" in capsys.readouterr().err
    monkeypatch.setattr(derived, "derive_in_transaction", real)
    # The second run has no derived rows yet: readers are refused with the command to finish.
    assert main(["analyze", "--db", str(db), "--run", "overlap"]) == 3
    err = capsys.readouterr().err
    assert "were being recomputed when that stopped" in err and f"rederive --db {db}" in err
    assert main(["rederive", "--db", str(db), "--run", "overlap"]) == 0
    assert "rederived 2 run(s)" in capsys.readouterr().err
    assert _counts(db) == before


def test_an_ingest_into_a_stale_store_is_refused_before_converting(tmp_path: Path, capsys) -> None:
    """The write's refusal came after every trace was converted (2.6 s of a 16-rank ingest; at
    scale the whole conversion). A broken trace shows the order: the store is named first."""
    run = build_run(tmp_path, "stragglers")
    db = tmp_path / "s.duckdb"
    ingest(run.paths, db=db, run=run.name, workers=1, progress=False)
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE tracelab_meta SET value = '0' WHERE key = 'derived_version'")
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [')
    assert main(["ingest", str(bad), "--db", str(db), "--run", "new"]) == 3
    err = capsys.readouterr().err
    assert f"tracelab rederive --db {db}" in err and "bad.json" not in err, err


def test_the_keyed_collectives_are_made_once_a_pass_and_never_outlive_it(
    tmp_path: Path, monkeypatch
) -> None:
    """The clocks' bounds and the matches read one temp table of keyed_collectives' rows
    (collectives.keyed): made once per derive pass, for that pass's run only, then dropped, so
    a second run derived on the same connection never reads the first one's rows."""
    from tracelab.derived import collectives, derive_in_transaction

    runs = [build_run(tmp_path / n, "stragglers", steps=s) for n, s in (("a", 2), ("b", 3))]
    db = tmp_path / "s.duckdb"
    for n, r in zip("ab", runs, strict=True):
        ingest(r.paths, db=db, run=n, workers=1, progress=False)
    made: list[int] = []
    real = collectives.host_bytes_needed
    monkeypatch.setattr(
        collectives,
        "host_bytes_needed",
        lambda con, run_id, source: made.append(run_id) or real(con, run_id, source),
    )
    query = (
        "SELECT run_id, match_key, rank, start_ns, wait_ns FROM matched_collectives ORDER BY ALL"
    )
    with duckdb.connect(str(db)) as con:
        before = con.execute(query).fetchall()
        offsets = con.execute("SELECT * FROM clock_offsets ORDER BY ALL").fetchall()
        for run_id in (1, 2, 1):
            derive_in_transaction(con, run_id)
        assert made == [1, 2, 1]
        assert con.execute(query).fetchall() == before
        assert con.execute("SELECT * FROM clock_offsets ORDER BY ALL").fetchall() == offsets
        temp = "SELECT count(*) FROM duckdb_tables() WHERE temporary AND table_name = $t"
        assert con.execute(temp, {"t": collectives.KEYED}).fetchall() == [(0,)]
    assert {r[0] for r in before} == {1, 2}
