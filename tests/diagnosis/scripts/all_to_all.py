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
  With `backward`, the layer is trained: autograd all-to-alls, the expert's backward, and an
  all-reduce of the expert's gradients (its work time is forward plus backward).

Each writes one Chrome trace per rank (tensorboard_trace_handler, record_shapes=True;
profiled.py) to <out>/<name>/; no tracelab import here on purpose. Every rank times its lookups (with their indices) or expert work
in each recorded step, in wall time (perf_counter) and in its thread's CPU time (thread_time:
on shared cores the wall time is stretched by whatever else runs, the CPU time is the work), and
the (start, end) of each work phase on the machine's monotonic clock (one phase; the trained
layer's forward and backward are two). Rank 0 writes them all to <out>/<name>.work.json
({"ranks": {rank: [wall ns per recorded step]}, "cpu": {rank: [CPU ns ...]}, "spans": {rank:
[[[start, end] per phase] per recorded step]}, "splits": {rank: {"in": [...], "out": [...]}},
"elem_bytes"}): the tests compare tracelab's impact with what the faulty rank's lateness cost
and its bytes with the splits.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from profiled import profiled_steps, run_scenarios
from torch import nn


def _now() -> tuple[int, int]:
    """(wall ns, this thread's CPU ns)."""
    return time.perf_counter_ns(), time.thread_time_ns()


@dataclass(frozen=True, kw_only=True)
class Work:
    """One step's timed work on a rank: wall and CPU ns, and its phases as (start, end)
    perf_counter_ns spans (CLOCK_MONOTONIC: one clock for every process on the machine)."""

    wall: int
    cpu: int
    spans: list[tuple[int, int]]


def _work(t0: tuple[int, int], t1: tuple[int, int] | None = None) -> Work:
    """The work from t0 to t1 (default now): one phase."""
    end = t1 or _now()
    return Work(wall=end[0] - t0[0], cpu=end[1] - t0[1], spans=[(t0[0], end[0])])


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

    def step(times: list[Work]) -> None:
        t0 = _now()  # the lookups' indices are per table too
        idx = [torch.randint(0, rows, (gbatch * bag,)) for _ in bags]
        offsets = torch.arange(0, gbatch * bag, bag)
        with torch.no_grad():
            pooled = torch.stack([b(i, offsets) for b, i in zip(bags, idx, strict=True)], dim=1)
        send = pooled.reshape(world, batch, -1).contiguous().reshape(-1)
        recv = torch.empty(sum(out_splits))
        times.append(_work(t0))  # up to the all-to-all's call: all the rank's lateness there
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

    if sc.get("backward"):
        return _moe_training(sc, in_tok, out_tok, repeat, w1, w2), {
            "in": [t * width for t in in_tok],
            "out": [t * width for t in out_tok],
        }

    def step(times: list[Work]) -> None:
        x = torch.randn(tokens, width)
        recv = torch.empty(sum(out_tok), width)
        dist.all_to_all_single(recv, x, out_tok, in_tok)  # dispatch
        t0 = _now()
        if sc.get("sleep_rank") == rank:  # a slow host, not the data: it receives more too
            time.sleep(sc["sleep_ms"] / 1000)
        h = recv
        for _ in range(repeat):
            h = torch.relu(h @ w1) @ w2
        h = h.contiguous()
        back = torch.empty(tokens, width)
        times.append(_work(t0))  # up to the combine's call
        dist.all_to_all_single(back, h, in_tok, out_tok)  # combine
        dist.all_reduce(back[:1].clone())

    return step, {"in": [t * width for t in in_tok], "out": [t * width for t in out_tok]}


def _moe_training(
    sc: dict[str, Any],
    in_tok: list[int],
    out_tok: list[int],
    repeat: int,
    w1: torch.Tensor,
    w2: torch.Tensor,
) -> Any:
    """The MoE layer with a backward pass: autograd's all-to-alls (combine's and dispatch's
    backward) run inside autograd ops, where the other ranks block while the hot rank runs
    its expert's backward. The expert's forward and backward are timed (the backward between
    gradient hooks on its output and its input)."""
    from torch.distributed.nn.functional import all_to_all_single

    width, tokens = sc["width"], sc["tokens"]
    w1.requires_grad_()
    w2.requires_grad_()

    def step(times: list[Work]) -> None:
        x = torch.randn(tokens, width, requires_grad=True)
        recv = all_to_all_single(torch.empty(sum(out_tok), width), x, out_tok, in_tok)
        marks: dict[str, tuple[int, int]] = {}
        recv.register_hook(lambda g: marks.__setitem__("end", _now()))
        t0 = _now()
        h = recv
        for _ in range(repeat):
            h = torch.relu(h @ w1) @ w2
        fwd = _work(t0)
        h.register_hook(lambda g: marks.__setitem__("start", _now()))
        back = all_to_all_single(torch.empty(tokens, width), h, in_tok, out_tok)
        back.square().mean().backward()
        bwd = _work(marks["start"], marks["end"])
        times.append(
            Work(wall=fwd.wall + bwd.wall, cpu=fwd.cpu + bwd.cpu, spans=fwd.spans + bwd.spans)
        )
        grads = torch.cat([w1.grad.flatten(), w2.grad.flatten()])  # type: ignore[union-attr]
        dist.all_reduce(grads)
        w1.grad = None
        w2.grad = None

    return step


def run_scenario(out: Path, sc: dict[str, Any], prof_sched: dict[str, int]) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    make = _dlrm if sc["kind"] == "dlrm" else _moe
    step, splits = make(sc, rank, world)
    times: list[Work] = []
    dist.barrier()
    # record_shapes: the all-to-alls' sizes (Input Dims); a scenario without them is
    # profiled as torch.profiler's default leaves a trace.
    shapes = sc.get("record_shapes", True)
    for _ in profiled_steps(out / sc["name"], prof_sched, record_shapes=shapes):
        step(times)
    rec = times[prof_sched["warmup"] :]
    mine = {
        "work": [w.wall for w in rec],
        "cpu": [w.cpu for w in rec],
        "spans": [w.spans for w in rec],
        "splits": splits,
    }
    every: list[Any] = [None] * world
    dist.all_gather_object(every, mine)
    if rank == 0:
        doc = {
            "ranks": {r: x["work"] for r, x in enumerate(every)},
            "cpu": {r: x["cpu"] for r, x in enumerate(every)},
            "spans": {r: x["spans"] for r, x in enumerate(every)},
            "splits": {r: x["splits"] for r, x in enumerate(every)},
            "elem_bytes": 4,
        }
        (out / f"{sc['name']}.work.json").write_text(json.dumps(doc))
    dist.barrier()


if __name__ == "__main__":
    run_scenarios(run_scenario)
