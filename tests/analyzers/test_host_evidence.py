"""HOST_BOUND's evidence at many ranks: the host spans of the ranks with the most host time,
read from their own events files. Reading every rank's events grew with the run (10,000 ranks:
9.3 s of a 16.9 s analysis, each query on the `events` view binding the list of every file).

Twelve GPU ranks, 10 ms steps: each waits on its host at the start of a step, inside a named
host span, then runs a kernel. Ranks 4-11 (the eight with the most host time: 5 ms) wait in
`slow_loader`, ranks 0-3 (2 ms) in `fast_loader`."""

from __future__ import annotations

from pathlib import Path

from tracelab.analyzers import breakdown, run_all
from tracelab.ingest import ingest
from tracelab.store import open_store, resolve_run
from tracelab.store.files import rank_events_sql
from tracelab.testing._kineto import MS, RankTrace
from tracelab.testing.synth import write_ranks


def _run(tmp: Path, ranks: int) -> tuple[Path, str]:
    traces = []
    for r in range(ranks):
        t = RankTrace(r, ranks)
        gap = (5 if r >= 4 else 2) * MS
        for s in range(4):
            o = s * 10 * MS
            t.step(s + 1, o, o + 10 * MS)
            t.cpu_op("slow_loader" if r >= 4 else "fast_loader", o, o + gap)
            t.kernel("sm90_gemm", o + gap, o + 8 * MS)
            t.nccl("all_reduce", o + 8 * MS, o + 9 * MS, nbytes=1 << 20)
        traces.append(t)
    name = f"host{ranks}"
    paths = write_ranks(tmp / name, traces)
    db = tmp / f"{name}.duckdb"
    ingest([str(p) for p in paths], db=db, run=name, workers=1, progress=False)
    return db, name


def _host_bound(db: Path, name: str):  # type: ignore[no-untyped-def]
    with open_store(db) as con:
        rid, _ = resolve_run(con, name)
        results = {r.analyzer: r for r in run_all(con, rid)}
    return next(f for f in results["breakdown"].findings if f.code == "HOST_BOUND")


def test_host_bound_names_the_spans_of_the_ranks_with_the_most_host_time(tmp_path: Path) -> None:
    assert breakdown.HOST_EVIDENCE_RANKS == 8
    f = _host_bound(*_run(tmp_path, 12))
    nums = f.evidence.numbers
    assert f.evidence.ranks[:8] == (4, 5, 6, 7, 8, 9, 10, 11)  # the most host time first
    assert nums["host_spans_of_ranks"] == (
        "ranks 4-11: the 8 with the most host time (of ranks alike, the lowest)"
    )
    assert f.title.endswith("(most on 8 ranks alike)")  # tied: no one rank is named
    # Of those eight ranks' host time (5 ms in slow_loader and 1 ms after the all-reduce, a
    # step), slow_loader overlaps 5 of 6; fast_loader (ranks 0-3 only) is not among their spans.
    assert nums["host_span_1"] == "slow_loader: overlaps 83% of the host time of these 8 ranks"
    assert "host_span_2" not in nums or "fast_loader" not in str(nums["host_span_2"])


def test_host_bound_of_a_few_ranks_reads_every_rank(tmp_path: Path) -> None:
    f = _host_bound(*_run(tmp_path, 6))
    nums = f.evidence.numbers
    assert "host_spans_of_ranks" not in nums
    assert f.title.endswith("of the step (most on ranks 4 and 5)")
    # A step's host time: ranks 4-5 6 ms (5 in slow_loader), ranks 0-3 3 ms (2 in fast_loader):
    # 24 ms, of which slow_loader 10 and fast_loader 8.
    assert nums["host_span_1"] == "slow_loader: overlaps 42% of the host time"
    assert nums["host_span_2"] == "fast_loader: overlaps 33% of the host time"


def test_rank_events_sql_reads_the_named_ranks_files_only(tmp_path: Path) -> None:
    db, name = _run(tmp_path, 6)
    with open_store(db) as con:
        rid, _ = resolve_run(con, name)
        some = rank_events_sql(con, rid, [1, 4])
        assert "rank=0/" not in some and "rank=1/" in some and "rank=4/" in some
        got = con.execute(
            f"SELECT rank, count(*), sum(dur_ns) FROM {some} GROUP BY rank"
        ).fetchall()
        want = con.execute(
            "SELECT rank, count(*), sum(dur_ns) FROM events WHERE run_id = ? AND rank IN (1, 4) "
            "GROUP BY rank",
            [rid],
        ).fetchall()
        assert sorted(got) == sorted(want) and len(want) == 2
        cols = con.execute(f"SELECT * FROM {some} LIMIT 0").description
        assert [c[0] for c in cols] == [
            c[0] for c in con.execute("SELECT * FROM events LIMIT 0").description
        ]
        none = rank_events_sql(con, rid, [99])
        assert con.execute(f"SELECT count(*) FROM {none}").fetchall() == [(0,)]


def test_host_bound_says_when_every_rank_is_alike() -> None:
    """'most on rank 0' named a rank no worse than any other (a golden run: every rank 16.4%)."""
    where = breakdown._where_most
    assert where({0: 0.2, 1: 0.2, 2: 0.2}, [0, 1, 2]) == " (every rank alike)"
    assert where({0: 0.2, 1: 0.5, 2: 0.2}, [1, 0, 2]) == " (most on rank 1)"
    assert where({0: 0.2, 1: 0.5, 2: 0.4995}, [1, 2, 0]) == " (most on ranks 1 and 2)"
    assert where({0: 0.2}, [0]) == ""
