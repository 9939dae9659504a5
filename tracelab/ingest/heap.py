"""Freed memory kept in the process during an ingest, not handed back to the kernel and faulted
in again.

An ingest allocates and frees large buffers over and over (a trace's scanned columns, Arrow
tables, numpy arrays of the parts). glibc's malloc gives freed memory at the top of its heap
back to the kernel once more than 128 KB is free there (M_TRIM_THRESHOLD), and grows the heap by
only what each request needs (M_TOP_PAD): the next buffer then faults every page in again, each
fault a trip into the kernel. On the 8-rank set (benchmarks/ingest.py) that was 262k page faults
and 1.2-1.6 s of system time in a 3.4-4.7 s ingest; keeping freed memory (trim threshold 1 GiB)
and growing the heap 256 MiB at a time took it to 186k faults and 0.8-1.3 s (four interleaved
runs each, 2026-12-06). Peak memory is not raised: the pages kept are ones the process already
held at its peak.

Only `tracelab ingest`'s own process and its conversion workers (forked from it) call this: not
the Python API, whose caller's process is not ours to tune, nor Ray's long-lived workers.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

#: mallopt's parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
#: Free memory at the heap's top kept before any is returned to the kernel.
TRIM_THRESHOLD = 1 << 30
#: Extra memory taken each time the heap grows (only pages touched count in RSS).
TOP_PAD = 256 << 20


def keep_freed_memory() -> bool:
    """Set glibc's trim threshold and top pad for this process (and the processes it forks);
    False where the C library is not glibc (nothing to tune, nothing changed)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl has no mallopt
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and bool(mallopt(M_TOP_PAD, TOP_PAD))
