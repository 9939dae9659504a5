"""All-to-all workloads on CPU (gloo) profiled with plain torch.profiler, one after another.

Run under torchrun. argv[1] is the output folder, argv[2] a JSON spec {"profiler": {"warmup",
"active"}, "scenarios": [...]}; each scenario is {"name", "kind": "dlrm" | "moe", ...}:

- dlrm: every rank holds `tables` embedding tables (EmbeddingBag, sum pooling) and rank
  `heavy["rank"]` holds `heavy["factor"]` times as many (and so that many times the lookups).
  Each rank pools its tables for the global batch and sends each rank its slice of the batch
  with all_to_all_single (model-parallel embeddings, as in DLRM): the heavy rank sends
  `factor` times the bytes, and the others wait for its lookups at the all-to-all.
- moe: each rank routes `tokens` tokens of width `width` to the ranks' experts with
  all_to_all_single (dispatch), runs its expert on what it received (an MLP applied
  `expert_repeat` times) and sends the results back (combine, the reverse splits). With
  `hot_rank` set, every rank sends `hot_factor` times as many tokens to it as to the others:
  it receives that many times the tokens and does that much more expert work. With
  `slow_rank` set, the splits are even and that rank runs its expert `slow_factor` times.

Each writes one Chrome trace per rank (tensorboard_trace_handler, record_shapes=True) to
<out>/<name>/; no tracelab import here on purpose. Every rank times its lookups (with their indices) or expert work
in each recorded step (perf_counter) and rank 0 writes them all to <out>/<name>.work.json
({"ranks": {rank: [ns per recorded step]}, "splits": {rank: {"in": [...], "out": [...]}},
"elem_bytes"}): the tests compare tracelab's impact with the extra work and its bytes with the
splits.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler


def _dlrm(sc: dict[str, Any], rank: int, world: int) -> tuple[Any, dict[str, list[int]]]:
    heavy = sc["heavy"]
    tables_of = [
        sc["tables"] * (heavy["factor"] if r == heavy["rank"] else 1) for r in range(world)
    ]
    dim, rows, bag, batch = sc["dim"], sc["rows"], sc["bag"], sc["batch"]
    bags = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables_of[rank]))
    gbatch = batch * world
    in_splits = [batch * tables_of[rank] * dim] * world
    out_splits = [batch * tables_of[src] * dim for src in range(world)]

    def step(times: list[int]) -> None:
        t0 = time.perf_counter_ns()  # the lookups' indices are per table too
        idx = [torch.randint(0, rows, (gbatch * bag,)) for _ in bags]
        offsets = torch.arange(0, gbatch * bag, bag)
        with torch.no_grad():
            pooled = torch.stack([b(i, offsets) for b, i in zip(bags, idx, strict=True)], dim=1)
        times.append(time.perf_counter_ns() - t0)
        send = pooled.reshape(world, batch, -1).contiguous().reshape(-1)
        recv = torch.empty(sum(out_splits))
        dist.all_to_all_single(recv, send, out_splits, in_splits)
        dense = recv.reshape(-1) @ torch.ones(recv.numel(), 1) / recv.numel()
        dist.all_reduce(dense)

    return step, {"in": in_splits, "out": out_splits}


def _moe(sc: dict[str, Any], rank: int, world: int) -> tuple[Any, dict[str, list[int]]]:
    width, tokens = sc["width"], sc["tokens"]
    hot, factor = sc.get("hot_rank"), sc.get("hot_factor", 1)
    weight = [factor if dst == hot else 1 for dst in range(world)]
    # tokens each rank sends to each rank (the same routing on every rank)
    per = [tokens * w // sum(weight) for w in weight]
    per[0] += tokens - sum(per)
    in_tok = per
    out_tok = [per[rank]] * world
    repeat = sc["expert_repeat"] * (sc.get("slow_factor", 1) if sc.get("slow_rank") == rank else 1)
    torch.manual_seed(rank)
    w1 = torch.randn(width, 4 * width) / width**0.5
    w2 = torch.randn(4 * width, width) / (4 * width) ** 0.5

    def step(times: list[int]) -> None:
        x = torch.randn(tokens, width)
        recv = torch.empty(sum(out_tok), width)
        dist.all_to_all_single(recv, x, out_tok, in_tok)  # dispatch
        t0 = time.perf_counter_ns()
        h = recv
        for _ in range(repeat):
            h = torch.relu(h @ w1) @ w2
        times.append(time.perf_counter_ns() - t0)
        back = torch.empty(tokens, width)
        dist.all_to_all_single(back, h.contiguous(), in_tok, out_tok)  # combine
        dist.all_reduce(back[:1].clone())

    return step, {"in": [t * width for t in in_tok], "out": [t * width for t in out_tok]}


def run_scenario(out: Path, sc: dict[str, Any], prof_sched: dict[str, int]) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    make = _dlrm if sc["kind"] == "dlrm" else _moe
    step, splits = make(sc, rank, world)
    steps = prof_sched["warmup"] + prof_sched["active"]
    times: list[int] = []
    dist.barrier()
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        schedule=schedule(wait=0, warmup=prof_sched["warmup"], active=prof_sched["active"]),
        on_trace_ready=tensorboard_trace_handler(str(out / sc["name"]), worker_name=f"rank{rank}"),
    ) as prof:
        for _ in range(steps):
            step(times)
            prof.step()
    mine = {"work": times[prof_sched["warmup"] :], "splits": splits}
    every: list[Any] = [None] * world
    dist.all_gather_object(every, mine)
    if rank == 0:
        doc = {
            "ranks": {r: x["work"] for r, x in enumerate(every)},
            "splits": {r: x["splits"] for r, x in enumerate(every)},
            "elem_bytes": 4,
        }
        (out / f"{sc['name']}.work.json").write_text(json.dumps(doc))
    dist.barrier()


def main() -> None:
    out = Path(sys.argv[1])
    spec = json.loads(sys.argv[2])
    dist.init_process_group("gloo")
    for sc in spec["scenarios"]:
        t0 = time.perf_counter()
        run_scenario(out, sc, spec["profiler"])
        if dist.get_rank() == 0:
            print(f"scenario {sc['name']}: {time.perf_counter() - t0:.1f} s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
