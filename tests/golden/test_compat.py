"""Trace compatibility as the peers read the same traces (issue 11 section 4): categories in any
case and PyTorch 1.8's names, string thread ids, MTIA device events, Kineto's moved Stream Sync
rows, PyTorch 1.8's lower-case `external id`, and message sizes from the `nccl:*` host op."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tracelab.ingest import classify as cl
from tracelab.ingest import columns, decode
from tracelab.ingest.decode import ABSENT

from ._golden import US, ingest_ranks, step_parts_us

CASES = [
    ("Kernel", "void gemm_kernel", "compute"),
    ("KERNEL", "ncclKernel_AllReduce_RING", "communication"),
    ("Memcpy", "Memcpy HtoD", "memcpy"),
    ("Memset", "Memset (Device)", "memset"),
    ("Runtime", "cudaLaunchKernel", "runtime"),
    ("Runtime", "cudaDeviceSynchronize", "sync"),
    ("Operator", "aten::mm", "cpu_op"),
    ("Operator", "ProfilerStep#3", "annotation"),
    ("Operator", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "annotation"),
    ("Operator", "nccl:all_reduce", "communication"),
    ("Python", "train.py(12): step", "python"),
    ("Cuda_Runtime", "cudaMemcpyAsync", "runtime"),
    ("USER_ANNOTATION", "gloo:all_reduce", "communication"),
    ("mtia_ccp_events", "aten::mul.out-dtype_Float", "compute"),
    ("mtia_ccp_events", "dma_request", "memcpy"),
    ("mtia_ccp_events", "event_wait", "sync"),
    ("mtia_ccp_events", "pe_exe", "other"),
    ("mtia_ccp_events", "hccl::all_reduce", "communication"),
    ("mtia_runtime", "runFunction - job_prep_and_submit_for_execution", "runtime"),
    ("mtia_runtime", "synchronizeStream", "sync"),
    ("xpu_runtime", "urEnqueueKernelLaunch", "runtime"),
    ("Trace", "PyTorch Profiler (0)", "other"),
    (None, "x", "other"),
]


@pytest.mark.parametrize(("cat", "name", "want"), CASES)
def test_categories_any_case_and_old_names(cat: str | None, name: str, want: str) -> None:
    """classify() in any case and with the PyTorch 1.8 names."""
    assert cl.classify(cat, name).value == want
    assert cl.on_device(cat) == (cl.canonical_cat(cat) in cl.DEVICE_CATS)


def test_device_categories_any_case() -> None:
    for cat in (
        "Kernel",
        "kernel",
        "Memcpy",
        "GPU_MEMCPY",
        "Memset",
        "cuda_sync",
        "mtia_ccp_events",
        "MTIA_CCP_EVENTS",
    ):
        assert cl.on_device(cat), cat
    for cat in ("Runtime", "Operator", "cpu_op", "mtia_runtime", None):
        assert not cl.on_device(cat), cat


def test_string_thread_ids_stay_apart() -> None:
    """ "tid": "23800" is thread 23800 (the plugin does int(tid)); "stream 7" is stream 7;
    text that names no integer stays NULL, with the text in lane_label."""
    odd = {
        (0, "tid"): "23800",
        (1, "tid"): "23805",
        (2, "tid"): "stream 7",
        (3, "pid"): "Spans",
        (3, "tid"): "PyTorch Profiler",
        (4, "tid"): 1.5,
    }
    pid = np.array([1, 1, 0, ABSENT, 1], dtype=np.int64)
    tid = np.full(5, ABSENT, dtype=np.int64)
    p, t, label = columns.lane_columns(pid, tid, lambda i, f: odd[(i, f)])
    assert t.to_pylist() == [23800, 23805, 7, None, None]
    assert p.to_pylist() == [1, 1, 0, None, 1]
    assert label.to_pylist() == [None, None, None, "Spans/PyTorch Profiler", "1/1.5"]


def _doc(events: list[dict], **top: object) -> bytes:
    return json.dumps({"schemaVersion": 1, "traceEvents": events, **top}).encode()


def test_scanner_and_reference_agree_on_old_traces() -> None:
    """The C scanner and the reference decoder read PyTorch 1.8's `external id`, and string
    tids, identically (tests/foundation/test_fast_scan.py checks the rest)."""
    if decode._kineto is None:
        pytest.skip("extension not built")
    buf = _doc(
        [
            {
                "ph": "X",
                "cat": "Kernel",
                "name": "k",
                "pid": 0,
                "tid": "stream 7",
                "ts": 1,
                "dur": 2,
                "args": {"device": 0, "correlation": 3, "external id": 5},
            },
            {
                "ph": "X",
                "cat": "Operator",
                "name": "aten::mm",
                "pid": 1,
                "tid": "23800",
                "ts": 0,
                "dur": 4,
                "args": {"External id": 5, "external id": 6},
            },
        ]
    )
    fast = decode._from_scan(decode._kineto.scan(buf), buf)
    ref = decode.decode_reference(buf, Path("x.json"))
    assert set(fast.ids) == set(ref.ids) == set(decode.ID_KEYS)
    for key in decode.ID_KEYS:
        np.testing.assert_array_equal(fast.ids[key], ref.ids[key])
    assert fast.ids["external id"].tolist() == [5, 6]
    assert fast.ids["External id"].tolist() == [ABSENT, 5]
    assert fast.odd == ref.odd


def test_lower_case_external_id_links_device_work(tmp_path: Path) -> None:
    """external_id comes from `External id`, else PyTorch 1.8's `external id`."""
    s = ingest_ranks(
        tmp_path,
        {
            0: [
                {
                    "ph": "X",
                    "cat": "Operator",
                    "name": "aten::mm",
                    "pid": 1,
                    "tid": "9",
                    "ts": 0,
                    "dur": 10,
                    "args": {"External id": 4},
                },
                {
                    "ph": "X",
                    "cat": "Runtime",
                    "name": "cudaLaunchKernel",
                    "pid": 1,
                    "tid": "9",
                    "ts": 2,
                    "dur": 3,
                    "args": {"correlation": 40, "external id": 4},
                },
                {
                    "ph": "X",
                    "cat": "Kernel",
                    "name": "gemm",
                    "pid": 0,
                    "tid": "stream 7",
                    "ts": 6,
                    "dur": 20,
                    "args": {"correlation": 40, "external id": 4, "device": 0},
                },
            ]
        },
        name="extid",
    )
    rows = s.rows(
        "SELECT name, external_id, correlation, stream FROM events WHERE run_id = $run "
        "ORDER BY ts_ns"
    )
    assert [(r["external_id"], r["correlation"], r["stream"]) for r in rows] == [
        (4, None, None),
        (4, 40, None),
        (4, 40, 7),
    ]


