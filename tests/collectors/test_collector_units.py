"""The collector's pure pieces with known answers: pairing hooked records with Flight Recorder
entries, borrowing gloo times from trace events, sizes, topology and record lines."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tracelab.collectors import flight_recorder as fr
from tracelab.collectors import manifest as mf
from tracelab.collectors.records import CollectiveRecord, op_from_profiling_name

MS = 1_000_000


def entry(
    seq: int,
    created_ms: float,
    name: str = "gloo:all_reduce",
    pg: str = "0",
    sizes: Any = ((1024,),),
    p2p: bool = False,
) -> dict[str, Any]:
    return {
        "collective_seq_id": seq,
        "time_created_ns": int(created_ms * MS),
        "profiling_name": name,
        "process_group": [pg, "default_pg"],
        "input_sizes": [list(s) for s in sizes],
        "input_dtypes": ["Float"] * len(sizes),
        "output_sizes": [list(s) for s in sizes],
        "output_dtypes": ["Float"] * len(sizes),
        "is_p2p": p2p,
    }


def hooked(
    enqueue_ms: float, issued_ms: float, op: str = "all_reduce", pg: str = "0", seq: int = 0
) -> CollectiveRecord:
    return CollectiveRecord(
        op=op, pg_name=pg, enqueue_ns=int(enqueue_ms * MS), issued_ns=int(issued_ms * MS), seq=seq
    )


def test_profiling_names() -> None:
    assert op_from_profiling_name("gloo:all_reduce") == "all_reduce"
    assert op_from_profiling_name("nccl:_allgather_base") == "all_gather"
    assert op_from_profiling_name("nccl:reduce_scatter_tensor_coalesced") == "reduce_scatter"
    assert op_from_profiling_name("gloo:all_to_all") == "all_to_all"
    assert op_from_profiling_name("nccl:something_new") == "unknown"


def test_window_entries_keeps_the_window_and_drops_p2p_and_our_group() -> None:
    data = {
        "entries": [
            entry(1, 5),
            entry(2, 10),
            entry(3, 11, name="nccl:send", p2p=True),
            entry(1, 12, pg="7"),
            entry(4, 20),
            entry(5, 31),
        ]
    }
    got = fr.window_entries(data, 10 * MS, 30 * MS, exclude_pgs=["7"])
    assert [e["collective_seq_id"] for e in got] == [2, 4]


def test_reconcile_gives_hooked_records_the_recorders_numbers() -> None:
    # the reducer's bucket all-reduces (seq 7, 8) interleave with two hooked calls (6, 9)
    entries = [entry(6, 1.5), entry(7, 3.0), entry(8, 4.0), entry(9, 6.2)]
    records = [hooked(1.0, 2.0, seq=1), hooked(6.0, 6.5, seq=2)]
    leftover, failed = fr.reconcile(records, entries)
    assert failed == []
    assert [r.seq for r in records] == [6, 9]
    assert [e["collective_seq_id"] for e in leftover] == [7, 8]


def test_reconcile_failure_clears_seq_instead_of_mixing_numberings() -> None:
    entries = [entry(3, 10.0)]
    records = [hooked(1.0, 2.0, seq=1)]  # no entry was created during this call
    leftover, failed = fr.reconcile(records, entries)
    assert failed == ["0"] and records[0].seq is None
    assert [e["collective_seq_id"] for e in leftover] == [3]


def test_entry_record_sizes_and_step() -> None:
    e = entry(12, 7.0, sizes=((4, 256), (10,)))
    e["input_dtypes"] = ["BFloat16", "Float"]
    rec = fr.entry_record(
        e, groups={"0": [0, 1, 2, 3]}, step_of=lambda t: 5 if t >= 6 * MS else 4, window=0
    )
    assert (rec.op, rec.source, rec.seq, rec.group_size) == ("all_reduce", "flight_recorder", 12, 4)
    assert rec.in_bytes == 4 * 256 * 2 + 10 * 4 and rec.dtype == "bfloat16"
    assert rec.out_bytes == (4 * 256 + 10) * 4
    assert rec.enqueue_ns == 7 * MS and rec.step == 5
    assert rec.start_ns is None and rec.end_ns is None


def _pairs(entries: list[dict[str, Any]]) -> list[tuple[CollectiveRecord, dict[str, Any]]]:
    return [(fr.entry_record(e, groups={}, step_of=lambda t: None, window=0), e) for e in entries]


def test_fill_gloo_times_in_fifo_order() -> None:
    entries = [entry(1, 1.0), entry(2, 1.2), entry(3, 5.0)]
    events = [
        ("gloo:all_reduce", int(1.3 * MS), 2 * MS),
        ("gloo:all_reduce", int(1.1 * MS), MS),
        ("gloo:all_reduce", int(5.5 * MS), MS),
        ("gloo:broadcast", 2 * MS, MS),
    ]
    pairs = _pairs(entries)
    assert fr.fill_gloo_times(pairs, entries, events) == 3
    assert [(r.start_ns, r.end_ns) for r, _ in pairs] == [
        (int(1.1 * MS), int(2.1 * MS)),
        (int(1.3 * MS), int(3.3 * MS)),
        (int(5.5 * MS), int(6.5 * MS)),
    ]


@pytest.mark.parametrize(
    "events",
    [
        # two events starting 10 us apart: two worker threads may have swapped them
        [("gloo:all_reduce", int(1.30 * MS), MS), ("gloo:all_reduce", int(1.31 * MS), MS)],
        # one event missing from the trace
        [("gloo:all_reduce", int(1.3 * MS), MS)],
        # an event that starts before its entry was created
        [("gloo:all_reduce", int(0.5 * MS), MS), ("gloo:all_reduce", int(1.6 * MS), MS)],
    ],
)
def test_fill_gloo_times_leaves_doubtful_pairs_null(events: list[tuple[str, int, int]]) -> None:
    entries = [entry(1, 1.0), entry(2, 1.2)]
    pairs = _pairs(entries)
    assert fr.fill_gloo_times(pairs, entries, events) == 0
    assert all(r.start_ns is None and r.end_ns is None for r, _ in pairs)


def test_fill_gloo_times_needs_a_single_group() -> None:
    entries = [entry(1, 1.0), entry(1, 1.2, pg="1")]
    events = [("gloo:all_reduce", int(1.3 * MS), MS), ("gloo:all_reduce", int(2.0 * MS), MS)]
    assert fr.fill_gloo_times(_pairs(entries), entries, events) == 0


def test_parallelism_from_user() -> None:
    par, coords = mf.parallelism_from_user({"dp": 2, "pp": 4}, None, pp_stage=3)
    assert par == {"dims": {"dp": 2, "tp": 1, "pp": 4, "cp": 1, "ep": 1}, "source": "user"}
    assert coords == {"dp": None, "tp": 0, "pp": 3, "cp": 0, "ep": 0}  # never guessed
    par, coords = mf.parallelism_from_user(None, None, None)
    assert par == {"dims": None, "source": "unknown"} and set(coords.values()) == {None}


def test_pipeline_info_from_a_dict() -> None:
    info, stages = mf.pipeline_info(
        {"schedule": "Schedule1F1B", "stages": 4, "microbatches": 8, "rank_stages": [2]}
    )
    assert info == {"schedule": "Schedule1F1B", "stages": 4, "microbatches": 8}
    assert stages == [2]
    assert mf.pipeline_info(None) == (None, None)


def test_record_line_has_exactly_the_documented_fields() -> None:
    rec = hooked(1.0, 2.0)
    rec.cuda_events = [object(), None]
    data = json.loads(rec.to_json())
    assert set(data) == {
        "op",
        "source",
        "pg_name",
        "pg_desc",
        "pg_ranks",
        "group_size",
        "seq",
        "in_bytes",
        "out_bytes",
        "in_split_bytes",
        "out_split_bytes",
        "dtype",
        "peer",
        "enqueue_ns",
        "start_ns",
        "end_ns",
        "step",
        "window",
    }


def test_store_gather_returns_every_rank_in_order_and_cleans_up() -> None:
    import torch.distributed as dist

    from tracelab.collectors import store_gather

    store = dist.HashStore()
    key = store_gather.next_key()
    assert store_gather.next_key() != key  # a second profile in the process gets its own keys
    for rank in (2, 1):  # the other ranks, in any order, before rank 0 collects
        assert (
            store_gather.gather_json(
                store, key, {"rank": rank, "x": [rank] * 3}, rank=rank, world_size=3, timeout_s=5
            )
            is None
        )
    got = store_gather.gather_json(
        store, key, {"rank": 0, "x": []}, rank=0, world_size=3, timeout_s=5
    )
    assert got == [{"rank": 0, "x": []}, {"rank": 1, "x": [1, 1, 1]}, {"rank": 2, "x": [2, 2, 2]}]
    assert store.num_keys() == 0


def test_store_gather_times_out_on_a_missing_rank() -> None:
    import torch.distributed as dist

    from tracelab.collectors import store_gather

    store = dist.HashStore()
    key = store_gather.next_key()
    store_gather.gather_json(store, key, {"rank": 1}, rank=1, world_size=3, timeout_s=5)
    with pytest.raises(Exception, match="(?i)timeout|wait"):
        store_gather.gather_json(store, key, {"rank": 0}, rank=0, world_size=3, timeout_s=0.2)
