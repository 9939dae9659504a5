"""Waiting where it happens, on constructed two-rank gloo traces with a known answer (issue 20):
a rank blocked in `_c10d_functional::wait_tensor`, or in an untraced wait() inside an operator,
waits for the collective's last rank; and a late rank's queued collectives do not inflate the
transfer of the others (issue 21, section 3). Times in ms on one host (1 us clock uncertainty),
rank 1 late."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracelab.ingest import ingest
from tracelab.store import open_store, resolve_run
from tracelab.testing._kineto import RankTrace
from tracelab.testing.synth import write_ranks

MS = 1_000_000
TOL = 5_000  # ns: the transfer's clock margin is 2 x 1 us


def _gloo_ranks() -> list[RankTrace]:
    return [RankTrace(r, 2, backend="gloo", device=None) for r in range(2)]


def _derive(tmp: Path, traces: list[RankTrace], name: str) -> dict[str, Any]:
    paths = write_ranks(tmp / name, traces)
    db = tmp / f"{name}.duckdb"
    ingest([str(p) for p in paths], db=db, run=name, workers=1, progress=False)
    with open_store(db) as con:
        rid, _ = resolve_run(con, name)

        def q(sql: str) -> list[tuple[Any, ...]]:
            return con.execute(sql.replace("$run", str(int(rid)))).fetchall()

        return {
            "parts": {
                r: dict(zip(("compute", "transfer", "wait", "host"), rest, strict=True))
                for r, *rest in q(
                    "SELECT rank, compute_ns, transfer_ns, wait_ns, host_ns FROM step_parts "
                    "WHERE run_id = $run"
                )
            },
            "attribution": q(
                "SELECT rank, part, op, culprit_rank, exposed_ns FROM comm_attribution "
                "WHERE run_id = $run ORDER BY rank, part, op"
            ),
            "matched": q(
                "SELECT match_key, rank, transfer_ns, wait_ns, last_rank FROM matched_collectives "
                "WHERE run_id = $run ORDER BY match_key, rank"
            ),
        }


def test_wait_tensor_waits_for_the_late_rank(tmp_path: Path) -> None:
    """Rank 0 issues an all-reduce at 2 (on gloo's worker thread, 2-22) and blocks in
    wait_tensor 3-23; rank 1 computes until 20, its all-reduce runs 20-22. Rank 0: compute 2 +
    7, waiting 2-20 (the all-reduce's own wait) and 22-23 (the wait_tensor beyond its
    collective, linked to it: was unmatched transfer), transfer 20-22."""
    t0, t1 = _gloo_ranks()
    for t in (t0, t1):
        t.step(1, 0, 30 * MS)
    t0.cpu_op("aten::mm", 0, 2 * MS)
    t0.gloo("all_reduce", 2 * MS, 22 * MS, blocking=False)
    t0.cpu_op("_c10d_functional::wait_tensor", 3 * MS, 23 * MS)
    t0.cpu_op("aten::mm", 23 * MS, 30 * MS)
    t1.cpu_op("aten::mm", 0, 20 * MS)
    t1.gloo("all_reduce", 20 * MS, 22 * MS, blocking=False)
    t1.cpu_op("_c10d_functional::wait_tensor", 20 * MS, 22 * MS + 500_000)
    t1.cpu_op("aten::mm", 22 * MS + 500_000, 30 * MS)
    d = _derive(tmp_path, [t0, t1], "wait_tensor")
    p0 = d["parts"][0]
    assert abs(p0["transfer"] - 2 * MS) <= TOL, p0
    assert abs(p0["wait"] - 19 * MS) <= TOL, p0
    assert p0["compute"] == 9 * MS, p0
    waits = {(r, op, c): ns for r, part, op, c, ns in d["attribution"] if part == "wait"}
    assert abs(waits[(0, "all_reduce", 1)] - 19 * MS) <= TOL, d["attribution"]
    assert not [a for a in d["attribution"] if a[2] in ("wait_tensor", "unknown")], d["attribution"]


def test_blocked_parent_operator_is_not_compute(tmp_path: Path) -> None:
    """Rank 0 runs a backward node 2-24 whose hook issues an all-gather (aten::empty 2-3, then
    gloo's worker 3-22) and blocks in an untraced wait(); rank 1 is late (computes until 20,
    all-gather 20-22). The node's own time while the all-gather is in flight is waiting and
    transfer, its own time after (22-24) compute: rank 0 computes 2 + 1 + 2 + 6 = 11 ms, waits
    17, transfers 2 (before: computed 30)."""
    t0, t1 = _gloo_ranks()
    for t in (t0, t1):
        t.step(1, 0, 30 * MS)
    t0.cpu_op("aten::mm", 0, 2 * MS)
    t0.cpu_op("autograd::engine::evaluate_function: AddBackward0", 2 * MS, 24 * MS)
    t0.cpu_op("aten::empty", 2 * MS, 3 * MS)
    t0.gloo("all_gather", 3 * MS, 22 * MS, blocking=False)
    t0.cpu_op("aten::mm", 24 * MS, 30 * MS)
    t1.cpu_op("aten::mm", 0, 20 * MS)
    t1.gloo("all_gather", 20 * MS, 22 * MS, blocking=False)
    t1.cpu_op("aten::mm", 22 * MS, 30 * MS)
    d = _derive(tmp_path, [t0, t1], "parent_op")
    p0 = d["parts"][0]
    assert p0["compute"] == 11 * MS, p0
    assert abs(p0["wait"] - 17 * MS) <= TOL, p0
    assert abs(p0["transfer"] - 2 * MS) <= TOL, p0


def test_late_rank_queued_collectives_do_not_inflate_transfer(tmp_path: Path) -> None:
    """Two buckets a step. Rank 0 issues both early (bucket 1 at 1, bucket 2 at 2 on its second
    worker thread); both end at 21 and 24. Rank 1 sleeps, issues both at 20: bucket 1 runs
    20-21, bucket 2 starts at 20 too but cannot move data before bucket 1 ends (21): it ends at
    24. The shortest duration (the plugin's) would make bucket 2's transfer 4 ms of rank 1's own
    contention; from the last effective arrival (21) it is 3 ms."""
    t0, t1 = _gloo_ranks()
    for t in (t0, t1):
        t.step(1, 0, 30 * MS)
    t0.cpu_op("aten::mm", 0, 1 * MS)
    t0.gloo("all_reduce", 1 * MS, 21 * MS, blocking=False)
    t0.gloo("all_reduce", 2 * MS, 24 * MS, blocking=False)["tid"] = t0.comm_tid + 1
    t0.cpu_op("aten::mm", 24 * MS, 30 * MS)
    t1.cpu_op("aten::mm", 0, 1 * MS)
    t1.gloo("all_reduce", 20 * MS, 21 * MS, blocking=False)
    t1.gloo("all_reduce", 20 * MS, 24 * MS, blocking=False)["tid"] = t1.comm_tid + 1
    t1.cpu_op("aten::mm", 24 * MS, 30 * MS)
    d = _derive(tmp_path, [t0, t1], "queued")
    transfer = {key: tr for key, _, tr, _, _ in d["matched"]}
    assert len(transfer) == 2, d["matched"]
    first, second = sorted(transfer, key=lambda k: k.split(":")[-1])
    assert abs(transfer[first] - 1 * MS) <= TOL, d["matched"]
    assert abs(transfer[second] - 3 * MS) <= TOL, d["matched"]
    assert all(last == 1 for *_, last in d["matched"]), d["matched"]
