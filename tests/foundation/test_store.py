"""Run isolation, idempotent re-ingest, replace/refuse, deletion, versions, and readers during
an ingest."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from tracelab.errors import StoreError, UsageError
from tracelab.ingest import ingest
from tracelab.store import delete_run, list_runs, open_store, run_id
from tracelab.store_folder import parquet_root

from .hostile import REPO, RUN_BASE_TABLES
from .kineto import run_set, trace, write


def counts(db: Path, run: str) -> dict[str, int]:
    with open_store(db) as con:
        rid = run_id(con, run)
        return {
            t: con.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?", [rid]).fetchone()[0]
            for t in ("events", "steps", "ranks", "memory", "lanes", "collectives")
        }


def test_reingest_of_identical_files_is_a_no_op(tmp_path: Path) -> None:
    db, folder = tmp_path / "s.duckdb", run_set(tmp_path / "t", ranks=2)
    first = ingest([folder], db=db, run="a", progress=False)
    again = ingest([folder], db=db, run="a", progress=False)
    assert again.unchanged and again.run_id == first.run_id
    assert counts(db, "a") == {
        "events": 8,
        "steps": 2,
        "ranks": 2,
        "memory": 2,
        "lanes": 2,
        "collectives": 0,
    }


def test_changed_files_are_refused_then_replaced(tmp_path: Path) -> None:
    db, folder = tmp_path / "s.duckdb", run_set(tmp_path / "t", ranks=2)
    ingest([folder], db=db, run="a", progress=False)
    ingest([run_set(tmp_path / "u", ranks=1)], db=db, run="b", progress=False)
    write(folder / "rank-1.json", trace(rank=1, world=2, base=1_800_000_000_000_000_000))
    with pytest.raises(UsageError, match="--replace"):
        ingest([folder], db=db, run="a", progress=False)
    ingest([folder], db=db, run="a", if_exists="replace", progress=False)
    with open_store(db) as con:
        names = sorted(r["name"] for r in list_runs(con))
        starts = con.execute(
            "SELECT min(ts_ns) FROM events JOIN runs USING (run_id) WHERE runs.name = 'a' AND rank = 1"
        ).fetchone()[0]
    assert names == ["a", "b"]
    assert starts == 1_800_000_000_000_000_000
    assert counts(db, "b")["events"] == 4


def test_delete_run_removes_every_row(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "t")], db=db, run="a", progress=False)
    ingest([run_set(tmp_path / "u")], db=db, run="b", progress=False)
    with open_store(db, read_only=False) as con:
        rid = run_id(con, "a")
        delete_run(con, rid)
        leftovers = sum(
            con.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?", [rid]).fetchone()[0]
            for t in RUN_BASE_TABLES
        )
    assert leftovers == 0
    assert counts(db, "b")["events"] == 8


def test_other_schema_version_is_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "t")], db=db, progress=False)
    con = duckdb.connect(str(db))
    con.execute("UPDATE tracelab_meta SET value = '99' WHERE key = 'schema_version'")
    con.close()
    with pytest.raises(StoreError, match="version 99") as err:
        with open_store(db):
            pass
    # written by a newer tracelab: upgrading reads it (re-ingesting was the only advice)
    assert "newer tracelab" in str(err.value) and "Upgrade tracelab" in str(err.value)
    junk = tmp_path / "notes.duckdb"
    junk.write_text("not a database\n")
    with pytest.raises(StoreError, match="not a tracelab store \\(not a DuckDB database\\)"):
        with open_store(junk):
            pass
    other = tmp_path / "other.duckdb"
    con = duckdb.connect(str(other))
    con.execute("CREATE TABLE t (x INT)")
    con.close()
    with pytest.raises(StoreError, match="not a tracelab store"):
        ingest([run_set(tmp_path / "u")], db=other, progress=False)


def test_unknown_run_lists_the_runs(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "t")], db=db, run="known", progress=False)
    with open_store(db) as con, pytest.raises(UsageError, match="known"):
        run_id(con, "nope")


def test_readers_keep_working_while_an_ingest_runs(tmp_path: Path) -> None:
    """A reader that opens the store per request succeeds while another process ingests."""
    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "t")], db=db, run="first", progress=False)
    big = tmp_path / "big"
    for r in range(4):
        events = [
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": f"op{i % 50}",
                "pid": 1,
                "tid": 1,
                "ts": float(i),
                "dur": 0.5,
                "args": {"External id": i},
            }
            for i in range(60_000)
        ]
        write(big / f"rank-{r}.json", trace(rank=r, world=4, events=events))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracelab.cli", "ingest", str(big), "--db", str(db), "--run", "big"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    reads = 0
    try:
        while proc.poll() is None:
            with open_store(db, timeout_s=60) as con:
                assert (
                    con.execute("SELECT count(*) FROM runs WHERE name='first'").fetchone()[0] == 1
                )
            reads += 1
            time.sleep(0.05)
    finally:
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert reads >= 3
    assert counts(db, "big")["events"] == 4 * 60_000 + 0


def test_preconverted_ranks_are_registered_not_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace converted on its rank (collector or `tracelab convert`) is not parsed again,
    and gives the same rows as a fresh parse; a changed trace is parsed afresh."""
    from tracelab.ingest import convert, converted
    from tracelab.ingest import pool as ingest_mod

    folder = run_set(tmp_path / "t", ranks=2)
    fresh = tmp_path / "fresh.duckdb"
    ingest([folder], db=fresh, run="a", progress=False)
    for r in range(2):
        path = folder / f"rank-{r}.json"
        convert.convert_trace(path, converted.converted_dir(path))

    def boom(*_a: object, **_k: object) -> None:
        raise AssertionError("parsed a trace that was already converted")

    monkeypatch.setattr(ingest_mod, "convert_trace", boom)
    reg = tmp_path / "registered.duckdb"
    report = ingest([folder], db=reg, run="a", progress=False)
    assert report.ranks == [0, 1] and not report.ignored
    query = "SELECT * EXCLUDE (run_id) FROM events ORDER BY rank, idx"
    with open_store(fresh) as a, open_store(reg) as b:
        assert a.execute(query).fetchall() == b.execute(query).fetchall()
    write(folder / "rank-1.json", trace(rank=1, world=2, base=1_900_000_000_000_000_000))
    monkeypatch.undo()
    ingest([folder], db=reg, run="a", if_exists="replace", progress=False)
    with open_store(reg) as con:
        assert (
            con.execute("SELECT min(ts_ns) FROM events WHERE rank = 1").fetchone()[0]
            == 1_900_000_000_000_000_000
        )


