"""The collectives a trace shows, read where each rank is converted
(tracelab.ingest.trace_collectives) and typed at load (tracelab.ingest.load): what the SQL over
the whole run's events, which this replaced, gave. The real traces (the bundled captures, HTA's
test traces, the 8-rank benchmark set, 2,000 ranks of the scale-out set) ingested before and
after the change gave the same rows in every table; these cases pin the rules one by one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tracelab.ingest import ingest
from tracelab.ingest.trace_collectives import _object, _text, trace_collectives
from tracelab.store import open_store
from tracelab.testing.synth import MS, US, RankTrace, write_ranks

COLUMNS = (
    "rank, op, pg_name, CAST(pg_ranks AS VARCHAR), group_size, seq, in_bytes, out_bytes, "
    "dtype, peer, enqueue_ns IS NOT NULL"
)


def _bare_kernel(t: RankTrace, start: int, end: int, *, launch_ns: int | None = None,
                 name: str = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
                 args: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """An NCCL kernel whose args name nothing of its call (older PyTorch)."""
    return t.device_event("kernel", name, start, end, stream=20, launch_ns=launch_ns, args=args)


def _rows(tmp_path: Path, traces: list[RankTrace], where: str = "TRUE") -> list[tuple[Any, ...]]:
    db = tmp_path / "s.duckdb"
    ingest(write_ranks(tmp_path / "cap", traces), db=db, run="r", workers=0, progress=False)
    with open_store(db, read_only=True) as con:
        return con.execute(
            f"SELECT {COLUMNS} FROM collectives WHERE {where} ORDER BY rank, start_ns, out_bytes"
        ).fetchall()


def test_fields_come_from_the_kernel_else_its_record_param_comms(tmp_path: Path) -> None:
    """A kernel's own args win field by field; what it lacks comes from the record_param_comms
    of its External id, one row per such record (as the join gave); numbers typed as DuckDB
    casts their JSON text (1024.0 elements, a size given as a string)."""
    t = RankTrace(0, 2)
    t.step(1, 0, 10 * MS)
    k = _bare_kernel(t, 2 * MS, 3 * MS, name="ncclKernel_AllReduce_RING_LL_Sum_float(x)",
                     args={"dtype": "Float", "In msg nelems": 1024.0, "Group size": "2"})  # fmt: skip
    ext = k["args"]["External id"]
    for nelems in (256, 512):
        t.cpu_op("record_param_comms", 1 * MS, 1 * MS + 10 * US, args={
            "External id": ext, "Collective name": "allreduce", "dtype": "BFloat16",
            "In msg nelems": 9, "Out msg nelems": nelems, "Seq": 7})  # fmt: skip
    assert _rows(tmp_path, [t]) == [
        (0, "all_reduce", None, None, 2, 7, 4096, 4 * 256, "Float", None, True),
        (0, "all_reduce", None, None, 2, 7, 4096, 4 * 512, "Float", None, True),
    ]


def test_an_unnamed_kernel_takes_the_op_of_the_annotation_around_its_launch(
    tmp_path: Path,
) -> None:
    """SendRecv kernels named by nothing but the `nccl:<op>` annotation around their launch on
    the launching thread: of the annotations holding the launch, the latest to start (an inner
    send inside an all_to_all); one on another thread does not count; a kernel with no launch
    is named by its kernel name."""
    t = RankTrace(0, 2)
    t.step(1, 0, 20 * MS)
    t.cpu_op("nccl:all_to_all", 1 * MS, 9 * MS)
    t.cpu_op("nccl:send", 2 * MS, 3 * MS)
    t.cpu_op("nccl:recv", 4 * MS, 6 * MS, tid=t.comm_tid)
    _bare_kernel(t, 10 * MS, 11 * MS, launch_ns=2 * MS + 500 * US)  # inside the send
    _bare_kernel(t, 12 * MS, 13 * MS, launch_ns=5 * MS)  # the send is over; recv elsewhere
    k = _bare_kernel(t, 14 * MS, 15 * MS, name="ncclDevKernel_AllGather_RING_LL(x)")
    k["args"]["correlation"] = 10**6  # no launch
    assert [(op, has_launch) for _, op, *_, has_launch in _rows(tmp_path, [t])] == [
        ("send", True),
        ("all_to_all", True),
        ("all_gather", False),
    ]


def test_a_named_group_keeps_its_ranks_on_its_first_call_of_the_run(tmp_path: Path) -> None:
    """Each rank's file keeps a named group's list on that rank's first call; the load keeps
    it on the lowest rank's first call only. A call naming no group keeps its own list."""
    traces = [RankTrace(rank=r, world_size=2) for r in range(2)]
    for t in traces:
        t.step(1, 0, 30 * MS)
        for i in range(3):
            t.nccl("all_reduce", (10 - 3 * i) * MS, (11 - 3 * i) * MS, nbytes=1 << 10,
                   pg_name="tp", seq=i + 1)  # fmt: skip
        for i in range(2):
            ev = t.nccl("broadcast", (20 + 2 * i) * MS, (21 + 2 * i) * MS, nbytes=1 << 10)
            del ev["args"]["Process Group Name"]
    got = [(r, op, pg, members, seq) for r, op, pg, members, _, seq, *_ in _rows(tmp_path, traces)]
    assert got == [
        (0, "all_reduce", "tp", "[0, 1]", 3),  # rank 0's earliest call of 'tp'
        (0, "all_reduce", "tp", None, 2),
        (0, "all_reduce", "tp", None, 1),
        (0, "broadcast", None, "[0, 1]", None),
        (0, "broadcast", None, "[0, 1]", None),
        (1, "all_reduce", "tp", None, 3),
        (1, "all_reduce", "tp", None, 2),
        (1, "all_reduce", "tp", None, 1),
        (1, "broadcast", None, "[0, 1]", None),
        (1, "broadcast", None, "[0, 1]", None),
    ]


