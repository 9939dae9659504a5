"""Run a command as a fresh process and measure wall time and peak RSS of its whole process tree.

Peak RSS is the largest *sum* of the resident sets of the process and all its descendants seen
by sampling /proc every 20 ms: a tool that fans out into a pool of workers is charged for all of
them, not only for its biggest process (which is what `time -v` reports).
"""

from __future__ import annotations

import compileall
import os
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path


def _children(pid: int) -> list[int]:
    out: list[int] = []
    task_dir = Path(f"/proc/{pid}/task")
    try:
        for task in task_dir.iterdir():
            text = (task / "children").read_text().split()
            out.extend(int(c) for c in text)
    except OSError:
        pass
    return out


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def tree_rss(pid: int) -> int:
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        total += _rss_bytes(p)
        stack.extend(_children(p))
    return total


@dataclass(frozen=True, kw_only=True)
class Sample:
    wall_s: float
    peak_rss_bytes: int
    returncode: int
    stdout: str


def run_measured(
    cmd: list[str], *, env: dict[str, str] | None = None, timeout_s: float = 900
) -> Sample:
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )
    peak = 0
    stop = threading.Event()

    def poll() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(0.02)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    finally:
        stop.set()
        watcher.join()
    wall = time.perf_counter() - start
    return Sample(wall_s=wall, peak_rss_bytes=peak, returncode=proc.returncode, stdout=out)


def median(values: list[float]) -> float:
    return statistics.median(values)


def compile_bytecode() -> int:
    """Compile tracelab's modules to bytecode, as pip does when it installs the wheel; returns
    how many sources there are. Every dependency in site-packages (HTA's among them) runs from
    bytecode compiled at its install, but a source checkout (an editable install) under
    PYTHONDONTWRITEBYTECODE=1, which this machine sets, compiles every tracelab module again in
    every run: 0.60 s of imports against 0.43 s from bytecode (`tracelab ingest`'s modules,
    three runs each, 2026-12-06). The bytecode lands in git-ignored __pycache__ folders."""
    root = Path(__file__).resolve().parents[1] / "tracelab"
    if not compileall.compile_dir(str(root), quiet=1):
        raise SystemExit(f"could not compile {root}")
    return sum(1 for _ in root.rglob("*.py"))
