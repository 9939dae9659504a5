"""An all-to-all is a group collective, never pipeline send/recv (issue 21 §1).

HTA's trace_diff/control is rank 3 of 8 of a recommendation model: each step exchanges pooled
embeddings with `nccl:all_to_all`, which NCCL runs as `ncclKernel_SendRecv` kernels that carry
no `Collective name`. Read as send/recv, 8.8 to 18.3 ms of each 76-81 ms step was counted as
pipeline bubble in a job with no pipeline. The kernels' op comes from the `nccl:<op>` host
annotation around their launch.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tracelab.analyzers import run
from tracelab.ingest import ingest
from tracelab.store import open_store, resolve_run


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory, hta_traces: Path) -> Path:
    files = sorted((hta_traces / "trace_diff" / "control").rglob("*.json.gz"))
    if not files:
        pytest.skip("HTA trace_diff/control not present")
    db = tmp_path_factory.mktemp("a2a") / "store.duckdb"
    ingest(files, db=db, run="control", workers=1, progress=False)
    return db


def test_sendrecv_kernels_of_an_all_to_all_are_all_to_all(control: Path) -> None:
    with open_store(control) as con:
        rid, _ = resolve_run(con, "control")
        ops = dict(
            con.execute(
                "SELECT op, count(*) FROM collectives WHERE run_id = ? AND source = 'kernel' "
                "GROUP BY op",
                [rid],
            ).fetchall()
        )
        # The trace holds 42 nccl:all_to_all annotations and 42 SendRecv kernels.
        assert ops.get("all_to_all") == 42
        assert not {"send", "recv", "send_recv"} & set(ops), ops
        p2p = con.execute("SELECT count(*) FROM p2p_ops WHERE run_id = ?", [rid]).fetchone()
        assert p2p == (0,)


def test_no_pipeline_bubble_and_no_pipeline_finding(control: Path) -> None:
    with open_store(control) as con:
        rid, _ = resolve_run(con, "control")
        bubble = con.execute(
            "SELECT sum(bubble_ns), sum(stall_ns), sum(step_ns) FROM step_parts WHERE run_id = ?",
            [rid],
        ).fetchone()
        assert bubble is not None and bubble[2] > 0
        assert bubble[:2] == (0, 0)
        pipe = con.execute(
            "SELECT count(*) FROM time_parts WHERE run_id = ? AND part = 'pipeline'", [rid]
        ).fetchone()
        assert pipe == (0,)
        ops = con.execute(
            "SELECT DISTINCT op FROM comm_attribution WHERE run_id = ?", [rid]
        ).fetchall()
        assert {op for (op,) in ops} == {"all_reduce", "all_to_all"}
        analysis = run(con, rid)
        assert not analysis.errors, analysis.errors
        codes = [f.code for f in analysis.findings]
        assert not [c for c in codes if "pipeline" in c or "bubble" in c], codes


def test_per_call_bytes_of_a_one_rank_trace(control: Path) -> None:
    """all_to_all_ranks on trace_diff/control: no record_param_comms args and no split sizes,
    so each of the 42 calls gets the bytes this rank sent from its nccl:all_to_all
    annotation's Input Dims and type (the first: [8, 1024, 8816] float = 288,882,688 B); what
    it received is unknown, and with one rank there is no match, no skew and no bandwidth."""
    with open_store(control) as con:
        rid, _ = resolve_run(con, "control")
        rows = con.execute(
            "SELECT call_key, sent_bytes, recv_bytes, bytes_from, match_key, sent_skew, "
            "busbw_gbps, group_size FROM all_to_all_ranks WHERE run_id = ? ORDER BY start_ns",
            [rid],
        ).fetchall()
    assert len(rows) == 42
    assert rows[0][:2] == ("rank 3 #0", 8 * 1024 * 8816 * 4)
    assert rows[1][1] == 1002496 * 4  # [[1002496]] int
    assert {r[3] for r in rows} == {"input_dims"}
    assert all(r[1] is not None and r[1] > 0 for r in rows)
    assert {r[2] for r in rows} == {None} and {r[4] for r in rows} == {None}
    assert {r[5] for r in rows} == {None} and {r[6] for r in rows} == {None}
    assert {r[7] for r in rows} == {None}


def test_skew_of_an_empty_call_is_missing_not_nan(tmp_path: Path) -> None:
    """A call in which every rank sends and receives 0 bytes has no mean to divide by: its
    skews are NULL ("a number that would mislead is reported as missing"), not DuckDB's NaN,
    which no JSON document can hold; an even call of 1 MiB has skew 1."""
    import math

    from tracelab.testing.synth import MS, RankTrace, write_ranks

    traces = []
    for rank in range(2):
        t = RankTrace(rank, 2)
        for k in range(3):
            o = k * 20 * MS
            t.step(k + 1, o, o + 18 * MS)
            t.kernel("gemm", o + 1 * MS, o + 4 * MS)
            t.nccl("all_to_all", o + 5 * MS, o + 7 * MS, nbytes=0)
            t.nccl("all_to_all", o + 8 * MS, o + 12 * MS, nbytes=1 << 20)
        traces.append(t)
    db = tmp_path / "s.duckdb"
    ingest(write_ranks(tmp_path / "empty_a2a", traces), db=db, run="e", workers=1, progress=False)
    with open_store(db) as con:
        rid, _ = resolve_run(con, "e")
        got = con.execute(
            "SELECT sent_bytes, sent_skew, recv_skew FROM all_to_all_ranks WHERE run_id = ? "
            "AND match_key IS NOT NULL",
            [rid],
        ).fetchall()
        doc = run(con, rid, only=["alltoall"])
    assert {b for b, _, _ in got} == {0, 1 << 20}
    for sent, s_skew, r_skew in got:
        assert (s_skew, r_skew) == ((None, None) if sent == 0 else (1.0, 1.0))
    res = doc.get("alltoall")
    assert res is not None
    assert not any(isinstance(v, float) and math.isnan(v) for v in res.metrics.values())


def test_kernel_calls_take_the_sizes_of_their_own_launch(tmp_path: Path) -> None:
    """The CPU runs ahead of the GPU: both all-to-alls of a step are issued (record_param_comms
    with their sizes, then the kernel launch) before the first kernel starts, and the kernels
    carry no sizes themselves. Each call takes the sizes recorded before its own launch: the
    1 MiB call 1 MiB and the 4 MiB call 4 MiB (read at the kernels' starts, the first call took
    the second's 4 MiB and the second none)."""
    from tracelab.testing.synth import MS, US, RankTrace, write_ranks

    def param_comms(nbytes: int) -> dict[str, object]:
        n = nbytes // 4
        return {"Collective name": "all_to_all", "In msg nelems": n, "Out msg nelems": n,
                "dtype": "Float", "In split size": "[]", "Out split size": "[]"}  # fmt: skip

    sizes = (1 << 20, 4 << 20)
    traces = []
    for rank in range(2):
        t = RankTrace(rank, 2)
        for k in range(3):
            o = k * 20 * MS
            t.step(k + 1, o, o + 18 * MS)
            for i, (nbytes, start, end) in enumerate(zip(sizes, (5, 8), (7, 12), strict=True)):
                host = o + 1 * MS + i * 100 * US
                t.cpu_op("record_param_comms", host, host + 10 * US, args=param_comms(nbytes))
                ev = t.nccl(
                    "all_to_all", o + start * MS, o + end * MS, nbytes=nbytes,
                    launch_ns=host + 20 * US,
                )  # fmt: skip
                for key in ("In msg nelems", "Out msg nelems", "In split size", "Out split size"):
                    ev["args"].pop(key, None)
        traces.append(t)
    db = tmp_path / "s.duckdb"
    ingest(write_ranks(tmp_path / "ahead", traces), db=db, run="a", workers=1, progress=False)
    with open_store(db) as con:
        rid, _ = resolve_run(con, "a")
        got = con.execute(
            "SELECT rank, step, sent_bytes, recv_bytes, bytes_from FROM all_to_all_ranks "
            "WHERE run_id = ? ORDER BY rank, start_ns",
            [rid],
        ).fetchall()
    assert len(got) == 2 * 3 * 2
    for i, (_rank, _step, sent, recv, via) in enumerate(got):
        assert (sent, recv, via) == (sizes[i % 2], sizes[i % 2], "split_sizes"), got
