"""What a collector capture of a hung job showed (issue 21): its manifest listed only rank 0
(rank 0 wrote it when its collective timed out, before the skipping rank wrote its rank.json),
and the `parts` derivation failed with "Current transaction is aborted" (a collective that
waited out the 4 s timeout overflowed BIGINT in comm_attribution, and unregistering the Arrow
table in the aborted transaction then replaced that error). The end-to-end torchrun capture is
tests/hang/test_ingest_hang.py's test_a_collector_capture_of_a_hung_job."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from tracelab.derived import sqlfiles
from tracelab.ingest import ingest
from tracelab.store import open_store, run_id
from tracelab.testing.synth import build_run

MS = 1_000_000


def test_a_collective_that_waits_out_a_timeout_is_attributed(tmp_path: Path) -> None:
    """Rank 1 arrives 4 s late at every all-reduce: rank 0 waits 4 s, a segment whose length
    times its overlap (1.6e19 ns^2) is beyond BIGINT. The parts are derived, and the wait is
    attributed in full to rank 1."""
    run = build_run(tmp_path / "t", "stragglers", arrivals_ms=(0, 4000), end_ms=4002, steps=3)
    db = tmp_path / "s.duckdb"
    report = ingest(run.paths, db=str(db), workers=1)
    assert report.derived_errors == {}
    with open_store(db) as con:
        rid = run_id(con, report.run)
        parts = con.execute(
            "SELECT step, wait_ns FROM step_parts WHERE run_id = ? AND rank = 0 ORDER BY step",
            [rid],
        ).fetchall()
        attributed = dict(
            con.execute(
                "SELECT step, sum(exposed_ns) FROM comm_attribution WHERE run_id = ? AND rank = 0 "
                "AND part = 'wait' AND culprit_rank = 1 GROUP BY step",
                [rid],
            ).fetchall()
        )
    assert len(parts) == 3
    for step, wait_ns in parts:
        # The synthetic run's oracle: rank 0 waits arrivals[1] - arrivals[0] = 4000 ms.
        assert wait_ns == pytest.approx(run.expected["waits_ms"][0] * MS, rel=1e-6)
        assert wait_ns > 3_040_000_000  # beyond sqrt(2**63) ns: the case that overflowed
        assert attributed[step] == wait_ns


def test_one_rank_with_a_timed_out_collective_derives_its_parts(tmp_path: Path) -> None:
    """The capture's shape before the manifest fix: one rank, whose all-reduce took 4 s."""
    run = build_run(tmp_path / "t", "stragglers", arrivals_ms=(0,), end_ms=4002, steps=3)
    db = tmp_path / "s.duckdb"
    report = ingest(run.paths, db=str(db), workers=1)
    assert report.derived_errors == {} and report.ranks == [0]
    with open_store(db) as con:
        rid = run_id(con, report.run)
        rows = con.execute(
            "SELECT p.transfer_ns, (SELECT sum(exposed_ns) FROM comm_attribution c "
            "WHERE c.run_id = p.run_id AND c.step = p.step AND c.part = 'transfer') "
            "FROM step_parts p WHERE run_id = ?",
            [rid],
        ).fetchall()
    assert len(rows) == 3
    for transfer_ns, attributed in rows:
        assert transfer_ns == pytest.approx(4002 * MS, rel=1e-6) and attributed == transfer_ns


def test_a_failed_statement_keeps_its_own_error(tmp_path: Path) -> None:
    """A statement that fails inside a transaction aborts it; sqlfiles.run must raise the
    statement's error (what derived_errors records), not the "transaction is aborted" error of
    unregistering its Arrow table afterwards."""
    con = duckdb.connect(str(tmp_path / "x.duckdb"))
    con.execute(sqlfiles.schema_sql())
    con.execute("BEGIN TRANSACTION")
    bad = pa.table({"component": pa.array([None], pa.string()), "message": ["m"]})
    with pytest.raises(duckdb.ConstraintException, match="NOT NULL"):
        sqlfiles.run(con, "derived_errors", {"run": 1}, {"_tl_errors": bad})
    con.execute("ROLLBACK")
    good = pa.table({"component": ["parts"], "message": ["m"]})
    sqlfiles.run(con, "derived_errors", {"run": 1}, {"_tl_errors": good})  # usable again
    assert con.execute("SELECT run_id, component FROM derived_errors").fetchall() == [(1, "parts")]


def _manifest(root: Path, ranks: list[int]) -> None:
    doc = {"format": "tracelab.capture", "ranks": [{"rank": r, "traces": []} for r in ranks]}
    (root / "manifest.json").write_text(json.dumps(doc))


def test_a_late_rank_adds_itself_to_the_manifest(tmp_path: Path) -> None:
    from tracelab.collectors import manifest as mf

    entry = {"rank": 1, "traces": ["rank-1/window-0.pt.trace.json.gz"]}
    # Rank 0 has not written the manifest yet: it will read this rank's rank.json itself.
    assert mf.add_rank(tmp_path, entry) is False
    assert not (tmp_path / "manifest.json").exists()
    _manifest(tmp_path, [0, 2])
    assert mf.add_rank(tmp_path, entry) is True
    doc = json.loads((tmp_path / "manifest.json").read_text())
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2] and doc["ranks"][1] == entry
    assert mf.add_rank(tmp_path, entry) is False  # listed once
    assert [r["rank"] for r in json.loads((tmp_path / "manifest.json").read_text())["ranks"]] == [
        0,
        1,
        2,
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]  # no lock file left
