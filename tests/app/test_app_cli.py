"""`tracelab serve` and `tracelab demo` as a user runs them, and serving during an ingest."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tracelab.store.files import parquet_root
from tracelab.testing.synth import build_run

REPO = Path(__file__).resolve().parents[2]


def test_serve_without_a_store_says_how_to_make_one(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "tracelab.cli", "serve", "--db", str(tmp_path / "none.duckdb")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 3
    assert "no store here" in r.stderr and "tracelab ingest" in r.stderr


def test_demo_ingests_every_capture(tmp_path: Path) -> None:
    traces = tmp_path / "captures"
    build_run(traces, "stragglers", capture=True)
    build_run(traces, "pipeline", capture=True)
    db = tmp_path / "demo.duckdb"
    cmd = [
        sys.executable,
        "-m",
        "tracelab.cli",
        "demo",
        "--traces",
        str(traces),
        "--db",
        str(db),
        "--no-serve",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "run 'stragglers_nccl'" in r.stdout and "tracelab serve --db" in r.stdout
    from tracelab.store import list_runs, open_store

    with open_store(db) as con:
        assert {x["name"] for x in list_runs(con)} == {
            "stragglers_nccl",
            "pipeline_1f1b_p4_m8_nccl",
        }
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "unchanged" in again.stdout


def test_demo_serves_the_sample_traces(route, tmp_path: Path) -> None:
    """The README's main command: ingest sample_traces/ into a temporary store and serve it."""
    import socket

    samples = REPO / "sample_traces"
    if not any(samples.glob("*/manifest.json")):
        pytest.skip("sample_traces/ has no captures yet")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "demo.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracelab.cli", "demo", "--port", str(port)],
        cwd=REPO,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                status, body = route(url, "/")
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
        assert status == 200
        for sample in samples.glob("*/manifest.json"):
            assert sample.parent.name in body
        status, body = route(url, "/timeline", f"?run={sample.parent.name}")
        assert status == 200 and "Timeline of" in body
    finally:
        proc.terminate()
        proc.wait(30)
    text = log.read_text()
    assert "tracelab: serving" in text and "127.0.0.1" in text


def test_app_keeps_serving_while_another_process_ingests(
    route, app_store: Path, tmp_path: Path, start_app_server
) -> None:  # type: ignore[no-untyped-def]
    """An ingest in another process takes the write lock while the app reads per request: every
    request still answers, and the new run shows up once the ingest commits."""
    db = tmp_path / "live.duckdb"
    shutil.copy(app_store, db)
    # A store is the file and its Parquet folder (docs/store.md): copy both.
    shutil.copytree(parquet_root(app_store), parquet_root(db))
    new = build_run(tmp_path / "new", "overlap", ranks=4, steps=20)
    proc, url = start_app_server(db, tmp_path / "serve.log")
    errors: list[str] = []
    answered = 0
    stop = threading.Event()

    def hammer() -> None:
        nonlocal answered
        while not stop.is_set():
            try:
                status, body = route(url, "/timeline", "?run=stragglers")
                if status != 200 or "Timeline of stragglers" not in body:
                    errors.append(body[:300])
                answered += 1
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(repr(exc))

    threads = [threading.Thread(target=hammer) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        time.sleep(1)
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "tracelab.cli",
                "ingest",
                *[str(p) for p in new.paths],
                "--db",
                str(db),
                "--run",
                "live-new",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        time.sleep(1)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
        try:
            status, body = route(url, "/")
        finally:
            proc.terminate()
            proc.wait(30)
    assert errors == [], (tmp_path / "serve.log").read_text()[-4000:]
    assert answered >= 4
    assert status == 200 and "live-new" in body
