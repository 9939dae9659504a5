"""Tiny Kineto trace writer for the foundation's tests (bad input, ranks, precision)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any


def trace(
    rank: int | None = 0,
    world: int = 2,
    events: list[dict[str, Any]] | None = None,
    base: int | None = 1_700_000_000_000_000_000,
    **extra: Any,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schemaVersion": 1,
        "traceEvents": events
        if events is not None
        else [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "ProfilerStep#1",
                "pid": 1,
                "tid": 1,
                "ts": 0.0,
                "dur": 100.0,
                "args": {},
            },
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": 1,
                "tid": 1,
                "ts": 10.5,
                "dur": 20.25,
                "args": {"External id": 7},
            },
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": 12.0,
                "dur": 3.0,
                "args": {"correlation": 42, "External id": 7},
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": "sm90_gemm",
                "pid": 0,
                "tid": 7,
                "ts": 20.0,
                "dur": 50.0,
                "args": {"correlation": 42, "stream": 7, "device": 0},
            },
            {
                "ph": "i",
                "cat": "cpu_instant_event",
                "name": "[memory]",
                "pid": 1,
                "tid": 1,
                "ts": 11.0,
                "s": "t",
                "args": {
                    "Bytes": 1024,
                    "Total Allocated": 4096,
                    "Total Reserved": 8192,
                    "Device Type": 1,
                    "Device Id": 0,
                    "Addr": 1,
                },
            },
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}},
        ],
    }
    if rank is not None:
        doc["distributedInfo"] = {
            "backend": "nccl",
            "rank": rank,
            "world_size": world,
            "pg_config": [
                {
                    "pg_name": "0",
                    "pg_desc": "default_pg",
                    "pg_size": world,
                    "ranks": list(range(world)),
                }
            ],
        }
    if base is not None:
        doc["baseTimeNanoseconds"] = base
    doc.update(extra)
    return doc


def write(path: Path, doc: Any, *, gz: bool | None = None) -> Path:
    data = json.dumps(doc).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz if gz is not None else path.name.endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def run_set(folder: Path, ranks: int = 2, **kw: Any) -> Path:
    for r in range(ranks):
        write(folder / f"rank-{r}.json", trace(rank=r, world=ranks, **kw))
    return folder
