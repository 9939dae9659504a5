"""Bad input gets an error naming the file and the fix, and never a half-written store."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tracelab.errors import InputError, RankConflictError, TraceFormatError
from tracelab.ingest import ingest
from tracelab.store import open_store

from .hostile import RUN_BASE_TABLES
from .kineto import run_set, trace, write

TABLES = RUN_BASE_TABLES


def snapshot(db: Path) -> dict[str, int]:
    with open_store(db) as con:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    db = tmp_path / "store.duckdb"
    ingest([run_set(tmp_path / "good")], db=db, run="good", progress=False)
    return db


def _bad_files(folder: Path) -> dict[str, tuple[Path, str]]:
    good = json.dumps(trace(rank=1)).encode()
    cases = {
        "truncated": (write(folder / "truncated.json", None), "truncated"),
        "empty": (folder / "empty.json", "empty"),
        "corrupt_gzip": (folder / "corrupt.json.gz", "gzip"),
        "invalid_json": (folder / "invalid.json", "not valid Kineto JSON"),
        "no_trace_events": (write(folder / "nokey.json", {"schemaVersion": 1}), "traceEvents"),
        "top_level_list": (write(folder / "list.json", [1, 2]), "not a JSON object"),
        "negative_dur": (
            write(
                folder / "neg.json",
                trace(
                    rank=1,
                    events=[
                        {
                            "ph": "X",
                            "cat": "cpu_op",
                            "name": "x",
                            "pid": 1,
                            "tid": 1,
                            "ts": 1.0,
                            "dur": -5.0,
                        }
                    ],
                ),
            ),
            "negative duration",
        ),
        "nan_dur": (folder / "nan.json", "NaN"),
        "non_utf8": (folder / "latin1.json", "UTF-8"),
        "no_complete_events": (write(folder / "noevents.json", trace(rank=1, events=[])), "empty"),
        "wrong_schema": (
            write(folder / "schema.json", {"traceEvents": [{"ph": "X", "name": 3}]}),
            "unexpected event shape",
        ),
    }
    (folder / "truncated.json").write_bytes(good[: len(good) // 2])
    (folder / "empty.json").write_bytes(b"")
    (folder / "corrupt.json.gz").write_bytes(gzip.compress(good)[:40] + b"garbage")
    (folder / "invalid.json").write_bytes(b'{"traceEvents": [}')
    (folder / "nan.json").write_bytes(
        json.dumps(
            trace(
                rank=1,
                events=[
                    {
                        "ph": "X",
                        "cat": "cpu_op",
                        "name": "x",
                        "pid": 1,
                        "tid": 1,
                        "ts": 1.0,
                        "dur": float("nan"),
                    }
                ],
            )
        ).encode()
    )
    (folder / "latin1.json").write_bytes(
        json.dumps(trace(rank=1)).encode().replace(b"aten::mm", "aten::m\u00e9".encode("latin-1"))
    )
    return cases


@pytest.mark.parametrize(
    "case",
    [
        "truncated",
        "empty",
        "corrupt_gzip",
        "invalid_json",
        "no_trace_events",
        "top_level_list",
        "negative_dur",
        "nan_dur",
        "non_utf8",
        "no_complete_events",
        "wrong_schema",
    ],
)
def test_bad_file_is_named_and_store_unchanged(case: str, store: Path, tmp_path: Path) -> None:
    path, words = _bad_files(tmp_path / "bad")[case]
    before = snapshot(store)
    good = run_set(tmp_path / f"other-{case}", ranks=1)
    with pytest.raises(TraceFormatError) as err:
        ingest([good, path], db=store, run="mixed", progress=False)
    assert str(path) in str(err.value)
    assert words.lower() in str(err.value).replace(str(path), "").lower()
    assert snapshot(store) == before


def test_skip_bad_ingests_good_ranks_and_records_skipped(store: Path, tmp_path: Path) -> None:
    folder = run_set(tmp_path / "partial", ranks=3)
    (folder / "rank-1.json").write_bytes(b'{"traceEvents": [')
    report = ingest([folder], db=store, run="partial", skip_bad=True, progress=False)
    assert report.ranks == [0, 2]
    with open_store(store) as con:
        skipped = json.loads(
            con.execute("SELECT skipped FROM runs WHERE name = 'partial'").fetchone()[0]
        )
        ranks = [
            r[0]
            for r in con.execute(
                "SELECT rank FROM ranks JOIN runs USING (run_id) WHERE name = 'partial' ORDER BY rank"
            ).fetchall()
        ]
    assert ranks == [0, 2]
    assert skipped[0]["file"].endswith("rank-1.json") and "truncated" in skipped[0]["error"]


def test_missing_rank_metadata_needs_an_explicit_map(store: Path, tmp_path: Path) -> None:
    """A lone trace without a rank is rank 0 of 1 (tests/foundation/test_rankless_traces.py);
    two of them need a map."""
    path = write(tmp_path / "norank.json", trace(rank=None))
    other = write(tmp_path / "norank2.json", trace(rank=None))
    before = snapshot(store)
    with pytest.raises(RankConflictError, match="--rank norank.json=0 --rank norank2.json=1"):
        ingest([path, other], db=store, run="norank", progress=False)
    assert snapshot(store) == before
    report = ingest([path], db=store, run="norank", ranks={"norank.json": 3}, progress=False)
    assert report.ranks == [3]


def test_two_files_claiming_one_rank_are_named(store: Path, tmp_path: Path) -> None:
    a = write(tmp_path / "a" / "x.json", trace(rank=0))
    b = write(tmp_path / "b" / "y.json", trace(rank=0))
    before = snapshot(store)
    with pytest.raises(RankConflictError) as err:
        ingest([a, b], db=store, run="dup", progress=False)
    assert str(a) in str(err.value) and str(b) in str(err.value)
    assert snapshot(store) == before
    report = ingest([a, b], db=store, run="dup", ranks={"x.json": 0, "y.json": 1}, progress=False)
    assert report.ranks == [0, 1]


def test_partial_capture_records_ranks_out_of_world(store: Path, tmp_path: Path) -> None:
    path = write(tmp_path / "r34.json", trace(rank=34, world=300))
    report = ingest([path], db=store, run="r34", progress=False)
    assert report.ranks == [34] and report.world_size == 300
    with open_store(store) as con:
        assert con.execute(
            "SELECT rank_count, world_size FROM runs WHERE name='r34'"
        ).fetchone() == (1, 300)


def test_non_trace_files_are_listed_not_taken(tmp_path: Path) -> None:
    folder = run_set(tmp_path / "t", ranks=1)
    (folder / "notes.txt").write_text("hello")
    report = ingest([folder], db=tmp_path / "s.duckdb", progress=False)
    assert report.ignored == [str(folder / "notes.txt")]
    with pytest.raises(InputError, match="not a trace file name"):
        ingest([folder / "notes.txt"], db=tmp_path / "s.duckdb", progress=False)


def test_hostile_names_are_stored_verbatim(tmp_path: Path) -> None:
    name = "<img src=x onerror=alert(1)>'; DROP TABLE events; --"
    doc = trace(rank=0)
    doc["traceEvents"][1]["name"] = name
    write(tmp_path / "t" / "rank-0.json", doc)
    ingest([tmp_path / "t"], db=tmp_path / "s.duckdb", progress=False)
    with open_store(tmp_path / "s.duckdb") as con:
        assert con.execute("SELECT count(*) FROM events WHERE name = ?", [name]).fetchone()[0] == 1


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tracelab.cli", *args], capture_output=True, text=True
    )


def test_cli_exit_codes(tmp_path: Path) -> None:
    db = str(tmp_path / "c.duckdb")
    good = run_set(tmp_path / "g", ranks=2)
    assert _cli("ingest", str(good), "--db", db).returncode == 0
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"{")
    res = _cli("ingest", str(bad), "--db", db, "--run", "b")
    assert res.returncode == 3 and str(bad) in res.stderr
    assert _cli("ingest", "--db", db).returncode == 2
    assert _cli("ingest", str(good), "--db", db, "--rank", "oops").returncode == 2
    assert _cli("analyze-nope").returncode == 2


def test_capture_rank_without_trace_is_skippable(tmp_path: Path) -> None:
    """A rank whose collector failed before writing a trace: an error by default, skipped and
    recorded with --skip-bad."""
    cap = tmp_path / "cap"
    ranks = []
    for r in range(2):
        rel = f"rank-{r}/window-0.pt.trace.json"
        if r == 0:
            write(cap / rel, trace(rank=r))
        ranks.append(
            {"rank": r, "traces": [rel] if r == 0 else [], "collector_error": "boom" if r else None}
        )
    write(
        cap / "manifest.json",
        {
            "format": "tracelab.capture",
            "format_version": 1,
            "run_name": "cap",
            "world_size": 2,
            "ranks": ranks,
        },
    )
    with pytest.raises(InputError, match="rank 1 has no trace files.*boom"):
        ingest([cap], db=tmp_path / "s.duckdb", progress=False)
    report = ingest([cap], db=tmp_path / "s.duckdb", skip_bad=True, progress=False)
    assert report.ranks == [0] and "rank 1" in report.skipped[0]["error"]
