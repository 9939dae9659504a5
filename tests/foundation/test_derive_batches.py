"""The lost-time parts are derived a batch of ranks at a time (tracelab.derived.batches.rank_batches),
so that an ingest's memory does not grow with the run's ranks: every batching gives the same
rows as one batch of the whole run, on the bundled captures (DDP with a slow rank, FSDP2, tensor
parallel, pipeline schedules) and constructed multi-rank GPU runs (NCCL kernels, clock offsets)."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from tracelab.derived import batches, derive_in_transaction, part_batches
from tracelab.ingest import ingest
from tracelab.store import open_store
from tracelab.testing.synth import build_run

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_traces"
TABLES = ("time_parts", "step_parts", "comm_attribution")


def _rows(db: Path) -> dict[str, list[tuple[object, ...]]]:
    with open_store(db) as con:
        return {
            t: con.execute(f"SELECT * EXCLUDE (run_id) FROM {t} ORDER BY ALL").fetchall()
            for t in TABLES
        }


def _rederive(db: Path, runner: part_batches.Runner | None = None) -> None:
    """Derive run 1 again, its batches one after another in this process unless `runner`."""
    with open_store(db, read_only=False) as con:
        assert not derive_in_transaction(con, 1, runner or part_batches.Runner()).errors


SAMPLE_CASES = ["ddp_slow_rank", "fsdp2", "tensor_parallel", "pipeline_1f1b"]
SYNTH_CASES = ["stragglers", "clock_offset", "pipeline"]


@pytest.mark.parametrize("case", SAMPLE_CASES + SYNTH_CASES)
def test_every_batching_gives_the_rows_of_one_batch(
    tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = [str(SAMPLES / case)] if case in SAMPLE_CASES else build_run(tmp_path, case).paths
    db = tmp_path / "s.duckdb"
    ingest(paths, db=str(db), run="r", workers=1, progress=False)
    ingested = _rows(db)  # two batches at once, in threads (part_batches.local_runner)
    monkeypatch.setattr(batches, "BATCH_EVENTS", 2**40)
    _rederive(db)
    whole = _rows(db)
    assert whole["step_parts"] and whole["time_parts"]
    assert ingested == whole
    with open_store(db) as con:
        ranks = con.execute("SELECT count(*) FROM ranks").fetchall()[0][0]
        monkeypatch.setattr(batches, "BATCH_EVENTS", 1)
        assert len(batches.rank_batches(con, 1)) == ranks > 1  # one rank a batch
    _rederive(db)
    assert _rows(db) == whole
    with open_store(db) as con:  # two ranks a batch, the last batch holding the rest
        events = con.execute("SELECT max(row_count) FROM parquet_files").fetchall()[0][0]
        monkeypatch.setattr(batches, "BATCH_EVENTS", 2 * int(events))
        assert len(batches.rank_batches(con, 1)) == (ranks + 1) // 2
    _rederive(db)
    assert _rows(db) == whole
    _rederive(db, part_batches.local_runner(2))  # one rank a batch, two at once
    assert _rows(db) == whole
    for small in (0, 2**40):  # every batch's events read as a view, then into memory
        monkeypatch.setattr(part_batches, "SMALL_FILES_EVENTS", small)
        _rederive(db)
        assert _rows(db) == whole


def test_batches_cover_every_rank_and_hold_at_most_the_budget(tmp_path: Path) -> None:
    """rank_batches on a catalog of known counts (ranks 0, 1, 2, 5 hold 3, 4, 1, 9 events)."""
    import duckdb

    con = duckdb.connect()
    con.execute(
        "CREATE TABLE parquet_files AS SELECT * FROM (VALUES (1, 0, 'events', 3), "
        "(1, 1, 'events', 4), (1, 2, 'events', 1), (1, 5, 'events', 9), (2, 0, 'events', 99)) "
        "t(run_id, rank, kind, row_count)"
    )
    lo, hi = -(2**31), 2**31 - 1
    assert batches.rank_batches(con, 1, 5) == [(lo, 0), (1, 4), (5, hi)]
    assert batches.rank_batches(con, 1, 8) == [(lo, 4), (5, hi)]
    assert batches.rank_batches(con, 1, 100) == [(lo, hi)]
    assert batches.rank_batches(con, 3, 5) == [(lo, hi)]  # a run without files: one batch
    # `parts` workers share the run: at most a 1/parts share of its 17 events a batch (9)
    assert batches.rank_batches(con, 1, 100, parts=2) == [(lo, 4), (5, hi)]
    assert batches.rank_batches(con, 1, 100, parts=3) == [(lo, 0), (1, 4), (5, hi)]
    assert batches.rank_batches(con, 1, 5, parts=2) == [(lo, 0), (1, 4), (5, hi)]
    assert batches.rank_batches(con, 3, 5, parts=4) == [(lo, hi)]


@pytest.mark.parametrize("case", ["ddp_slow_rank", "pipeline_1f1b", "clock_offset"])
def test_batches_derived_in_other_processes_give_the_rows_of_this_one(
    tmp_path: Path, case: str
) -> None:
    """A batch's job is all its worker reads (tracelab.derived.part_batches: the events files
    and the small tables' rows of its ranks): derived in fresh processes (spawned, so nothing
    of this one's store is inherited), two or more batches give what one batch in this process
    gave."""
    paths = [str(SAMPLES / case)] if case in SAMPLE_CASES else build_run(tmp_path, case).paths
    db = tmp_path / "s.duckdb"
    ingest(paths, db=str(db), run="r", workers=1, progress=False)
    whole = _rows(db)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        runner = part_batches.Runner(map=pool.map, workers=2)
        with open_store(db, read_only=False) as con:
            assert not derive_in_transaction(con, 1, runner).errors
            files = con.execute(
                "SELECT count(*) FROM parquet_files WHERE kind = 'time_parts'"
            ).fetchall()[0][0]
    assert files >= 2
    assert _rows(db) == whole
