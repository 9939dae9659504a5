"""The report on real GPU traces (HTA's test data in ../shared, read in place, never copied)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracelab.cli import main


def _report(tmp_path: Path, *args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    out = tmp_path / "r.json"
    rc = main(["report", *args, "--format", "json", "--out", str(out)])
    return rc, json.loads(out.read_text())


def test_two_gpu_traces_of_different_jobs(hta_traces: Path, tmp_path: Path) -> None:
    """trace_diff: one rank of an 8-rank job against one rank of a 2-rank job, 6 steps each."""
    rc, data = _report(
        tmp_path,
        "--baseline",
        str(hta_traces / "trace_diff" / "control"),
        "--candidate",
        str(hta_traces / "trace_diff" / "test"),
    )
    assert rc == 0  # 5 steps a side after warm-up: shown, not judged
    assert data["verdict"] == "warn"
    assert data["warnings"][0].startswith("the runs differ in shape: baseline 1 rank(s) of 8")
    step = next(m for m in data["metrics"] if m["key"] == "step_time")
    assert (step["n_baseline"], step["n_candidate"]) == (5, 5)
    # The 2-rank job's steps take about 1.5x the 8-rank job's (tiled steps, which never count
    # device work twice when it runs past the next step's start).
    assert step["verdict"] == "warn" and step["delta"] > 0.4
    assert step["ci_low"] is not None  # computed and shown even when not judged
    ops = [m for m in data["metrics"] if m["metric"] == "op_time"]
    assert len(ops) == 10 and all(m["label"].startswith("kernel ") for m in ops)
    assert any("ncclKernel_AllReduce" in m["key"] for m in ops)


def test_same_gpu_trace_twice_passes(hta_traces: Path, tmp_path: Path) -> None:
    trace = str(hta_traces / "trace_diff" / "control")
    rc, data = _report(tmp_path, "--baseline", trace, "--candidate", trace, "--min-steps", "5")
    assert rc == 0 and data["verdict"] == "pass"
    for m in data["metrics"]:
        assert m["delta"] == pytest.approx(0.0, abs=1e-12), m
        assert m["verdict"] in ("pass", "info"), m


def test_peaks_measured_from_different_sources_are_never_gated(tmp_path: Path) -> None:
    # The same capture with and without the trace's [memory] events: the peaks come from
    # those events in one run and from process RSS in the other (5 MB against 355 MB), which
    # failed the gate on peak memory though nothing changed.
    import gzip
    import shutil

    base = Path(__file__).resolve().parents[2] / "sample_traces" / "pipeline_unbalanced"
    stripped = shutil.copytree(base, tmp_path / "stripped")
    for path in stripped.glob("rank-*/window-*.pt.trace.json.gz"):
        doc = json.loads(gzip.decompress(path.read_bytes()))
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "[memory]"]
        path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    rc, data = _report(tmp_path, "--baseline", str(base), "--candidate", str(stripped))
    memory = [m for m in data["metrics"] if m["key"].startswith(("peak_memory", "memory_imb"))]
    assert memory and all(m["verdict"] == "info" for m in memory), memory
    assert "the trace's [memory] events in the baseline and process RSS" in memory[0]["reason"]
    assert rc == 0, data["verdict"]
