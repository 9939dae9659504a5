"""Issue 15 items 1, 5, 6 and 16: out-of-range, mistyped or malformed trace values are input
errors (exit 3) that name the file and the fault; the store is unchanged and still works."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tracelab.ingest import validate
from tracelab.ingest.decode import _kineto

from .hostile import cli, snapshot, still_works, store  # noqa: F401 (fixture)
from .kineto import trace

Doc = dict[str, Any]


def _event(**fields: Any) -> Callable[[Doc], None]:
    def edit(doc: Doc) -> None:
        doc["traceEvents"][1].update(fields)

    return edit


def _top(key: str, value: Any) -> Callable[[Doc], None]:
    def edit(doc: Doc) -> None:
        doc[key] = value

    return edit


def _dist(key: str, value: Any) -> Callable[[Doc], None]:
    def edit(doc: Doc) -> None:
        doc["distributedInfo"][key] = value

    return edit


def _step(name: str) -> Callable[[Doc], None]:
    def edit(doc: Doc) -> None:
        doc["traceEvents"][0]["name"] = name

    return edit


BAD_VALUES: dict[str, tuple[Callable[[Doc], None], str]] = {
    # item 1: ts + dur past int64 once the base is added
    "dur_9e15_us": (_event(dur=9e15), "beyond the"),
    "base_near_2_63": (_top("baseTimeNanoseconds", 2**63 - 10), "baseTimeNanoseconds"),
    "end_after_base": (_event(dur=4.5e15), "after the base time"),
    # item 5: times stored as 0 before
    "ts_1e30": (_event(ts=1e30), "has ts"),
    "ts_2_63": (_event(ts=2.0**63), "has ts"),
    "ts_2_64_int": (_event(ts=2**64), "has ts"),
    "ts_minus_1e30": (_event(ts=-1e30), "has ts"),
    "dur_1e30": (_event(dur=1e30), "has dur"),
    # item 6
    "step_beyond_int32": (_step("ProfilerStep#2147483648"), "ProfilerStep#2147483648"),
    "base_null_list": (_top("baseTimeNanoseconds", [1]), "baseTimeNanoseconds"),
    "base_2_64": (_top("baseTimeNanoseconds", 2**64), "baseTimeNanoseconds"),
    "base_float": (_top("baseTimeNanoseconds", 1.5), "baseTimeNanoseconds"),
    "rank_beyond_int32": (_dist("rank", 2**40), "'rank'"),
    "rank_string": (_dist("rank", "0"), "'rank' must be an integer"),
    "world_beyond_int32": (_dist("world_size", 2**31), "'world_size'"),
    "pg_config_int": (_dist("pg_config", 5), "'pg_config'"),
    "backend_list": (_dist("backend", ["nccl"]), "'backend'"),
    "dist_info_list": (_top("distributedInfo", [1]), "distributedInfo"),
    # item 15
    "world_negative": (_dist("world_size", -4), "'world_size' is -4"),
    "world_zero": (_dist("world_size", 0), "'world_size' is 0"),
    "rank_7_of_2": (_dist("rank", 7), "rank 7 is not below world_size 2"),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_bad_values_are_input_errors(case: str, store: Path, tmp_path: Path) -> None:
    edit, words = BAD_VALUES[case]
    doc = copy.deepcopy(trace(rank=0))
    edit(doc)
    path = tmp_path / f"{case}.json"
    path.write_text(json.dumps(doc))
    before = snapshot(store)
    res = cli("ingest", str(path), "--db", str(store), "--run", case)
    assert res.code == 3, res.err
    assert str(path) in res.err and words in res.err, res.err
    assert snapshot(store) == before
    still_works(store)


def _text(doc: Doc) -> str:
    return json.dumps(doc)


BAD_TEXT: dict[str, tuple[Callable[[str], str], str]] = {
    "number_1e400": (lambda t: t.replace('"dur": 20.25', '"dur": 1e400'), "64-bit float"),
    "lone_surrogate_name": (lambda t: t.replace("aten::mm", "\\ud800mm"), "lone UTF-16 surrogate"),
    "lone_low_surrogate_args": (
        lambda t: t.replace('"External id": 7}', '"External id": 7, "s": "\\udc00"}'),
        "lone UTF-16 surrogate",
    ),
    "lone_surrogate_metadata": (
        lambda t: t.replace('"schemaVersion": 1', '"schemaVersion": "x\\udbff"'),
        "lone UTF-16 surrogate",
    ),
    "nesting_5000_args": (
        lambda t: t.replace(
            '"External id": 7}', '"External id": 7, "d": ' + "[" * 5000 + "]" * 5000 + "}"
        ),
        "deeper than 512",
    ),
    "nesting_5000_top": (
        lambda t: t[:-1] + ', "d": ' + "[" * 5000 + "]" * 5000 + "}",
        "deeper than 512",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_TEXT))
def test_malformed_text_is_named(case: str, store: Path, tmp_path: Path) -> None:
    edit, words = BAD_TEXT[case]
    path = tmp_path / f"{case}.json"
    path.write_text(edit(_text(trace(rank=0))))
    before = snapshot(store)
    res = cli("ingest", str(path), "--db", str(store), "--run", case)
    assert res.code == 3 and words in res.err and str(path) in res.err, res.err
    assert "truncated" not in res.err  # item 16: a lone surrogate is not a cut-off file
    assert snapshot(store) == before
    still_works(store)


@pytest.mark.parametrize(
    "case, edit",
    [
        ("bom", lambda t: "\ufeff" + t),
        ("nesting_600_top", lambda t: t[:-1] + ', "d": ' + "[" * 600 + "]" * 600 + "}"),
        (
            "pid_int64_min",
            lambda t: t.replace(
                '"pid": 1, "tid": 1, "ts": 10.5', f'"pid": {-(2**63)}, "tid": 1, "ts": 10.5'
            ),
        ),
        (
            "tid_int64_min",
            lambda t: t.replace('"tid": 1, "ts": 10.5', f'"tid": {-(2**63)}, "ts": 10.5'),
        ),
        (
            "device_props_odd",
            lambda t: (
                t[:-1] + f', "deviceProperties": [{{"name": [1], "totalGlobalMem": {2**70}}}]}}'
            ),
        ),
        (
            "base_null",
            lambda t: t.replace(
                '"baseTimeNanoseconds": 1700000000000000000', '"baseTimeNanoseconds": null'
            ),
        ),
    ],
)
def test_odd_but_valid_traces_ingest(
    case: str, edit: Callable[[str], str], store: Path, tmp_path: Path
) -> None:
    path = tmp_path / f"{case}.json"
    path.write_text(edit(_text(trace(rank=0))), encoding="utf-8")
    res = cli("ingest", str(path), "--db", str(store), "--run", case)
    assert res.code == 0, res.err
    still_works(store)


def test_the_scanner_and_validate_share_the_nesting_limit() -> None:
    if _kineto is None:
        pytest.skip("C scanner not built")
    assert _kineto.MAX_DEPTH == validate.MAX_DEPTH


def _forge(kind: str, folder: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta = folder / "trace.json"
    if kind == "rank_string":
        info = json.loads(meta.read_text())
        info["rank"] = "0"
        meta.write_text(json.dumps(info))
    elif kind == "event_count":
        info = json.loads(meta.read_text())
        info["event_count"] += 5
        meta.write_text(json.dumps(info))
    elif kind == "old_columns":
        pq.write_table(pa.table({"ts": [1]}), folder / "events.parquet")
    elif kind == "overflowing_times":
        table = pq.read_table(folder / "events.parquet")
        dur = pa.array([2**62] * table.num_rows, pa.int64())
        pq.write_table(
            table.set_column(table.schema.get_field_index("dur_ns"), "dur_ns", dur),
            folder / "events.parquet",
        )
    elif kind == "truncated_parquet":
        data = (folder / "steps.parquet").read_bytes()
        (folder / "steps.parquet").write_bytes(data[: len(data) // 2])
    elif kind == "metadata_not_json":
        meta.write_text("{")


@pytest.mark.parametrize(
    "kind",
    [
        "rank_string",
        "event_count",
        "old_columns",
        "overflowing_times",
        "truncated_parquet",
        "metadata_not_json",
    ],
)
def test_stale_or_forged_converted_folder_is_converted_again(
    kind: str, store: Path, tmp_path: Path
) -> None:
    """Item 12: a `.tracelab` folder beside a trace is registered only when it is exactly what
    convert_trace writes; otherwise the trace itself is converted (and validated) again."""
    from tracelab.ingest.convert import convert_trace
    from tracelab.ingest.converted import converted_dir

    from .kineto import write

    path = write(tmp_path / "cap" / "window-0.pt.trace.json", trace(rank=0, world=1))
    convert_trace(path, converted_dir(path))
    _forge(kind, converted_dir(path))
    res = cli("ingest", str(path), "--db", str(store), "--run", kind)
    assert res.code == 0, res.err
    got = cli(
        "sql",
        f"SELECT count(*), max(dur_ns) FROM events JOIN runs USING (run_id) "
        f"WHERE runs.name = '{kind}'",
        "--db",
        str(store),
        "--format",
        "csv",
    ).out.split()
    assert got[1] == "4,100000", got
    still_works(store)
