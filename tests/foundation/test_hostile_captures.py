"""Issue 15 items 6, 12, 15 and 16 for captures: manifest, rank.json and collectives.jsonl
values of the wrong type or range, paths leaving the capture, one file for two ranks, and
inconsistent ranks are input errors naming the file; the store is unchanged and still works."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .hostile import cli, snapshot, still_works, store  # noqa: F401 (fixture)
from .kineto import trace, write

Doc = dict[str, Any]


def capture(root: Path, ranks: int = 2) -> Path:
    entries = []
    for r in range(ranks):
        rel = f"rank-{r}/window-0.pt.trace.json"
        write(root / rel, trace(rank=r, world=ranks))
        (root / f"rank-{r}" / "collectives.jsonl").write_text(
            json.dumps(
                {
                    "op": "all_reduce",
                    "pg_name": "0",
                    "seq": 0,
                    "in_bytes": 4,
                    "out_bytes": 4,
                    "start_ns": 1_700_000_000_000_010_000,
                    "end_ns": 1_700_000_000_000_020_000,
                    "step": 1,
                }
            )
            + "\n"
        )
        entries.append(
            {
                "rank": r,
                "host": "h",
                "traces": [rel],
                "collectives": f"rank-{r}/collectives.jsonl",
                "memory": [{"step": 1, "ts_ns": 1_700_000_000_000_000_000, "rss_bytes": 10}],
                "clock": {"offset_ns": 0, "uncertainty_ns": 0},
            }
        )
    write(
        root / "manifest.json",
        {
            "format": "tracelab.capture",
            "format_version": 1,
            "run_name": root.name,
            "world_size": ranks,
            "ranks": entries,
        },
    )
    return root


def _manifest(edit: Callable[[Doc], None]) -> Callable[[Path], Path]:
    def apply(root: Path) -> Path:
        doc = json.loads((root / "manifest.json").read_text())
        edit(doc)
        (root / "manifest.json").write_text(json.dumps(doc))
        return root / "manifest.json"

    return apply


def _entry(**fields: Any) -> Callable[[Doc], None]:
    def edit(doc: Doc) -> None:
        doc["ranks"][1].update(fields)

    return edit


def _set(key: str, value: Any) -> Callable[[Doc], None]:
    def edit(doc: Doc) -> None:
        doc[key] = value

    return edit


def _raw_manifest(text: Callable[[str], str] | bytes) -> Callable[[Path], Path]:
    def apply(root: Path) -> Path:
        path = root / "manifest.json"
        path.write_bytes(text if isinstance(text, bytes) else text(path.read_text()).encode())
        return path

    return apply


def _records(line: str) -> Callable[[Path], Path]:
    def apply(root: Path) -> Path:
        path = root / "rank-1" / "collectives.jsonl"
        path.write_text(line + "\n" + json.dumps({"op": "barrier"}) + "\n")
        return path

    return apply


def _symlink_escape(root: Path) -> Path:
    outside = root.parent / "outside.json"
    write(outside, trace(rank=1))
    link = root / "rank-1" / "link.json"
    link.symlink_to(outside)
    _manifest(_entry(traces=["rank-1/link.json"]))(root)
    return root / "manifest.json"


BAD: dict[str, tuple[Callable[[Path], Path], str]] = {
    "version_string": (_manifest(_set("format_version", "1")), "version the str '1'"),
    "world_zero": (_manifest(_set("world_size", 0)), "'world_size' is 0"),
    "world_2_of_4": (_manifest(_set("world_size", 1)), "rank 1 is not below world_size 1"),
    "world_string": (_manifest(_set("world_size", "2")), "'world_size' must be an integer"),
    "world_beyond_int32": (_manifest(_set("world_size", 2**40)), "'world_size'"),
    "pipeline_string": (_manifest(_set("pipeline", "1f1b")), "'pipeline' must be an object"),
    "pipeline_zero_mb": (_manifest(_set("pipeline", {"microbatches": 0})), "'microbatches'"),
    "ranks_object": (_manifest(_set("ranks", {"0": {}})), "'ranks' must be an array"),
    "run_name_list": (_manifest(_set("run_name", ["x"])), "'run_name' must be a string"),
    "run_name_escape": (_manifest(_set("run_name", "x\x1b]0;owned\x07")), "control characters"),
    "rank_beyond_int32": (_manifest(_entry(rank=2**31)), "'rank'"),
    "host_list": (_manifest(_entry(host=["h"])), "'host' must be a string"),
    "memory_bytes_negative": (_manifest(_entry(device_memory_bytes=-1)), "device_memory_bytes"),
    "memory_ts_string": (_manifest(_entry(memory=[{"ts_ns": "0"}])), "'ts_ns' must be an int"),
    "memory_step_beyond_int32": (_manifest(_entry(memory=[{"step": 2**31}])), "'step'"),
    "clock_beyond_int64": (_manifest(_entry(clock={"offset_ns": 2**70})), "'offset_ns'"),
    "coords_string": (_manifest(_entry(coords={"dp": "0"})), "coords 'dp'"),
    "traces_string": (_manifest(_entry(traces="rank-1/window-0.pt.trace.json")), "'traces'"),
    "pp_stage_negative": (_manifest(_entry(pp_stage=-1)), "'pp_stage'"),
    "one_file_two_ranks": (
        _manifest(_entry(traces=["rank-0/window-0.pt.trace.json"])),
        "of rank 0 and of rank 1",
    ),
    "dotdot_path": (
        _manifest(_entry(traces=["../elsewhere/rank-1.json"])),
        "leaves the capture folder",
    ),
    "absolute_path": (_manifest(_entry(traces=["/etc/passwd.json"])), "leaves the capture"),
    "symlink_escape": (_symlink_escape, "outside the capture folder"),
    "collectives_dotdot": (_manifest(_entry(collectives="../x.jsonl")), "leaves the capture"),
    "manifest_deep": (
        _raw_manifest(lambda t: t[:-1] + ', "d": ' + "[" * 5000 + "]" * 5000 + "}"),
        "deeper than 512",
    ),
    "manifest_surrogate": (
        _raw_manifest(lambda t: t.replace('"h"', '"\\ud800"', 1)),
        "lone UTF-16 surrogate",
    ),
    "manifest_latin1": (_raw_manifest(b'{"format": "tracelab.capture", "x": "\xe9"}'), "UTF-8"),
    "manifest_list": (_raw_manifest(b"[1]"), "not a tracelab capture manifest"),
    "records_seq_string": (_records('{"op": "all_reduce", "seq": "x"}'), "'seq' must be an int"),
    "records_bytes_negative": (_records('{"op": "send", "in_bytes": -1}'), "'in_bytes'"),
    "records_end_beyond_int64": (_records('{"op": "send", "end_ns": %d}' % 2**70), "'end_ns'"),
    "records_step_float": (_records('{"op": "send", "step": 1.5}'), "'step' must be an int"),
    "records_deep": (
        _records('{"op": "x", "d": ' + "[" * 5000 + "]" * 5000 + "}"),
        "deeper than 512",
    ),
    "records_surrogate": (_records('{"op": "\\udc00"}'), "lone UTF-16 surrogate"),
    "records_ranks_strings": (_records('{"op": "x", "pg_ranks": ["0"]}'), "'pg_ranks' item"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_capture_is_an_input_error(case: str, store: Path, tmp_path: Path) -> None:
    root = capture(tmp_path / case)
    edit, words = BAD[case]
    named = edit(root)
    before = snapshot(store)
    res = cli("ingest", str(root), "--db", str(store))
    assert res.code == 3, res.err
    assert words in res.err and str(named) in res.err, res.err
    assert "Traceback" not in res.err
    assert snapshot(store) == before
    still_works(store)


def test_bad_collectives_file_is_skipped_with_skip_bad(store: Path, tmp_path: Path) -> None:
    root = capture(tmp_path / "cap")
    bad = _records('{"op": "all_reduce", "seq": "x"}')(root)
    res = cli("ingest", str(root), "--db", str(store), "--skip-bad")
    assert res.code == 0, res.err
    assert f"skipped {bad}" in res.out
    rows = cli(
        "sql",
        "SELECT DISTINCT rank FROM collectives JOIN runs USING (run_id) "
        "WHERE name = 'cap' AND collectives.source = 'collector'",
        "--db",
        str(store),
        "--format",
        "csv",
    )
    assert rows.out.split() == ["rank", "0"]
    assert "2/2" in cli("runs", "--db", str(store)).out


def test_bom_and_rank_parts_are_read(store: Path, tmp_path: Path) -> None:
    root = capture(tmp_path / "bom")
    path = root / "manifest.json"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert cli("ingest", str(root), "--db", str(store)).code == 0
    parts = capture(tmp_path / "parts")
    doc = json.loads((parts / "manifest.json").read_text())
    for entry in doc["ranks"]:
        write(parts / f"rank-{entry['rank']}" / "rank.json", entry)
    (parts / "manifest.json").unlink()
    assert cli("ingest", str(parts), "--db", str(store)).code == 0
    (parts / "rank-1" / "rank.json").write_text(json.dumps({"rank": 1, "host": 7}))
    res = cli("ingest", str(parts), "--db", str(store), "--run", "parts2")
    assert res.code == 3 and "rank.json" in res.err and "'host'" in res.err


def test_symlinks_inside_the_capture_are_followed(store: Path, tmp_path: Path) -> None:
    root = capture(tmp_path / "inside")
    os.rename(root / "rank-1" / "window-0.pt.trace.json", root / "rank-1" / "real.json")
    (root / "rank-1" / "window-0.pt.trace.json").symlink_to("real.json")
    assert cli("ingest", str(root), "--db", str(store)).code == 0
