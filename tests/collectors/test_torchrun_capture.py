"""Real multi-process torchrun jobs on CPU (gloo): the capture layout and its collective records.

Each job runs the shipped example (or a script under scripts/) with 2-4 ranks and checks the
capture against what the job must have done: traces per rank and window, the manifest, equal
record counts and matching sequence numbers across ranks, bytes equal to the tensor sizes,
clock offsets within their own uncertainty, and the injected straggler arriving last.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.torchrun

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parents[1] / "examples"
SCRIPTS = HERE / "scripts"

#: examples/ddp.py's model: Linear(256,512), Linear(512,512), Linear(512,10), float32.
DDP_PARAM_BYTES = 4 * (256 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10)


def _check_common(cap: Any, world: int, steps: list[int]) -> None:
    """Invariants every capture must satisfy."""
    m = cap.manifest
    assert m["format"] == "tracelab.capture" and m["format_version"] == 1
    assert m["world_size"] == world
    assert sorted(cap.ranks) == list(range(world))
    assert m["versions"]["torch"]
    for rank, entry in cap.ranks.items():
        assert (cap.root / f"rank-{rank}" / "rank.json").is_file()
        assert entry["collector_error"] is None
        assert len(entry["traces"]) == 1
        trace = cap.trace(rank)
        assert trace["distributedInfo"]["rank"] == rank
        assert trace["distributedInfo"]["world_size"] == world
        names = {e.get("name") for e in trace["traceEvents"]}
        assert {f"ProfilerStep#{s}" for s in steps} <= names
        assert [p["step"] for p in entry["memory"]] == steps
        assert all(p["rss_bytes"] and p["rss_bytes"] > 0 for p in entry["memory"])
        assert {g["pg_name"] for g in entry["process_groups"]} >= {"0"}
        clock = entry["clock"]
        # One host, one clock: the true offset is 0, and an NTP estimate is always within half
        # the round trip of the truth, so |offset| <= uncertainty must hold exactly.
        assert clock["offset_ns"] is not None
        assert abs(clock["offset_ns"]) <= clock["uncertainty_ns"] + 1
        assert clock["uncertainty_ns"] < 50_000_000
        for rec in cap.records(rank):
            assert rec["step"] in steps
            assert rec["enqueue_ns"] is not None
            if rec["start_ns"] is not None and rec["end_ns"] is not None:
                assert rec["end_ns"] >= rec["start_ns"] >= rec["enqueue_ns"] - 1_000


def _by_key(records: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    out = {}
    for r in records:
        if r["op"] not in ("send", "recv"):
            key = (r["pg_name"], r["seq"])
            assert key not in out, f"two records share group/seq {key}"
            out[key] = r
    return out


def test_ddp_capture(tmp_path: Path, torchrun: Any, capture_reader: Any) -> None:
    out = tmp_path / "ddp"
    proc = torchrun(
        EXAMPLES / "ddp.py", "--out", str(out), "--steps", "6", "--record", "2:5", nproc=2
    )
    # rank 0 got every rank's metadata through the store, not from the rank.json fallback
    assert "could not gather" not in proc.stderr + proc.stdout
    cap = capture_reader(out)
    _check_common(cap, 2, [2, 3, 4])
    assert cap.manifest["run_name"] == "ddp"
    per_rank = {r: cap.records(r) for r in cap.ranks}
    counts = {r: Counter((x["op"], x["source"]) for x in recs) for r, recs in per_rank.items()}
    assert counts[0] == counts[1]
    # the explicit loss all-reduce: one per step, hooked, 4 bytes (one float32)
    hooked = [x for x in per_rank[0] if x["source"] == "collector"]
    assert [(x["op"], x["in_bytes"], x["step"]) for x in hooked] == [
        ("all_reduce", 4, 2),
        ("all_reduce", 4, 3),
        ("all_reduce", 4, 4),
    ]
    # the DDP reducer's gradient all-reduces come from the Flight Recorder, on every rank, with
    # the same sequence numbers, and their buckets add up to the model's parameter bytes
    grads = {
        r: [x for x in recs if x["source"] == "flight_recorder"] for r, recs in per_rank.items()
    }
    assert grads[0] and [x["seq"] for x in grads[0]] == [x["seq"] for x in grads[1]]
    for recs in grads.values():
        assert all(x["op"] == "all_reduce" and x["dtype"] == "float32" for x in recs)
        per_step: dict[int, int] = defaultdict(int)
        for x in recs:
            per_step[x["step"]] += x["in_bytes"]
        assert dict(per_step) == {2: DDP_PARAM_BYTES, 3: DDP_PARAM_BYTES, 4: DDP_PARAM_BYTES}
    # one numbering for both sources: sequence numbers are unique and consecutive per rank
    for recs in per_rank.values():
        seqs = sorted(x["seq"] for x in recs)
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    a, b = _by_key(per_rank[0]), _by_key(per_rank[1])
    assert a.keys() == b.keys()
    for key in a:
        assert (a[key]["op"], a[key]["in_bytes"]) == (b[key]["op"], b[key]["in_bytes"])


def test_all_op_kinds(tmp_path: Path, torchrun: Any, capture_reader: Any) -> None:
    out = tmp_path / "ops"
    torchrun(SCRIPTS / "all_ops.py", str(out), nproc=2)
    cap = capture_reader(out)
    _check_common(cap, 2, [1, 2])
    for rank in (0, 1):
        expected = json.loads((out / f"expected-rank-{rank}.json").read_text())
        got = [[r["op"], r["in_bytes"], r["out_bytes"], r["peer"]] for r in cap.records(rank)]
        assert got == expected  # issue order, exact sizes, global peers
        assert all(r["source"] == "collector" for r in cap.records(rank))
        assert all(r["start_ns"] and r["end_ns"] for r in cap.records(rank))
        splits = json.loads((out / f"expected-splits-rank-{rank}.json").read_text())
        a2a = [r for r in cap.records(rank) if r["op"] == "all_to_all"]
        got_splits = [[r["in_split_bytes"], r["out_split_bytes"]] for r in a2a]
        assert got_splits == splits  # even and uneven all_to_all_single, per peer
        assert all(sum(r["in_split_bytes"]) == r["in_bytes"] for r in a2a)
    _check_all_to_all_rows(out, tmp_path / "ops.duckdb")
    a, b = _by_key(cap.records(0)), _by_key(cap.records(1))
    assert a.keys() == b.keys() and len(a) == 18
    # point-to-point: the n-th send from i to j pairs with the n-th recv at j from i
    sends = {(0, r["peer"], r["seq"]): r for r in cap.records(0) if r["op"] == "send"}
    recvs = {(r["peer"], 1, r["seq"]): r for r in cap.records(1) if r["op"] == "recv"}
    assert sends.keys() == recvs.keys() and len(sends) == 4
    for key, send in sends.items():
        assert send["in_bytes"] == recvs[key]["out_bytes"]
        assert recvs[key]["end_ns"] >= send["start_ns"]


def _check_all_to_all_rows(out: Path, db: Path) -> None:
    """Ingested, the capture's all-to-alls (the collector's records, which the run matches
    on) give all_to_all_ranks exactly the bytes each rank sent and received, in total and per
    peer: the trace (tracelab.profile, no record_shapes) gives no size and no split list, so
    both come from the records, the per-peer lists through collectives.in_split_bytes /
    out_split_bytes."""
    from tracelab.ingest import ingest
    from tracelab.store import open_store, resolve_run

    ingest([out], db=db, run="ops", workers=1, progress=False)
    want = set()
    for rank in (0, 1):
        for ins, outs in json.loads((out / f"expected-splits-rank-{rank}.json").read_text()):
            want.add((rank, sum(ins), sum(outs), tuple(ins), tuple(outs)))
    with open_store(db) as con:
        rid, _ = resolve_run(con, "ops")
        got = con.execute(
            "SELECT rank, sent_bytes, recv_bytes, sent_to_bytes, recv_from_bytes, bytes_from "
            "FROM all_to_all_ranks WHERE run_id = ? AND match_key IS NOT NULL",
            [rid],
        ).fetchall()
    assert len(got) == 8  # 2 all-to-alls x 2 steps x 2 ranks
    assert {(*g[:3], tuple(g[3]), tuple(g[4])) for g in got} == want
    assert any(g[3] != g[3][:1] * len(g[3]) for g in got)  # the uneven call is there
    assert {g[5] for g in got} == {"record"}


def test_slow_rank_arrives_last(tmp_path: Path, torchrun: Any, capture_reader: Any) -> None:
    out = tmp_path / "slow"
    torchrun(
        EXAMPLES / "ddp_slow_rank.py",
        "--out",
        str(out),
        "--steps",
        "6",
        "--record",
        "2:5",
        "--slow-rank",
        "2",
        "--delay-ms",
        "100",
        nproc=4,
    )
    cap = capture_reader(out)
    _check_common(cap, 4, [2, 3, 4])
    keyed = {r: _by_key(cap.records(r)) for r in range(4)}
    assert all(keyed[r].keys() == keyed[0].keys() for r in range(4))
    sources = Counter(x["source"] for x in keyed[0].values())
    assert sources["collector"] == 3 and sources["flight_recorder"] >= 6
    # The delay sits between forward and backward, so the gradient all-reduces (issued by the
    # DDP reducer, seen through the Flight Recorder) are where the others wait for rank 2.
    # Arrival = enqueue time; the loss all-reduce after them starts in lockstep again.
    grads = [k for k, x in keyed[0].items() if x["source"] == "flight_recorder"]
    for key in grads:
        arrival = {r: keyed[r][key]["enqueue_ns"] for r in range(4)}
        assert max(arrival, key=lambda r: arrival[r]) == 2, f"{key}: arrivals {arrival}"
        others = max(arrival[r] for r in range(4) if r != 2)
        assert arrival[2] - others > 20_000_000  # 100 ms delay, minus the others' backward
        # the others' all-reduces last longer: they wait for rank 2
        dur = {
            r: keyed[r][key]["end_ns"] - keyed[r][key]["start_ns"]
            for r in range(4)
            if keyed[r][key]["end_ns"] is not None
        }
        if len(dur) == 4:
            assert dur[2] < min(dur[r] for r in (0, 1, 3))


def test_pipeline_capture(tmp_path: Path, torchrun: Any, capture_reader: Any) -> None:
    out = tmp_path / "pp"
    torchrun(
        EXAMPLES / "pipeline.py",
        "--schedule",
        "interleaved-1f1b",
        "--out",
        str(out),
        "--steps",
        "3",
        "--record",
        "1:2",
        nproc=2,
    )
    cap = capture_reader(out)
    _check_common(cap, 2, [1])
    assert cap.manifest["pipeline"] == {
        "schedule": "ScheduleInterleaved1F1B",
        "stages": 4,
        "microbatches": 8,
    }
    assert cap.manifest["parallelism"]["dims"]["pp"] == 2
    assert [cap.ranks[r]["pp_stages"] for r in (0, 1)] == [[0, 2], [1, 3]]
    assert [cap.ranks[r]["pp_stage"] for r in (0, 1)] == [0, 1]
    mb_bytes = 16 * 256 * 4  # a microbatch's activation: 16 x 256 float32
    for src, dst in ((0, 1), (1, 0)):
        sends = [r for r in cap.records(src) if r["op"] == "send" and r["peer"] == dst]
        recvs = [r for r in cap.records(dst) if r["op"] == "recv" and r["peer"] == src]
        # 4 stages on 2 ranks (0, 2 | 1, 3), 8 microbatches: each stage boundary carries 8
        # activations forward and 8 gradients back. Rank 0 -> 1: activations 0->1 and 2->3,
        # gradients 2->1 (24); rank 1 -> 0: activations 1->2, gradients 1->0 and 3->2 (24).
        assert len(sends) == len(recvs) == 24
        assert [r["seq"] for r in sends] == list(range(1, len(sends) + 1))
        assert [r["seq"] for r in recvs] == list(range(1, len(recvs) + 1))
        assert all(r["in_bytes"] == mb_bytes for r in sends)
        assert all(r["out_bytes"] == mb_bytes for r in recvs)
        for s, r in zip(sends, recvs):
            assert r["end_ns"] >= s["start_ns"]


def test_internal_fault_never_reaches_the_loop(
    tmp_path: Path, torchrun: Any, capture_reader: Any
) -> None:
    out = tmp_path / "fault"
    proc = torchrun(SCRIPTS / "internal_fault.py", str(out), nproc=2)
    output = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-6000:]}"
    assert "rank 0 finished: total=10 error=None" in proc.stdout, output
    assert 'rank 1 finished: total=10 error="IsADirectoryError' in proc.stdout, output
    assert proc.stderr.count("tracelab: internal error on rank 1") == 1, output
    for rank in (0, 1):
        assert f"rank {rank} process groups after the profile: 1" in proc.stdout, output
    # The failed rank still answers the clock exchanges: rank 0 never waits out the timeout.
    assert "clock exchange failed" not in proc.stderr, output
    cap = capture_reader(out)
    assert sorted(cap.ranks) == [0, 1]
    assert cap.ranks[0]["collector_error"] is None and len(cap.ranks[0]["traces"]) == 1
    assert "IsADirectoryError" in cap.ranks[1]["collector_error"]
    assert cap.ranks[1]["traces"] == []
