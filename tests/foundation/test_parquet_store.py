"""Issue 22: the events as Parquet files in the store folder, the store as their catalog
(tracelab/store/files.py). Every test runs the real CLI or ingest on a real DuckDB file."""

from __future__ import annotations

import filecmp
import gzip
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tracelab.errors import StoreError
from tracelab.ingest import ingest
from tracelab.store import open_store, store_cursor
from tracelab.store.files import MARKER, parquet_root

from .hostile import REPO, cli, snapshot
from .kineto import run_set, trace, write

FIXTURES = Path(__file__).parent / "fixtures"


def _files_on_disk(db: Path) -> set[str]:
    root = parquet_root(db)
    if not root.is_dir():
        return set()
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} - {MARKER}


def _events_on_disk(db: Path) -> set[str]:
    return {p for p in _files_on_disk(db) if "/rank=" in p and "/events-" in p}


def _memory_on_disk(db: Path) -> set[str]:
    return {p for p in _files_on_disk(db) if "/rank=" in p and "/memory-" in p}


def check_catalog(db: Path) -> dict[str, int]:
    """The invariants of the layout, read as a reader reads them: every file the catalog lists
    is there and whole (its row count as listed), each run's events are its ranks' events, and
    the events and time_parts views read exactly the listed rows. Returns events per run
    name."""
    root = parquet_root(db)
    with open_store(db) as con:
        every = con.execute(
            "SELECT path, row_count, file_bytes, kind FROM parquet_files"
        ).fetchall()
        for path, rows, size, _ in every:
            assert (root / path).stat().st_size == size, path
            assert pq.ParquetFile(root / path).metadata.num_rows == rows, path
        assert con.execute("SELECT count(*) FROM time_parts").fetchall()[0][0] == sum(
            r[1] for r in every if r[3] == "time_parts"
        )
        listed = [r[:3] for r in every if r[3] == "events"]
        for path, rows, size in listed:
            assert (root / path).stat().st_size == size, path
            assert pq.ParquetFile(root / path).metadata.num_rows == rows, path
        per_run = dict(
            con.execute(
                "SELECT r.name, (SELECT count(*) FROM events e WHERE e.run_id = r.run_id) "
                "FROM runs r"
            ).fetchall()
        )
        ranks = dict(
            con.execute(
                "SELECT r.name, sum(k.event_count) FROM runs r JOIN ranks k USING (run_id) "
                "GROUP BY r.name"
            ).fetchall()
        )
        assert per_run == ranks
        assert con.execute("SELECT count(*) FROM events").fetchall()[0][0] == sum(
            r[1] for r in listed
        )
        # The trace's memory instants: exactly the listed memory files' rows, each rank's.
        instants = con.execute(
            "SELECT run_id, rank, count(*) FROM memory WHERE source = 'trace' GROUP BY ALL"
        ).fetchall()
        counted = con.execute(
            "SELECT run_id, rank, sum(row_count) FROM parquet_files WHERE kind = 'memory' "
            "GROUP BY ALL"
        ).fetchall()
        assert sorted(instants) == sorted(counted)
    return {str(k): int(v) for k, v in per_run.items()}


def test_events_live_in_the_store_folder_and_read_as_before(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "t", ranks=3)], db=db, run="a", progress=False)
    files = _files_on_disk(db)
    assert {f for f in files if "/rank=" in f} == {
        f"run=1/rank={r}/{kind}-0.parquet" for r in range(3) for kind in ("events", "memory")
    }
    # The derived time_parts: one file for the run's one batch of ranks (part_files).
    parts = {f for f in files if "/rank=" not in f}
    assert len(parts) == 1 and next(iter(parts)).startswith("run=1/parts/time_parts-0-")
    assert check_catalog(db) == {"a": 12}
    describe = (
        "SELECT column_name, data_type, comment FROM duckdb_columns() "
        "WHERE table_name = $view ORDER BY column_index"
    )
    with open_store(db) as con:
        # The views have the columns, types and comments their empty forms document.
        described = {v: con.execute(describe, {"view": v}).fetchall() for v in ("events", "memory")}
    empty = tmp_path / "empty.duckdb"
    with open_store(empty, read_only=False):
        pass
    with open_store(empty) as con:
        for view, columns in described.items():
            assert con.execute(f"SELECT count(*) FROM {view}").fetchall() == [(0,)]
            assert con.execute(describe, {"view": view}).fetchall() == columns
            assert columns and all(c for *_, c in columns), view


def test_windows_of_one_rank_keep_their_idx(tmp_path: Path) -> None:
    """Two windows of rank 0: the second file's idx continue after the first's events."""
    from .kineto import trace, write

    cap = tmp_path / "cap"
    for w in range(2):  # one tensorboard_trace_handler worker's two windows, no rank
        write(cap / f"host_1.{1000 + w}.pt.trace.json", trace(rank=None, world=1))
    db = tmp_path / "s.duckdb"
    ingest([cap], db=db, run="w", progress=False)
    assert _events_on_disk(db) == {
        "run=1/rank=0/events-0.parquet",
        "run=1/rank=0/events-4.parquet",
    }
    with open_store(db) as con:
        idx = [r[0] for r in con.execute("SELECT idx FROM events ORDER BY idx").fetchall()]
    assert idx == list(range(8))


