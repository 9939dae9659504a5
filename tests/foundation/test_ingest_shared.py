"""Every real trace in ../shared/traces/hta lands in the store with exact event counts."""

from __future__ import annotations

import collections
import gzip
import json
from decimal import Decimal
from pathlib import Path

import pytest

from tracelab.ingest import ingest
from tracelab.ingest.classify import classify
from tracelab.store import open_store

TRACES = [
    "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    "critical_path/cuda_event_sync/event_sync_trace.json.gz",
    "critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz",
    "critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz",
    "df_index_resolver/df_index_resolver.json.gz",
    "nccl_parser_config/nccl_data.json.gz",
    "negative_queue_length_values_check/rank0.json.gz",
    "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "trace_diff/control/control.json.gz",
    "trace_diff/test/test.json.gz",
    "trace_filter/sampled_rank-0.json.gz",
    "trace_filter/sampled_rank-1.json.gz",
    "triton_example/triton_example.json.gz",
]


def _load(path: Path) -> dict:
    with gzip.open(path, "rb") as fh:
        return json.load(fh)


@pytest.mark.parametrize("rel", TRACES)
def test_counts_ranks_and_groups_match_the_json(rel: str, hta_traces: Path, tmp_path: Path) -> None:
    path = hta_traces / rel
    doc = _load(path)
    dist = doc.get("distributedInfo") or {}
    has_rank = isinstance(dist.get("rank"), int)
    ranks = {} if has_rank else {path.name: 5}
    report = ingest([path], db=tmp_path / "s.duckdb", run="r", ranks=ranks, progress=False)
    expected_rank = dist["rank"] if has_rank else 5
    assert report.ranks == [expected_rank]

    direct = collections.Counter(
        classify(e.get("cat"), e.get("name", "")).value
        for e in doc["traceEvents"]
        if e.get("ph") == "X"
    )
    with open_store(tmp_path / "s.duckdb") as con:
        stored = dict(con.execute("SELECT category, count(*) FROM events GROUP BY 1").fetchall())
        rank_row = con.execute(
            "SELECT r.rank, r.world_size, c.process_groups FROM ranks r "
            "JOIN process_group_configs c ON c.run_id = r.run_id "
            "AND c.config = r.process_groups_config"
        ).fetchone()
        mem = con.execute("SELECT count(*) FROM memory").fetchone()[0]
        negative = con.execute("SELECT count(*) FROM events WHERE dur_ns < 0").fetchone()[0]
    assert stored == dict(direct)
    assert rank_row[0] == expected_rank
    assert rank_row[1] == dist.get("world_size")
    assert json.loads(rank_row[2]) == (dist.get("pg_config") or [])
    assert mem == sum(
        1 for e in doc["traceEvents"] if e.get("ph") in ("i", "I") and e.get("name") == "[memory]"
    )
    assert negative == 0


def test_nccl_kernels_become_collectives_with_metadata(hta_traces: Path, tmp_path: Path) -> None:
    path = hta_traces / "nccl_parser_config/nccl_data.json.gz"
    ingest([path], db=tmp_path / "s.duckdb", run="r", progress=False)
    doc = _load(path)
    kernels = [
        e for e in doc["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e["name"].lower()
    ]
    with open_store(tmp_path / "s.duckdb") as con:
        rows = con.execute(
            "SELECT op, pg_name, group_size, in_bytes, dtype, start_ns, end_ns FROM collectives "
            "WHERE source = 'kernel' ORDER BY start_ns"
        ).fetchall()
    assert len(rows) == len(kernels)
    first = min(kernels, key=lambda e: e["ts"])
    op, pg, size, in_bytes, dtype, start, end = rows[0]
    assert (
        op
        == {"allreduce": "all_reduce", "broadcast": "broadcast"}[first["args"]["Collective name"]]
    )
    assert (pg, size, dtype) == ("0", 2, first["args"]["dtype"])
    elem = {"Float": 4, "Long": 8}[first["args"]["dtype"]]
    assert in_bytes == first["args"]["In msg nelems"] * elem
    base = doc["baseTimeNanoseconds"]
    assert start == base + round(Decimal(str(first["ts"])) * 1000)


def test_ns_resolution_timestamps_are_exact(hta_traces: Path, tmp_path: Path) -> None:
    """Absolute µs with fractional digits (no baseTimeNanoseconds) keep every nanosecond."""
    path = hta_traces / "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
    raw = gzip.decompress(path.read_bytes())
    doc = json.loads(raw, parse_float=Decimal)
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    ingest([path], db=tmp_path / "s.duckdb", run="r", progress=False)
    with open_store(tmp_path / "s.duckdb") as con:
        got = dict(con.execute("SELECT idx, ts_ns FROM events").fetchall())
        durs = dict(con.execute("SELECT idx, dur_ns FROM events").fetchall())
    fractional = [i for i, e in enumerate(xs) if Decimal(e["ts"]) % 1 != 0]
    assert fractional, "the trace should hold fractional-µs timestamps"
    for i, e in enumerate(xs):
        assert got[i] == int(Decimal(e["ts"]) * 1000), e
        assert durs[i] == int((Decimal(e.get("dur", 0)) * 1000).to_integral_value())


def test_device_events_get_their_launch_step(hta_traces: Path, tmp_path: Path) -> None:
    ingest(
        [hta_traces / "nccl_parser_config/nccl_data.json.gz"],
        db=tmp_path / "s.duckdb",
        run="r",
        progress=False,
    )
    with open_store(tmp_path / "s.duckdb") as con:
        mismatched = con.execute(
            """SELECT count(*) FROM events k JOIN events l
               ON l.run_id = k.run_id AND l.rank = k.rank AND l.correlation = k.correlation
               AND l.category = 'runtime'
               WHERE k.on_device AND k.step IS DISTINCT FROM l.step AND l.step IS NOT NULL"""
        ).fetchone()[0]
        steps = con.execute("SELECT step FROM steps ORDER BY step").fetchall()
    assert mismatched == 0
    assert [s[0] for s in steps] == [4, 5, 6]
