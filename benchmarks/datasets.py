"""Benchmark data sets, built from the shared real traces (never committed: see .gitignore).

`rank_set(n)` is N copies of HTA's `df_index_resolver` trace (54 MB, 216k events, of which 123k
complete events) with `distributedInfo` rewritten to rank 0..N-1, written uncompressed: the
"8-rank, 430 MB, 1.7M-event set" the issues refer to at N=8. Only the `distributedInfo` object
is replaced, in the original text, so every copy keeps the trace's own layout and size.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TRACELAB_SHARED", REPO.parent / "shared"))
SOURCE = SHARED / "traces" / "hta" / "df_index_resolver" / "df_index_resolver.json.gz"
DATA = Path(os.environ.get("TRACELAB_BENCH_DATA", REPO / "bench_data"))


def single_rank() -> Path:
    """A folder holding the one uncompressed df_index_resolver trace."""
    return rank_set(1)


def rank_set(n: int, *, gz: bool = False) -> Path:
    """A folder of n rank files (built once, then reused); gzipped (level 6) when `gz`."""
    folder = DATA / f"df_index_resolver_{'gz' if gz else 'text'}_x{n}"
    done = folder / ".complete"
    if done.exists():
        unconverted(folder)
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    text = gzip.decompress(SOURCE.read_bytes())
    found = re.search(rb'"distributedInfo":\s*(\{[^{}]*\})', text)
    if found is None:
        raise SystemExit(f"{SOURCE}: no distributedInfo object to rewrite")
    info = json.loads(found.group(1))
    for rank in range(n):
        info.update(rank=rank, world_size=max(n, 2))
        new = json.dumps(info).encode()
        body = text[: found.start(1)] + new + text[found.end(1) :]
        if gz:
            (folder / f"rank-{rank}.json.gz").write_bytes(gzip.compress(body, 6, mtime=0))
        else:
            (folder / f"rank-{rank}.json").write_bytes(body)
    done.touch()
    return folder


def unconverted(folder: Path) -> None:
    """Refuse a data set with converted folders beside its traces (`tracelab convert`, or an
    ingest with `--engine ray`, leaves them there): an ingest registers such a folder instead
    of converting its trace, so it would measure another path. On 2026-12-07 such folders left
    in the 8-rank set made `results/ingest_v24.json` time their registration, not the
    conversion (benchmarks/README.md)."""
    found = sorted(d.name for d in folder.glob("*.tracelab"))
    if found:
        raise SystemExit(
            f"{folder}: converted folders beside the traces ({', '.join(found)}): an ingest "
            f"would register them rather than convert. Remove them: rm -r {folder}/*.tracelab"
        )