def test_delete_and_replace_remove_the_files(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "a", ranks=2)], db=db, run="a", progress=False)
    ingest([run_set(tmp_path / "b", ranks=3)], db=db, run="b", progress=False)
    assert {p.split("/")[0] for p in _files_on_disk(db)} == {"run=1", "run=2"}
    assert cli("delete", "a", "--db", str(db)).code == 0
    assert {p.split("/")[0] for p in _files_on_disk(db)} == {"run=2"}
    assert check_catalog(db) == {"b": 12}
    ingest([run_set(tmp_path / "b2", ranks=1)], db=db, run="b", progress=False, if_exists="replace")
    assert _events_on_disk(db) == {"run=3/rank=0/events-0.parquet"}
    assert {p.split("/")[0] for p in _files_on_disk(db)} == {"run=3"}
    assert check_catalog(db) == {"b": 4}


def test_export_copies_the_files(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "t", ranks=2)], db=db, run="a", progress=False)
    out = tmp_path / "out"
    assert cli("export", "--db", str(db), "--run", "a", "--out", str(out)).code == 0
    for r in range(2):
        assert filecmp.cmp(
            parquet_root(db) / f"run=1/rank={r}/events-0.parquet",
            out / "events" / f"rank={r}" / "events-0.parquet",
            shallow=False,
        )


def test_a_moved_store_reads_its_files_where_they_are(tmp_path: Path) -> None:
    db = tmp_path / "a" / "s.duckdb"
    db.parent.mkdir()
    ingest([run_set(tmp_path / "t", ranks=2)], db=db, run="a", progress=False)
    moved = tmp_path / "b"
    shutil.move(tmp_path / "a", moved)
    assert check_catalog(moved / "s.duckdb") == {"a": 8}  # a reader: a temporary view
    # ... which a cursor sees too (the analyzers and the app read through cursors; a bare one
    # read the old folder: "No files found" on every page of `tracelab open`).
    with open_store(moved / "s.duckdb") as con:
        parts = con.execute("SELECT count(*) FROM time_parts").fetchall()
        cur = store_cursor(con)
        assert cur.execute("SELECT count(*) FROM events").fetchall() == [(8,)]
        assert cur.execute("SELECT count(*) FROM time_parts").fetchall() == parts != [(0,)]
        cur.close()
    ingest([run_set(tmp_path / "u", ranks=1)], db=moved / "s.duckdb", run="u", progress=False)
    assert check_catalog(moved / "s.duckdb") == {"a": 8, "u": 4}
    # The file copied without its folder: refused with what to do, for readers and writers, and
    # nothing in the copy is changed (not an empty run read as if it had no events).
    alone = tmp_path / "alone" / "s.duckdb"
    alone.parent.mkdir()
    shutil.copyfile(moved / "s.duckdb", alone)
    for read_only in (True, False):
        with pytest.raises(StoreError, match="Parquet folder is missing.*copy or move both"):
            with open_store(alone, read_only=read_only):
                pass
    res = cli("analyze", "--db", str(alone))
    assert res.code == 3 and "Parquet folder is missing" in res.err and "Traceback" not in res.err


def test_a_folder_of_the_users_is_never_taken_for_the_store_folder(tmp_path: Path) -> None:
    (tmp_path / "s.parquet").mkdir()
    (tmp_path / "s.parquet" / "mine.txt").write_text("keep me")
    with pytest.raises(StoreError, match="not a tracelab store folder"):
        ingest([run_set(tmp_path / "t")], db=tmp_path / "s.duckdb", run="a", progress=False)
    assert (tmp_path / "s.parquet" / "mine.txt").read_text() == "keep me"


def test_a_version_2_store_is_refused_then_migrated(tmp_path: Path) -> None:
    """tests/foundation/fixtures/v2_store.duckdb.gz: made by tracelab at e4b8424 (schema 2) from
    run_set(ranks=2) as run 'a' and run_set(ranks=3) as run 'b'."""
    db = tmp_path / "old.duckdb"
    db.write_bytes(gzip.decompress((FIXTURES / "v2_store.duckdb.gz").read_bytes()))
    with pytest.raises(StoreError, match=f"tracelab migrate --db {db}"):
        with open_store(db):
            pass
    with pytest.raises(StoreError, match="tracelab migrate"):
        ingest([run_set(tmp_path / "x")], db=db, run="x", progress=False)
    res = cli("migrate", "--db", str(db))
    assert res.code == 0 and "20 events moved into 5 Parquet files" in res.err, res.err
    assert check_catalog(db) == {"a": 8, "b": 12}
    fresh = tmp_path / "new.duckdb"
    ingest([run_set(tmp_path / "ta", ranks=2)], db=fresh, run="a", progress=False)
    ingest([run_set(tmp_path / "tb", ranks=3)], db=fresh, run="b", progress=False)
    old, new = snapshot(db), snapshot(fresh)
    assert old["events"] == new["events"]
    assert old["steps"] == new["steps"] and old["collectives"] == new["collectives"]
    assert cli("analyze", "--db", str(db), "--run", "a").code == 0
    assert "nothing to do" in cli("migrate", "--db", str(db)).out
    ingest([run_set(tmp_path / "c", ranks=1)], db=db, run="c", progress=False)
    assert check_catalog(db) == {"a": 8, "b": 12, "c": 4}


