"""Shared builders for the report tests: hand-made RunMetrics with known samples."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tracelab.report.compare import MetricValue, RunMetrics, RunSummary
from tracelab.results import Evidence, Finding, Severity
from tracelab.testing.chromium import CHROMIUM, headless_flags
from tracelab.testing.synth import MS, RankTrace, write_capture


def finding(
    code: str, ranks: tuple[int, ...], title: str = "t", sev: Severity = Severity.WARNING
) -> Finding:
    return Finding(
        code=code,
        severity=sev,
        title=title,
        evidence=Evidence(ranks=ranks),
        impact_ns_per_step=1_500_000,
        impact_share=0.02,
        suggestion="do x",
        analyzer="stragglers",
    )


def make_run(
    name: str,
    *,
    step_ms: float = 100.0,
    steps: int = 20,
    slowdown: float = 1.0,
    seed: int = 0,
    exposed: float = 0.10,
    peak: float = 8e9,
    findings: tuple[Finding, ...] = (),
    extra: dict[str, MetricValue] | None = None,
) -> RunMetrics:
    rng = np.random.default_rng(seed)
    samples = tuple((step_ms * slowdown * rng.lognormal(0, 0.01, steps)).tolist())
    exp = tuple((exposed + rng.normal(0, 0.002, steps)).tolist())
    values = {
        "step_time": MetricValue(
            key="step_time",
            gate="step_time",
            label="Step time",
            value=float(np.median(samples)),
            samples=samples,
        ),
        "exposed_comm_share": MetricValue(
            key="exposed_comm_share",
            gate="exposed_comm_share",
            label="Exposed communication",
            value=exposed,
            samples=exp,
        ),
        "peak_memory[stage=0]": MetricValue(
            key="peak_memory[stage=0]", gate="peak_memory", label="Peak memory, stage 0", value=peak
        ),
    }
    values.update(extra or {})
    per_rank = [
        {"rank": r, "step_time_ms": step_ms * slowdown + r, "compute_ms": 50.0 + r}
        for r in range(4)
    ]
    return RunMetrics(
        run=RunSummary(
            name=name, run_id=1, ranks=4, world_size=4, steps_used=steps, steps_dropped=1
        ),
        values=values,
        findings=findings,
        tables={"per_rank": per_rank},
    )


@pytest.fixture(autouse=True)
def _isolated_cwd(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run every report test in an empty folder: the CLI reads ./.tracelab-thresholds.yml and
    ./tracelab.duckdb when present, and the repository's own must not leak into tests."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture
def make_run_metrics() -> Callable[..., RunMetrics]:
    """Builder of RunMetrics: make_run_metrics(name, slowdown=1.1, steps=20, ...)."""
    return make_run


@pytest.fixture
def make_finding() -> Callable[..., Finding]:
    """Builder of Findings: make_finding(code, ranks)."""
    return finding


def write_training_run(
    folder: Path,
    *,
    steps: int = 16,
    ranks: int = 4,
    step_ms: float = 20.0,
    compute_slowdown: float = 1.0,
    exposed_comm_ms: float = 0.0,
    slow_rank: int | None = None,
    seed: int = 0,
    backend: str = "gloo",
) -> Path:
    """A data-parallel CPU/gloo-shaped run as a capture folder: each step, every rank computes
    (aten::mm, lognormal jitter), then all-reduces 4 MiB; the all-reduce ends together on all
    ranks (the last arriver sets it). `exposed_comm_ms` lengthens the all-reduce; `slow_rank`
    computes 30% longer (a straggler); `compute_slowdown` scales every rank's compute.
    backend="nccl" writes the same run as GPU kernels (a GEMM, then an NCCL all-reduce)."""
    rng = np.random.default_rng(seed)
    gpu = backend == "nccl"
    traces = [
        RankTrace(r, ranks, backend=backend, **({} if gpu else {"device": None}))
        for r in range(ranks)
    ]
    t = 0
    for step in range(steps):
        compute = {
            r: step_ms
            * 0.7
            * compute_slowdown
            * rng.lognormal(0, 0.02)
            * (1.3 if r == slow_rank else 1.0)
            for r in range(ranks)
        }
        last = max(compute.values())
        transfer = step_ms * 0.2 + exposed_comm_ms
        end = t + int((last + transfer) * MS)
        for tr in traces:
            c_end = t + int(compute[tr.rank] * MS)
            tr.step(step, t, end + int(0.5 * MS))
            if gpu:
                tr.kernel("sm90_xmma_gemm_bf16", t + 10_000, c_end)
                tr.nccl("all_reduce", c_end, end, nbytes=4 << 20)
            else:
                tr.cpu_op("aten::mm", t + 10_000, c_end)
                tr.gloo("all_reduce", c_end, end, nbytes=4 << 20)
        t = end + int(0.5 * MS) + 1000
    write_capture(folder, traces, clock=False)
    return folder


@pytest.fixture(scope="session")
def training_run() -> Callable[..., Path]:
    """Builder of synthetic capture folders: training_run(folder, compute_slowdown=1.1, ...)."""
    return write_training_run


def chromium_dump(page: Path, tmp: Path) -> tuple[str, list[str]]:
    """Open `page` in headless Chromium; return the DOM after scripts ran and every console
    message (uncaught exceptions show up there as 'Uncaught ...')."""
    if not CHROMIUM.exists():
        pytest.skip("needs Debian's chromium (apt-get install chromium)")
    profile = tmp / "chromium-profile"
    profile.mkdir(exist_ok=True)
    out = subprocess.run(
        [
            str(CHROMIUM),
            *headless_flags(profile),
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
            "--dump-dom",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    console = [line for line in out.stderr.splitlines() if ":CONSOLE" in line]
    return out.stdout, console


@pytest.fixture
def open_in_chromium(tmp_path: Path) -> Callable[[Path], tuple[str, list[str]]]:
    """open_in_chromium(page) -> (dom, console messages); skips without Chromium."""
    return lambda page: chromium_dump(page, tmp_path)
