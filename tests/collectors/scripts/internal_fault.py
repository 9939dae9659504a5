"""A real internal fault on one rank (run under torchrun): rank 1's first trace file cannot be
written, because a directory stands where the file should go. The collector must log it, switch
itself off on that rank, and let every rank finish its loop; argv[1] is the capture folder."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

import tracelab


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 1:
        (out / "rank-1" / "window-0.pt.trace.json.gz").mkdir(parents=True)
    total = torch.zeros(1)
    # 20 s: long enough for both ranks to reach tracelab.profile on a loaded machine (10 s was
    # not, once, with other tests running). Rank 1 keeps answering the clock exchanges after its
    # collector fails, so nobody waits that long here.
    with tracelab.profile(out, steps=range(1, 3), control_timeout_s=20) as prof:
        for _ in range(5):
            t = torch.ones(1)
            dist.all_reduce(t)
            total += t
            prof.step()
    print(f"rank {rank} finished: total={int(total.item())} error={prof.error!r}", flush=True)
    # tracelab's own gloo group is gone once the profile exits (left to the interpreter's exit,
    # it aborted a rank now and then): only the job's default group is left.
    groups = len(dist.distributed_c10d._world.pg_map)
    print(f"rank {rank} process groups after the profile: {groups}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