def test_gloo_annotations_are_host_collectives(tmp_path: Path) -> None:
    t = RankTrace(0, 2, backend="gloo")
    t.step(1, 0, 10 * MS)
    t.gloo("all_reduce", 1 * MS, 2 * MS)
    t.gloo("broadcast", 3 * MS, 4 * MS)
    assert _rows(tmp_path, [t], "source = 'host'") == [
        (0, "all_reduce", None, None, None, None, None, None, None, None, False),
        (0, "broadcast", None, None, None, None, None, None, None, None, False),
    ]


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        ('{"Seq": 7, "dtype": "Float"}', {"Seq": "7", "dtype": "Float"}),
        ('{"Seq": 1e3, "Group size": true}', {"Seq": "1000.0", "Group size": "true"}),
        ('{"Seq": null, "dtype": [1, 2]}', {"Seq": None, "dtype": "[1,2]"}),
        ('{"Seq": 123456789012345678901234567890}', {"Seq": "123456789012345678901234567890"}),
        ("[1, 2]", {}),
        ("{not json", {}),
    ],
)
def test_args_read_as_json_extract_string_reads_them(text: str, fields: dict[str, Any]) -> None:
    """The text of each field is what DuckDB's json_extract_string gave (the store's columns
    are typed from it with DuckDB's casts, at load): strings as they are, JSON null as NULL,
    other values as their JSON text; args that are not an object give nothing."""
    got = {key: _text(value) for key, value in _object(text).items()}
    assert got == fields


def test_a_trace_without_collectives_gives_an_empty_table() -> None:
    from tracelab.ingest.converted import EVENTS_SCHEMA

    table = trace_collectives(EVENTS_SCHEMA.empty_table())
    assert table.num_rows == 0
    assert isinstance(table, pa.Table)


def test_the_list_form_of_gloo_all_to_all_counts_every_input_tensor(tmp_path: Path) -> None:
    """dist.all_to_all (a list of tensors, one per peer): the gloo annotation lists all four
    64 x 64 float inputs; only the first was read, 16 KiB sent instead of 64 (the bus bandwidth
    understated 4x). all_to_all_single's one tensor reads as before."""
    traces = []
    for rank in range(2):
        t = RankTrace(rank, 2, backend="gloo")
        t.step(1, 0, 10 * MS)
        for start, dims in ((1 * MS, [[64, 64]] * 4), (3 * MS, [[256, 64]])):
            ev = t.annotation("gloo:all_to_all", start, start + MS, tid=t.comm_tid)
            ev["args"] = {**ev.get("args", {}), "Input Dims": dims, "Input type": ["float"] * 4}
        traces.append(t)
    db = tmp_path / "s.duckdb"
    ingest(write_ranks(tmp_path / "cap", traces), db=db, run="r", workers=0, progress=False)
    with open_store(db, read_only=True) as con:
        got = con.execute(
            "SELECT rank, in_bytes FROM collectives WHERE op = 'all_to_all' ORDER BY rank, start_ns"
        ).fetchall()
        sent = con.execute(
            "SELECT rank, sent_bytes FROM all_to_all_ranks ORDER BY rank, start_ns"
        ).fetchall()
    assert got == [(0, 65536), (0, 65536), (1, 65536), (1, 65536)]
    assert sent == got