def _raw_rows(db: Path) -> dict[str, list[str]]:
    """The events' and hang verdicts' rows, read past tracelab's version check."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return {
            "events": sorted(
                map(
                    repr,
                    con.execute(
                        "SELECT run_id, rank, idx, name, ts_ns, dur_ns, step, "
                        "CAST(args AS VARCHAR) FROM events"
                    ).fetchall(),
                )
            ),
            "hang_verdicts": sorted(
                map(repr, con.execute("SELECT * FROM hang_verdicts").fetchall())
            ),
        }
    finally:
        con.close()


def test_a_version_3_store_keeps_its_hang_verdicts_through_the_migration(tmp_path: Path) -> None:
    """tests/foundation/fixtures/v3_store.duckdb.gz: made by tracelab at ac7a405 (schema 3,
    derived 4) from run_set(ranks=2) as run 'a' and tests/hang/captures.capture('skip') as 'h'
    (8 and 24 events; one hang verdict)."""
    db = tmp_path / "v3.duckdb"
    db.write_bytes(gzip.decompress((FIXTURES / "v3_store.duckdb.gz").read_bytes()))
    with pytest.raises(StoreError, match="store schema version 3 .*tracelab migrate --db"):
        with open_store(db):
            pass
    before = _raw_rows(db)
    res = cli("migrate", "--db", str(db))
    assert res.code == 0 and "32 events moved into 4 Parquet files" in res.err, res.err
    # Its derived tables were computed by derived version 4 (time_parts a table): recomputed.
    assert "rederived 2 run(s)" in res.err, res.err
    assert check_catalog(db) == {"a": 8, "h": 24}
    after = _raw_rows(db)
    assert after["hang_verdicts"] == before["hang_verdicts"] and len(after["hang_verdicts"]) == 1
    assert after["events"] == before["events"] and len(after["events"]) == 32
    with open_store(db) as con:  # opens: the schema and derived versions are this tracelab's
        assert con.execute("SELECT count(*) FROM job_steps").fetchall()[0][0] > 0
    out = tmp_path / "export"
    assert cli("export", "--db", str(db), "--run", "h", "--out", str(out)).code == 0
    assert pq.read_table(out / "hang_verdicts.parquet").num_rows == 1


def _as_version_6(con: Any, db: Path) -> None:
    """A store of this tracelab turned into what version 6 wrote: a memory table holding the
    trace's memory instants (each rank's in its trace's order) and the collector's step peaks;
    no memory files, no memory_peaks."""
    con.execute(
        "CREATE TABLE _m AS SELECT * EXCLUDE (idx) FROM memory ORDER BY source, run_id, rank, idx"
    )
    con.execute("DROP VIEW memory")
    con.execute("DROP TABLE memory_peaks")
    con.execute("ALTER TABLE _m RENAME TO memory")
    paths = con.execute("SELECT path FROM parquet_files WHERE kind = 'memory'").fetchall()
    con.execute("DELETE FROM parquet_files WHERE kind = 'memory'")
    for (path,) in paths:
        (parquet_root(db) / path).unlink()
    con.execute("UPDATE tracelab_meta SET value = '6' WHERE key = 'schema_version'")


def test_a_version_6_store_moves_its_memory_instants_into_files(tmp_path: Path) -> None:
    """A version 6 store (`memory` a table of the trace's instants and the collector's step
    peaks, as version 6 wrote it) is refused with the command, then migrated in place: the
    instants become a file per run and rank beside the events, the peaks stay rows
    (memory_peaks), and `memory` reads every row it had, each rank's instants in the order
    they were stored (idx); new runs ingest."""
    import duckdb

    db = tmp_path / "v6.duckdb"
    ingest([run_set(tmp_path / "ta", ranks=2)], db=db, run="a", progress=False)
    ingest([REPO / "sample_traces" / "ddp"], db=db, run="ddp", progress=False)
    before = snapshot(db)
    with open_store(db) as con:
        sources = dict(con.execute("SELECT source, count(*) FROM memory GROUP BY ALL").fetchall())
        instants = con.execute(
            "SELECT run_id, rank, count(*) FROM memory WHERE source = 'trace' GROUP BY ALL"
        ).fetchall()
    assert sources.get("trace") and sources.get("step_peak"), sources
    con = duckdb.connect(str(db))
    try:
        _as_version_6(con, db)
    finally:
        con.close()
    assert _memory_on_disk(db) == set()
    with pytest.raises(StoreError, match="store schema version 6 .*tracelab migrate --db"):
        with open_store(db):
            pass
    res = cli("migrate", "--db", str(db))
    assert res.code == 0 and "from schema version 6 to 7" in res.err, res.err
    assert f"{sources['trace']} trace memory instants into {len(instants)} Parquet files" in res.err
    assert "rederived" not in res.err
    assert snapshot(db) == before
    assert _memory_on_disk(db) == {
        f"run={rid}/rank={rank}/memory-0.parquet" for rid, rank, _ in instants
    }
    with open_store(db) as con:
        peaks = con.execute("SELECT count(*) FROM memory_peaks").fetchall()[0][0]
    assert peaks == sources["step_peak"]
    assert "nothing to do" in cli("migrate", "--db", str(db)).out
    ingest([run_set(tmp_path / "tb", ranks=1)], db=db, run="b", progress=False)
    assert check_catalog(db)["b"] == 4


def _as_version_5(con: Any, db: Path) -> None:
    """A store of this tracelab turned into what version 5 wrote: each rank's own copy of its
    process-group configuration (ranks.process_groups), no process_group_configs."""
    _as_version_6(con, db)
    con.execute("ALTER TABLE ranks ADD COLUMN process_groups JSON")
    con.execute(
        "UPDATE ranks SET process_groups = c.process_groups FROM process_group_configs c "
        "WHERE c.run_id = ranks.run_id AND c.config = ranks.process_groups_config"
    )
    con.execute("ALTER TABLE ranks ALTER COLUMN process_groups SET NOT NULL")
    con.execute("ALTER TABLE ranks DROP COLUMN process_groups_config")
    con.execute("DROP TABLE process_group_configs")
    con.execute("UPDATE tracelab_meta SET value = '5' WHERE key = 'schema_version'")


def _groups_of_ranks(db: Path) -> dict[tuple[str, int], Any]:
    with open_store(db, read_only=True) as con:
        rows = con.execute(
            "SELECT n.name, r.rank, CAST(c.process_groups AS VARCHAR) FROM ranks r "
            "JOIN runs n USING (run_id) JOIN process_group_configs c "
            "ON c.run_id = r.run_id AND c.config = r.process_groups_config"
        ).fetchall()
    return {(name, rank): json.loads(text) for name, rank, text in rows}


def test_a_version_5_store_keeps_each_process_group_configuration_once(tmp_path: Path) -> None:
    """A version 5 store (a copy of the configuration per rank) is refused with the command,
    then migrated in place: each run's distinct configurations once, numbered from its lowest
    rank, each rank naming its own; the derived groups as they were; it takes new runs."""
    import duckdb

    from tracelab.testing.synth import MS, RankTrace, write_ranks

    db = tmp_path / "v5.duckdb"
    ingest([run_set(tmp_path / "ta", ranks=2)], db=db, run="a", progress=False)
    traces = [RankTrace(r, 4, pg_ranks=[0, 1] if r < 2 else [2, 3]) for r in range(4)]
    for t in traces:
        t.step(1, 0, 10 * MS)
        t.kernel("gemm", 1 * MS, 2 * MS)
    ingest(write_ranks(tmp_path / "tb", traces), db=db, run="b", progress=False)
    before, groups = snapshot(db), _groups_of_ranks(db)
    with open_store(db, read_only=True) as con:
        derived = con.execute("SELECT * FROM process_groups ORDER BY ALL").fetchall()
    con = duckdb.connect(str(db))
    try:
        _as_version_5(con, db)
    finally:
        con.close()
    with pytest.raises(StoreError, match=r"version 5 \(a copy of the .*tracelab migrate --db"):
        with open_store(db):
            pass
    res = cli("migrate", "--db", str(db))
    assert res.code == 0 and "from schema version 5 to 7" in res.err, res.err
    assert _groups_of_ranks(db) == groups
    with open_store(db, read_only=True) as con:
        configs = con.execute(
            "SELECT n.name, c.config, CAST(c.process_groups -> '$[0].ranks' AS VARCHAR) "
            "FROM process_group_configs c JOIN runs n USING (run_id) ORDER BY ALL"
        ).fetchall()
        ranks = con.execute(
            "SELECT rank, process_groups_config FROM ranks JOIN runs USING (run_id) "
            "WHERE name = 'b' ORDER BY rank"
        ).fetchall()
        assert con.execute("SELECT * FROM process_groups ORDER BY ALL").fetchall() == derived
    assert configs == [("a", 0, "[0,1]"), ("b", 0, "[0,1]"), ("b", 1, "[2,3]")]
    assert ranks == [(0, 0), (1, 0), (2, 1), (3, 1)]
    after = snapshot(db)
    assert after["events"] == before["events"] and after["collectives"] == before["collectives"]
    assert "nothing to do" in cli("migrate", "--db", str(db)).out
    ingest([run_set(tmp_path / "tc", ranks=1)], db=db, run="c", progress=False)
    assert check_catalog(db)["c"] == 4


def test_a_version_4_store_gains_the_split_columns(tmp_path: Path) -> None:
    """A version 4 store (the current DDL less collectives.in_split_bytes / out_split_bytes, as
    version 4 wrote it) is refused with the command, then migrated in place: the columns are
    there (NULL on any row it had), its events and steps as they were, and it takes new runs."""
    import duckdb

    db = tmp_path / "v4.duckdb"
    ingest([run_set(tmp_path / "ta", ranks=2)], db=db, run="a", progress=False)
    before = snapshot(db)
    con = duckdb.connect(str(db))
    try:
        _as_version_5(con, db)
        for col in ("in_split_bytes", "out_split_bytes"):
            con.execute(f"ALTER TABLE collectives DROP COLUMN {col}")
        con.execute("UPDATE tracelab_meta SET value = '4' WHERE key = 'schema_version'")
    finally:
        con.close()
    with pytest.raises(StoreError, match="store schema version 4 .*tracelab migrate --db"):
        with open_store(db):
            pass
    res = cli("migrate", "--db", str(db))
    assert res.code == 0 and "from schema version 4 to 7" in res.err, res.err
    assert "rederived" not in res.err
    with open_store(db) as con:
        rows = con.execute(
            "SELECT count(*), count(in_split_bytes), count(out_split_bytes) FROM collectives"
        ).fetchall()[0]
        comment = con.execute(
            "SELECT comment FROM duckdb_columns() WHERE table_name = 'collectives' "
            "AND column_name = 'in_split_bytes'"
        ).fetchall()[0][0]
    assert rows[1:] == (0, 0)  # the columns are there, NULL on the rows it had
    assert comment and comment.startswith("All-to-all only")
    after = snapshot(db)
    assert after["events"] == before["events"] and after["steps"] == before["steps"]
    assert "nothing to do" in cli("migrate", "--db", str(db)).out
    ingest([run_set(tmp_path / "tb", ranks=1)], db=db, run="b", progress=False)
    assert check_catalog(db) == {"a": 8, "b": 4}


def _ingest_cmd(data: Path, db: Path, run: str) -> list[str]:
    return [sys.executable, "-m", "tracelab.cli", "ingest", str(data), "--db", str(db)] + [
        "--run",
        run,
        "--workers",
        "2",
    ]


@pytest.fixture(scope="module")
def two_ranks() -> Path:
    """Two copies of a real 54 MB trace (benchmarks/datasets.py), long enough to kill."""
    sys.path.insert(0, str(REPO))
    from benchmarks.datasets import rank_set

    if not Path(rank_set.__globals__["SOURCE"]).is_file():
        pytest.skip("needs the shared HTA traces")
    return rank_set(2)


def _stage(tmp_path: Path, db: Path) -> str:
    """Where the ingest is now, as seen from outside."""
    if any(p.name.startswith("run=") and p.name != "run=1" for p in parquet_root(db).glob("*")):
        return "placed"
    if list(tmp_path.glob(".tracelab-ingest-*/run.parquet/run=*")):
        return "staged"  # (built in the staged store: tracelab.store.staged)
    return "converting"


@pytest.mark.parametrize("at", ["converting", "staged", "placed"])
def test_sigkill_never_leaves_a_listed_file_incomplete(
    at: str, two_ranks: Path, tmp_path: Path
) -> None:
    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "good")], db=db, run="good", progress=False)
    proc = subprocess.Popen(
        _ingest_cmd(two_ranks, db, "big"), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    order = ["converting", "staged", "placed"]
    seen = "converting"
    while proc.poll() is None:
        seen = _stage(tmp_path, db)
        if order.index(seen) >= order.index(at):
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.002)
    proc.communicate(timeout=60)
    if proc.returncode != -signal.SIGKILL:
        pytest.skip(f"the ingest ended ({proc.returncode}) before it was seen {at}")
    assert seen == at
    runs = check_catalog(db)  # the committed runs whole, whatever the moment of the kill
    assert runs.get("good") == 8 and set(runs) <= {"good", "big"}
    if at != "placed":
        assert "big" not in runs, "a run commits only after its files are placed"
    # The next writer removes what the killed one left; the folder holds the listed files only.
    ingest([run_set(tmp_path / "next", ranks=1)], db=db, run="next", progress=False)
    with open_store(db) as con:
        listed = {r[0] for r in con.execute("SELECT path FROM parquet_files").fetchall()}
    assert _files_on_disk(db) == listed


def test_readers_see_a_run_whole_or_not_at_all(two_ranks: Path, tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "good")], db=db, run="good", progress=False)
    proc = subprocess.Popen(
        _ingest_cmd(two_ranks, db, "big"), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    seen: list[int] = []
    while proc.poll() is None:
        with open_store(db) as con:
            seen.append(
                con.execute(
                    "SELECT count(*) FROM events WHERE run_id IN "
                    "(SELECT run_id FROM runs WHERE name = 'big')"
                ).fetchall()[0][0]
            )
        time.sleep(0.01)
    assert proc.returncode == 0, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
    full = check_catalog(db)["big"]
    assert set(seen) <= {0, full} and seen.count(0) > 5, set(seen)


def test_readers_are_not_blocked_while_the_run_is_derived(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run is loaded and derived in a staged store (tracelab.store.staged), not inside the
    store's write: a reader in another process opens the store at once meanwhile
    (TRACELAB_LOCK_TIMEOUT_S=0), and sees the runs committed before, not the one being built.
    The check runs where the derivation's per-rank batches start (the runner's map)."""
    import os

    from tracelab.derived import part_batches
    from tracelab.ingest import orchestrate

    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "good")], db=db, run="good", progress=False)
    seen: list[tuple[int, str]] = []

    def reading_map(fn, jobs):  # type: ignore[no-untyped-def]
        query = "SELECT string_agg(name, ',' ORDER BY name) AS names FROM runs"
        res = subprocess.run(
            [sys.executable, "-m", "tracelab.cli", "sql", query, "--db", str(db)]
            + ["--format", "csv"],
            env={**os.environ, "TRACELAB_LOCK_TIMEOUT_S": "0"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        seen.append((res.returncode, res.stdout + res.stderr))
        return map(fn, jobs)

    monkeypatch.setattr(
        orchestrate, "_batch_runner", lambda *_a: (part_batches.Runner(map=reading_map), [])
    )
    ingest([run_set(tmp_path / "new", ranks=2)], db=db, run="new", progress=False)
    assert seen, "the derivation ran no batch"
    assert all(code == 0 for code, _ in seen), seen
    assert all(text.split() == ["names", "good"] for _, text in seen), seen
    assert check_catalog(db) == {"good": 8, "new": 8}


@pytest.mark.parametrize("kind", ["events", "time_parts", "a later events file"])
def test_a_file_removed_from_outside_names_its_run_and_the_way_out(
    kind: str, tmp_path: Path
) -> None:
    """One listed file removed from outside tracelab: DuckDB binds the first file of a view as
    it is created, so with that one gone every later ingest and the delete that would repair
    the store failed as an internal error (exit 70); with another one gone a rederive recorded
    it as a failed component of every other run. Now exit 3 naming the run (an ingest before it
    converts anything), whose delete repairs the store."""
    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "a", ranks=2)], db=db, run="a", progress=False)
    ingest([run_set(tmp_path / "b", ranks=1)], db=db, run="b", progress=False)
    pattern = {
        "events": "run=1/rank=0/events-*.parquet",
        "time_parts": "run=1/parts/*.parquet",
        "a later events file": "run=1/rank=1/events-*.parquet",
    }[kind]
    victim = sorted(parquet_root(db).glob(pattern))[0]
    victim.unlink()
    named = ["sql", f"SELECT count(*) FROM {'time_parts' if kind == 'time_parts' else 'events'}",
             "--db", str(db)]  # fmt: skip
    later = ["ingest", str(run_set(tmp_path / "c", ranks=1)), "--db", str(db), "--run", "c"]
    for args in (named, ["rederive", "--db", str(db)], later):
        res = cli(*args)
        assert res.code == 3, (args[0], res.err)
        assert "1 of the files this store lists is not there" in res.err, res.err
        assert victim.relative_to(parquet_root(db)).as_posix() in res.err
        assert "of run 'a'" in res.err and "tracelab delete RUN" in res.err, res.err
    assert cli("delete", "a", "--db", str(db)).code == 0
    assert cli("rederive", "--db", str(db)).code == 0
    ingest([run_set(tmp_path / "c", ranks=1)], db=db, run="c", progress=False)
    assert check_catalog(db) == {"b": 4, "c": 4}
    with open_store(db) as con:
        assert not con.execute("SELECT * FROM derived_errors").fetchall()


