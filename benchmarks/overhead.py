"""Step-time overhead of tracelab.profile on the CPU DDP example (examples/ddp.py's model).

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 benchmarks/overhead.py [--blocks 7 --steps 40]

Modes, run in interleaved blocks whose order rotates (A B C D E, B C D E A, ...) so that drift
in the machine's load and the position in a round hit every mode alike:

- bare:             no profiler at all (the reference)
- bare_again:       bare once more: the A/A difference is the noise floor
- tracelab_outside: inside `tracelab.profile`, but outside its active windows
- torch_profiler:   bare torch.profiler, recording (CPU activity), no tracelab
- tracelab_active:  tracelab.profile inside an active window: torch.profiler + c10d hooks +
                    Flight Recorder pairing + memory peaks

Each block runs `--steps` training steps; steps whose timing includes a window's start or its
end are dropped from the active modes (those costs are paid once per window and are reported
separately as "window end ms": for torch.profiler the trace export, for tracelab also the Flight
Recorder pairing and the clock exchange, which waits for the slowest rank's export). Rank 0 prints a Markdown table of per-step medians.

On a shared machine the end-to-end differences drown in noise (compare bare_again with bare), so
the script also measures the direct costs that make up the overhead, which do not: one
`prof.step()` outside a window, and one hooked collective minus an unhooked one (an all-reduce of
one float on a single-rank gloo group, so that the communication itself costs little).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import tracelab
from tracelab.collectors import arm_flight_recorder

MODES = ("bare", "bare_again", "tracelab_outside", "torch_profiler", "tracelab_active")


class _NoProfiler:
    def __enter__(self) -> _NoProfiler:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def step(self) -> None:
        return None


def make_step(ddp: nn.Module, opt: torch.optim.Optimizer) -> Callable[[], None]:
    def step() -> None:
        x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        logged = loss.detach().clone()
        dist.all_reduce(logged)

    return step


def run_block(
    mode: str, steps: int, train_step: Callable[[], None], out: Path
) -> tuple[list[int], float]:
    """Per-step times (ns) of one block, and the time spent in the step that exported."""
    window = range(1, steps - 1)  # step 0 warms up, the last step is the export step
    if mode in ("bare", "bare_again"):
        prof: Any = _NoProfiler()
    elif mode == "tracelab_outside":
        prof = tracelab.profile(out, steps=range(10**9, 10**9 + 1))
    elif mode == "torch_profiler":
        sched = torch.profiler.schedule(wait=0, warmup=1, active=len(window))
        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=sched,
            on_trace_ready=lambda p: p.export_chrome_trace(str(out / "torch.pt.trace.json.gz")),
        )
    else:
        prof = tracelab.profile(out, steps=window)
    times: list[int] = []
    with prof:
        for _ in range(steps):
            dist.barrier()  # every rank starts the step together: one rank's noise stays its own
            t0 = time.perf_counter_ns()
            train_step()
            prof.step()
            times.append(time.perf_counter_ns() - t0)
    export_ns = 0.0
    if mode in ("torch_profiler", "tracelab_active"):
        export_ns = float(times[window.stop - 1])
        times = times[window.start + 1 : window.stop - 1]  # inside the window, no transitions
    else:
        times = times[1:]
    return times, export_ns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=7, help="blocks per mode")
    parser.add_argument("--steps", type=int, default=40, help="steps per block")
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset")
    args = parser.parse_args()

    arm_flight_recorder()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    train_step = make_step(ddp, torch.optim.SGD(ddp.parameters(), lr=0.01))
    for _ in range(20):
        train_step()

    modes = [m for m in MODES if m in args.modes.split(",")]
    samples: dict[str, list[int]] = {m: [] for m in modes}
    block_medians: dict[str, list[float]] = {m: [] for m in modes}
    exports: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for block in range(args.blocks):
            shift = block % len(modes)  # rotate the order: no mode always follows another
            for mode in modes[shift:] + modes[:shift]:
                out = Path(tmp) / f"{mode}-{block}"
                out.mkdir()
                times, export_ns = run_block(mode, args.steps, train_step, out)
                samples[mode] += times
                block_medians[mode].append(statistics.median(times))
                if export_ns:
                    exports[mode].append(export_ns)
    direct = direct_costs()
    if rank == 0:
        report(samples, block_medians, exports, args, dist.get_world_size())
        print(f"\nDirect costs (median of {direct['rounds']} rounds):")
        print(f"- prof.step() outside a window: {direct['step_outside_ns']:.0f} ns per call")
        print(
            f"- c10d hook on a 1-float all_reduce: {direct['hook_ns']:+.0f} ns per op "
            f"({direct['unhooked_ns']:.0f} ns unhooked, {direct['hooked_ns']:.0f} ns hooked)"
        )
        if args.json is not None:
            data = json.loads(args.json.read_text())
            data["direct"] = direct
            args.json.write_text(json.dumps(data, indent=1))
    dist.destroy_process_group()


def direct_costs(rounds: int = 15, calls: int = 2000) -> dict[str, float]:
    """Per-call costs of tracelab's own code, timed in tight loops (immune to step noise)."""
    from tracelab.collectors.comm_timing import CommTimer

    with tempfile.TemporaryDirectory() as tmp:
        prof = tracelab.profile(tmp, steps=range(10**9, 10**9 + 1), clock_sync=False)
        with prof:
            per_step = []
            for _ in range(rounds):
                t0 = time.perf_counter_ns()
                for _ in range(calls * 10):
                    prof.step()
                per_step.append((time.perf_counter_ns() - t0) / (calls * 10))
    solo, _ = dist.new_subgroups(group_size=1)  # this rank alone: the op costs little
    t = torch.ones(1)
    timer = CommTimer(rank=dist.get_rank(), on_error=lambda exc: None)
    unhooked, hooked = [], []
    for _ in range(rounds):
        for installed, out in ((False, unhooked), (True, hooked)):
            if installed:
                timer.install(0)
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                dist.all_reduce(t, group=solo)
            out.append((time.perf_counter_ns() - t0) / calls)
            if installed:
                timer.uninstall()
                timer.drain()
    diffs = [h - u for h, u in zip(hooked, unhooked)]
    return {
        "rounds": rounds,
        "step_outside_ns": statistics.median(per_step),
        "unhooked_ns": statistics.median(unhooked),
        "hooked_ns": statistics.median(hooked),
        "hook_ns": statistics.median(diffs),
    }


