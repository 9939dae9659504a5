"""DDP training on CPU (gloo) profiled with plain torch.profiler, one scenario after another.

Run under torchrun. argv[1] is the output folder, argv[2] a JSON list of scenarios, each
{"name", "model": {"width", "layers"}, "bucket_cap_mb", "sleep": {"rank", "ms"} | null,
"extra_matmuls": {"rank", "count", "size"} | null}. Each scenario builds its own model and
DDP wrapper and writes one Chrome trace per rank to <out>/<name>/ with
torch.profiler.tensorboard_trace_handler (profiled.py): what a user without tracelab would
have. No tracelab import here on purpose. The faulty rank also writes <out>/<name>.fault.json:
the wall time of the injected sleep or extra compute in each recorded step (perf_counter), for
the tests to compare tracelab's impact with.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist
from profiled import extra_matmuls, profiled_steps, run_scenarios, write_fault
from torch import nn


def run_scenario(out: Path, sc: dict, prof_sched: dict) -> None:
    rank = dist.get_rank()
    torch.manual_seed(0)
    width, layers = sc["model"]["width"], sc["model"]["layers"]
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*mods, nn.Linear(width, 10))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=sc["bucket_cap_mb"])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    sleep = sc.get("sleep")
    fault = extra_matmuls(sc, rank)
    batch = sc.get("batch", 32)
    injected: list[tuple[int, int]] = []  # (loop index, ns) of the injected fault
    dist.barrier()
    for i in profiled_steps(out / sc["name"], prof_sched):
        x, y = torch.randn(batch, width), torch.randint(0, 10, (batch,))
        if fault is not None:
            injected.append((i, fault()))
        loss = nn.functional.cross_entropy(ddp(x), y)
        if sleep and sleep["rank"] == rank:
            t0 = time.perf_counter_ns()
            time.sleep(sleep["ms"] / 1000)
            injected.append((i, time.perf_counter_ns() - t0))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    write_fault(out, sc["name"], injected, prof_sched["warmup"])
    dist.barrier()


if __name__ == "__main__":
    run_scenarios(run_scenario)