def test_moved_stream_sync_maps_back_to_its_stream(tmp_path: Path) -> None:
    """Kineto writes "Stream Sync" (cuda_sync) on tid = stream + 1,000,000 (libkineto
    output_json.h kSyncStreamTidOffset) with the stream in args.stream; without the arg the
    stream is read back from the tid. The tid stays as written (its own timeline row)."""
    s = ingest_ranks(
        tmp_path,
        {
            0: [
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": "gemm",
                    "pid": 0,
                    "tid": 7,
                    "ts": 0,
                    "dur": 10,
                    "args": {"stream": 7, "correlation": 1},
                },
                {
                    "ph": "X",
                    "cat": "cuda_sync",
                    "name": "Stream Sync",
                    "pid": 0,
                    "tid": 1000007,
                    "ts": 2,
                    "dur": 8,
                    "args": {"stream": 7, "correlation": 2},
                },
                {
                    "ph": "X",
                    "cat": "cuda_sync",
                    "name": "Stream Sync",
                    "pid": 0,
                    "tid": 1000013,
                    "ts": 12,
                    "dur": 1,
                    "args": {"correlation": 3},
                },
            ]
        },
        name="sync",
    )
    rows = s.rows("SELECT tid, stream, category FROM events WHERE run_id = $run ORDER BY ts_ns")
    assert [(r["tid"], r["stream"], r["category"]) for r in rows] == [
        (7, 7, "compute"),
        (1000007, 7, "sync"),
        (1000013, 13, "sync"),
    ]


