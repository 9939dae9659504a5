"""Golden tests from TraceLens's collective analysis (AMD-AGI/TraceLens).

TraceLens.NcclAnalyser.nccl_analyser.NcclAnalyser.build_df_implicit_sync (HEAD of
AMD-AGI/TraceLens; its tests: tests/test_nccl_analyser.py, tests/test_simplified_nccl_mode.py,
tests/test_collective_analysis.py with the reference sheet
tests/traces/mi300/llama_70b_fsdp/nccl_analysis_report_csvs/nccl_summary_implicit_sync.csv)
defines, per collective matched across the ranks:

    comm_latency          = min over ranks of the kernel duration
    rank_r_wait_time      = latest start - rank r's start
    skew in start time    = max wait (earliest arrival rank: its rank)
    skew in end time      = latest end - earliest end
    Full msg size         = Out msg size for all-gather, else In msg size (nccl-tests)
    algo bw (GB/s)        = Full msg size (MiB) / 1024 / (comm_latency / 1e6), i.e. GiB/s
    bus bw (GB/s)         = algo bw * 2(n-1)/n (all-reduce), (n-1)/n (all-gather,
                            reduce-scatter, all-to-all)
    straggler summary     = per rank, total wait over the collectives; the rank with the
                            lowest total wait is the straggler (build_df_straggler_summary)

The reference sheet itself checks the size rule: `_allgather_base` BFloat16 with In msg nelems
106956800 in a group of 8 has a Full msg size of 1632.03125 MiB = 106956800 * 2 * 8 bytes (the
gathered output), and `_reduce_scatter_base` Float 855654400 one of 3264.0625 MiB =
855654400 * 4 bytes (the whole input); its bus bw columns are its algo bw columns times 7/8.

The trace here is built the way TraceLens's own tests build theirs (tests/test_nccl_analyser.py
`_nccl_kernel`: NCCL kernels whose args carry the record_param_comms metadata), with the
arrivals of FACTS.md section 4 (4 ranks arrive at 0, 1, 5, 2 µs and all end at 7: straggler
rank 2, waits 5, 4, 0, 3, transfer 2).
"""

from __future__ import annotations

import pytest

from ._golden import US, Store, ingest_ranks

WORLD = 4
MIB = 1 << 20
#: (op, Collective name, dtype, bytes per element, in nelems, out nelems, starts µs, durs µs)
COLLECTIVES = [
    ("all_reduce", "allreduce", "Float", 4, MIB, MIB, [0, 1, 5, 2], [7, 6, 2, 5]),
    (
        "all_gather",
        "_allgather_base",
        "BFloat16",
        2,
        MIB,
        WORLD * MIB,
        [103, 100, 100, 101],
        [7, 10, 10, 9],
    ),
    (
        "reduce_scatter",
        "_reduce_scatter_base",
        "Float",
        4,
        WORLD * MIB,
        MIB,
        [200, 200, 200, 201],
        [20, 21, 22, 20],
    ),
]
KERNEL = {
    "all_reduce": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
    "all_gather": "ncclDevKernel_AllGather_RING_LL",
    "reduce_scatter": "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL",
}


def _rank_events(rank: int) -> list[dict]:
    events = []
    for i, (op, cname, dtype, _, n_in, n_out, starts, durs) in enumerate(COLLECTIVES):
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": KERNEL[op],
                "pid": rank,
                "tid": 20,
                "ts": 1000 + starts[rank],
                "dur": durs[rank],
                "args": {
                    "External id": 100 + i,
                    "device": rank,
                    "stream": 20,
                    "Collective name": cname,
                    "Process Group Name": "0",
                    "Process Group Description": "default_pg",
                    "Process Group Ranks": list(range(WORLD)),
                    "Group size": WORLD,
                    "In msg nelems": n_in,
                    "Out msg nelems": n_out,
                    "dtype": dtype,
                },
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": "ampere_sgemm_128x64_tn",
                "pid": rank,
                "tid": 7,
                "ts": 1000 + starts[rank] - 0.5,
                "dur": 0.25,
                "args": {"device": rank, "stream": 7},
            }
        )
    return events


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    # One host: the ranks share a clock, so arrivals are compared as written (as TraceLens does).
    return ingest_ranks(
        tmp_path_factory.mktemp("tracelens"),
        {r: _rank_events(r) for r in range(WORLD)},
        name="tracelens",
        extra={"host_name": "node0"},
    )


def tracelens_rows() -> dict[str, dict]:
    """TraceLens's implicit-sync row of each collective, by its formulas (module docstring)."""
    out = {}
    for op, _, _, size, n_in, n_out, starts, durs in COLLECTIVES:
        ends = [s + d for s, d in zip(starts, durs, strict=True)]
        latency = min(durs)
        waits = [max(starts) - s for s in starts]
        full_mib = (n_out if op == "all_gather" else n_in) * size / MIB
        algbw = full_mib / 1024 / (latency / 1e6)
        factor = 2 * (WORLD - 1) / WORLD if op == "all_reduce" else (WORLD - 1) / WORLD
        out[op] = {
            "comm_latency": latency,
            "waits": waits,
            "skew_start": max(waits),
            "earliest": max((w, r) for r, w in enumerate(waits))[1],
            "skew_end": max(ends) - min(ends),
            "full_bytes": full_mib * MIB,
            "algbw_gib": algbw,
            "busbw_gib": algbw * factor,
        }
    return out


