"""How long a writer's sweep of the store folder takes on a large store (tracelab.store.files).

    python benchmarks/sweep.py [--runs 10] [--ranks 10000] [--reps 3] [--out FILE]

Every process that opens the store for writing sweeps its folder when it opens and when it
closes the store, holding the write lock: readers wait for it. A constructed store: `--runs`
runs of `--ranks` ranks, each rank one listed (empty) events file, each run 4 listed parts
files, plus what a killed ingest and a rederive leave (a placed run folder no file of which is
listed, an unlisted parts file): the real store schema and catalog, files of no content (the
sweep never reads them). Prints the median of `--reps` sweeps (each removes the leftovers,
which are put back before the next) and checks that exactly the leftovers went.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build(db: Path, runs: int, ranks: int) -> None:
    from tracelab.derived.sqlfiles import insert_rows
    from tracelab.store import open_store
    from tracelab.store.files import make_root, rank_file
    from tracelab.store_folder import PARQUET_FILES_COLUMNS

    with open_store(db, read_only=False) as con:
        root = make_root(con)
        rows = []
        for run in range(1, runs + 1):
            for rank in range(ranks):
                rows.append([run, rank, "events", rank_file(run, rank, "events", 0), 0, 0])
            for first in range(0, ranks, max(1, ranks // 4)):
                rows.append(
                    [
                        run,
                        first,
                        "time_parts",
                        f"run={run}/parts/time_parts-{first}-x.parquet",
                        0,
                        0,
                    ]
                )
        for row in rows:
            path = root / row[3]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        insert_rows(con, "parquet_files", PARQUET_FILES_COLUMNS, rows)


def leftovers(root: Path, runs: int) -> set[Path]:
    """What a killed ingest (a placed, unlisted run) and a rederive (an old parts file) leave."""
    made = {
        root / f"run={runs + 1}" / "rank=0" / "events-0.parquet",
        root / f"run={runs + 1}" / "rank=1" / "events-0.parquet",
        root / "run=1" / "parts" / "time_parts-0-old.parquet",
    }
    for path in made:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    return made


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--ranks", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import duckdb

    from tracelab.store.files import parquet_root, sweep

    with tempfile.TemporaryDirectory(prefix="tl-sweep-") as tmp:
        db = Path(tmp) / "s.duckdb"
        build(db, args.runs, args.ranks)
        root = parquet_root(db)
        times = []
        for _ in range(args.reps):
            made = leftovers(root, args.runs)
            con = duckdb.connect(str(db))
            try:
                start = time.perf_counter()
                removed = sweep(con)
                times.append(time.perf_counter() - start)
            finally:
                con.close()
            assert {Path(p) for p in removed} == made, sorted(map(str, removed))
            assert not any(p.exists() for p in made)
        result = {
            "runs": args.runs,
            "ranks": args.ranks,
            "listed_files": args.runs * (args.ranks + 4),
            "sweep_s": times,
            "median_s": statistics.median(times),
        }
    print(
        f"{args.runs} runs x {args.ranks:,} ranks: sweep median {result['median_s']:.3f} s {times}"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