def test_mtia_rank_is_a_device_rank(tmp_path: Path) -> None:
    """An MTIA rank (event shapes of HTA's tests/data/mtia_* traces: `mtia_ccp_events` on the
    device, `mtia_runtime` launches with correlation) is analysed as a device rank: its kernels
    are compute, `dma*` is memory, `event_wait` the device's sync, and the `pe_exe` wrapper
    (which HTA leaves out of compute) is not counted."""
    s = ingest_ranks(
        tmp_path,
        {
            0: [
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": "ProfilerStep#0",
                    "pid": 9,
                    "tid": 1,
                    "ts": 0,
                    "dur": 100,
                },
                {
                    "ph": "X",
                    "cat": "mtia_runtime",
                    "name": "runFunction - job_prep_and_submit_for_execution",
                    "pid": 9,
                    "tid": 1,
                    "ts": 5,
                    "dur": 5,
                    "args": {"correlation": 18},
                },
                {
                    "ph": "X",
                    "cat": "mtia_ccp_events",
                    "name": "pe_exe",
                    "pid": 17,
                    "tid": 408,
                    "ts": 15,
                    "dur": 60,
                    "args": {"stream": 102, "column": "0", "row": "0"},
                },
                {
                    "ph": "X",
                    "cat": "mtia_ccp_events",
                    "name": "aten::mul.out-dtype_Float",
                    "pid": 17,
                    "tid": 408,
                    "ts": 20,
                    "dur": 30,
                    "args": {"correlation": 18, "stream": 102},
                },
                {
                    "ph": "X",
                    "cat": "mtia_ccp_events",
                    "name": "dma_request",
                    "pid": 17,
                    "tid": 801,
                    "ts": 60,
                    "dur": 10,
                    "args": {"direction": "DEVICE_TO_HOST", "size": 16, "stream": 103},
                },
                {
                    "ph": "X",
                    "cat": "mtia_ccp_events",
                    "name": "event_wait",
                    "pid": 17,
                    "tid": 3774,
                    "ts": 70,
                    "dur": 5,
                    "args": {"stream": 108, "wait_on_stream": 104},
                },
            ]
        },
        name="mtia",
        extra={"distributedInfo": {"backend": "mtia:hccl,cpu:gloo", "rank": 0, "world_size": 1}},
    )
    ev = {
        r["name"][:12]: r
        for r in s.rows(
            "SELECT name, category, on_device, stream, step FROM events WHERE run_id = $run"
        )
    }
    assert ev["aten::mul.ou"]["category"] == "compute" and ev["aten::mul.ou"]["on_device"]
    assert ev["aten::mul.ou"]["stream"] == 102 and ev["aten::mul.ou"]["step"] == 0
    assert (ev["dma_request"]["category"], ev["event_wait"]["category"]) == ("memcpy", "sync")
    assert ev["pe_exe"]["category"] == "other"
    p = step_parts_us(s)[0][0]
    assert (p["compute_ns"], p["memcpy_ns"]) == (30, 10)


def test_all_gather_size_from_host_op_without_record_param_comms(tmp_path: Path) -> None:
    """A kernel all-gather without record_param_comms: the `nccl:all_gather` host op's input
    is this rank's shard (Input Dims [[1024, 256]], c10::BFloat16: 512 KiB); nccl-tests counts
    the gathered buffer, shard * n = 1 MiB on 2 ranks (busbw factor (n-1)/n)."""

    def rank(r: int) -> list[dict]:
        return [
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "nccl:all_gather",
                "pid": 1,
                "tid": 1,
                "ts": 0,
                "dur": 5,
                "args": {
                    "External id": 7,
                    "Input Dims": [[1024, 256]],
                    "Input type": ["c10::BFloat16"],
                },
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": "ncclDevKernel_AllGather_RING_LL",
                "pid": 0,
                "tid": 20,
                "ts": 10 + r,
                "dur": 20 - r,
                "args": {"External id": 7, "stream": 20},
            },
        ]

    s = ingest_ranks(tmp_path, {0: rank(0), 1: rank(1)}, name="ag", extra={"host_name": "node0"})
    rows = s.rows(
        "SELECT rank, op, bytes, group_size, transfer_ns FROM matched_collectives "
        "WHERE run_id = $run ORDER BY rank"
    )
    assert [(r["op"], r["bytes"], r["group_size"], r["transfer_ns"] / US) for r in rows] == [
        ("all_gather", 2 * 1024 * 256 * 2, 2, 19)
    ] * 2