def test_the_writers_sweep_removes_every_unlisted_file_by_the_layout(tmp_path: Path) -> None:
    """The sweep reads the folder by its layout (tracelab.store.files.sweep): whatever is
    not listed goes, in a listed run's folder too, and every listed file stays."""
    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "a", ranks=2)], db=db, run="a", progress=False)
    root = parquet_root(db)
    strays = [
        "run=1/rank=7/events-0.parquet",  # a rank the run does not list
        "run=1/parts/time_parts-0-old.parquet",  # a rederive's old parts
        "run=1/notes.txt",
        "run=99/rank=0/events-0.parquet",  # a killed ingest's placed run
        ".run=5.partial/rank=0/events-0.parquet",  # a killed copy across file systems
        "junk.txt",
    ]
    for rel in strays:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    ingest([run_set(tmp_path / "b", ranks=1)], db=db, run="b", progress=False)
    with open_store(db) as con:
        listed = {r[0] for r in con.execute("SELECT path FROM parquet_files").fetchall()}
    assert _files_on_disk(db) == listed
    assert not [rel for rel in strays if (root / rel).exists()]
    assert check_catalog(db) == {"a": 8, "b": 4}


def test_concurrent_ingests_both_land(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "first")], db=db, run="first", progress=False)
    procs = [
        subprocess.Popen(
            _ingest_cmd(run_set(tmp_path / n, ranks=3), db, n),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for n in ("x", "y", "z")
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()[-2000:]
    assert check_catalog(db) == {"first": 8, "x": 12, "y": 12, "z": 12}
    with open_store(db) as con:
        listed = {r[0] for r in con.execute("SELECT path FROM parquet_files").fetchall()}
    assert _files_on_disk(db) == listed


def test_sql_reads_the_store_folder_only(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "t")], db=db, run="a", progress=False)
    ok = cli("sql", "SELECT count(*) AS n FROM events", "--db", str(db), "--format", "csv")
    assert ok.code == 0 and ok.out.splitlines() == ["n", "8"]
    outside = tmp_path / "t" / "rank-0.json"
    bad = cli("sql", f"SELECT * FROM read_text('{outside}')", "--db", str(db))
    assert bad.code == 2 and "the query failed" in bad.err, bad.err


