"""DistributedDataParallel on CPU with gloo, profiled by tracelab.

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 4 examples/ddp.py --out runs/ddp
    tracelab ingest runs/ddp

On GPUs (NCCL, one GPU per rank): add `--device cuda`.

The DDP reducer all-reduces gradient buckets from C++ during backward; tracelab captures them
through PyTorch's Flight Recorder, armed before init_process_group. The explicit all_reduce of
the loss goes through torch.distributed in Python and is timed by tracelab's hooks.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn

import tracelab
from tracelab.collectors import arm_flight_recorder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/ddp", help="capture folder")
    parser.add_argument("--steps", type=int, default=12, help="training steps to run")
    parser.add_argument("--record", default="2:12", help="steps to record, START:STOP")
    parser.add_argument("--disable", action="store_true", help="run with tracelab disabled")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    first, stop = (int(x) for x in args.record.split(":"))

    arm_flight_recorder()  # before init_process_group: captures the reducer's all-reduces
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    ).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

    with tracelab.profile(args.out, steps=range(first, stop), enabled=not args.disable) as prof:
        for _ in range(args.steps):
            x = torch.randn(64, 256, device=device)
            y = torch.randint(0, 10, (64,), device=device)
            loss = nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            mean_loss = loss.detach().clone()
            dist.all_reduce(mean_loss)  # sum over ranks, for logging
            prof.step()
    if dist.get_rank() == 0:
        print(f"final mean loss {mean_loss.item() / dist.get_world_size():.4f}")
    if dist.get_rank() == 0:
        print(prof.summary())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
