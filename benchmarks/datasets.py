"""Benchmark data sets, built from the shared real traces (never committed: see .gitignore).

`rank_set(n)` is N copies of HTA's `df_index_resolver` trace (54 MB, 216k events, of which 123k
complete events) with `distributedInfo.rank` rewritten to 0..N-1, written uncompressed: the
"8-rank, 430 MB, 1.7M-event set" the issues refer to at N=8.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TRACELAB_SHARED", REPO.parent / "shared"))
SOURCE = SHARED / "traces" / "hta" / "df_index_resolver" / "df_index_resolver.json.gz"
DATA = Path(os.environ.get("TRACELAB_BENCH_DATA", REPO / "bench_data"))


def single_rank() -> Path:
    """A folder holding the one uncompressed df_index_resolver trace."""
    return rank_set(1)


def rank_set(n: int) -> Path:
    """A folder of n rank files (built once, then reused)."""
    folder = DATA / f"df_index_resolver_x{n}"
    done = folder / ".complete"
    if done.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(SOURCE, "rb") as fh:
        trace = json.load(fh)
    for rank in range(n):
        trace["distributedInfo"]["rank"] = rank
        trace["distributedInfo"]["world_size"] = max(n, 2)
        (folder / f"rank-{rank}.json").write_text(json.dumps(trace))
    done.touch()
    return folder