def matched(store: Store) -> dict[str, dict[int, dict]]:
    out: dict[str, dict[int, dict]] = {}
    for r in store.rows("SELECT * FROM matched_collectives WHERE run_id = $run"):
        out.setdefault(r["op"], {})[int(r["rank"])] = r
    return out


def test_comm_latency_is_transfer(store: Store) -> None:
    """comm_latency (min duration across ranks) = matched_collectives.transfer_ns."""
    m = matched(store)
    for op, want in tracelens_rows().items():
        assert {r["transfer_ns"] / US for r in m[op].values()} == {want["comm_latency"]}, op


def test_full_message_size_as_nccl_tests(store: Store) -> None:
    """Full msg size (all-gather: the gathered output; reduce-scatter: the whole input) =
    matched_collectives.bytes; the group size is the trace's."""
    m = matched(store)
    for op, want in tracelens_rows().items():
        assert {r["bytes"] for r in m[op].values()} == {want["full_bytes"]}, op
        assert {r["group_size"] for r in m[op].values()} == {WORLD}


def test_per_rank_waits_and_skews(store: Store) -> None:
    """rank_r_wait_time = last_arrival_ns - start_ns; skew in start time = the last arrival
    minus the first; the rank TraceLens calls the earliest arrival waits longest; the last
    arriver (matched_collectives.last_rank) waits 0; skew in end time from start + dur."""
    m = matched(store)
    for op, want in tracelens_rows().items():
        rows = m[op]
        waits = [(rows[r]["last_arrival_ns"] - rows[r]["start_ns"]) / US for r in range(WORLD)]
        assert waits == want["waits"], op
        assert max(waits) == want["skew_start"]
        assert max(range(WORLD), key=lambda r: (waits[r], r)) == want["earliest"]
        assert {rows[r]["last_rank"] for r in range(WORLD)} == {waits.index(0)}
        ends = [rows[r]["end_ns"] for r in range(WORLD)]
        assert (max(ends) - min(ends)) / US == want["skew_end"]


def test_straggler_is_lowest_total_wait(store: Store) -> None:
    """build_df_straggler_summary: total wait per rank; the straggler has the lowest.
    Here rank 2 (totals 6, 8, 4, 5 µs)."""
    waits = store.by_rank(
        "SELECT rank, sum(last_arrival_ns - start_ns) AS w "
        "FROM matched_collectives WHERE run_id = $run GROUP BY rank"
    )
    want = [sum(row["waits"][r] for row in tracelens_rows().values()) for r in range(WORLD)]
    assert [waits[r]["w"] / US for r in range(WORLD)] == want == [6, 8, 4, 5]
    assert min(range(WORLD), key=lambda r: waits[r]["w"]) == 2


def test_bandwidths_with_the_same_factors(store: Store) -> None:
    """algo bw and bus bw from tracelab's bytes, transfer and bus factor (BUS_FACTOR_SQL, the
    one the breakdown analyzer uses) equal TraceLens's once the unit is the same: tracelab
    reports GB/s = 1e9 bytes/s (nccl-tests' unit), TraceLens's 'GB/s' is GiB/s (MiB / 1024)."""
    from tracelab.derived.collectives import BUS_FACTOR_SQL

    rows = store.rows(f"""SELECT op, any_value(bytes / transfer_ns) AS algbw,
                                 any_value(bytes / transfer_ns * {BUS_FACTOR_SQL}) AS busbw
                          FROM (SELECT *, group_size AS n FROM matched_collectives
                                WHERE run_id = $run) GROUP BY op""")
    gib = (1 << 30) / 1e9
    for r in rows:
        want = tracelens_rows()[r["op"]]
        assert r["algbw"] == pytest.approx(want["algbw_gib"] * gib, rel=1e-12)
        assert r["busbw"] == pytest.approx(want["busbw_gib"] * gib, rel=1e-12)


def test_wait_differs_on_purpose(store: Store) -> None:
    """Different on purpose: tracelab's wait_ns is the op's duration minus the transfer (the
    TensorBoard plugin's synchronizing time, the part of the op spent not moving data), while
    TraceLens's wait time is the lateness of the last arrival (latest start - own start).
    They agree when the ranks end together (the all-reduce here) and not otherwise: in the
    reduce-scatter rank 2 ends 2 µs after the others (dur 22, transfer 20), so tracelab counts
    2 µs of waiting where TraceLens counts 1 (it arrived 1 µs before rank 3)."""
    m = matched(store)
    ar = m["all_reduce"]
    assert [ar[r]["wait_ns"] / US for r in range(WORLD)] == [5, 4, 0, 3]
    rs = m["reduce_scatter"][2]
    assert rs["wait_ns"] / US == 2
    assert (rs["last_arrival_ns"] - rs["start_ns"]) / US == 1
