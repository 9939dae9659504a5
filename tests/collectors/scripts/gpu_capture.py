"""One-GPU capture for the gpu-marked tests (run under torchrun --nproc_per_node 1, NCCL).

Every step: a chain of matmuls the host does not wait for, then an async all-reduce of 64 MiB,
then DDP's own gradient all-reduce. Step 2 also holds a 2 GiB tensor for a moment, so its
memory peak is known. Writes the capture to argv[1] and host-side facts to argv[1]/facts.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import tracelab
from tracelab.collectors import arm_flight_recorder

MIB = 1 << 20


def main() -> None:
    out = Path(sys.argv[1])
    arm_flight_recorder()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    device = torch.device("cuda", local)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(
            torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
        ).to(device),
        device_ids=[local],
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    a = torch.randn(4096, 4096, device=device)
    facts: dict[str, list[int]] = {"issue_ns": []}
    with tracelab.profile(out, steps=range(1, 4), memory_snapshot=True) as prof:
        for step in range(5):
            b = a
            for _ in range(40):  # tens of ms of GPU work, queued without waiting
                b = torch.tanh(b @ a) * 0.01
            big = torch.ones(64 * MIB // 4, device=device)
            t0 = time.time_ns()
            work = dist.all_reduce(big, async_op=True)
            facts["issue_ns"].append(time.time_ns() - t0)
            if step == 2:
                held = torch.empty(2048 * MIB, dtype=torch.uint8, device=device)
                del held
            loss = model(torch.randn(64, 1024, device=device)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            work.wait()
            prof.step()
    torch.cuda.synchronize()
    (out / "facts.json").write_text(json.dumps(facts))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