def test_a_converted_capture_is_registered_not_copied(tmp_path: Path) -> None:
    """What the collector's convert=True leaves (`tracelab convert TRACE` on each rank) is the
    store's own layout: the ingest links those events files into the store folder, no parse
    and no copy (the same inode where the capture and the store share a file system)."""
    from tracelab.ingest.converted import converted_dir

    data = run_set(tmp_path / "cap", ranks=2)
    for r in range(2):
        assert cli("convert", str(data / f"rank-{r}.json")).code == 0
    db = tmp_path / "s.duckdb"
    ingest([data], db=db, run="a", progress=False)
    for r in range(2):
        assert (parquet_root(db) / f"run=1/rank={r}/events-0.parquet").samefile(
            converted_dir(data / f"rank-{r}.json") / "events.parquet"
        )
    assert check_catalog(db) == {"a": 8}


@pytest.mark.parametrize("first,second", [("s.duckdb", "s"), ("s", "s.duckdb")])
def test_two_store_files_of_one_folder_never_share_it(tmp_path: Path, first, second) -> None:
    # `--db s` and `--db s.duckdb` both keep their files in s.parquet/: the second is refused
    # before it creates its file, and the first keeps every file and row.
    ingest([run_set(tmp_path / "t", ranks=2)], db=tmp_path / first, run="a", progress=False)
    before = check_catalog(tmp_path / first)
    files = _files_on_disk(tmp_path / first)
    res = cli("ingest", str(run_set(tmp_path / "u", ranks=1)), "--db", str(tmp_path / second))
    assert res.code == 3 and "holds the files of the store" in res.err, res.err
    assert "Traceback" not in res.err and not (tmp_path / second).exists()
    assert check_catalog(tmp_path / first) == before == {"a": 8}
    assert _files_on_disk(tmp_path / first) == files
    assert (parquet_root(tmp_path / first) / MARKER).read_text().strip() == first


