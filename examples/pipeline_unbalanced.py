"""A 4-stage 1F1B pipeline whose stages are deliberately unbalanced in memory.

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 4 examples/pipeline_unbalanced.py

Stage 0 holds most of the layers (`--layers 8,1,1,1`) and each of them widens the activations
4x, so stage 0 keeps far more activation memory per microbatch than the others; 1F1B makes it
worse, since stage s keeps min(m, p - s) microbatches in flight (4, 3, 2, 1 here). The
capture records per-step peak memory of every rank (process RSS on CPU, allocator peaks on
CUDA) and, with profile_memory=True, the trace's own allocation events, which the stage memory
imbalance analyzer compares across stages.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

import tracelab
from tracelab.collectors import arm_flight_recorder

WIDTH = 256
MICROBATCHES = 8
MICROBATCH_SIZE = 64


class Wide(nn.Module):
    """width -> 4*width -> width: keeps a 4x-wide activation alive for the backward."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/pipeline_unbalanced", help="capture folder")
    parser.add_argument("--steps", type=int, default=12, help="training steps to run")
    parser.add_argument("--record", default="2:12", help="steps to record, START:STOP")
    parser.add_argument("--layers", default="8,1,1,1", help="layers per stage")
    args = parser.parse_args()
    first, stop = (int(x) for x in args.record.split(":"))
    layers = [int(n) for n in args.layers.split(",")]

    arm_flight_recorder()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if len(layers) != world:
        raise SystemExit(f"--layers names {len(layers)} stages but there are {world} ranks")
    torch.manual_seed(rank)
    module = nn.Sequential(*(Wide() for _ in range(layers[rank])))
    example = torch.empty(MICROBATCH_SIZE, WIDTH)
    stage = PipelineStage(module, rank, world, torch.device("cpu"), input_args=(example,))
    schedule = Schedule1F1B(stage, n_microbatches=MICROBATCHES, loss_fn=nn.MSELoss())
    opt = torch.optim.SGD(module.parameters(), lr=0.01)

    with tracelab.profile(
        args.out,
        steps=range(first, stop),
        pipeline=schedule,
        parallelism={"pp": world},
        pp_stage=rank,
        profile_memory=True,
    ) as prof:
        for _ in range(args.steps):
            x = torch.randn(MICROBATCHES * MICROBATCH_SIZE, WIDTH)
            if rank == 0:
                schedule.step(x)
            elif rank == world - 1:
                schedule.step(target=torch.randn(MICROBATCHES * MICROBATCH_SIZE, WIDTH))
            else:
                schedule.step()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    if dist.get_rank() == 0:
        print(prof.summary())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
