"""A 4-rank CPU pipeline with unbalanced stages, captured by tracelab.profile with the model
states and CPU allocator events (profile_memory=True), for the memory estimate's proof.

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 4 pipeline_memory.py OUT SCHEDULE

SCHEDULE: 1f1b (Schedule1F1B, one stage per rank) or interleaved_1f1b (two stages per rank,
round-robin). Stage k has LAYERS[k] Linear+ReLU layers (unbalanced on purpose); Adam, so the
optimizer holds two states per parameter. As in a language model, the first stage embeds
integer tokens and the last projects onto a few classes, so the input batch is small beside the
activations.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

import tracelab
from tracelab.collectors import arm_flight_recorder

WIDTH = 256
MICROBATCHES = 8
MICROBATCH_SIZE = 64
VOCAB = 64
CLASSES = 8
#: Layers per stage, by stage count: heavier first stages, as a naive split leaves them.
LAYERS = {4: [4, 2, 2, 1], 8: [3, 2, 2, 1, 2, 1, 1, 1]}


def main() -> None:
    out, name = sys.argv[1], sys.argv[2]
    arm_flight_recorder()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    per_rank = 1 if name == "1f1b" else 2
    n_stages = world * per_rank
    ids = [rank + k * world for k in range(per_rank)]
    modules = []
    for i in ids:
        torch.manual_seed(i)
        layers: list[nn.Module] = [nn.Embedding(VOCAB, WIDTH)] if i == 0 else []
        for _ in range(LAYERS[n_stages][i]):
            layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
        if i == n_stages - 1:
            layers.append(nn.Linear(WIDTH, CLASSES))
        modules.append(nn.Sequential(*layers))
    tokens = torch.zeros(MICROBATCH_SIZE, dtype=torch.long)
    hidden = torch.empty(MICROBATCH_SIZE, WIDTH)
    stages = [
        PipelineStage(
            m, i, n_stages, torch.device("cpu"), input_args=(tokens if i == 0 else hidden,)
        )
        for m, i in zip(modules, ids)
    ]
    loss_fn = nn.CrossEntropyLoss()
    if per_rank == 1:
        sched = Schedule1F1B(stages[0], n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    else:
        sched = ScheduleInterleaved1F1B(stages, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    opt = torch.optim.Adam([p for m in modules for p in m.parameters()], lr=1e-3)
    first, last = 0 in ids, n_stages - 1 in ids
    with tracelab.profile(
        out,
        steps=range(2, 4),
        pipeline=sched,
        parallelism={"pp": world},
        pp_stage=rank,
        optimizer=opt,
        profile_memory=True,
    ) as prof:
        for _ in range(4):
            x = torch.randint(0, VOCAB, (MICROBATCHES * MICROBATCH_SIZE,))
            target = torch.randint(0, CLASSES, (MICROBATCHES * MICROBATCH_SIZE,))
            if first and last:
                sched.step(x, target=target)
            elif first:
                sched.step(x)
            elif last:
                sched.step(target=target)
            else:
                sched.step()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
