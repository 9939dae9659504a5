"""Synthetic multi-rank Kineto traces with known answers (the oracles in docs/metrics.md and tests/analyzers/test_oracles.py).

Every scenario writes real Kineto-shaped JSON files (or a capture folder, docs/capture-format.md)
that `tracelab ingest` reads like any other trace, and returns the answers an analyzer must find.

    from tracelab.testing.synth import build_run, SCENARIOS
    run = build_run(tmp_path, "stragglers")           # or build_run(tmp_path, "overlap", backend="gloo")
    ingest(run.paths, db=..., run=run.name)
    run.expected["straggler_rank"]                    # -> 2

`SCENARIOS` maps each name to its builder; each builder's docstring lists its parameters and the
keys of `expected`. Times in scenario parameters and in `expected` are milliseconds (`*_ms`),
shares are fractions. Ranks are written one file each (`rank-N.json`, `.json.gz` with gz=True);
`capture=True` writes a capture folder instead (manifest with the pipeline, clock offsets,
per-step memory peaks and collectives.jsonl), whose path is then `run.paths[0]`.

For a custom layout, build `RankTrace` objects directly (tracelab.testing._kineto: one per rank,
add steps, kernels, NCCL kernels, gloo collectives, annotations and memory instants on the true
clock) and write them with `write_ranks` or `write_capture`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracelab.testing._kineto import MS, US, RankTrace
from tracelab.testing._pipelines import pipeline_traces

__all__ = [
    "MS",
    "SCENARIOS",
    "US",
    "RankTrace",
    "SynthRun",
    "build_run",
    "write_capture",
    "write_ranks",
]


@dataclass(frozen=True, kw_only=True)
class SynthRun:
    """What a scenario wrote and what an analysis of it must find."""

    name: str
    #: Paths to hand to tracelab.ingest.ingest (the rank files, or the capture folder).
    paths: list[Path]
    world_size: int
    expected: dict[str, Any] = field(default_factory=dict)
    traces: list[RankTrace] = field(default_factory=list, repr=False)


def ms(x: float) -> int:
    """Milliseconds to integer nanoseconds."""
    return int(round(x * MS))


def write_ranks(folder: Path, traces: list[RankTrace], *, gz: bool = False) -> list[Path]:
    """One Kineto file per rank: folder/rank-N.json[.gz]."""
    folder.mkdir(parents=True, exist_ok=True)
    return [t.write(folder / f"rank-{t.rank}.json{'.gz' if gz else ''}") for t in traces]


def write_capture(
    folder: Path,
    traces: list[RankTrace],
    *,
    pipeline: dict[str, Any] | None = None,
    clock: bool = True,
    clock_uncertainty_ns: int = 20 * US,
    memory_peaks: dict[int, list[dict[str, Any]]] | None = None,
    collectives: bool = True,
    run_name: str | None = None,
) -> Path:
    """A capture folder (docs/capture-format.md) holding `traces`; returns the folder."""
    world = traces[0].world_size
    ranks = []
    for t in traces:
        rdir = folder / f"rank-{t.rank}"
        t.write(rdir / "window-0.pt.trace.json.gz")
        coll_rel = None
        if collectives and t.collectives:
            coll_rel = f"rank-{t.rank}/collectives.jsonl"
            (folder / coll_rel).write_text("".join(json.dumps(c) + "\n" for c in t.collectives))
        entry = {
            "rank": t.rank,
            "host": f"synth-{t.rank // 8}",
            "device": t.device or "cpu",
            "device_memory_bytes": t.device_memory_bytes if t.device else None,
            "backend": t.backend,
            "coords": {"dp": 0, "tp": 0, "pp": t.rank if pipeline else 0, "cp": 0, "ep": 0},
            "pp_stage": t.rank if pipeline else None,
            "process_groups": [
                {
                    "pg_name": "0",
                    "pg_desc": "default_pg",
                    "ranks": list(range(world)),
                    "backend": t.backend,
                }
            ],
            "traces": [f"rank-{t.rank}/window-0.pt.trace.json.gz"],
            "collectives": coll_rel,
            "memory": (memory_peaks or {}).get(t.rank, []),
            "clock": (
                {
                    "offset_ns": t.clock_offset_ns,
                    "uncertainty_ns": clock_uncertainty_ns,
                    "reference_rank": 0,
                    "samples": [],
                }
                if clock
                else None
            ),
        }
        (rdir / "rank.json").write_text(json.dumps(entry))
        ranks.append(entry)
    manifest = {
        "format": "tracelab.capture",
        "format_version": 1,
        "run_name": run_name or folder.name,
        "world_size": world,
        "created_unix_ns": 1_733_097_600_000_000_000,
        "versions": {
            "tracelab": "0.1.0",
            "torch": "synthetic",
            "cuda": None,
            "nccl": None,
            "python": "3",
        },
        "parallelism": {
            "dims": {
                "dp": 1 if pipeline else world,
                "tp": 1,
                "pp": world if pipeline else 1,
                "cp": 1,
                "ep": 1,
            },
            "source": "user",
        },
        "pipeline": pipeline,
        "schedule": {"wait": 0, "warmup": 0, "active": 1, "repeat": 1},
        "ranks": ranks,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return folder


def _ranks(world: int, backend: str, offsets: list[int] | None = None) -> list[RankTrace]:
    device = None if backend == "gloo" else "NVIDIA H100 80GB HBM3"
    return [
        RankTrace(
            r, world, backend=backend, device=device, clock_offset_ns=(offsets or [0] * world)[r]
        )
        for r in range(world)
    ]


def _comm(
    t: RankTrace,
    op: str,
    start: int,
    end: int,
    nbytes: int,
    *,
    style: str = "legacy",
    stream: int = 20,
    blocking: bool = True,
) -> None:
    if t.backend == "gloo":
        t.gloo(op, start, end, nbytes=nbytes, blocking=blocking)
    else:
        t.nccl(op, start, end, nbytes=nbytes, style=style, stream=stream)


def _compute(t: RankTrace, start: int, end: int, name: str = "sm90_xmma_gemm_bf16") -> None:
    if t.backend == "gloo":
        t.cpu_op("aten::mm", start, end)
    else:
        t.kernel(name, start, end)


def _finish(
    folder: Path,
    name: str,
    traces: list[RankTrace],
    expected: dict[str, Any],
    *,
    gz: bool,
    capture: bool,
    **cap: Any,
) -> SynthRun:
    paths = (
        [write_capture(folder / name, traces, run_name=name, **cap)]
        if capture
        else write_ranks(folder / name, traces, gz=gz)
    )
    return SynthRun(
        name=name, paths=paths, world_size=traces[0].world_size, expected=expected, traces=traces
    )


def overlap(
    folder: Path,
    *,
    backend: str = "nccl",
    second_comm_stream: bool = False,
    steps: int = 1,
    ranks: int = 2,
    gz: bool = False,
    capture: bool = False,
) -> SynthRun:
    """Compute [0,10] and [20,30] ms, communication [5,25] ms (optionally twice, on two streams):
    overlap 50 %, exposed comm 10 ms, compute 20 ms, idle 0, step 30 ms, on every rank and step.
    On gloo the compute is aten::mm on the main thread and the all-reduce runs on the gloo thread.
    Expected: overlap_pct, exposed_comm_ms, overlapped_comm_ms, compute_ms, idle_ms, step_ms."""
    traces = _ranks(ranks, backend)
    for t in traces:
        for k in range(steps):
            o = ms(30 * k)
            t.step(k + 1, o, o + ms(30))
            _compute(t, o, o + ms(10))
            _compute(t, o + ms(20), o + ms(30))
            if backend == "gloo":
                t.gloo("all_reduce", o + ms(5), o + ms(25), nbytes=64 << 20, blocking=False)
            else:
                _comm(
                    t,
                    "all_reduce",
                    o + ms(5),
                    o + ms(25),
                    64 << 20,
                    style="dev" if t.rank % 2 else "legacy",
                )
                if second_comm_stream:
                    _comm(t, "all_gather", o + ms(5), o + ms(25), 64 << 20, stream=24)
    expected = {
        "overlap_pct": 50.0,
        "exposed_comm_ms": 10.0,
        "overlapped_comm_ms": 10.0,
        "compute_ms": 20.0,
        "idle_ms": 0.0,
        "step_ms": 30.0,
        "exposed_memcpy_ms": 0.0,
    }
    return _finish(
        folder,
        f"overlap_{backend}{'_2s' if second_comm_stream else ''}",
        traces,
        expected,
        gz=gz,
        capture=capture,
    )


def stragglers(
    folder: Path,
    *,
    backend: str = "nccl",
    arrivals_ms: tuple[float, ...] = (0, 1, 5, 2),
    end_ms: float = 7,
    base_ms: float = 10,
    steps: int = 4,
    gz: bool = False,
    capture: bool = False,
    name: str | None = None,
    clock_offsets_ms: tuple[float, ...] | None = None,
) -> SynthRun:
    """Each step: rank r computes for base+arrivals[r] ms, then an all-reduce that ends for all
    at base+end. Default: rank 2 is the straggler, waits [5,4,0,3] ms, transfer 2 ms; it is a
    compute straggler; at the median compute (base + median(arrivals)) the step would take
    base + median + transfer (ideal_step_ms; slowdown = step / ideal), and had the straggler
    alone run at the median, saved_ms_straggler sooner. clock_offsets_ms skews the ranks'
    clocks (true times unchanged). Expected: straggler_rank, waits_ms, transfer_ms, kind,
    step_ms, ideal_step_ms, slowdown, saved_ms, saved_ms_straggler."""
    world = len(arrivals_ms)
    traces = _ranks(world, backend, [ms(o) for o in clock_offsets_ms] if clock_offsets_ms else None)
    period = base_ms + end_ms + 5
    for t in traces:
        for k in range(steps):
            o = period * k
            t.step(k + 1, ms(o), ms(o + base_ms + end_ms))
            arrive = ms(o + base_ms + arrivals_ms[t.rank])
            _compute(t, ms(o), arrive)
            _comm(t, "all_reduce", arrive, ms(o + base_ms + end_ms), 256 << 20)
    last = max(arrivals_ms)
    srt = sorted(arrivals_ms)
    med = (srt[(world - 1) // 2] + srt[world // 2]) / 2
    transfer = end_ms - last
    step = base_ms + end_ms
    ideal = base_ms + med + transfer
    alone = max([a for i, a in enumerate(arrivals_ms) if i != arrivals_ms.index(last)] + [med])
    expected = {
        "saved_ms_straggler": step - (base_ms + alone + transfer),
        "straggler_rank": arrivals_ms.index(last),
        "waits_ms": [last - a for a in arrivals_ms],
        "transfer_ms": transfer,
        "kind": "compute",
        "step_ms": step,
        "ideal_step_ms": ideal,
        "slowdown": step / ideal,
        "saved_ms": step - ideal,
        "steps": steps,
    }
    return _finish(
        folder, name or f"stragglers_{backend}", traces, expected, gz=gz, capture=capture
    )


def whatif(folder: Path, *, backend: str = "nccl", gz: bool = False) -> SynthRun:
    """Two ranks compute 10 and 13 ms, then an all-reduce with 2 ms of transfer: both end at
    15 ms; at the median compute both would end at 13.5 ms: slowdown 15/13.5 = 1.111."""
    run = stragglers(
        folder,
        backend=backend,
        arrivals_ms=(0, 3),
        end_ms=5,
        base_ms=10,
        steps=3,
        gz=gz,
        name=f"whatif_{backend}",
    )
    return SynthRun(
        name=run.name,
        paths=run.paths,
        world_size=2,
        traces=run.traces,
        expected={
            **run.expected,
            "step_ms": 15.0,
            "ideal_step_ms": 13.5,
            "slowdown": 15 / 13.5,
            "saved_ms": 1.5,
            "saved_ms_straggler": 1.5,
        },
    )


def clock_offset(
    folder: Path,
    *,
    offset_ms: float = 3.0,
    backend: str = "nccl",
    capture: bool = False,
    gz: bool = False,
) -> SynthRun:
    """Rank 1's clock runs offset_ms ahead; both ranks arrive together at collectives that end at
    true 10, 20 and 30 ms. Estimated offset of rank 1: +offset_ms; uncorrected, rank 1 looks
    offset_ms late at every collective (a false straggler). With capture=True the collector's
    clock exchange records the offset. Expected: offsets_ms, false_lateness_ms."""
    traces = _ranks(2, backend, [0, ms(offset_ms)])
    for t in traces:
        for k in range(3):
            o = 10 * k
            t.step(k + 1, ms(o), ms(o + 10))
            _compute(t, ms(o), ms(o + 7))
            _comm(t, "all_reduce", ms(o + 7), ms(o + 10), 16 << 20)
    expected = {
        "offsets_ms": [0.0, offset_ms],
        "false_lateness_ms": offset_ms,
        "collective_ends_ms": [10.0, 20.0, 30.0],
    }
    return _finish(
        folder,
        f"clock_offset{'_capture' if capture else ''}",
        traces,
        expected,
        gz=gz,
        capture=capture,
    )


def bandwidth(folder: Path, *, style: str = "legacy", gz: bool = False) -> SynthRun:
    """8 ranks all-reduce 10^9 bytes in 10 ms: algbw 100 GB/s, busbw 175 GB/s."""
    traces = _ranks(8, "nccl")
    for t in traces:
        t.step(1, 0, ms(12))
        t.kernel("sm90_xmma_gemm_bf16", 0, ms(2))
        t.nccl("all_reduce", ms(2), ms(12), nbytes=10**9, dtype="Float", style=style)
    expected = {"bytes": 10**9, "time_ms": 10.0, "algbw_gbps": 100.0, "busbw_gbps": 175.0}
    return _finish(folder, f"bandwidth_{style}", traces, expected, gz=gz, capture=False)


def pipeline(
    folder: Path,
    *,
    schedule: str = "1f1b",
    p: int = 4,
    m: int = 8,
    v: int = 1,
    tf_ms: float = 1.0,
    tb_ms: float = 2.0,
    backend: str = "nccl",
    annotate: str = "pp",
    steps: int = 2,
    capture: bool = True,
    slow_stage: int | None = None,
    slow_factor: float = 1.0,
    stall_ms: float = 0.0,
    act_bytes: int = 1 << 30,
    gz: bool = False,
) -> SynthRun:
    """A pipeline run laid out by replaying `schedule` (gpipe, 1f1b, interleaved_1f1b, zb_h1)
    with op times tf/tb ms (ZB-H1: F = I = W = tf) and free communication. annotate: 'pp'
    (PP:{stage}{F|I|B|W}{mb}), 'gpipe' (Forward i / Backward i) or 'none' (Schedule1F1B: only
    forward ops, autograd backward ops and send/recv). slow_stage/slow_factor slow one stage's
    ops; stall_ms delays stage 1's first forward of each step (an excess bubble). Each F
    allocates act_bytes and its backward frees them. Expected: makespan_ms, idle_ms (per rank),
    bubble_share (per rank, share of the step), bubble_share_megatron, inherent_idle_ms,
    peak_microbatches (per rank), memory_max_over_mean."""
    traces, expected = pipeline_traces(
        schedule=schedule,
        p=p,
        m=m,
        v=v,
        tf_ms=tf_ms,
        tb_ms=tb_ms,
        backend=backend,
        annotate=annotate,
        steps=steps,
        slow_stage=slow_stage,
        slow_factor=slow_factor,
        stall_ms=stall_ms,
        act_bytes=act_bytes,
    )
    name = f"pipeline_{schedule}_p{p}_m{m}" + (f"_v{v}" if v > 1 else "") + f"_{backend}"
    torch_names = {
        "gpipe": "ScheduleGPipe",
        "1f1b": "Schedule1F1B",
        "interleaved_1f1b": "ScheduleInterleaved1F1B",
        "zb_h1": "ZBH1",
    }
    meta = {"schedule": torch_names[schedule], "stages": p * v, "microbatches": m}
    peaks = {
        t.rank: [
            {
                "step": k + 1,
                "ts_ns": t.abs_ns(0),
                "device_type": "cpu" if backend == "gloo" else "cuda",
                "peak_allocated_bytes": expected["peak_microbatches"][t.rank] * act_bytes,
                "peak_reserved_bytes": expected["peak_microbatches"][t.rank] * act_bytes,
                "rss_bytes": None,
            }
            for k in range(steps)
        ]
        for t in traces
    }
    return _finish(
        folder, name, traces, expected, gz=gz, capture=capture, pipeline=meta, memory_peaks=peaks
    )


SCENARIOS: dict[str, Callable[..., SynthRun]] = {
    "overlap": overlap,
    "stragglers": stragglers,
    "whatif": whatif,
    "clock_offset": clock_offset,
    "bandwidth": bandwidth,
    "pipeline": pipeline,
}


def build_run(folder: str | Path, scenario: str, **params: Any) -> SynthRun:
    """Write scenario `scenario` (a key of SCENARIOS) under `folder`; see each builder's doc."""
    if scenario not in SCENARIOS:
        raise KeyError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    return SCENARIOS[scenario](Path(folder), **params)
