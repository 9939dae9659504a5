"""Tensor parallelism (DTensor, Megatron-style column/row split) on CPU with gloo.

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 4 examples/tensor_parallel.py --out runs/tp

Each MLP's first linear layer is split by columns and its second by rows over 4 ranks, so every
block ends with an all-reduce of its output in the forward pass (and of the input gradient in
the backward). DTensor issues these as functional collectives from C++, so tracelab captures
them through the Flight Recorder.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

import tracelab
from tracelab.collectors import arm_flight_recorder


class MLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/tensor_parallel", help="capture folder")
    parser.add_argument("--steps", type=int, default=12, help="training steps to run")
    parser.add_argument("--record", default="2:12", help="steps to record, START:STOP")
    args = parser.parse_args()
    first, stop = (int(x) for x in args.record.split(":"))

    arm_flight_recorder()
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    torch.manual_seed(0)  # every rank builds the same weights before they are split
    model = nn.Sequential(MLP(128), MLP(128))
    for mlp in model:
        parallelize_module(mlp, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    with tracelab.profile(args.out, steps=range(first, stop), mesh=mesh) as prof:
        for step in range(args.steps):
            torch.manual_seed(step)  # tensor parallel ranks see the same batch
            x = torch.randn(32, 128)
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    if dist.get_rank() == 0:
        print(prof.summary())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