def report(
    samples: dict[str, list[int]],
    block_medians: dict[str, list[float]],
    exports: dict[str, list[float]],
    args: argparse.Namespace,
    world: int,
) -> None:
    base = statistics.median(samples["bare"])
    rows = []
    for mode in samples:
        med = statistics.median(samples[mode])
        # spread of the overhead across blocks: each block's median against the bare block's
        per_block = sorted(m / b - 1 for m, b in zip(block_medians[mode], block_medians["bare"]))
        rows.append(
            {
                "mode": mode,
                "steps": len(samples[mode]),
                "step_ms_median": med / 1e6,
                "overhead_pct": (med / base - 1) * 100,
                "block_overhead_pct_median": statistics.median(per_block) * 100,
                "block_overhead_pct_min": per_block[0] * 100,
                "block_overhead_pct_max": per_block[-1] * 100,
                "export_ms_median": statistics.median(exports[mode]) / 1e6
                if exports[mode]
                else None,
            }
        )
    print(
        f"\nCPU DDP example, {world} ranks (gloo), {args.blocks} blocks x {args.steps} steps "
        "per mode, medians\n"
    )
    print(
        "| mode | steps | step ms (median) | overhead vs bare (pooled medians) | "
        "overhead, median of blocks | per-block range | window end ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        export = f"{r['export_ms_median']:.1f}" if r["export_ms_median"] is not None else "-"
        print(
            f"| {r['mode']} | {r['steps']} | {r['step_ms_median']:.3f} | "
            f"{r['overhead_pct']:+.2f}% | {r['block_overhead_pct_median']:+.2f}% | "
            f"{r['block_overhead_pct_min']:+.1f}% .. "
            f"{r['block_overhead_pct_max']:+.1f}% | {export} |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({"world_size": world, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
