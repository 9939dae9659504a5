"""Every c10d op kind, with known sizes, inside one recorded window (run under torchrun).

Writes the capture to argv[1] and the expected (op, in_bytes, out_bytes, peer) of each op on
this rank, in issue order, to argv[1]/expected-rank-N.json for the test to compare with, and
each all-to-all's bytes per peer (sent, received) to expected-splits-rank-N.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import tracelab
from tracelab.collectors import arm_flight_recorder


def main() -> None:
    out = Path(sys.argv[1])
    arm_flight_recorder()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = (rank + 1) % world
    prev = (rank - 1) % world
    expected: list[tuple[str, int, int, int | None]] = []
    #: (in_split_bytes, out_split_bytes) of each all-to-all, in issue order.
    splits: list[tuple[list[int], list[int]]] = []
    f32 = 4

    def ops() -> None:
        t = torch.ones(1000)
        dist.all_reduce(t)
        expected.append(("all_reduce", 1000 * f32, 1000 * f32, None))
        gathered = torch.empty(world * 250)
        dist.all_gather_into_tensor(gathered, torch.ones(250))
        expected.append(("all_gather", 250 * f32, world * 250 * f32, None))
        dist.all_gather([torch.empty(10) for _ in range(world)], torch.ones(10))
        expected.append(("all_gather", 10 * f32, world * 10 * f32, None))
        shard = torch.empty(64, dtype=torch.float64)
        dist.reduce_scatter_tensor(shard, torch.ones(64 * world, dtype=torch.float64))
        expected.append(("reduce_scatter", 64 * world * 8, 64 * 8, None))
        dist.broadcast(torch.ones(33), src=0)
        expected.append(("broadcast", 33 * f32, 33 * f32, None))
        dist.all_to_all_single(torch.empty(8 * world), torch.ones(8 * world))
        expected.append(("all_to_all", 8 * world * f32, 8 * world * f32, None))
        splits.append(([8 * f32] * world, [8 * f32] * world))
        # uneven: rank r sends (r + 1) * (j + 2) rows of 3 floats to rank j
        ins = [(rank + 1) * (j + 2) for j in range(world)]
        outs = [(j + 1) * (rank + 2) for j in range(world)]
        dist.all_to_all_single(torch.empty(sum(outs), 3), torch.ones(sum(ins), 3), outs, ins)
        expected.append(("all_to_all", sum(ins) * 3 * f32, sum(outs) * 3 * f32, None))
        splits.append(([x * 3 * f32 for x in ins], [x * 3 * f32 for x in outs]))
        dist.barrier()
        expected.append(("barrier", 0, 0, None))
        # p2p in a ring: even ranks send first, odd ranks receive first
        send_t, recv_t = torch.full((100,), float(rank)), torch.empty(100)
        if rank % 2 == 0:
            dist.send(send_t, peer)
            dist.recv(recv_t, prev)
            expected.extend([("send", 400, 0, peer), ("recv", 0, 400, prev)])
        else:
            dist.recv(recv_t, prev)
            dist.send(send_t, peer)
            expected.extend([("recv", 0, 400, prev), ("send", 400, 0, peer)])
        assert int(recv_t[0]) == prev
        reqs = dist.batch_isend_irecv(
            [
                dist.P2POp(dist.isend, torch.ones(7), peer),
                dist.P2POp(dist.irecv, torch.empty(7), prev),
            ]
        )
        for req in reqs:
            req.wait()
        expected.extend([("send", 28, 0, peer), ("recv", 0, 28, prev)])
        work = dist.all_reduce(torch.ones(5, dtype=torch.int64), async_op=True)
        work.wait()
        expected.append(("all_reduce", 40, 40, None))

    with tracelab.profile(out, steps=range(1, 3), control_timeout_s=20) as prof:
        for step in range(4):
            if step in (1, 2):
                ops()
            else:
                dist.all_reduce(torch.ones(3))  # outside the window: never recorded
            prof.step()
    # a P2POp built inside no window and the hooks gone: c10d still works
    reqs = dist.batch_isend_irecv(
        [dist.P2POp(dist.isend, torch.ones(2), peer), dist.P2POp(dist.irecv, torch.empty(2), prev)]
    )
    for req in reqs:
        req.wait()
    (out / f"expected-rank-{rank}.json").write_text(json.dumps(expected))
    (out / f"expected-splits-rank-{rank}.json").write_text(json.dumps(splits))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
