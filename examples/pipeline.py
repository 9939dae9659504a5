"""A 4-stage pipeline with 8 microbatches (torch.distributed.pipelining), profiled by tracelab.

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 4 examples/pipeline.py --schedule 1f1b --out runs/pp
    OMP_NUM_THREADS=1 torchrun --nproc_per_node 4 examples/pipeline.py --schedule interleaved-1f1b

Schedules: 1f1b (Schedule1F1B, one stage per rank), gpipe (ScheduleGPipe), interleaved-1f1b
(ScheduleInterleaved1F1B) and interleaved-zb (ScheduleInterleavedZeroBubble), the last two with
two stages per rank placed round-robin (rank r holds stages r and r + 4). tracelab records the
schedule, the stage count, the microbatch count and each rank's stages in the manifest.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)

import tracelab
from tracelab.collectors import arm_flight_recorder

SCHEDULES = {
    "1f1b": (Schedule1F1B, 1),
    "gpipe": (ScheduleGPipe, 1),
    "interleaved-1f1b": (ScheduleInterleaved1F1B, 2),
    "interleaved-zb": (ScheduleInterleavedZeroBubble, 2),
}
WIDTH = 256
LAYERS_PER_STAGE = 2
MICROBATCHES = 8
MICROBATCH_SIZE = 16


def make_stage_module(stage_index: int) -> nn.Module:
    torch.manual_seed(stage_index)
    layers: list[nn.Module] = []
    for _ in range(LAYERS_PER_STAGE):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    parser.add_argument("--out", default="runs/pipeline", help="capture folder")
    parser.add_argument("--steps", type=int, default=12, help="training steps to run")
    parser.add_argument("--record", default="2:12", help="steps to record, START:STOP")
    args = parser.parse_args()
    first, stop = (int(x) for x in args.record.split(":"))

    arm_flight_recorder()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    schedule_cls, stages_per_rank = SCHEDULES[args.schedule]
    num_stages = world * stages_per_rank
    device = torch.device("cpu")
    example = torch.empty(MICROBATCH_SIZE, WIDTH)

    stage_ids = [rank + k * world for k in range(stages_per_rank)]
    modules = [make_stage_module(i) for i in stage_ids]
    stages = [
        PipelineStage(m, i, num_stages, device, input_args=(example,))
        for m, i in zip(modules, stage_ids)
    ]
    loss_fn = nn.MSELoss()
    if stages_per_rank == 1:
        schedule = schedule_cls(stages[0], n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    else:
        schedule = schedule_cls(stages, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    params = [p for m in modules for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=0.01)

    holds_first = 0 in stage_ids
    holds_last = num_stages - 1 in stage_ids
    with tracelab.profile(
        args.out,
        steps=range(first, stop),
        pipeline=schedule,
        parallelism={"pp": world},
        pp_stage=rank,
    ) as prof:
        for _ in range(args.steps):
            x = torch.randn(MICROBATCHES * MICROBATCH_SIZE, WIDTH)
            target = torch.randn(MICROBATCHES * MICROBATCH_SIZE, WIDTH)
            losses: list[torch.Tensor] = []
            if holds_first and holds_last:
                schedule.step(x, target=target, losses=losses)
            elif holds_first:
                schedule.step(x)
            elif holds_last:
                schedule.step(target=target, losses=losses)
            else:
                schedule.step()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    if holds_last:
        print(f"rank {rank}: last loss {torch.stack(losses).mean().item():.4f}")
    if dist.get_rank() == 0:
        print(prof.summary())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
