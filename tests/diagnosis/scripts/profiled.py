"""What every capture script here shares: plain torch.profiler around a training loop, the way a
user without tracelab profiles a job, and the torchrun entry point that runs scenarios one after
another. No tracelab import here on purpose: these are traces tracelab did not design.

The scripts run under torchrun by path, so they import this module from their own folder.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler


def profiled_steps(
    trace_dir: Path, prof_sched: dict[str, int], *, record_shapes: bool = False
) -> Iterator[int]:
    """Yield the loop index of each of `warmup + active` steps inside a CPU torch.profiler that
    records the `active` ones once and writes this rank's Chrome trace to `trace_dir`
    (tensorboard_trace_handler, worker name `rank<N>`); prof.step() follows each step."""
    rank = dist.get_rank()
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=record_shapes,
        schedule=schedule(
            wait=0, warmup=prof_sched["warmup"], active=prof_sched["active"], repeat=1
        ),
        on_trace_ready=tensorboard_trace_handler(str(trace_dir), worker_name=f"rank{rank}"),
    ) as prof:
        for i in range(prof_sched["warmup"] + prof_sched["active"]):
            yield i
            prof.step()


def write_fault(out: Path, name: str, injected: list[tuple[int, int]], warmup: int) -> None:
    """The faulty rank's <out>/<name>.fault.json: {"rank", "recorded_ns"}, the wall time of
    the injected fault in each recorded step (`injected`: (loop index, ns)), beside (not in)
    the traces; nothing when this rank injected nothing."""
    if injected:
        recorded = [ns for i, ns in injected if i >= warmup]
        (out / f"{name}.fault.json").write_text(
            json.dumps({"rank": dist.get_rank(), "recorded_ns": recorded})
        )


def run_scenarios(run_scenario: Callable[[Path, dict[str, Any], dict[str, int]], None]) -> None:
    """The scripts' main(): argv[1] is the output folder, argv[2] a JSON spec {"profiler":
    {"warmup", "active"}, "scenarios": [...]}; runs run_scenario(out, scenario, profiler) for
    each scenario in one gloo process group, rank 0 printing each one's wall time."""
    out = Path(sys.argv[1])
    spec = json.loads(sys.argv[2])
    dist.init_process_group("gloo")
    for sc in spec["scenarios"]:
        t0 = time.perf_counter()
        run_scenario(out, sc, spec["profiler"])
        if dist.get_rank() == 0:
            print(f"scenario {sc['name']}: {time.perf_counter() - t0:.1f} s", flush=True)
    dist.destroy_process_group()


def extra_matmuls(sc: dict[str, Any], rank: int) -> Callable[[], int] | None:
    """The injected compute fault of scenario `sc` ("extra_matmuls": rank, size, count) on this
    `rank`: a function that runs it and returns how long it took in ns; None on other ranks.
    Its matrices are drawn here, where the scripts drew them (the same random stream)."""
    extra = sc.get("extra_matmuls")
    if not extra or extra["rank"] != rank:
        return None
    a = torch.randn(extra["size"], extra["size"])
    w = torch.randn(extra["size"], extra["size"]) / extra["size"] ** 0.5

    def run() -> int:
        t0 = time.perf_counter_ns()
        h = a
        for _ in range(extra["count"]):
            h = torch.tanh(h @ w)
        return time.perf_counter_ns() - t0

    return run
