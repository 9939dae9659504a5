"""tracelab.ingest.heap: `tracelab ingest` keeps freed memory in its process and its forked
workers (glibc)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

GLIBC = platform.libc_ver()[0] == "glibc"

#: mallinfo2's fields (glibc 2.33+): arena (bytes from sbrk) and keepcost (free at the top).
PROBE = """
import ctypes, os, sys
from tracelab.ingest.heap import keep_freed_memory

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)
if sys.argv[1] == "tuned":
    assert keep_freed_memory() is True
pid = os.fork()
if pid == 0:  # the settings travel to forked workers, as the conversion pool's
    # Many 64 KB blocks (below the mmap threshold: from the heap), all freed again.
    blocks = [libc.malloc(64 << 10) for _ in range(800)]
    for b in blocks:
        libc.free(b)
    print(libc.mallinfo2().keepcost, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"""


def _kept(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_freed_memory_stays_in_forked_workers() -> None:
    # 50 MB freed at the heap's top: trimmed back to the kernel by default (under 128 KB plus
    # the pad left), kept once tuned.
    assert _kept("default") < 1 << 20
    assert _kept("tuned") > 40 << 20


def test_ingest_command_tunes_the_heap(tmp_path, monkeypatch) -> None:
    import tracelab.ingest.heap as heap
    from tracelab.cli import main

    calls = []
    monkeypatch.setattr(heap, "keep_freed_memory", lambda: calls.append(1) or True)
    trace = tmp_path / "missing.json"
    main(["ingest", str(trace), "--db", str(tmp_path / "s.duckdb")])
    assert calls == [1]
