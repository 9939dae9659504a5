"""Ingest speed and memory: tracelab vs HTA's parser on the same files, in the same run.

    python benchmarks/ingest.py [--reps 3] [--scaling 8,64]

Each case also times the decode floor (FLOOR: gunzip + scan of every rank, in the ingest's
number of processes) in the same repetition. Cases: (a) the single 54 MB `df_index_resolver` trace, (b) 8 copies of it with the rank rewritten
(benchmarks/datasets.py), (c) the same 8 files gzipped, the form the collector and
torch.profiler write, (d) the 8 files of (b) converted where they were written (`tracelab
convert`, as the collector's `convert=True` does on each rank, untimed): the ingest only checks
and registers the converted folders. Each repetition runs each tool as a fresh process, interleaved, so
both see the same machine load; we report medians, events/s, the peak RSS of each tool's whole
process tree, and the ratio. `--scaling` measures tracelab's peak RSS as ranks grow.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.datasets import rank_set  # noqa: E402
from benchmarks.measure import Sample, compile_bytecode, median, run_measured  # noqa: E402

HTA_PARSE = "from hta.trace_analysis import TraceAnalysis; TraceAnalysis(trace_dir={folder!r})"
#: The decode floor: what any ingest must do, and no more: read each rank's file, gunzip it and
#: scan it into columns (tracelab's C scanner), in as many processes as the ingest uses. No
#: validation, no Parquet, no store. An ingest "within 1.5x of the floor" is the issue's target.
FLOOR = """
import os, sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from tracelab.ingest.convert import _decompress, _mapped
from tracelab.ingest.decode import decode

def scan(path):
    with _mapped(Path(path)) as raw:
        return decode(_decompress(raw, Path(path)), Path(path)).n

files = sorted(str(p) for p in Path({folder!r}).glob("*.json*"))
with ProcessPoolExecutor(min(os.cpu_count() or 1, len(files))) as pool:
    print(sum(pool.map(scan, files)))
