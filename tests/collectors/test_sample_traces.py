"""The committed sample captures (sample_traces/) say what their README says they show.

Cheap: reads the files only. Regenerate them with sample_traces/regenerate.sh; these checks
hold for any regeneration, since they test structure rather than timings.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
NAMES = [
    "ddp",
    "ddp_slow_rank",
    "pipeline_1f1b",
    "pipeline_interleaved_1f1b",
    "pipeline_zero_bubble",
    "pipeline_unbalanced",
    "fsdp2",
    "tensor_parallel",
]


def load(name: str) -> tuple[dict[str, Any], dict[int, list[dict[str, Any]]]]:
    root = SAMPLES / name
    manifest = json.loads((root / "manifest.json").read_text())
    records = {
        r["rank"]: [json.loads(x) for x in (root / r["collectives"]).read_text().splitlines()]
        for r in manifest["ranks"]
    }
    return manifest, records


@pytest.mark.parametrize("name", NAMES)
def test_sample_is_a_complete_capture(name: str) -> None:
    manifest, records = load(name)
    assert manifest["format"] == "tracelab.capture" and manifest["format_version"] == 1
    assert manifest["world_size"] == 4 and [r["rank"] for r in manifest["ranks"]] == [0, 1, 2, 3]
    for rank in manifest["ranks"]:
        assert rank["collector_error"] is None and rank["memory"]
        assert abs(rank["clock"]["offset_ns"]) <= rank["clock"]["uncertainty_ns"] + 1
        with gzip.open(SAMPLES / name / rank["traces"][0], "rt") as fh:
            trace = json.load(fh)
        assert trace["distributedInfo"]["rank"] == rank["rank"]
        assert records[rank["rank"]], "every rank has collective records"
    total = sum(p.stat().st_size for p in SAMPLES.rglob("*") if p.is_file())
    assert total < 12_000_000  # 10 recorded steps in each of 8 captures: 11 MB


@pytest.mark.parametrize("name", ["ddp", "ddp_slow_rank", "fsdp2", "tensor_parallel"])
def test_collectives_match_across_ranks(name: str) -> None:
    _, records = load(name)
    keyed = {
        r: {(x["pg_name"], x["seq"]): (x["op"], x["in_bytes"]) for x in recs}
        for r, recs in records.items()
    }
    assert all(keyed[r] == keyed[0] for r in keyed)
    assert all(x["start_ns"] and x["end_ns"] for recs in records.values() for x in recs)


def test_slow_rank_is_last_at_every_gradient_all_reduce() -> None:
    _, records = load("ddp_slow_rank")
    fr_rows = {
        r: {(x["pg_name"], x["seq"]): x for x in recs if x["source"] == "flight_recorder"}
        for r, recs in records.items()
    }
    assert len(fr_rows[0]) == 20  # 2 buckets x 10 steps
    for key in fr_rows[0]:
        arrival = {r: fr_rows[r][key]["enqueue_ns"] for r in fr_rows}
        assert max(arrival, key=lambda r: arrival[r]) == 2


@pytest.mark.parametrize(
    ("name", "schedule", "stages", "rank_stages"),
    [
        ("pipeline_1f1b", "Schedule1F1B", 4, [[0], [1], [2], [3]]),
        (
            "pipeline_interleaved_1f1b",
            "ScheduleInterleaved1F1B",
            8,
            [[0, 4], [1, 5], [2, 6], [3, 7]],
        ),
        (
            "pipeline_zero_bubble",
            "ScheduleInterleavedZeroBubble",
            8,
            [[0, 4], [1, 5], [2, 6], [3, 7]],
        ),
        ("pipeline_unbalanced", "Schedule1F1B", 4, [[0], [1], [2], [3]]),
    ],
)
def test_pipeline_samples(
    name: str, schedule: str, stages: int, rank_stages: list[list[int]]
) -> None:
    manifest, records = load(name)
    assert manifest["pipeline"] == {"schedule": schedule, "stages": stages, "microbatches": 8}
    assert [r["pp_stages"] for r in manifest["ranks"]] == rank_stages
    assert [r["pp_stage"] for r in manifest["ranks"]] == [0, 1, 2, 3]
    sends = Counter(
        (r, x["peer"], x["seq"], x["in_bytes"])
        for r, recs in records.items()
        for x in recs
        if x["op"] == "send"
    )
    recvs = Counter(
        (x["peer"], r, x["seq"], x["out_bytes"])
        for r, recs in records.items()
        for x in recs
        if x["op"] == "recv"
    )
    assert sends == recvs and sends


def test_unbalanced_stage_holds_the_most_memory() -> None:
    manifest, _ = load("pipeline_unbalanced")
    peak = {r["rank"]: max(p["rss_bytes"] for p in r["memory"]) for r in manifest["ranks"]}
    assert peak[0] > 1.3 * max(peak[r] for r in (1, 2, 3))
