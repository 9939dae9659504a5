"""A gloo job that hangs or desyncs on purpose, then leaves each rank's Flight Recorder dump.

    torchrun --nproc_per_node 2 hang_job.py --fault skip|size|kill|none --out DIR

Each rank runs a few all-reduces (a broadcast first), with the Flight Recorder armed
(TORCH_FR_BUFFER_SIZE, before init_process_group) and a short collective timeout:
- skip: rank 1 skips the 4th all-reduce, so rank 0 waits in it until the timeout;
- size: rank 1 passes a tensor of another size to the 4th all-reduce (gloo aborts it: it dumps
  once the collective is enqueued);
- kill: rank 1 dies (os._exit) before the 4th all-reduce;
- none: every rank does the same collectives.
A rank dumps its recorder (PyTorch's JSON dump) to DIR/rank-N.json when its collective fails,
when it is signalled (SIGTERM from torchrun, or SIGUSR1), or at the end. Plain torch: no
tracelab import, so the dumps are what any job would leave.
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


def dump(out: Path, rank: int) -> None:
    data = torch._C._distributed_c10d._dump_fr_trace_json(True, False)
    (out / f"rank-{rank}.json").write_bytes(data if isinstance(data, bytes) else data.encode())
    # The pickle form too, as PyTorch's dump-on-timeout writes it (its fr_trace reads both).
    pickled = torch._C._distributed_c10d._dump_fr_trace(True, True, False)
    (out / f"rank-{rank}.pkl").write_bytes(pickled)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--fault", choices=("skip", "size", "kill", "none"), default="none")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--timeout-s", type=float, default=6.0)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    dist.init_process_group("gloo", timeout=timedelta(seconds=a.timeout_s))
    rank = dist.get_rank()

    def on_signal(signum: int, _frame: object) -> None:
        dump(a.out, rank)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGUSR1, on_signal)
    x = torch.ones(1024)
    dist.broadcast(x, src=0)
    try:
        for k in range(6):
            if k == 3 and rank == 1:
                if a.fault == "skip":
                    time.sleep(a.timeout_s + 2)  # never enters it; rank 0 times out meanwhile
                    break
                if a.fault == "kill":
                    os._exit(7)
                if a.fault == "size":
                    # gloo aborts this process on the mismatch, before any handler runs: dump
                    # once the collective is enqueued, as a watchdog would while it hangs.
                    work = dist.all_reduce(torch.ones(512), async_op=True)
                    dump(a.out, rank)
                    work.wait()
                    continue
            dist.all_reduce(x)
    except Exception as exc:  # noqa: BLE001 (the collective's timeout or mismatch)
        print(f"rank {rank}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
    dump(a.out, rank)
    os._exit(0)  # no destroy_process_group: a peer may be gone


if __name__ == "__main__":
    main()