"""
EVENTS_PER_RANK = 216_092  # all events of df_index_resolver
X_EVENTS_PER_RANK = 123_379  # its complete (X) events, the ones both tools keep


def warm(folder: Path) -> None:
    """Read the input into the page cache before a timed run. Both tools are measured parsing
    cached files: on the VMs we use, the page cache is dropped from outside every few minutes,
    and a cold read of the 8-rank set took 1.7 s, which would land on whichever tool ran next."""
    for path in sorted(folder.glob("*.json*")):
        with path.open("rb") as fh:
            while fh.read(1 << 24):
                pass


def tracelab_ingest(folder: Path, work: Path) -> Sample:
    db = work / "bench.duckdb"
    # A new store each time, as HTA starts from nothing: the store file and its Parquet folder
    # (before 2026-12-06 12:00 UTC only the file was removed, so each run after the first also
    # swept the previous run's files out of the folder it took over).
    db.unlink(missing_ok=True)
    shutil.rmtree(work / "bench.parquet", ignore_errors=True)
    warm(folder)
    sample = run_measured(
        [sys.executable, "-m", "tracelab.cli", "ingest", str(folder), "--db", str(db)]
    )
    if sample.returncode != 0:
        raise SystemExit(f"tracelab ingest failed:\n{sample.stdout}")
    return sample


def hta_parse(folder: Path) -> Sample:
    warm(folder)
    sample = run_measured([sys.executable, "-c", HTA_PARSE.format(folder=str(folder))])
    if sample.returncode != 0:
        raise SystemExit(f"HTA failed:\n{sample.stdout[-2000:]}")
    return sample


def decode_floor(folder: Path) -> Sample:
    warm(folder)
    sample = run_measured([sys.executable, "-c", FLOOR.format(folder=str(folder))])
    if sample.returncode != 0:
        raise SystemExit(f"the decode floor failed:\n{sample.stdout[-2000:]}")
    return sample


def converted_on_ranks(work: Path) -> Path:
    """Case (d): the 8-rank set's files (hard links) in a folder of their own, each converted
    beside itself by `tracelab convert` (not timed: on a real job each rank does it at the end
    of its window). Removed with `work`."""
    folder = work / "converted_x8"
    folder.mkdir()
    for path in sorted(rank_set(8).glob("*.json")):
        (folder / path.name).hardlink_to(path)
    traces = [str(p) for p in sorted(folder.glob("*.json"))]
    done = run_measured([sys.executable, "-m", "tracelab.cli", "convert", *traces])
    if done.returncode != 0:
        raise SystemExit(f"tracelab convert failed:\n{done.stdout}")
    return folder


def bench_case(name: str, folder: Path, ranks: int, reps: int, work: Path) -> dict[str, object]:
    tl: list[Sample] = []
    hta: list[Sample] = []
    floor: list[Sample] = []
    for _ in range(reps):
        tl.append(tracelab_ingest(folder, work))
        hta.append(hta_parse(folder))
        floor.append(decode_floor(folder))
    tl_s = median([s.wall_s for s in tl])
    hta_s = median([s.wall_s for s in hta])
    floor_s = median([s.wall_s for s in floor])
    x_events = X_EVENTS_PER_RANK * ranks
    return {
        "case": name,
        "ranks": ranks,
        "bytes": sum(p.stat().st_size for p in folder.glob("*.json*")),
        "events": EVENTS_PER_RANK * ranks,
        "x_events": x_events,
        "tracelab_s": tl_s,
        "hta_s": hta_s,
        "speedup": hta_s / tl_s,
        "floor_s": floor_s,
        "over_floor": tl_s / floor_s,
        "floor_runs_s": [round(s.wall_s, 3) for s in floor],
        "tracelab_events_per_s": x_events / tl_s,
        "hta_events_per_s": x_events / hta_s,
        "tracelab_peak_rss_mb": median([s.peak_rss_bytes for s in tl]) / 2**20,
        "hta_peak_rss_mb": median([s.peak_rss_bytes for s in hta]) / 2**20,
        "tracelab_runs_s": [round(s.wall_s, 3) for s in tl],
        "hta_runs_s": [round(s.wall_s, 3) for s in hta],
    }


def scaling(ranks: list[int], reps: int, work: Path) -> list[dict[str, object]]:
    out = []
    for n in ranks:
        folder = rank_set(n)
        samples = [tracelab_ingest(folder, work) for _ in range(reps)]
        out.append(
            {
                "ranks": n,
                "tracelab_s": median([s.wall_s for s in samples]),
                "tracelab_peak_rss_mb": median([s.peak_rss_bytes for s in samples]) / 2**20,
            }
        )
    return out


def table(rows: list[dict[str, object]]) -> str:
    lines = [
        "| case | ranks | input | X events | tracelab (median) | HTA (median) | speed-up | decode floor | tracelab / floor | tracelab peak RSS | HTA peak RSS |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['ranks']} | {r['bytes'] / 1e6:.0f} MB | {r['x_events']:,} | "
            f"{r['tracelab_s']:.2f} s | {r['hta_s']:.2f} s | {r['speedup']:.1f}x | "
            f"{r['floor_s']:.2f} s | {r['over_floor']:.2f}x | "
            f"{r['tracelab_peak_rss_mb']:.0f} MB | {r['hta_peak_rss_mb']:.0f} MB |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--scaling", default="", help="comma-separated rank counts, e.g. 8,64")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "ingest.json"))
    parser.add_argument("--cases", default="a,b,c", help="which cases, e.g. b,c")
    args = parser.parse_args()
    compile_bytecode()  # as a wheel install would (benchmarks/measure.py)
    work = Path(tempfile.mkdtemp(prefix="tracelab-bench-"))
    cases = {
        "a": ("(a) df_index_resolver", lambda: rank_set(1), 1),
        "b": ("(b) 8-rank set", lambda: rank_set(8), 8),
        "c": ("(c) 8-rank set, gzipped", lambda: rank_set(8, gz=True), 8),
        "d": ("(d) 8-rank set, converted on its ranks", lambda: converted_on_ranks(work), 8),
    }
    try:
        rows = [
            bench_case(cases[c][0], cases[c][1](), cases[c][2], args.reps, work)
            for c in args.cases.split(",")
        ]
        scale = scaling([int(n) for n in args.scaling.split(",") if n], args.reps, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(rows))
    if scale:
        print("\n| ranks | tracelab ingest (median) | tracelab peak RSS |\n|---|---|---|")
        for s in scale:
            print(
                f"| {s['ranks']} | {s['tracelab_s']:.2f} s | {s['tracelab_peak_rss_mb']:.0f} MB |"
            )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"cases": rows, "scaling": scale}, indent=2))


if __name__ == "__main__":
    main()
