"""Converting each window's trace to tracelab's columnar form, off the training process.

With `tracelab.profile(..., convert=True)` every exported trace is handed to a child process
(`python -m tracelab.cli convert TRACE`, at low CPU priority) that writes
`window-K.pt.trace.tracelab/` beside it, so that `tracelab ingest` later only registers the
result: the parsing happens on every rank's own node, in parallel. The training process never
waits for it until the profile exits, and then only up to a bound.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

log = logging.getLogger("tracelab.collectors")


class BackgroundConverter:
    """Starts one converter child per trace; `wait()` reaps them all."""

    def __init__(self) -> None:
        self._children: list[tuple[Path, subprocess.Popen[bytes]]] = []

    def submit(self, trace: Path) -> None:
        cmd = [sys.executable, "-m", "tracelab.cli", "convert", str(trace)]
        nice = shutil.which("nice")
        if nice:
            cmd = [nice, "-n", "10", *cmd]
        child = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self._children.append((trace, child))

    def wait(self, timeout_s: float) -> list[str]:
        """Wait for every child (at most `timeout_s` in all); return one line per failure."""
        deadline = time.monotonic() + timeout_s
        failures = []
        for trace, child in self._children:
            try:
                _, err = child.communicate(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.communicate()
                failures.append(f"{trace.name}: conversion still running after {timeout_s:.0f} s")
                continue
            if child.returncode != 0:
                last = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
                failures.append(f"{trace.name}: exit {child.returncode}: {last[0]}")
        self._children.clear()
        for line in failures:
            log.warning(
                "tracelab: could not convert %s; `tracelab ingest` will parse the trace itself.",
                line,
            )
        return failures
