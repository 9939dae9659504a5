"""Fixtures of the app tests: one store with synthetic runs (known answers, an XSS probe) and
the real sample captures when sample_traces/ has them, plus a running server for browser tests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tracelab.testing.synth import MS, RankTrace, build_run, write_ranks

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_traces"
SHARED = Path(os.environ.get("TRACELAB_SHARED", REPO.parent / "shared"))
#: A real single-GPU trace with 123k events: big enough for the timeline's aggregate mode.
REAL_TRACE = SHARED / "traces" / "hta" / "df_index_resolver"
SCREENSHOTS = REPO / "artifacts" / "screenshots"
#: The XSS probe of the issue: an event and a thread named like this must render as text.
PROBE = "<img src=x onerror=alert(1)>"


def xss_run(folder: Path) -> list[Path]:
    """Two ranks whose kernel, host op and thread names are the XSS probe."""
    traces = []
    for rank in range(2):
        t = RankTrace(rank, 2)
        for k in range(3):
            o = k * 20 * MS
            t.step(k + 1, o, o + 15 * MS)
            t.cpu_op(PROBE, o + 1 * MS, o + 3 * MS)
            t.kernel(PROBE, o + 2 * MS, o + 9 * MS)
            t.nccl("all_reduce", o + 9 * MS + rank * MS, o + 14 * MS, nbytes=1 << 20)
        t.cpu_op("aten::mm", 1 * MS, 2 * MS, tid=t.pid + 7)
        t.events.append(
            {
                "name": "thread_name",
                "ph": "M",
                "ts": 0,
                "pid": t.pid,
                "tid": t.pid + 7,
                "args": {"name": PROBE},
            }
        )
        traces.append(t)
    return write_ranks(folder / "xss", traces)


def sample_captures() -> list[tuple[str, Path]]:
    """(run name, folder) of each capture under sample_traces/ (empty until they exist)."""
    if not SAMPLES.is_dir():
        return []
    return sorted(
        (p.name, p) for p in SAMPLES.iterdir() if p.is_dir() and (p / "manifest.json").is_file()
    )


def build_store(folder: Path) -> Path:
    """The app tests' store: synthetic runs with known answers, the XSS probe, the samples."""
    from tracelab.ingest import ingest

    db = folder / "app.duckdb"
    runs = [
        ("stragglers", build_run(folder, "stragglers", capture=True).paths),
        ("pipeline", build_run(folder, "pipeline", schedule="1f1b", p=4, m=8, capture=True).paths),
        ("overlap_gloo", build_run(folder, "overlap", backend="gloo", steps=3).paths),
        ("xss", xss_run(folder)),
        # 40 ranks (over MANY_RANKS): the timeline opens on a rank summary; rank 33 is slow.
        (
            "many",
            build_run(
                folder,
                "stragglers",
                name="many",
                end_ms=10,
                steps=2,
                arrivals_ms=tuple(8.0 if r == 33 else 0.5 * (r % 3) for r in range(40)),
            ).paths,
        ),
    ]
    if REAL_TRACE.is_dir():
        runs.append(("real-gpu", [REAL_TRACE]))
    runs += [(f"sample-{name}", [path]) for name, path in sample_captures()]
    for name, paths in runs:
        ingest([str(p) for p in paths], db=str(db), run=name, if_exists="replace", workers=1)
    return db


@pytest.fixture(scope="session")
def app_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("appstore"))


@pytest.fixture(scope="session")
def app_module(app_store: Path):  # type: ignore[no-untyped-def]
    """The Dash app on the test store, in this process (for direct callback tests)."""
    from tracelab.app import create_app

    return create_app(str(app_store), warm=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    db: Path, log: Path, extra_env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """`tracelab serve` in a subprocess on a free port; returns it and its base URL once it
    answers."""
    port = free_port()
    env = {**os.environ, **(extra_env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracelab.cli", "serve", "--db", str(db), "--port", str(port)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tracelab serve exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"tracelab serve did not answer in 60 s: {log.read_text()[-2000:]}")


@pytest.fixture(scope="session")
def server(app_store: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    log = tmp_path_factory.mktemp("server") / "serve.log"
    proc, url = start_server(app_store, log)
    yield url
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="session")
def sample_runs(app_store: Path) -> list[str]:
    """Names of the runs ingested from sample_traces/ (empty until the captures exist)."""
    from tracelab.store import open_store

    with open_store(app_store) as con:
        rows = con.execute("SELECT name FROM runs WHERE name LIKE 'sample-%' ORDER BY name")
        return [str(r[0]) for r in rows.fetchall()]


@pytest.fixture(scope="session")
def real_run(app_store: Path) -> str:
    """The run holding the shared real GPU trace (fails when ../shared is missing)."""
    if not REAL_TRACE.is_dir():
        pytest.fail(f"the shared real trace is missing at {REAL_TRACE}; set TRACELAB_SHARED")
    return "real-gpu"


@pytest.fixture(scope="session")
def start_app_server():  # type: ignore[no-untyped-def]
    """`start_server(db, log) -> (process, url)`, for tests that need their own server."""
    return start_server


def router_request(path: str, search: str = "") -> bytes:
    """The body of the page router callback's request, as the browser sends it for a URL."""
    return json.dumps(
        {
            "output": ".._pages_content.children..._pages_store.data..",
            "outputs": [
                {"id": "_pages_content", "property": "children"},
                {"id": "_pages_store", "property": "data"},
            ],
            "inputs": [
                {"id": "_pages_location", "property": "pathname", "value": path},
                {"id": "_pages_location", "property": "search", "value": search},
            ],
            "changedPropIds": ["_pages_location.pathname"],
            "state": [],
        }
    ).encode()


def dash_route(url: str, path: str, search: str = "") -> tuple[int, str]:
    """The page router callback over real HTTP, as the browser calls it."""
    req = urllib.request.Request(
        url + "/_dash-update-component",
        data=router_request(path, search),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.status, r.read().decode()


@pytest.fixture(scope="session")
def route():  # type: ignore[no-untyped-def]
    """dash_route: the page router callback over real HTTP, for tests that run a server."""
    return dash_route


@pytest.fixture(scope="session")
def page_request():  # type: ignore[no-untyped-def]
    """router_request: the page router callback's request body, for a test client."""
    return router_request
