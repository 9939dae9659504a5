"""A 2-rank gloo job under tracelab.profile in which rank 1 skips an all-reduce: rank 0's
collective times out inside the profiled loop, and the collector leaves its Flight Recorder dump
in the capture folder (flight-recorder/rank_0.*)."""

from __future__ import annotations

import argparse
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import tracelab
from tracelab.collectors import arm_flight_recorder

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
a = p.parse_args()
arm_flight_recorder()
dist.init_process_group("gloo", timeout=timedelta(seconds=4))
rank = dist.get_rank()
x = torch.ones(256)
try:
    with tracelab.profile(a.out, steps=range(1, 10)) as prof:
        for step in range(6):
            if not (step == 3 and rank == 1):
                dist.all_reduce(x)
            else:
                time.sleep(6)
                break
            prof.step()
except Exception as exc:  # noqa: BLE001 (rank 0: the timeout)
    print(f"rank {rank}: {type(exc).__name__}: {exc}")
