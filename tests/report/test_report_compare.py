"""The comparison model: verdicts per row, the report's verdict, findings diff."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tracelab.report.compare import (
    MetricValue,
    RunMetrics,
    RunSummary,
    Verdict,
    compare,
    compare_values,
)
from tracelab.report.thresholds import Kind, load_settings

SETTINGS = load_settings(search_dir=None)


def _row(report, key):  # type: ignore[no-untyped-def]
    return next(r for r in report.rows if r.key == key)


def test_aa_same_distribution_passes(make_run_metrics: Callable[..., Any]) -> None:
    make_run = make_run_metrics
    report = compare(make_run("a", seed=1), make_run("b", seed=2), SETTINGS)
    assert report.verdict == "pass" and report.exit_code == 0
    step = _row(report, "step_time")
    assert step.verdict is Verdict.PASS
    assert step.ci_low is not None and step.ci_low < 0 < step.ci_high  # type: ignore[operator]


def test_slowdown_is_a_significant_regression(make_run_metrics: Callable[..., Any]) -> None:
    make_run = make_run_metrics
    report = compare(make_run("a", seed=1), make_run("b", seed=2, slowdown=1.10), SETTINGS)
    step = _row(report, "step_time")
    assert step.verdict is Verdict.REGRESSION
    assert step.delta == pytest.approx(0.10, abs=0.01)
    assert step.p_value is not None and step.p_value < 1e-4
    assert step.ci_low is not None and step.ci_low > 0.05
    assert [r.key for r in report.regressions] == ["step_time"]
    assert report.exit_code == 1


def test_small_significant_change_within_threshold_passes(
    make_run_metrics: Callable[..., Any],
) -> None:
    make_run = make_run_metrics
    report = compare(make_run("a", seed=1), make_run("b", seed=2, slowdown=1.03), SETTINGS)
    step = _row(report, "step_time")
    assert step.p_value is not None and step.p_value < 0.05
    assert step.verdict is Verdict.PASS and "within +5%" in step.reason


def test_speedup_is_improved_not_regression(make_run_metrics: Callable[..., Any]) -> None:
    make_run = make_run_metrics
    report = compare(make_run("a", seed=1), make_run("b", seed=2, slowdown=0.8), SETTINGS)
    row = _row(report, "step_time")
    assert row.verdict is Verdict.IMPROVED
    assert report.exit_code == 0
    # The p columns are the regression test's (near 1 here); the reason gives the improvement's
    # own p and says so: "p (adjusted) 1" beside "improved (p=0.00021)" read as a contradiction.
    assert row.p_adjusted is not None and row.p_adjusted > 0.5
    assert "for an improvement)" in row.reason


def test_too_few_steps_warns(make_run_metrics: Callable[..., Any]) -> None:
    make_run = make_run_metrics
    report = compare(make_run("a", steps=5), make_run("b", steps=30, slowdown=1.5), SETTINGS)
    step = _row(report, "step_time")
    assert step.verdict is Verdict.WARN and "too few steps" in step.reason
    assert (step.n_baseline, step.n_candidate) == (5, 30)
    assert report.verdict == "warn" and report.exit_code == 0
    assert any("too few steps" in w for w in report.warnings)


def test_points_threshold_on_shares(make_run_metrics: Callable[..., Any]) -> None:
    make_run = make_run_metrics
    report = compare(make_run("a", seed=1), make_run("b", seed=2, exposed=0.14), SETTINGS)
    row = _row(report, "exposed_comm_share")
    assert row.delta_kind is Kind.POINTS
    assert row.delta == pytest.approx(4.0, abs=0.3)
    assert row.verdict is Verdict.REGRESSION


def test_scalar_metric_uses_threshold_only(make_run_metrics: Callable[..., Any]) -> None:
    make_run = make_run_metrics
    report = compare(make_run("a"), make_run("b", peak=8e9 * 1.02), SETTINGS)
    assert _row(report, "peak_memory[stage=0]").verdict is Verdict.PASS
    report = compare(make_run("a"), make_run("b", peak=8e9 * 1.04), SETTINGS)
    row = _row(report, "peak_memory[stage=0]")
    assert row.verdict is Verdict.REGRESSION and "threshold only" in row.reason


def test_missing_side_warns_and_off_is_info() -> None:
    base = MetricValue(key="bubble_share[stage=1]", gate="bubble_share", label="b", value=0.2)
    cand = MetricValue(
        key="bubble_share[stage=1]",
        gate="bubble_share",
        label="b",
        value=None,
        note="no pipeline annotations",
    )
    row = compare_values(base, cand, SETTINGS)
    assert row.verdict is Verdict.WARN and "no pipeline annotations" in row.reason
    op = MetricValue(key="op_time[aten::mm]", gate="op_time", label="op", value=3.0)
    assert compare_values(op, op, SETTINGS).verdict is Verdict.INFO


def test_bandwidth_drop_is_the_regression() -> None:
    b = MetricValue(
        key="collective_bandwidth[all_reduce]", gate="collective_bandwidth", label="bw", value=100.0
    )
    up = MetricValue(key=b.key, gate=b.gate, label="bw", value=150.0)
    down = MetricValue(key=b.key, gate=b.gate, label="bw", value=80.0)
    assert compare_values(b, up, SETTINGS).verdict is Verdict.IMPROVED
    assert compare_values(b, down, SETTINGS).verdict is Verdict.REGRESSION


def test_top_movers_and_findings_diff(
    make_run_metrics: Callable[..., Any], make_finding: Callable[..., Any]
) -> None:
    make_run, finding = make_run_metrics, make_finding
    ops = {
        f"op_time[op{i}]": MetricValue(
            key=f"op_time[op{i}]", gate="op_time", label=f"op{i}", value=float(i)
        )
        for i in range(30)
    }
    cand_ops = {
        k: MetricValue(
            key=k,
            gate="op_time",
            label=v.label,
            value=(v.value or 0) * (2 if k == "op_time[op3]" else 1),
        )
        for k, v in ops.items()
    }
    old = finding("STRAGGLER", (2,))
    new = finding("EXPOSED_COMM", (0, 1))
    report = compare(
        make_run("a", extra=ops, findings=(old,)),
        make_run("b", extra=cand_ops, findings=(new,)),
        SETTINGS,
    )
    op_rows = [r for r in report.rows if r.gate == "op_time"]
    assert len(op_rows) == SETTINGS.top_ops
    assert op_rows[0].key == "op_time[op3]"
    assert report.new_findings == (new,)
    assert report.resolved_findings == (old,)
    assert report.still_present == ()


def test_findings_in_both_runs_are_still_present(
    make_run_metrics: Callable[..., Any], make_finding: Callable[..., Any]
) -> None:
    """Only new and resolved findings were listed: a critical finding in both runs (29% of the
    step lost to exposed communication) was invisible in the PR's report."""
    make_run, finding = make_run_metrics, make_finding
    both = finding("EXPOSED_COMM", (0, 1))
    report = compare(make_run("a", findings=(both,)), make_run("b", findings=(both,)), SETTINGS)
    assert report.new_findings == () and report.resolved_findings == ()
    assert report.still_present == (both,)


