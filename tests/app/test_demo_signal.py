"""`tracelab demo` removes its temporary store when stopped by SIGTERM, not only on Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tracelab.testing.synth import build_run


def test_demo_stopped_by_sigterm_removes_its_temporary_store(tmp_path: Path) -> None:
    traces = tmp_path / "captures"
    build_run(traces, "stragglers", capture=True)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "demo.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tracelab.cli",
            "demo",
            "--traces",
            str(traces),
            "--port",
            str(port),
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    try:
        deadline = time.monotonic() + 300
        while "tracelab: serving" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        store = Path(re.search(r"serving (\S+) at", log.read_text()).group(1))
        assert store.is_file() and store.is_relative_to(tmp)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert not store.exists()
    assert [p.name for p in tmp.iterdir() if p.name.startswith("tracelab-demo-")] == []
