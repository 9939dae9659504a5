"""Ingest and analysis at many ranks, on the local pool and on a local Ray cluster (issue 22).

    python benchmarks/scale_out.py --ranks 1000 --kernels 1600 [--ray] [--reps 1]
    python benchmarks/scale_out.py --ranks 10000 --kernels 4 --steps 3

A constructed run: every rank the same trace (built once with tracelab.testing's Kineto builder,
then written once per rank with its rank rewritten): `--steps` ProfilerSteps, each with
`--kernels` compute kernels (each one a launch and a kernel event) and `--collectives`
all-reduces. Measured, each as a fresh process (benchmarks.measure: wall time and the peak RSS
of the whole process tree): `tracelab ingest` with the local pool, with `--ray` also
`tracelab ingest --engine ray` against a local Ray cluster of 2 worker CPUs started on
127.0.0.1 (its workers are not children of the ingest: their memory is not in the figure),
and `tracelab analyze` on the store. The two stores are checked to hold the same row counts in
every per-run table (tests/foundation/test_ray_engine.py compares them row for row).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import Sample, compile_bytecode, run_measured  # noqa: E402
from tracelab.testing._kineto import MS, US, RankTrace  # noqa: E402


def build(
    folder: Path, ranks: int, steps: int, kernels: int, collectives: int, gz: bool = False
) -> int:
    """Write the run; returns the complete events per rank. With `gz`, each rank's file is
    `rank-R.json.gz` of two gzip members: its own `distributedInfo`, then the rest of the
    trace, compressed once and shared by every rank's file (a 1,000-rank run of 100k events a
    rank is 36 GB of JSON, 0.6 GB this way; the ingest still inflates and parses every byte)."""
    done = folder / ".complete"
    if done.exists():
        return int(done.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    t = RankTrace(0, ranks, backend="nccl", device="NVIDIA H100 80GB HBM3")
    step_ns = kernels * 20 * US + collectives * 200 * US + MS
    for s in range(steps):
        o = s * step_ns
        t.step(s + 1, o, o + step_ns - 10 * US)
        cur = o
        for k in range(kernels):
            t.kernel("sm90_xmma_gemm_bf16", cur, cur + 15 * US)
            cur += 20 * US
            if collectives and k % max(1, kernels // collectives) == 0:
                t.nccl("all_reduce", cur, cur + 150 * US, nbytes=64 << 20)
                cur += 200 * US
    doc = t.to_dict()
    events = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X")
    if gz:
        info = doc.pop("distributedInfo")
        body = gzip.compress(json.dumps(doc)[1:].encode(), compresslevel=6)  # '"traceEvents"...}'
        for r in range(ranks):
            head = json.dumps({"distributedInfo": {**info, "rank": r}})[:-1] + ", "
            (folder / f"rank-{r}.json.gz").write_bytes(gzip.compress(head.encode()) + body)
        done.write_text(str(events))
        return events
    for r in range(ranks):
        doc["distributedInfo"]["rank"] = r
        (folder / f"rank-{r}.json").write_text(json.dumps(doc))
    done.write_text(str(events))
    return events


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tracelab(*args: str) -> Sample:
    sample = run_measured([sys.executable, "-m", "tracelab.cli", *args], timeout_s=3600)
    if sample.returncode != 0:
        raise SystemExit(f"tracelab {' '.join(args)} failed:\n{sample.stdout[-3000:]}")
    return sample


def _counts(db: Path) -> dict[str, int]:
    from tracelab.store import RUN_TABLES, open_store

    with open_store(db) as con:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in RUN_TABLES}


def _clear_converted(folder: Path) -> None:
    for d in folder.glob("*.tracelab"):
        shutil.rmtree(d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--kernels", type=int, default=1600, help="compute kernels a step")
    ap.add_argument("--collectives", type=int, default=4, help="all-reduces a step")
    ap.add_argument("--ray", action="store_true", help="also ingest on a local Ray cluster")
    ap.add_argument("--gzip", action="store_true", help="rank-R.json.gz files (see build)")
    ap.add_argument("--data", type=Path, default=Path("bench_data"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    compile_bytecode()  # as a wheel install would (benchmarks/measure.py)
    name = f"scale_r{args.ranks}_s{args.steps}_k{args.kernels}_c{args.collectives}"
    folder = args.data / (name + ("_gz" if args.gzip else ""))
    events = build(folder, args.ranks, args.steps, args.kernels, args.collectives, args.gzip)
    files = sorted(folder.glob("rank-*.json*"))
    size = sum(p.stat().st_size for p in files)
    if args.gzip:
        with gzip.open(files[0]) as fh:
            text_bytes = len(fh.read()) * len(files)
        print(
            f"{args.ranks} ranks x {events:,} complete events ({text_bytes / 1e9:.2f} GB of "
            f"JSON, {size / 1e9:.2f} GB gzipped)"
        )
    else:
        text_bytes = size
        print(f"{args.ranks} ranks x {events:,} complete events ({size / 1e9:.2f} GB of JSON)")
    result: dict[str, object] = {
        "ranks": args.ranks,
        "events_per_rank": events,
        "json_bytes": text_bytes,
        "file_bytes": size,
        "cpus": os.cpu_count(),
    }
    with tempfile.TemporaryDirectory(prefix="tlscale", dir="/tmp") as tmp:
        work = Path(tmp)
        _clear_converted(folder)
        local = _tracelab("ingest", str(folder), "--db", str(work / "local.duckdb"), "--run", "r")
        print(
            f"ingest, local pool: {local.wall_s:.1f} s, peak RSS {local.peak_rss_bytes >> 20} MiB"
        )
        result["ingest_local"] = {"wall_s": local.wall_s, "peak_rss_bytes": local.peak_rss_bytes}
        analyze = _tracelab("analyze", "--db", str(work / "local.duckdb"), "--run", "r")
        print(f"analyze: {analyze.wall_s:.1f} s, peak RSS {analyze.peak_rss_bytes >> 20} MiB")
        result["analyze"] = {"wall_s": analyze.wall_s, "peak_rss_bytes": analyze.peak_rss_bytes}
        if args.ray:
            port = _free_port()
            ray_bin = str(Path(sys.executable).parent / "ray")
            temp = tempfile.mkdtemp(prefix="tlray", dir="/tmp")
            env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
            subprocess.run(
                [ray_bin, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                 "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats",
                 "--object-store-memory=200000000", f"--temp-dir={temp}"],
                check=True, env=env, capture_output=True,
            )  # fmt: skip
            try:
                on_ray = _tracelab(
                    "ingest", str(folder), "--db", str(work / "ray.duckdb"), "--run", "r",
                    "--engine", "ray", "--address", f"127.0.0.1:{port}",
                )  # fmt: skip
            finally:
                subprocess.run([ray_bin, "stop", "--force"], env=env, capture_output=True)
                _clear_converted(folder)
            print(
                f"ingest, Ray (2 workers): {on_ray.wall_s:.1f} s, driver peak RSS {on_ray.peak_rss_bytes >> 20} MiB"
            )
            result["ingest_ray"] = {
                "wall_s": on_ray.wall_s,
                "peak_rss_bytes": on_ray.peak_rss_bytes,
            }
            same = _counts(work / "local.duckdb") == _counts(work / "ray.duckdb")
            print(f"same row counts in every table: {same}")
            result["same_tables"] = same
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
