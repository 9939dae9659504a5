"""FSDP2 and DTensor tensor parallelism on CPU (gloo), profiled with plain torch.profiler.

Run under torchrun. argv[1] is the output folder, argv[2] a JSON spec: {"profiler": {"warmup",
"active"}, "scenarios": [{"name", "kind": "fsdp" | "tp", "width", "layers", "batch",
"reshard_after_forward", "shard_blocks" (FSDP: also shard each block; default true),
"extra_matmuls": {"rank", "count", "size"} | null}]}. Both issue their collectives
asynchronously and block later, in `_c10d_functional::wait_tensor` (or a work's `wait()`):
the collective's own span is not where a rank waits for a late peer. Each scenario builds a
fresh model on a 1-D mesh of every rank and writes one Chrome trace per rank to <out>/<name>/
(tensorboard_trace_handler, profiled.py). No tracelab import here on purpose. The faulty rank
also writes <out>/<name>.fault.json: the wall time of its extra compute in each recorded step.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from profiled import extra_matmuls, profiled_steps, run_scenarios, write_fault
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)


class Block(nn.Module):
    """An MLP block: up (column-parallel under TP), ReLU, down (row-parallel under TP)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def build(sc: dict, world: int) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(sc["width"]) for _ in range(sc["layers"])])
    mesh = init_device_mesh("cpu", (world,))
    if sc["kind"] == "fsdp":
        reshard = sc.get("reshard_after_forward", True)
        if sc.get("shard_blocks", True):
            for block in model:
                fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    else:
        for block in model:
            parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    return model


def run_scenario(out: Path, sc: dict, prof_sched: dict) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build(sc, world)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    fault = extra_matmuls(sc, rank)
    injected: list[tuple[int, int]] = []
    # TP replicates the batch over the mesh; FSDP shards data: same seed per rank either way.
    gen = torch.Generator().manual_seed(rank if sc["kind"] == "fsdp" else 0)
    dist.barrier()
    for i in profiled_steps(out / sc["name"], prof_sched):
        x = torch.randn(sc["batch"], sc["width"], generator=gen)
        loss = model(x).pow(2).mean()
        # Between forward and backward, where the ranks have just met at the forward's
        # collectives: at the step's start the fault would overlap the others' ends of the
        # previous step, which vary by tens of ms on an oversubscribed 2-core runner.
        if fault is not None:
            injected.append((i, fault()))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    write_fault(out, sc["name"], injected, prof_sched["warmup"])
    dist.barrier()


if __name__ == "__main__":
    run_scenarios(run_scenario)
