"""DDP with one deliberately slow rank: the straggler the analyzers should find.

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 4 examples/ddp_slow_rank.py --slow-rank 2

Every step, the slow rank sleeps `--delay-ms` between its forward and backward passes (think of a
slower GPU, a noisy neighbour or a data-loader hiccup). The other ranks reach each gradient
all-reduce first and wait for it, so in the collective records the slow rank arrives last at
every all-reduce, and the others' all-reduces last about `--delay-ms` longer.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn

import tracelab
from tracelab.collectors import arm_flight_recorder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/ddp_slow_rank", help="capture folder")
    parser.add_argument("--steps", type=int, default=12, help="training steps to run")
    parser.add_argument("--record", default="2:12", help="steps to record, START:STOP")
    parser.add_argument("--slow-rank", type=int, default=2, help="the rank that is slow")
    parser.add_argument("--delay-ms", type=float, default=100.0, help="its extra time per step")
    args = parser.parse_args()
    first, stop = (int(x) for x in args.record.split(":"))

    arm_flight_recorder()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

    with tracelab.profile(
        args.out,
        steps=range(first, stop),
        parallelism={"dp": dist.get_world_size()},
        coords={"dp": rank},
    ) as prof:
        for _ in range(args.steps):
            x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
            loss = nn.functional.cross_entropy(ddp(x), y)
            if rank == args.slow_rank:
                with torch.profiler.record_function("injected_delay"):
                    time.sleep(args.delay_ms / 1000)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            logged = loss.detach().clone()
            dist.all_reduce(logged)
            prof.step()
    if dist.get_rank() == 0:
        print(prof.summary())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
