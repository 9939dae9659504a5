"""tracelab.measures: the step time and bus bandwidth, each defined once, read alike by every
surface (the steps analyzer, the pipeline analyzer, the Runs page, the report)."""

from __future__ import annotations

import pytest

from tracelab.analyzers import run_all
from tracelab.measures import COLLECTIVE_BANDWIDTH_SQL, STEP_TIME_SQL
from tracelab.report.metrics import extract
from tracelab.report.thresholds import ReportSettings
from tracelab.store import open_store, resolve_run
from tracelab.testing.synth import build_run
from tracelab.views.runs import runs_page

from .conftest import store_of


def test_busbw_one_definition(tmp_path):
    """8 ranks all-reduce 10^9 bytes in 10 ms: busbw 175 GB/s (nccl-tests: 2(n-1)/n x algbw
    100 GB/s) per call, in the breakdown's table and the report's metric alike."""
    run = build_run(tmp_path, "bandwidth")
    with open_store(store_of(tmp_path, run)) as con:
        rid, _ = resolve_run(con, run.name)
        rows = con.execute(
            f"SELECT op, n, algbw_gbps, busbw_gbps FROM {COLLECTIVE_BANDWIDTH_SQL}", {"run": rid}
        ).fetchall()
        assert rows and all(r[0] == "all_reduce" and r[1] == 8 for r in rows)
        assert all(r[2] == pytest.approx(100.0) and r[3] == pytest.approx(175.0) for r in rows)
        (bw,) = {r.analyzer: r for r in run_all(con, rid)}["breakdown"].tables["bandwidth"]
        metrics = extract(con, rid, ReportSettings(warmup_steps=0))
    assert bw["busbw_gbps"] == pytest.approx(175.0)
    assert metrics.values["collective_bandwidth[all_reduce]"].value == pytest.approx(175.0)


def test_step_time_one_definition(tmp_path):
    """The mean over steady steps of job_steps.dur_ns, computed here from the rows, is the steps
    analyzer's step_ns and the Runs page's."""
    run = build_run(tmp_path, "pipeline", steps=3)
    with open_store(store_of(tmp_path, run)) as con:
        rid, _ = resolve_run(con, run.name)
        durs = [
            d
            for d, o in con.execute(
                "SELECT dur_ns, ordinal FROM job_steps WHERE run_id = ?", [rid]
            ).fetchall()
            if o >= 1
        ]
        by_name = {r.analyzer: r for r in run_all(con, rid)}
        (row,) = runs_page(con).rows
        (sql,) = con.execute(f"SELECT {STEP_TIME_SQL}", {"run": rid, "min_ordinal": 1}).fetchone()
    expected = sum(durs) / len(durs)
    assert len(durs) == 2
    assert sql == pytest.approx(expected)
    assert by_name["steps"].metrics["step_ns"] == pytest.approx(expected)
    assert row["step_ns"] == pytest.approx(expected)