def test_a_marker_of_older_tracelab_is_claimed_unless_both_store_files_exist(
    tmp_path: Path,
) -> None:
    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "t", ranks=2)], db=db, run="a", progress=False)
    marker = parquet_root(db) / MARKER
    marker.write_text("s\n")  # as tracelab wrote it before the marker named the store file
    ingest([run_set(tmp_path / "u", ranks=1)], db=db, run="u", progress=False)
    assert marker.read_text().strip() == "s.duckdb"  # a writer claims it
    # Both files beside one folder whose marker holds the stem: it names `s` (the marker of a
    # store file without .duckdb reads the same in both formats), and s.duckdb is refused.
    shutil.copyfile(db, tmp_path / "s")
    marker.write_text("s\n")
    with pytest.raises(StoreError, match="holds the files of the store"):
        with open_store(db, read_only=True):
            pass
    assert check_catalog(tmp_path / "s") == {"a": 8, "u": 4}
    assert marker.read_text().strip() == "s"


def test_a_store_renamed_with_its_folder_opens_under_its_new_name(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "t", ranks=2)], db=db, run="a", progress=False)
    db.rename(tmp_path / "r.duckdb")
    parquet_root(db).rename(tmp_path / "r.parquet")
    assert check_catalog(tmp_path / "r.duckdb") == {"a": 8}
    ingest([run_set(tmp_path / "u", ranks=1)], db=tmp_path / "r.duckdb", run="u", progress=False)
    assert check_catalog(tmp_path / "r.duckdb") == {"a": 8, "u": 4}
    assert (tmp_path / "r.parquet" / MARKER).read_text().strip() == "r.duckdb"


