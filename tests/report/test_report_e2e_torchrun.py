"""End to end on real training: the collectors' DDP example under torchrun (4 ranks, gloo, CPU).

Three captures: a baseline, a re-run of the same training (A/A: must not flag anything), and a
candidate with one slow rank (examples/ddp_slow_rank.py sleeps `DELAY_MS` per step on rank 2).
The candidate must fail the gate on the metrics that moved and on nothing else, and its
JUnit and HTML outputs must be valid (JUnit parsed back, HTML opened in headless Chromium).

Thresholds: the `.tracelab-thresholds.yml` a repository would commit for a shared CPU runner
(docs/ci.md). With 4 ranks on 2 cores and neighbours' jobs, two runs of the same training
differ by up to ~20% in median step time and ~17 pp in exposed-communication share (measured
here under load 11-14), which the default thresholds (made for dedicated GPU runners) would
flag. The default thresholds are tested on synthetic runs with known noise
(test_report_cli.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tracelab.cli import main

pytest.importorskip("torch")
pytestmark = pytest.mark.torchrun

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
#: 12 steps, 11 recorded: 10 per side after the report drops 1 warm-up step (>= min_steps 9).
STEPS = ["--steps", "12", "--record", "1:12"]
#: The injected straggler: large against step-time noise when 4 ranks share 2 cores.
DELAY_MS = "200"
#: Metrics a slow rank may legitimately move: the job's step, the others' waits inside the
#: all-reduces (exposed communication, waits for the last arriver) and the overlap.
MAY_MOVE = {"step_time", "exposed_comm_share", "straggler_wait", "comm_overlap"}
#: docs/ci.md, "Shared CPU runners".
CPU_RUNNER_THRESHOLDS = """\
# Shared CPU runner, 4 ranks on 2 cores: times swing with the neighbours' load.
step_time: +50%
exposed_comm_share: +25pp
straggler_wait: +25pp
comm_overlap: -10pp
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(script: str, out: Path, *args: str) -> tuple[subprocess.Popen[str], Path]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "4",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        str(EXAMPLES / script),
        "--out",
        str(out),
        *STEPS,
        *args,
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO
    )
    return proc, out


def _wait(job: tuple[subprocess.Popen[str], Path]) -> Path:
    proc, out = job
    try:
        _, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    if proc.returncode != 0:
        pytest.fail(f"torchrun for {out.name} failed ({proc.returncode}):\n{err[-6000:]}")
    assert (out / "manifest.json").is_file()
    return out


@pytest.fixture(scope="module")
def captures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not (EXAMPLES / "ddp.py").is_file() or not (EXAMPLES / "ddp_slow_rank.py").is_file():
        pytest.fail("examples/ddp.py and examples/ddp_slow_rank.py are missing")
    root = tmp_path_factory.mktemp("captures")
    # One after the other: side by side, one job's few-second training phase overlaps the
    # other's start-up (4 x import torch) and the two see very different loads.
    base = _wait(_start("ddp.py", root / "base"))
    rerun = _wait(_start("ddp.py", root / "rerun"))
    slow = _wait(
        _start("ddp_slow_rank.py", root / "slow", "--slow-rank", "2", "--delay-ms", DELAY_MS)
    )
    return {"base": base, "rerun": rerun, "slow": slow}


@pytest.fixture(scope="module")
def store(captures: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> str:
    db = str(tmp_path_factory.mktemp("store") / "ci.duckdb")
    assert main(["ingest", str(captures["base"]), "--db", db, "--run", "main"]) == 0
    assert main(["baseline", "save", "main-baseline", "--run", "main", "--db", db]) == 0
    return db


@pytest.fixture(autouse=True)
def _cpu_runner_thresholds() -> None:
    """The repository's thresholds file, found in the current folder like in CI."""
    Path(".tracelab-thresholds.yml").write_text(CPU_RUNNER_THRESHOLDS)


def _json(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / "tracelab-report.json").read_text()))


def _aa_report(store: str, candidate: Path, out: Path) -> tuple[int, dict[str, Any]]:
    rc = main(
        [
            "report",
            "--baseline",
            "main-baseline",
            "--candidate",
            str(candidate),
            "--db",
            store,
            "--format",
            "json",
            "--format",
            "markdown",
            "--out",
            str(out),
        ]
    )
    return rc, _json(out)


def test_aa_rerun_of_the_same_training_passes(
    captures: dict[str, Path], store: str, tmp_path: Path
) -> None:
    rc, data = _aa_report(store, captures["rerun"], tmp_path / "aa")
    if data["regressions"]:
        # The other test worker's jobs loaded one capture and not the other (a full run once
        # saw the re-run's all-reduces 5x slower than the baseline's, and the same pair passed
        # alone): the same training is captured as a fresh pair, back to back, and that pair
        # must pass. A gate that flags an A/A pair for what it measures fails both times.
        first = (tmp_path / "aa" / "tracelab-report.md").read_text()
        base = _wait(_start("ddp.py", tmp_path / "base2"))
        rerun = _wait(_start("ddp.py", tmp_path / "rerun2"))
        db = str(tmp_path / "aa2.duckdb")
        assert main(["ingest", str(base), "--db", db, "--run", "main"]) == 0
        assert main(["baseline", "save", "main-baseline", "--run", "main", "--db", db]) == 0
        rc, data = _aa_report(db, rerun, tmp_path / "aa2")
        out = tmp_path / "aa2"
        assert data["regressions"] == [], first + (out / "tracelab-report.md").read_text()
    assert rc == 0
    assert data["settings"]["config_file"].endswith(".tracelab-thresholds.yml")
    steps = next(m for m in data["metrics"] if m["key"] == "step_time")
    assert steps["n_baseline"] >= 9 and steps["n_candidate"] >= 9
    assert steps["threshold"] == "+50%"
    assert steps["verdict"] in ("pass", "improved")


def test_slow_rank_fails_the_gate_on_what_moved(
    captures: dict[str, Path],
    store: str,
    tmp_path: Path,
    open_in_chromium: Callable[[Path], tuple[str, list[str]]],
) -> None:
    out = tmp_path / "ab"
    rc = main(
        [
            "report",
            "--baseline",
            "main-baseline",
            "--candidate",
            str(captures["slow"]),
            "--db",
            store,
            "--format",
            "json",
            "--format",
            "junit",
            "--format",
            "html",
            "--format",
            "markdown",
            "--out",
            str(out),
        ]
    )
    data = _json(out)
    md = (out / "tracelab-report.md").read_text()
    assert rc == 1, md
    regressed = set(data["regressions"])
    assert "step_time" in regressed, md
    assert regressed <= MAY_MOVE, md
    step = next(m for m in data["metrics"] if m["key"] == "step_time")
    assert step["ci_low"] > 0.05 and step["p_value"] < 0.05
    for key in ("peak_memory", "memory_imbalance"):
        row = next((m for m in data["metrics"] if m["key"] == key), None)
        assert row is None or row["verdict"] != "regression", md

    suite = ET.parse(out / "tracelab-report.junit.xml").getroot().find("testsuite")
    assert suite is not None
    failed = {c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None}
    assert failed == regressed
    gated = {m["key"] for m in data["metrics"] if m["gated"]}
    assert {c.get("name") for c in suite.iter("testcase")} == gated

    dom, console = open_in_chromium(out / "tracelab-report.html")
    assert console == [], console
    assert "Performance regression" in dom
    assert dom.count('class="plotly-graph-div js-plotly-plot"') >= 2