def test_preconverted_ranks_are_checked_a_chunk_at_a_time_each_file_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The converted folders are checked on threads, a chunk of files at a time: each file
    keeps its own outcome across chunks (registered, parsed afresh, or skipped by name)."""
    import os

    from tracelab.ingest import convert, converted
    from tracelab.ingest import pool as ingest_mod

    folder = run_set(tmp_path / "t", ranks=5)
    for r in (0, 2, 3):
        path = folder / f"rank-{r}.json"
        convert.convert_trace(path, converted.converted_dir(path))
    real = ingest_mod.load_converted

    def failing_on_rank_3(path: Path) -> object:
        if Path(path).name == "rank-3.json":
            raise OSError("cannot read it")
        return real(path)

    monkeypatch.setattr(ingest_mod, "_REGISTER_CHUNK", 2)
    monkeypatch.setattr(ingest_mod, "load_converted", failing_on_rank_3)
    db = tmp_path / "s.duckdb"
    report = ingest([folder], db=db, run="a", skip_bad=True, workers=2, progress=False)
    assert report.ranks == [0, 1, 2, 4]
    assert [Path(s["file"]).name for s in report.skipped] == ["rank-3.json"], report.skipped
    with open_store(db) as con:
        files = dict(
            con.execute("SELECT rank, path FROM parquet_files WHERE kind = 'events'").fetchall()
        )
    root = parquet_root(db)

    # A registered rank's events file is its converted folder's, linked; a parsed one's not.
    def linked(rank: int) -> bool:
        own = converted.converted_dir(folder / f"rank-{rank}.json") / "events.parquet"
        return own.exists() and os.path.samefile(root / files[rank], own)

    assert [r for r in report.ranks if linked(r)] == [0, 2]


def test_preconverted_folder_of_an_older_format_is_converted_again(tmp_path: Path) -> None:
    """A columnar folder left by an older tracelab (another `format`) is never registered as is."""
    import json

    from tracelab.ingest import convert, converted

    path = run_set(tmp_path / "t", ranks=1) / "rank-0.json"
    folder = converted.converted_dir(path)
    convert.convert_trace(path, folder)
    assert converted.load_converted(path) is not None
    meta = json.loads((folder / "trace.json").read_text())
    meta.pop("format")  # what format 1 wrote
    (folder / "trace.json").write_text(json.dumps(meta))
    assert converted.load_converted(path) is None
    db = tmp_path / "s.duckdb"
    ingest([path.parent], db=db, run="a", progress=False)
    with open_store(db) as con:
        assert con.execute("SELECT count(*) FROM events").fetchone()[0] > 0


def test_conversion_workers_never_import_pandas(tmp_path: Path) -> None:
    """pyarrow imports pandas (a third of a second) on its first pandas check; the pool's
    initializer answers that check once with pandas blocked, so a worker converts without it."""
    import subprocess
    import sys

    path = run_set(tmp_path / "t", ranks=1) / "rank-0.json"
    code = (
        "import sys; from tracelab.ingest.pool import _worker_init; _worker_init(); "
        "from tracelab.ingest.convert import convert_trace; "
        f"convert_trace({str(path)!r}, {str(tmp_path / 'out')!r}); "
        "print('pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
    # and without the initializer pyarrow does import it (so the check above can fail)
    plain = code.replace("_worker_init(); ", "")
    out = subprocess.run([sys.executable, "-c", plain], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True", out.stderr


def test_store_under_a_folder_named_like_a_partition(tmp_path: Path) -> None:
    """The load reads each file's rank from the file's own name; a user's folder such as
    `rank=0` above the store, which DuckDB can take for a hive partition, changes no rank."""
    for parent in ("rank=0", "tracelab_rank=0"):
        folder = run_set(tmp_path / parent / "t", ranks=2)
        db = tmp_path / parent / "s.duckdb"
        ingest([folder], db=db, run="a", progress=False, workers=2)
        with open_store(db) as con:
            got = con.execute("SELECT rank, count(*) FROM events GROUP BY rank ORDER BY rank")
            assert [r for r, _ in got.fetchall()] == [0, 1]


def test_equal_process_group_configs_share_one_copy() -> None:
    """Ranks whose traces list the same groups keep one copy of them (pool._share_groups);
    a config of the same outline with other members stays its own, and whatever a trace
    puts in pg_config (an int for the ranks, a list for the name, not a dict) is compared
    without error."""
    from dataclasses import replace

    from tracelab.ingest.converted import TraceInfo
    from tracelab.ingest.pool import Groups, _share_groups

    base = TraceInfo(
        file="r0.json", file_bytes=1, sha256="x", rank=0, world_size=4, backend="nccl",
        process_groups=[], host=None, device=None, device_memory_bytes=None,
        device_properties=None, base_time_ns=0, event_count=0, memory_event_count=0,
        ignored_event_count=0,
    )  # fmt: skip

    def groups(members: list[int]) -> list[dict[str, object]]:
        return [{"pg_name": "0", "pg_size": 4, "ranks": members}]

    seen: Groups = {}
    a = _share_groups(replace(base, process_groups=groups([0, 1, 2, 3])), seen)
    b = _share_groups(replace(base, rank=1, process_groups=groups([0, 1, 2, 3])), seen)
    c = _share_groups(replace(base, rank=2, process_groups=groups([0, 1, 3, 2])), seen)
    assert b.process_groups is a.process_groups and b.rank == 1
    assert c.process_groups is not a.process_groups and c.process_groups == groups([0, 1, 3, 2])
    odd: list[object] = [5, {"pg_name": ["x"], "ranks": 7}, {"pg_name": "1", "ranks": [0]}]
    d = _share_groups(replace(base, process_groups=odd), seen)  # type: ignore[arg-type]
    e = _share_groups(replace(base, process_groups=list(odd)), seen)  # type: ignore[arg-type]
    assert e.process_groups is d.process_groups


def test_a_capture_whose_records_changed_is_not_the_same_run(tmp_path: Path) -> None:
    # The traces are unchanged but rank 0's collector records are cut to 10 lines: a
    # re-ingest is refused (different content) and --replace loads the new records, as a fresh
    # store would; unchanged records stay "nothing to do".
    capture = tmp_path / "ddp"
    shutil.copytree(REPO / "sample_traces" / "ddp", capture)
    db = tmp_path / "s.duckdb"
    ingest([capture], db=db, run="a", progress=False)
    assert ingest([capture], db=db, run="a", progress=False).unchanged
    records = capture / "rank-0" / "collectives.jsonl"
    lines = records.read_text().splitlines(keepends=True)
    assert len(lines) > 10
    records.write_text("".join(lines[:10]))
    with pytest.raises(UsageError, match="different content"):
        ingest([capture], db=db, run="a", progress=False)
    report = ingest([capture], db=db, run="a", if_exists="replace", progress=False)
    assert not report.unchanged
    fresh = tmp_path / "fresh.duckdb"
    ingest([capture], db=fresh, run="a", progress=False)
    record_rows = (
        "SELECT count(*) FROM collectives JOIN runs USING (run_id) WHERE runs.name = 'a' "
        "AND rank = 0 AND collectives.source IN ('collector', 'flight_recorder')"
    )
    with open_store(db) as con, open_store(fresh) as other:
        assert con.execute(record_rows).fetchone() == other.execute(record_rows).fetchone()
        assert con.execute(record_rows).fetchone()[0] == 10


@pytest.mark.parametrize("free_kib", [6000, 100])
def test_a_disk_that_fills_is_said_to_be_full_and_the_store_kept(
    free_kib: int, tmp_path: Path
) -> None:
    """A full disk was "internal error ... a bug" (exit 70) while converting, and "the store
    cannot be read ... It may be damaged" (exit 3) at the commit. Now exit 3 saying the disk
    is full, with the store as it was and usable once there is room (a real full file system:
    a tmpfs, where mounting one is allowed)."""
    import shutil
    import subprocess

    from .hostile import REPO, cli, snapshot

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:  # fmt: skip
        pytest.skip("cannot mount a small file system here")
    try:
        db = mnt / "s.duckdb"
        assert cli("ingest", str(REPO / "sample_traces" / "ddp"), "--db", str(db)).code == 0
        before = snapshot(db)
        filler = mnt / "filler"
        with filler.open("wb") as fh:
            fh.truncate(max(0, shutil.disk_usage(mnt).free - free_kib * 1024))
        subprocess.run(["fallocate", "-l", str(filler.stat().st_size), str(filler)], check=True)
        res = cli("ingest", str(REPO / "sample_traces" / "fsdp2"), "--db", str(db), "--run", "f")
        assert res.code == 3, res.err
        assert "the disk is full" in res.err or "no space left" in res.err, res.err
        assert "bug" not in res.err and "damaged" not in res.err, res.err
        assert snapshot(db) == before
        assert not list(mnt.glob(".tracelab-ingest-*")), "the staging folder is removed"
        filler.unlink()
        res = cli("ingest", str(REPO / "sample_traces" / "fsdp2"), "--db", str(db), "--run", "f")
        assert res.code == 0, res.err
        assert sorted(snapshot(db)["runs"])[0] == sorted(before["runs"])[0]
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