def test_holm_adjustment_across_gated_metrics() -> None:
    """A borderline step-time shift (raw p = 0.021 < alpha, CI above 1) fails the gate when
    judged alone, and passes once four other per-step metrics are judged in the same report
    (Holm: 5 x p)."""
    base_steps = tuple(np.round(100 + np.random.default_rng(3).normal(0, 1, 20), 2).tolist())
    cand_steps = tuple(x + 0.6 for x in base_steps)

    def run(name: str, steps: tuple[float, ...], n_other: int) -> RunMetrics:
        values = {
            f"straggler_wait[{i}]": MetricValue(
                key=f"straggler_wait[{i}]",
                gate="straggler_wait",
                label=f"w{i}",
                value=0.1,
                samples=tuple(0.1 + 0.001 * j for j in range(20)),
            )
            for i in range(n_other)
        }
        values["step_time"] = MetricValue(
            key="step_time",
            gate="step_time",
            label="Step time",
            value=float(np.median(steps)),
            samples=steps,
        )
        return RunMetrics(run=RunSummary(name=name), values=values)

    settings = load_settings(search_dir=None, cli_thresholds={"step_time": "+0.5%"})
    alone = _row(compare(run("a", base_steps, 0), run("b", cand_steps, 0), settings), "step_time")
    assert alone.p_value == pytest.approx(0.0206, abs=1e-4)
    assert alone.p_adjusted == alone.p_value
    assert alone.verdict is Verdict.REGRESSION
    family = _row(compare(run("a", base_steps, 4), run("b", cand_steps, 4), settings), "step_time")
    assert family.p_adjusted == pytest.approx(5 * family.p_value)  # type: ignore[operator]
    assert family.verdict is Verdict.PASS and "not significant" in family.reason


def test_new_op_counts_as_a_mover(make_run_metrics: Callable[..., Any]) -> None:
    """An op that only the candidate runs moved from 0 ms: it leads the top movers."""
    base = {"op_time[a]": MetricValue(key="op_time[a]", gate="op_time", label="a", value=5.0)}
    cand = {
        "op_time[a]": MetricValue(key="op_time[a]", gate="op_time", label="a", value=5.5),
        "op_time[new]": MetricValue(key="op_time[new]", gate="op_time", label="new", value=3.0),
    }
    report = compare(make_run_metrics("a", extra=base), make_run_metrics("b", extra=cand), SETTINGS)
    ops = [r for r in report.rows if r.gate == "op_time"]
    assert [r.key for r in ops] == ["op_time[new]", "op_time[a]"]
    assert ops[0].baseline is None and ops[0].verdict is Verdict.INFO
