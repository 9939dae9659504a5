"""What one rank's conversion costs, piece by piece, against the decode floor's scan.

    python benchmarks/conversion_parts.py [--reps 7] [--out results/conversion_parts.json]

CPU time (time.process_time: this process, every thread) of each piece of
tracelab.ingest.convert on one 54 MB rank of the 8-rank set, in one process, repeated: the
scan (what FLOOR in ingest.py does per rank), the SHA-256 of the file (what registers a
converted folder later), the events table's derived columns, the events Parquet write, and the
whole conversion (every file of the converted folder, the hash on its thread). Min and median
of the repetitions. It bounds what any ingest that converts can reach on a machine: the pieces
the issue's design needs (events as Parquet, converted folders that prove their trace) times the
ranks, over the cores, plus the interpreter's imports.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.datasets import rank_set  # noqa: E402


def cpu_times(fn: Callable[[], object], reps: int) -> dict[str, float]:
    runs = []
    for _ in range(reps):
        start = time.process_time()
        fn()
        runs.append(time.process_time() - start)
    return {"min_s": min(runs), "median_s": statistics.median(runs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import numpy as np
    import pyarrow.parquet as pq

    from tracelab.ingest import convert as cv
    from tracelab.ingest.decode import base_time_ns, decode

    trace = rank_set(8) / "rank-0.json"
    work = Path(tempfile.mkdtemp(prefix="tracelab-conversion-parts-"))
    try:
        decoded, _ = cv._read(trace)
        xs = np.flatnonzero(decoded.ph == ord("X"))
        mem = cv._memory_instants(decoded)
        base = base_time_ns(decoded.top, trace)
        events = cv._events(decoded, xs, mem, base, trace)

        def scan() -> None:
            with cv._mapped(trace) as raw:
                decode(cv._decompress(raw, trace), trace)

        def sha256() -> None:
            with cv._mapped(trace) as raw:
                hashlib.sha256(raw).hexdigest()

        def columns() -> None:
            cv._events(decoded, xs, mem, base, trace)

        def write() -> None:
            pq.write_table(
                events.table,
                work / "events.parquet",
                compression=cv._CODEC,
                row_group_size=cv._ROW_GROUP,
                use_dictionary=["cat", "name", "category", "lane_label"],
                write_statistics=["idx", "ts_ns", "dur_ns", "step"],
            )

        def whole() -> None:
            cv._convert(trace, work / "converted", False)

        pieces = {
            "scan (the floor's work)": scan,
            "sha256 of the file": sha256,
            "events columns": columns,
            "events Parquet write": write,
            "whole conversion": whole,
        }
        rows = {name: cpu_times(fn, args.reps) for name, fn in pieces.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{trace} ({trace.stat().st_size / 1e6:.0f} MB), CPU-s, {args.reps} runs each")
    for name, r in rows.items():
        print(f"{name:28s} min {r['min_s']:.3f}  median {r['median_s']:.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"trace": str(trace), "pieces": rows}, indent=2))


if __name__ == "__main__":
    main()
