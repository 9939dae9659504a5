"""A 4-rank gloo job for the hang cases two ranks cannot show, leaving each rank's Flight Recorder
dump in both forms (JSON and pickle).

    torchrun --nproc_per_node 4 hang_job4.py --fault subgroups|skip_killed|size_killed|a2a_dtype --out DIR

Each step runs an all-to-all and an all-reduce on the world group (and, for `subgroups`, an
all-reduce in each of two groups, {0, 1} and {2, 3}):
- subgroups: no fault. The two groups' all-reduces have different sizes (32 and 16 floats),
  and each group is the first one created after the world on its ranks, so both have the same
  local index (`pg_id` 1) on their ranks: only the group's name tells them apart;
- skip_killed: rank 3 never enters the 4th all-reduce, and rank 1 dies on the timeout before it
  can dump (os._exit): the others' dumps must still name rank 3;
- size_killed: rank 2 passes 300 floats to the 4th all-reduce where the others pass 256, and
  rank 1 dies before it can dump;
- a2a_dtype: rank 2 passes int32 to the 4th all-to-all where the others pass float32.
A rank dumps when its collective fails, when signalled (SIGTERM, SIGUSR1), or at the end; in the
size and dtype cases the faulty collective is dumped once enqueued, since gloo may abort the
process on the mismatch. Plain torch: no tracelab import.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "200")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

FAULTS = ("subgroups", "skip_killed", "size_killed", "a2a_dtype")
#: The step whose collectives the faults change.
FAULTY = 3


def dump(out: Path, rank: int, fault: str) -> None:
    if fault in ("skip_killed", "size_killed") and rank == 1:
        return  # the rank that dies leaves no dump
    data = torch._C._distributed_c10d._dump_fr_trace_json(True, False)
    (out / f"rank-{rank}.json").write_bytes(data if isinstance(data, bytes) else data.encode())
    (out / f"rank-{rank}.pkl").write_bytes(
        torch._C._distributed_c10d._dump_fr_trace(True, True, False)
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--fault", choices=FAULTS, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--timeout-s", type=float, default=5.0)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    dist.init_process_group("gloo", timeout=timedelta(seconds=a.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    pair = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]

    def on_signal(signum: int, _frame: object) -> None:
        dump(a.out, rank, a.fault)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGUSR1, on_signal)
    try:
        for k in range(5):
            faulty = k == FAULTY
            x = torch.randn(8 * world, 16)
            if faulty and a.fault == "a2a_dtype" and rank == 2:
                x = torch.ones(8 * world, 16, dtype=torch.int32)
            work = dist.all_to_all_single(torch.empty_like(x), x, async_op=True)
            if faulty and a.fault == "a2a_dtype":
                dump(a.out, rank, a.fault)  # enqueued: what a watchdog would dump while it hangs
            work.wait()
            if faulty and a.fault == "skip_killed" and rank == 3:
                time.sleep(a.timeout_s + 3)  # never enters the all-reduce
                break
            g = torch.ones(300 if faulty and a.fault == "size_killed" and rank == 2 else 256)
            work = dist.all_reduce(g, async_op=True)
            if faulty and a.fault == "size_killed":
                dump(a.out, rank, a.fault)
            work.wait()
            if a.fault == "subgroups":
                dist.all_reduce(torch.ones(32 if rank < 2 else 16), group=pair)
    except Exception as exc:  # noqa: BLE001 (the collective's timeout or mismatch)
        if a.fault in ("skip_killed", "size_killed") and rank == 1:
            os._exit(9)  # dies on the timeout, before it can dump
        print(f"rank {rank}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
    dump(a.out, rank, a.fault)
    os._exit(0)  # no destroy_process_group: a peer may be gone


if __name__ == "__main__":
    main()
