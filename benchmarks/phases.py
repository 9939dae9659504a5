"""Where one ingest's time goes: `tracelab ingest` run in this process with each phase timed.

    python benchmarks/phases.py FOLDER [--db PATH]

Prints, for each phase, when it ended (seconds since the start) and how long it took: the
conversions, rank resolution, the store's opening, each load of the small per-rank files, each
derived component and the staging folder's removal. One run, wall time: for finding where the
time goes, not for claims (ingest.py and scale_out.py measure those, repeated and paired).
This is how the reads of every rank's events file in the derived layer were found at 2,000
ranks (docs/scale-out.md).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

T0 = time.perf_counter()
LINES: list[tuple[float, float, str]] = []


def timed(module: ModuleType, name: str, label: str | None = None) -> None:
    """Replace module.name by a wrapper that records its duration (skipped if absent)."""
    fn = getattr(module, name, None)
    if fn is None:
        return

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            end = time.perf_counter()
            LINES.append((end - T0, end - start, label or name))

    setattr(module, name, wrapper)


def instrument() -> None:
    import tracelab.derived as derived
    import tracelab.ingest.load as load
    import tracelab.ingest.orchestrate as orchestrate
    import tracelab.ingest.workers as workers
    import tracelab.ingest.write as write
    import tracelab.store.open as store_open

    for name in ("convert_all", "resolve_ranks", "_hang_verdict", "write_run"):
        timed(orchestrate, name)
    timed(workers, "remove_staging")
    for name in ("connect_with_retry", "ensure_schema", "sweep"):
        timed(store_open, name, f"store: {name}")
    timed(write, "_insert_run")
    timed(derived, "in_transaction", "staged store: the run built and derived")
    import tracelab.store.staged as staged

    timed(staged, "move_run", "store: the run moved in")
    for name in [n for n in dir(load) if n.startswith("load_")]:
        timed(load, name)
    steps: list[tuple[str, Callable[..., None], tuple[str, ...]]] = []
    for name, _, needs in derived._STEPS:
        timed(derived, f"_{name}", f"derived: {name}")
        steps.append((name, getattr(derived, f"_{name}"), needs))
    derived._STEPS = tuple(steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument(
        "--db", type=Path, default=None, help="the store (default: a temporary one)"
    )
    args = parser.parse_args()
    from tracelab.ingest.pool import pyarrow_without_pandas

    pyarrow_without_pandas()  # as `tracelab ingest` does
    instrument()
    from tracelab.ingest.orchestrate import ingest

    work = Path(tempfile.mkdtemp(prefix="tracelab-phases-"))
    db = args.db or work / "phases.duckdb"
    started = time.perf_counter() - T0
    try:
        report = ingest([args.folder], db, progress=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    total = time.perf_counter() - T0
    print(f"{len(report.ranks)} ranks, {report.events:,} events; imports {started:.2f} s")
    print(f"{'ends at':>8} {'took':>8}  phase")
    for end, took, label in sorted(LINES):
        print(f"{end:8.3f} {took:8.3f}  {label}")
    print(f"{total:8.3f} {total - started:8.3f}  the ingest")


if __name__ == "__main__":
    main()
