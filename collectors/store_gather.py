"""Gathering each rank's metadata on rank 0 through the job's rendezvous store.

Why not `dist.gather_object` on tracelab's gloo group: a gloo collective's work object is freed
on one of gloo's worker threads after it completes, and freeing it drops the tensors' Python
objects, which needs the GIL. When that free loses the race against the process's exit (the
gather is the last thing a profile does, and many scripts exit right after), the thread finds the
interpreter finalizing and the process dies with "terminate called without an active exception"
(SIGABRT), after a capture that was otherwise complete. Store calls run on the caller's thread
and hold no tensors, so nothing is left behind for a worker thread.

Rank r sets one key; rank 0 waits for every key up to a timeout, reads and deletes them. Keys
carry a per-process sequence number, so two profiles in one job do not read each other's.
"""

from __future__ import annotations

import itertools
import json
from datetime import timedelta
from typing import Any

PREFIX = "tracelab/rank-meta"
_sequence = itertools.count()


def default_store() -> Any:
    """The default process group's store, or None when torch does not expose one."""
    import torch.distributed.distributed_c10d as c10d

    getter = getattr(c10d, "_get_default_store", None)
    if getter is None:
        return None
    try:
        return getter()
    except Exception:  # no default group, or a torch that keeps it elsewhere
        return None


def next_key() -> str:
    """The key prefix for this process's next gather (the same on every rank, which create
    their profiles in the same order)."""
    return f"{PREFIX}/{next(_sequence)}"


def gather_json(
    store: Any,
    key: str,
    entry: dict[str, Any],
    *,
    rank: int,
    world_size: int,
    timeout_s: float,
) -> list[dict[str, Any]] | None:
    """Every rank's `entry` on rank 0 (in rank order), None elsewhere.

    Raises what the store raises (a timeout names the keys that never came) so that the
    caller can fall back to other means.
    """
    store.set(f"{key}/{rank}", json.dumps(entry))
    if rank != 0:
        return None
    keys = [f"{key}/{r}" for r in range(world_size)]
    store.wait(keys, timedelta(seconds=timeout_s))
    try:
        values = store.multi_get(keys)  # one round trip for a thousand ranks
    except (AttributeError, RuntimeError, NotImplementedError):  # stores without it
        values = [store.get(k) for k in keys]
    out = [json.loads(v) for v in values]
    for k in keys:
        try:
            store.delete_key(k)
        except Exception:  # a store without deletes keeps a few kB until the job ends
            break
    return out
