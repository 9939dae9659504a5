"""Shared builders for the report tests: hand-made RunMetrics with known samples."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from tracelab.report.compare import MetricValue, RunMetrics, RunSummary
from tracelab.results import Evidence, Finding, Severity


def finding(code: str, ranks: tuple[int, ...], title: str = "t", sev: Severity = Severity.WARNING
            ) -> Finding:
    return Finding(code=code, severity=sev, title=title, evidence=Evidence(ranks=ranks),
                   impact_ms_per_step=1.5, impact_share=0.02, suggestion="do x",
                   analyzer="stragglers")


def make_run(name: str, *, step_ms: float = 100.0, steps: int = 20, slowdown: float = 1.0,
             seed: int = 0, exposed: float = 0.10, peak: float = 8e9,
             findings: tuple[Finding, ...] = (), extra: dict[str, MetricValue] | None = None
             ) -> RunMetrics:
    rng = np.random.default_rng(seed)
    samples = tuple((step_ms * slowdown * rng.lognormal(0, 0.01, steps)).tolist())
    exp = tuple((exposed + rng.normal(0, 0.002, steps)).tolist())
    values = {
        "step_time": MetricValue(key="step_time", gate="step_time", label="Step time",
                                 value=float(np.median(samples)), samples=samples),
        "exposed_comm_share": MetricValue(key="exposed_comm_share", gate="exposed_comm_share",
                                          label="Exposed communication", value=exposed,
                                          samples=exp),
        "peak_memory[stage=0]": MetricValue(key="peak_memory[stage=0]", gate="peak_memory",
                                            label="Peak memory, stage 0", value=peak),
    }
    values.update(extra or {})
    per_rank = [{"rank": r, "step_time_ms": step_ms * slowdown + r, "compute_ms": 50.0 + r}
                for r in range(4)]
    return RunMetrics(run=RunSummary(name=name, run_id=1, ranks=4, world_size=4,
                                     steps_used=steps, steps_dropped=1),
                      values=values, findings=findings, tables={"per_rank": per_rank})


@pytest.fixture
def make_run_metrics() -> Callable[..., RunMetrics]:
    """Builder of RunMetrics: make_run_metrics(name, slowdown=1.1, steps=20, ...)."""
    return make_run


@pytest.fixture
def make_finding() -> Callable[..., Finding]:
    """Builder of Findings: make_finding(code, ranks)."""
    return finding
