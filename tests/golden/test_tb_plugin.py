"""Golden tests from the PyTorch Profiler TensorBoard plugin's own test suite.

Source: pytorch/kineto, tb_plugin/test/test_profiler.py at 041e7ce9 (the parent of 94979607,
"Remove kineto tb_plugin directory entirely", April 2026); the traces under fixtures/tb_plugin/
are its inline JSON traces, verbatim (fixtures/PROVENANCE.md). Each test names the peer test
and quotes its expected numbers (µs).

The plugin's step breakdown has roles Kernel, Memcpy, Memset, Communication, Runtime,
DataLoader, CpuOp, Other, claimed in that order (torch_tb_profiler/profiler/overall_parser.py);
tracelab's lost-time model has parts compute, transfer, memcpy, wait, bubble, stall, host, idle
(compute first). Where both define a number the same way they agree to the µs:

    Kernel                                      = step_parts.compute_ns (device ranks)
    Memcpy + Memset                             = step_parts.memcpy_ns
    Runtime + DataLoader + CpuOp + Other        = step_parts.host_ns + idle_ns (no comm)
    Total                                       = step_parts.step_ns (same step boundaries)
    overlap graph: computation ∩ communication  = step_parts.overlapped_comm_ns
    overlap graph: communication                = step_parts.comm_ns
    wait graph / comm view: data transfer time  = matched_collectives.transfer_ns (shortest
                                                  duration of the op across the ranks;
                                                  tracelab's, from the last effective
                                                  arrival, is at most that: a gloo broadcast
                                                  queued behind another gets 10 us, not 30,
                                                  and the unions tested here agree)
    wait graph: synchronizing time              = matched_collectives.wait_ns (dur - transfer)

Where tracelab differs on purpose, a test says so and why.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ._golden import US, Store, ingest_ranks, step_parts_us, tb_events, union_us


def one_rank(tmp_path: Path, name: str) -> Store:
    return ingest_ranks(tmp_path, {0: tb_events(name, 0)}, name=name)


def two_ranks(tmp_path: Path, name: str) -> Store:
    return ingest_ranks(tmp_path, {0: tb_events(name, 0), 1: tb_events(name, 1)}, name=name)


def host_us(p: dict[str, float]) -> float:
    return p["host_ns"] + p["idle_ns"]


# --------------------------------------------------------------- categories and step breakdown


def test_all_categories_pytorch_1_8_names(tmp_path: Path) -> None:
    """test_all_categories: PyTorch 1.8 categories (`Kernel`, `Memcpy`, `Memset`, `Runtime`,
    `Operator`) and string thread ids. Expected: Kernel 15, Memcpy 10, Memset 5, Runtime 30,
    DataLoader 180, CpuOp 35, Other 125 (Total 400)."""
    s = one_rank(tmp_path, "all_categories")
    cats = {
        (r["cat"], r["name"][:20]): (r["category"], r["on_device"])
        for r in s.rows("SELECT cat, name, category, on_device FROM events WHERE run_id = $run")
    }
    assert cats[("Kernel", "void cunn_ClassNLLCr")] == ("compute", True)
    assert cats[("Memcpy", "Memcpy HtoD (Pageabl")] == ("memcpy", True)
    assert cats[("Memset", "Memset (Device)")] == ("memset", True)
    assert cats[("Runtime", "cudaMemcpyAsync")] == ("runtime", False)
    assert cats[("Operator", "aten::to")] == ("cpu_op", False)
    assert cats[("Operator", "ProfilerStep#1")] == ("annotation", False)
    assert cats[("Operator", "enumerate(DataLoader")] == ("annotation", False)
    # "tid": "123" and "456" are two threads; "stream 7" is stream 7
    lanes = s.rows(
        "SELECT DISTINCT tid, stream, lane_label FROM events WHERE run_id = $run ORDER BY tid"
    )
    assert [(r["tid"], r["stream"], r["lane_label"]) for r in lanes] == [
        (7, 7, None),
        (123, None, None),
        (456, None, None),
    ]
    p = step_parts_us(s)[0][1]
    assert p["step_ns"] == 400
    assert p["compute_ns"] == 15  # Kernel
    assert p["memcpy_ns"] == 10 + 5  # Memcpy + Memset
    assert host_us(p) == 30 + 180 + 35 + 125  # Runtime + DataLoader + CpuOp + Other


def test_runtime_called_by_profilerstep(tmp_path: Path) -> None:
    """test_runtime_called_by_profilerstep: Kernel 8, Runtime 20, CpuOp 0, Other 272."""
    p = step_parts_us(one_rank(tmp_path, "runtime_called_by_profilerstep"))[0][1]
    assert (p["step_ns"], p["compute_ns"], host_us(p)) == (300, 8, 20 + 0 + 272)


def test_no_profilerstep_is_one_step(tmp_path: Path) -> None:
    """test_no_profilerstep: 'If no ProfilerStep, all events will be regarded as a step.'
    Kernel 100, Runtime 10, CpuOp 70, Other 140, Total (320 + 100) - 100 = 320."""
    s = one_rank(tmp_path, "no_profilerstep")
    (span,) = s.rows("SELECT * FROM step_spans WHERE run_id = $run")
    assert span["source"] == "whole_trace"
    p = step_parts_us(s)[0][0]
    assert (p["step_ns"], p["compute_ns"], p["memcpy_ns"]) == (320, 100, 0)
    assert host_us(p) == 10 + 70 + 140


def test_multiple_steps_no_overlap(tmp_path: Path) -> None:
    """test_multiple_profilersteps_no_overlap. Step 2 agrees exactly: Kernel 200, Runtime 5,
    CpuOp 45, Other 10, Total 610 - 350 = 260.

    Step 1 differs on purpose: the plugin ends it at its last device event (320) and leaves
    the 30 µs gap before ProfilerStep#2 (350) in no step; tracelab's steps tile the profiled
    time (a gap belongs to the step before it), so per-step figures add up to the run. The
    plugin's Total 320 - 100 = 220 is tracelab's 250 minus that gap, which is host time;
    Memcpy 40 and Kernel 0 agree."""
    parts = step_parts_us(one_rank(tmp_path, "multiple_profilersteps_no_overlap"))[0]
    p2 = parts[2]
    assert (p2["step_ns"], p2["compute_ns"], host_us(p2)) == (260, 200, 5 + 45 + 10)
    p1 = parts[1]
    gap = 350 - 320
    assert p1["step_ns"] == 220 + gap
    assert (p1["compute_ns"], p1["memcpy_ns"]) == (0, 40)
    assert host_us(p1) == 5 + 55 + 120 + gap


def test_multiple_steps_with_overlap(tmp_path: Path) -> None:
    """test_multiple_profilersteps_with_overlap. Step 2 agrees exactly: Kernel 200, CpuOp
    (280 + 100) - 360 + (410 - 405) = 25, Runtime 5, Other 0, Total 610 - 380 = 230 (both start
    step 2 when step 1's memcpy ends, at 380).

    Step 1 differs on purpose: a kernel (150-240) whose launch is not in the trace (launched
    before profiling began) makes the plugin start step 1 at its end (240, Total 140). tracelab
    keeps device work whose launch the profiler lost (it is work the device did in the step)
    and starts the step at its span (100): 140 + (240 - 100) = 280, the lost-launch kernel's
    90 µs counted as compute; Memcpy 100 agrees."""
    parts = step_parts_us(one_rank(tmp_path, "multiple_profilersteps_with_overlap"))[0]
    p2 = parts[2]
    assert (p2["step_ns"], p2["compute_ns"], host_us(p2)) == (230, 200, 25 + 5 + 0)
    p1 = parts[1]
    assert p1["step_ns"] == 140 + (240 - 100)
    assert (p1["compute_ns"], p1["memcpy_ns"]) == (90, 100)


def test_last_steps_without_kernels(tmp_path: Path) -> None:
    """test_last_steps_no_kernel: the plugin drops trailing steps that launched no kernel
    ('the profiler may fail to capture all the kernels launched by these steps') and gives step
    1 a Total of (150 + 180) - (90 + 20) = 220, starting after a lost-launch kernel (90-110).

    tracelab keeps every step (a step without device work is a host-bound step, which is a
    finding, not an artefact) and starts step 1 at its span (100): 220 + 10."""
    s = one_rank(tmp_path, "last_steps_no_kernel")
    parts = step_parts_us(s)[0]
    assert sorted(parts) == [1, 2, 3]
    assert parts[1]["step_ns"] == 220 + (110 - 100)
    assert parts[1]["compute_ns"] == 180 + (110 - 100)
    assert (parts[2]["compute_ns"], parts[3]["compute_ns"]) == (0, 0)


def test_pure_cpu(tmp_path: Path) -> None:
    """test_pure_cpu (category `Operator`, no device): CpuOp 10 / 40, Other 190 / 60, Total
    200 / 100. On host-only ranks tracelab's compute is operator time minus the thread's own
    communication, i.e. the plugin's CpuOp."""
    parts = step_parts_us(one_rank(tmp_path, "pure_cpu"))[0]
    assert (parts[1]["step_ns"], parts[2]["step_ns"]) == (200, 100)
    assert (parts[1]["compute_ns"], parts[2]["compute_ns"]) == (10, 40)
    assert (host_us(parts[1]), host_us(parts[2])) == (190, 60)


def test_nccl_user_annotation_is_communication(tmp_path: Path) -> None:
    """test_distributed_nccl_user_annotation_has_communication (kineto#640): a `nccl:all_reduce`
    user_annotation is communication."""
    s = one_rank(tmp_path, "distributed_nccl_user_annotation_has_communication")
    (e,) = s.rows("SELECT category FROM events WHERE run_id = $run")
    assert e["category"] == "communication"
    assert step_parts_us(s)[0][0]["comm_ns"] == 71


# --------------------------------------------------------------- distributed view


def _per_rank_op_unions(s: Store) -> dict[tuple[int, str], tuple[float, float]]:
    """(rank, op) -> (union of the op's spans, union of its transfer intervals), µs: the
    plugin's comm_ops 'total latency' and 'data transfer time' (a transfer interval is the last
    transfer_ns of the op, the plugin's real_time_range)."""
    rows = s.rows(
        "SELECT rank, op, start_ns, end_ns, transfer_ns FROM matched_collectives "
        "WHERE run_id = $run"
    )
    out: dict[tuple[int, str], tuple[float, float]] = {}
    for key in {(r["rank"], r["op"]) for r in rows}:
        mine = [r for r in rows if (r["rank"], r["op"]) == key]
        out[key] = (
            union_us([(r["start_ns"], r["end_ns"]) for r in mine]),
            union_us([(r["end_ns"] - r["transfer_ns"], r["end_ns"]) for r in mine]),
        )
    return out


def _wait_graph(s: Store) -> dict[int, tuple[float, float]]:
    """rank -> (data transfer, synchronizing) as the plugin's wait graph: the union of the
    transfer intervals, and the union of the ops minus it."""
    rows = s.rows(
        "SELECT rank, start_ns, end_ns, transfer_ns FROM matched_collectives WHERE run_id = $run"
    )
    out = {}
    for rank in {r["rank"] for r in rows}:
        mine = [r for r in rows if r["rank"] == rank]
        total = union_us([(r["start_ns"], r["end_ns"]) for r in mine])
        transfer = union_us([(r["end_ns"] - r["transfer_ns"], r["end_ns"]) for r in mine])
        out[rank] = (transfer, total - transfer)
    return out


def test_distributed_nccl_transfer_and_wait(tmp_path: Path) -> None:
    """test_distributed_nccl, kernel numbers. Expected before kineto#813 (afdaf508^, the
    plugin's communication view measured from the NCCL kernels alone, as tracelab does):
    steps_to_wait worker0 [1074, 498], worker1 [1074, 15]; comm_ops worker0 broadcast
    [1, 212480 B, 16 µs, transfer 16], all_reduce [1, 8196000 B, 1556, 1058]; worker1 broadcast
    [31, 16], all_reduce [1058, 1058]. The message sizes come from the `nccl:*` host op's Input
    Dims and Input type (the trace has no record_param_comms), linked to the kernel by External
    id (PyTorch 1.8 spells it `external id` on device events)."""
    s = two_ranks(tmp_path, "distributed_nccl")
    m = {
        (r["rank"], r["op"]): r
        for r in s.rows("SELECT * FROM matched_collectives WHERE run_id = $run")
    }
    assert {k: (v["bytes"], v["dur_ns"] / US, v["transfer_ns"] / US) for k, v in m.items()} == {
        (0, "broadcast"): (212480, 16, 16),
        (0, "all_reduce"): (8196000, 1556, 1058),
        (1, "broadcast"): (212480, 31, 16),
        (1, "all_reduce"): (8196000, 1058, 1058),
    }
    assert _wait_graph(s) == {0: (1074, 498), 1: (1074, 15)}
    assert {k: v["wait_ns"] / US for k, v in m.items()} == {
        (0, "broadcast"): 0,
        (0, "all_reduce"): 498,
        (1, "broadcast"): 15,
        (1, "all_reduce"): 0,
    }


def test_distributed_nccl_host_span_differs_on_purpose(tmp_path: Path) -> None:
    """test_distributed_nccl, as the plugin expects it since kineto#813: steps_to_wait worker0
    [1169, 464], worker1 [1169, 3]; steps_to_overlap worker0 [30, 75, 75, 55]; costs Total 235.

    Different on purpose: since #813 the plugin adds the `nccl:*` host op's span (the CPU-side
    enqueue, 0-75 µs on worker0) to the op's communication time, and without ProfilerStep it
    bounds the step by host events only (0-235 µs), cutting the all-reduce kernel that runs to
    1718. On a GPU rank tracelab measures communication on the device (the kernels: the host
    enqueue is not data movement and does not block the device) and a step includes the device
    work it launched, so its step is 1718 µs and its transfer/wait are the kernel numbers
    above."""
    s = two_ranks(tmp_path, "distributed_nccl")
    parts = step_parts_us(s)
    assert parts[0][0]["step_ns"] == 1718 != 235
    assert _wait_graph(s)[0] == (1074, 498) != (1169, 464)


@pytest.mark.parametrize("name", ["distributed_gloo_gpu", "distributed_gloo_cpu"])
def test_distributed_gloo_transfer_and_wait(tmp_path: Path, name: str) -> None:
    """test_distributed_gloo_gpu / _cpu: steps_to_wait worker0 [75, 34], worker1 [78, 20];
    comm_ops worker0 gloo:broadcast [3 calls, 637440 B, 63 µs, transfer 41], gloo:all_reduce
    [2, 16392000, 46, 34]; worker1 broadcast [3, 637440, 44, 44], all_reduce [2, 16392000, 54,
    34]. gloo ops run on two threads ("tid": "23803" and "23805"), so they overlap on a rank."""
    s = two_ranks(tmp_path, name)
    rows = s.rows(
        "SELECT rank, op, count(*) AS n, sum(bytes) AS b FROM matched_collectives "
        "WHERE run_id = $run GROUP BY ALL"
    )
    assert {(r["rank"], r["op"]): (r["n"], r["b"]) for r in rows} == {
        (0, "broadcast"): (3, 637440),
        (0, "all_reduce"): (2, 16392000),
        (1, "broadcast"): (3, 637440),
        (1, "all_reduce"): (2, 16392000),
    }
    assert _per_rank_op_unions(s) == {
        (0, "broadcast"): (63, 41),
        (0, "all_reduce"): (46, 34),
        (1, "broadcast"): (44, 44),
        (1, "all_reduce"): (54, 34),
    }
    assert _wait_graph(s) == {0: (75, 34), 1: (78, 20)}


def test_distributed_gloo_gpu_step_and_overlap(tmp_path: Path) -> None:
    """test_distributed_gloo_gpu: costs worker0 [Kernel 101, Communication 39, CpuOp 16,
    Other 0, Total 156], worker1 [70, 44, 20, 12, 146]; steps_to_overlap worker0 [31, 70, 39,
    16], worker1 [16, 54, 44, 32] (computation only, overlapped, communication only, other).
    The plugin's Communication role is communication that no kernel covers: tracelab's
    exposed communication, transfer + wait."""
    parts = step_parts_us(two_ranks(tmp_path, "distributed_gloo_gpu"))
    for rank, (kernel, comm, cpu_other, total, overlap) in {
        0: (101, 39, 16 + 0, 156, 70),
        1: (70, 44, 20 + 12, 146, 54),
    }.items():
        p = parts[rank][0]
        assert p["step_ns"] == total
        assert p["compute_ns"] == kernel
        assert p["transfer_ns"] + p["wait_ns"] == comm
        assert host_us(p) == cpu_other
        assert p["overlapped_comm_ns"] == overlap
        assert p["comm_ns"] == overlap + comm


def test_distributed_gloo_cpu_step_and_overlap(tmp_path: Path) -> None:
    """test_distributed_gloo_cpu (host-only ranks): costs worker0 [Communication 109, CpuOp
    47, Other 0, Total 156], worker1 [98, 36, 12, 146]; steps_to_overlap worker0 [47, 74, 35,
    0], worker1 [36, 64, 34, 12]. Overlap and communication agree exactly (overlapped_comm_ns,
    comm_ns): that needs the threads kept apart ("tid": "23800" computes while "23803" and
    "23805" communicate).

    Different on purpose: the plugin's roles give communication precedence over CpuOp, so its
    CpuOp (47) is operator time that no communication overlaps; tracelab's parts give compute
    precedence (HTA's rule: communication under compute is hidden), so compute_ns is all of the
    operator time, 47 + 74 = 121, and exposed communication is 109 - 74 = 35. Both split the
    same 156 µs."""
    parts = step_parts_us(two_ranks(tmp_path, "distributed_gloo_cpu"))
    for rank, (comm, cpu_only, other, total, overlap) in {
        0: (109, 47, 0, 156, 74),
        1: (98, 36, 12, 146, 64),
    }.items():
        p = parts[rank][0]
        assert p["step_ns"] == total
        assert p["comm_ns"] == comm
        assert p["overlapped_comm_ns"] == overlap
        assert p["compute_ns"] == cpu_only + overlap
        assert p["transfer_ns"] + p["wait_ns"] == comm - overlap
        assert host_us(p) == other
