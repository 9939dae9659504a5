"""A 2-D FSDP x TP job on a 2x2 DeviceMesh (dp_shard=2 via fully_shard, tp=2 via
parallelize_module) on CPU with gloo, 4 ranks.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 4 fsdp_tp_2d.py --out DIR [--collector]

Without --collector the job is profiled by plain torch.profiler, no tracelab code at all: each
rank writes DIR/rank-<r>.pt.trace.json (what `tracelab ingest DIR` reads as any Kineto folder).
With --collector it runs under tracelab.profile(DIR, mesh=mesh), which records the mesh.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

WIDTH = 64


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--collector", action="store_true")
    args = parser.parse_args()

    if args.collector:
        from tracelab.collectors import arm_flight_recorder

        arm_flight_recorder()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
    torch.manual_seed(0)  # every rank builds the same weights before they are split
    model = nn.Sequential(MLP(), MLP())
    for mlp in model:
        parallelize_module(mlp, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(mlp, mesh=mesh["dp_shard"])
    fully_shard(model, mesh=mesh["dp_shard"])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def train_step(step: int) -> None:
        # TP ranks of one data-parallel shard see the same batch.
        torch.manual_seed(1000 * step + mesh["dp_shard"].get_local_rank())
        x = torch.randn(16, WIDTH)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    if args.collector:
        import tracelab

        with tracelab.profile(args.out, steps=range(2, args.steps), mesh=mesh) as prof:
            for step in range(args.steps):
                train_step(step)
                prof.step()
    else:
        os.makedirs(args.out, exist_ok=True)
        sched = torch.profiler.schedule(wait=1, warmup=1, active=args.steps - 2, repeat=1)
        path = os.path.join(args.out, f"rank-{rank}.pt.trace.json")
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=sched,
            on_trace_ready=lambda p: p.export_chrome_trace(path),
        ) as prof:
            for step in range(args.steps):
                train_step(step)
                prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
