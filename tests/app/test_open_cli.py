"""`tracelab open`: traces to the dashboard in one command, with the run's Overview URL."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tracelab.store import list_runs, open_store
from tracelab.testing.synth import build_run


def _open(tmp_path: Path, *paths: str) -> tuple[subprocess.Popen[bytes], Path]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "open.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracelab.cli", "open", *paths, "--port", str(port)],
        cwd=tmp_path,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    return proc, log


def _overview_urls(proc: subprocess.Popen[bytes], log: Path, count: int) -> list[str]:
    deadline = time.monotonic() + 300
    while len(urls := re.findall(r"overview of run '[^']+': (\S+)", log.read_text())) < count:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    return urls


def test_open_a_rankless_trace_serves_its_overview(route, hta_traces: Path, tmp_path: Path) -> None:
    proc, log = _open(tmp_path, str(hta_traces / "amd_trace"))
    try:
        (url,) = _overview_urls(proc, log, 1)
        base, _, query = url.partition("/overview")
        assert base.startswith("http://127.0.0.1:") and query == "?run=amd_trace"
        deadline = time.monotonic() + 60
        while True:
            try:
                status, body = route(base, "/overview", query)
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
        assert status == 200 and "Overview of amd_trace" in body
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    text = log.read_text()
    assert "rank 0 of 1" in text and "analyzed run 'amd_trace'" in text
    with open_store(tmp_path / "tracelab.duckdb") as con:  # the default store
        assert [r["name"] for r in list_runs(con)] == ["amd_trace"]


def test_open_a_folder_of_captures_prints_each_runs_overview(tmp_path: Path) -> None:
    build_run(tmp_path / "caps", "stragglers", capture=True)
    build_run(tmp_path / "caps", "pipeline", capture=True)
    proc, log = _open(tmp_path, "caps")
    try:
        urls = _overview_urls(proc, log, 2)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    assert sorted(u.rpartition("run=")[2] for u in urls) == [
        "pipeline_1f1b_p4_m8_nccl",
        "stragglers_nccl",
    ]
