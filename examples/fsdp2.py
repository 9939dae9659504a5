"""FSDP2 (`fully_shard`) on CPU with gloo, profiled by tracelab.

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 4 examples/fsdp2.py --out runs/fsdp2

Each block's parameters are sharded over the 4 ranks: the forward all-gathers them block by
block and the backward reduce-scatters the gradients (on gloo, FSDP2 emulates reduce-scatter
with an all-reduce of the full buffer). The DeviceMesh passed to tracelab.profile records the
data-parallel layout in the manifest.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import tracelab
from tracelab.collectors import arm_flight_recorder


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/fsdp2", help="capture folder")
    parser.add_argument("--steps", type=int, default=12, help="training steps to run")
    parser.add_argument("--record", default="2:12", help="steps to record, START:STOP")
    args = parser.parse_args()
    first, stop = (int(x) for x in args.record.split(":"))

    arm_flight_recorder()
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    model = nn.Sequential(*(Block(128) for _ in range(4)), nn.Linear(128, 10))
    for block in model[:4]:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    with tracelab.profile(args.out, steps=range(first, stop), mesh=mesh) as prof:
        for _ in range(args.steps):
            x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    if dist.get_rank() == 0:
        print(prof.summary())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