def _durations(db: Path) -> list[tuple[int, int]]:
    with open_store(db) as con:
        return con.execute(
            "SELECT rank, sum(dur_ns) FROM events GROUP BY rank ORDER BY rank"
        ).fetchall()


def test_converting_a_trace_again_leaves_the_ingested_events_as_they_were(tmp_path: Path) -> None:
    # A store's events files are links to a converted folder's (the collector's `convert=True`,
    # `tracelab convert`): converting a changed trace again replaces that folder's files; the
    # store keeps the files it ingested.
    folder = run_set(tmp_path / "t", ranks=2)
    for rank in range(2):
        assert cli("convert", str(folder / f"rank-{rank}.json")).code == 0
    db = tmp_path / "s.duckdb"
    ingest([folder], db=db, run="a", progress=False)
    before, events = _durations(db), check_catalog(db)
    stored = parquet_root(db) / "run=1/rank=0/events-0.parquet"
    converted = folder / "rank-0.tracelab" / "events.parquet"
    assert stored.stat().st_ino == converted.stat().st_ino  # registered, not parsed again
    other = trace(
        rank=0,
        world=2,
        events=[
            {"ph": "X", "name": "other", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 5.0, "dur": 7.0}
        ],
    )
    write(folder / "rank-0.json", other)
    res = cli("convert", str(folder / "rank-0.json"))
    assert res.code == 0, res.err
    assert pq.ParquetFile(converted).metadata.num_rows == 1  # the folder holds the new trace
    assert _durations(db) == before and check_catalog(db) == events
    assert not list(folder.glob("*.tmp-*"))


KILLED_CONVERT = """
import os, signal, sys
import tracelab.ingest.convert as convert
convert.os.rename = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # dies as it renames
convert.convert_beside(sys.argv[1])
"""


def test_a_conversion_killed_before_its_rename_leaves_nothing_an_ingest_reads(
    tmp_path: Path,
) -> None:
    folder = run_set(tmp_path / "t", ranks=2)
    res = subprocess.run([sys.executable, "-c", KILLED_CONVERT, str(folder / "rank-0.json")])
    assert res.returncode == -signal.SIGKILL
    assert not (folder / "rank-0.tracelab").exists()
    assert [p.name for p in folder.iterdir() if p.name.startswith(".rank-0.tracelab.tmp-")]
    report = ingest([folder], db=tmp_path / "s.duckdb", run="a", progress=False)
    assert report.ranks == [0, 1] and report.ignored == []


