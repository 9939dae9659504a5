"""Every torch.distributed.pipelining schedule on CPU (gloo), profiled with plain torch.profiler.

Run under torchrun. argv[1] is the output folder, argv[2] a JSON spec: {"profiler": {"warmup",
"active"}, "pipeline": {"width", "layers_per_stage", "microbatches", "microbatch_size"},
"schedules": [names]}. For each schedule, in one process group, this builds fresh stages, runs
warmup + active training steps under torch.profiler and writes one Chrome trace per rank to
<out>/<schedule>/ (tensorboard_trace_handler, profiled.py). No tracelab import here on purpose.

Stage placement, as the schedules require:
- GPipe, 1F1B: one stage per rank (stage = rank);
- Interleaved1F1B, LoopedBFS, InterleavedZeroBubble: two stages per rank, round-robin (rank r
  holds r and r + world);
- ZBVZeroBubble, DualPipeV: two stages per rank in a V (rank r holds r and 2 * world - 1 - r).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from profiled import profiled_steps
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleLoopedBFS,
    ScheduleZBVZeroBubble,
)

#: name -> (class, placement): "single", "loop" (round-robin) or "v".
SCHEDULES = {
    "gpipe": (ScheduleGPipe, "single"),
    "1f1b": (Schedule1F1B, "single"),
    "interleaved_1f1b": (ScheduleInterleaved1F1B, "loop"),
    "looped_bfs": (ScheduleLoopedBFS, "loop"),
    "interleaved_zb": (ScheduleInterleavedZeroBubble, "loop"),
    "zbv": (ScheduleZBVZeroBubble, "v"),
    "dualpipev": (ScheduleDualPipeV, "v"),
}


def stage_ids(placement: str, rank: int, world: int) -> list[int]:
    if placement == "single":
        return [rank]
    if placement == "loop":
        return [rank, rank + world]
    return [rank, 2 * world - 1 - rank]


def run_schedule(out: Path, name: str, pp: dict, prof_sched: dict) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    cls, placement = SCHEDULES[name]
    ids = stage_ids(placement, rank, world)
    n_stages = world * len(ids)
    width, mb, m = pp["width"], pp["microbatch_size"], pp["microbatches"]
    example = torch.empty(mb, width)
    modules = []
    for i in ids:
        torch.manual_seed(i)
        layers: list[nn.Module] = []
        for _ in range(pp["layers_per_stage"]):
            layers += [nn.Linear(width, width), nn.ReLU()]
        modules.append(nn.Sequential(*layers))
    stages = [
        PipelineStage(mod, i, n_stages, torch.device("cpu"), input_args=(example,))
        for mod, i in zip(modules, ids)
    ]
    loss_fn = nn.MSELoss()
    sched = (
        cls(stages[0], n_microbatches=m, loss_fn=loss_fn)
        if placement == "single"
        else cls(stages, n_microbatches=m, loss_fn=loss_fn)
    )
    params = [p for mod in modules for p in mod.parameters()]
    opt = torch.optim.SGD(params, lr=0.01)
    holds_first, holds_last = 0 in ids, n_stages - 1 in ids
    torch.manual_seed(1000 + rank)
    dist.barrier()
    for _ in profiled_steps(out / name, prof_sched):
        x = torch.randn(m * mb, width)
        target = torch.randn(m * mb, width)
        losses: list[torch.Tensor] = []
        if holds_first and holds_last:
            sched.step(x, target=target, losses=losses)
        elif holds_first:
            sched.step(x)
        elif holds_last:
            sched.step(target=target, losses=losses)
        else:
            sched.step()
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.barrier()


def main() -> None:
    out = Path(sys.argv[1])
    spec = json.loads(sys.argv[2])
    dist.init_process_group("gloo")
    for name in spec["schedules"]:
        t0 = time.perf_counter()
        run_schedule(out, name, spec["pipeline"], spec["profiler"])
        if dist.get_rank() == 0:
            print(f"schedule {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