CONVERT_LOOP = """
import sys
from tracelab.ingest.convert import convert_beside
for _ in range(int(sys.argv[2])):
    convert_beside(sys.argv[1])
"""


def test_two_conversions_of_one_trace_at_once_both_succeed(tmp_path: Path) -> None:
    from tracelab.ingest.converted import load_converted

    trace_file = run_set(tmp_path / "t", ranks=1) / "rank-0.json"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONVERT_LOOP, str(trace_file), "40"],
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    assert load_converted(trace_file) is not None
    assert sorted(p.name for p in trace_file.parent.iterdir()) == ["rank-0.json", "rank-0.tracelab"]


def test_migrate_never_writes_into_another_stores_folder(tmp_path: Path) -> None:
    """An old store `x` beside a store `x.duckdb` (both map to x.parquet/): `tracelab migrate`
    skipped the owner check every other writer makes, wrote x's events files over x.duckdb's
    (9,364 events read as 4,690) and failed after. Now it is refused before it writes."""
    ingest([run_set(tmp_path / "t", ranks=2)], db=tmp_path / "x.duckdb", run="a", progress=False)
    before = check_catalog(tmp_path / "x.duckdb")
    files = _files_on_disk(tmp_path / "x.duckdb")
    (tmp_path / "x").write_bytes(gzip.decompress((FIXTURES / "v3_store.duckdb.gz").read_bytes()))
    res = cli("migrate", "--db", str(tmp_path / "x"))
    assert res.code == 3 and "holds the files of the store" in res.err, res.err
    assert check_catalog(tmp_path / "x.duckdb") == before
    assert _files_on_disk(tmp_path / "x.duckdb") == files


def test_a_store_or_an_export_inside_a_store_folder_is_refused(tmp_path: Path) -> None:
    """Both were accepted, and the outer store's next write swept them away (its folder holds
    only what it lists)."""
    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "t", ranks=2)], db=db, run="a", progress=False)
    inner = parquet_root(db) / "inner.duckdb"
    res = cli("ingest", str(run_set(tmp_path / "u", ranks=1)), "--db", str(inner))
    assert res.code == 3 and "another store's Parquet folder" in res.err, res.err
    assert not inner.exists()
    out = parquet_root(db) / "exp"
    res = cli("export", "--db", str(db), "--run", "a", "--out", str(out))
    assert res.code == 2 and "Choose an --out outside it" in res.err, res.err
    assert not out.exists()
    assert check_catalog(db) == {"a": 8}


def test_a_write_interrupted_after_its_commit_keeps_its_own_error() -> None:
    """A SIGTERM that landed as the COMMIT ended (the Ray engine) found no transaction to roll
    back, and DuckDB's "cannot rollback - no transaction is active" replaced it (exit 70)."""
    import duckdb

    from tracelab.store.open import rollback as _rollback

    con = duckdb.connect()
    _rollback(con)  # no transaction: nothing to do, no error
    con.execute("BEGIN TRANSACTION")
    con.execute("CREATE TABLE t (x INTEGER)")
    _rollback(con)
    assert not con.execute("SELECT * FROM duckdb_tables() WHERE table_name = 't'").fetchall()


def test_a_version_6_store_that_lost_an_events_file_migrates_then_deletes_the_run(
    tmp_path: Path,
) -> None:
    """The migration lists the memory files without binding the events view again: a store
    whose events file was removed outside tracelab still migrates, and the run it names can
    then be deleted (the error names `tracelab delete`, which needs a store of this version)."""
    import duckdb

    db = tmp_path / "v6.duckdb"
    ingest([run_set(tmp_path / "ta", ranks=2)], db=db, run="a", progress=False)
    ingest([run_set(tmp_path / "tb", ranks=1)], db=db, run="b", progress=False)
    con = duckdb.connect(str(db))
    try:
        _as_version_6(con, db)
    finally:
        con.close()
    (parquet_root(db) / "run=1/rank=0/events-0.parquet").unlink()
    res = cli("migrate", "--db", str(db))
    assert res.code == 0 and "from schema version 6 to 7" in res.err, res.err
    res = cli("delete", "a", "--db", str(db))
    assert res.code == 0, res.err
    assert check_catalog(db) == {"b": 4}


def test_a_runs_memory_is_read_from_its_own_files(tmp_path: Path) -> None:
    """The memory analyzer and page read a run's own memory files (run_memory_sql), not the
    view over every run's (which binds them all): with another run's memory file gone, a run's
    memory reads as the view gives it, and its analysis runs."""
    from tracelab.store.files import run_memory_sql

    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "ta", ranks=2)], db=db, run="a", progress=False)
    ingest([run_set(tmp_path / "tb", ranks=1)], db=db, run="b", progress=False)
    with open_store(db) as con:
        whole = con.execute("SELECT * FROM memory WHERE run_id = 2 ORDER BY ALL").fetchall()
    (parquet_root(db) / "run=1/rank=0/memory-0.parquet").unlink()
    with open_store(db) as con:
        scoped = con.execute(f"SELECT * FROM {run_memory_sql(con, 2)} ORDER BY ALL").fetchall()
    assert scoped == whole and scoped
    res = cli("analyze", "--db", str(db), "--run", "b", "--only", "memory", "--format", "json")
    assert res.code == 0, res.err
