"""One collective or point-to-point operation, as written to `rank-N/collectives.jsonl`.

The record's fields are those of docs/capture-format.md. Records are mutable while the op is in
flight (its end arrives when the work completes, or when a CUDA event is read back) and frozen
into one JSON line when the window is flushed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

#: Normalized collective kinds (docs/capture-format.md, and the `collectives.op` column).
OPS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "send",
    "recv",
    "barrier",
    "gather",
    "scatter",
    "unknown",
)
P2P_OPS = frozenset({"send", "recv"})

#: Flight Recorder / trace profiling names (after the "gloo:" / "nccl:" prefix) -> kind.
_FR_NAMES = {
    "all_reduce": "all_reduce",
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_gather": "all_gather",
    "_allgather_base": "all_gather",
    "allgather": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "allgather_coalesced": "all_gather",
    "all_gather_base": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "all_to_all": "all_to_all",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
    "barrier": "barrier",
    "gather": "gather",
    "scatter": "scatter",
    "send": "send",
    "recv": "recv",
}


def op_from_profiling_name(name: str) -> str:
    """`gloo:all_reduce` / `nccl:_allgather_base` -> the normalized kind ('unknown' if new)."""
    base = name.split(":", 1)[-1].strip().lower()
    return _FR_NAMES.get(base, "unknown")


@dataclass(slots=True, kw_only=True)
class CollectiveRecord:
    """One op on this rank. Times are Unix wall-clock ns; sizes are bytes; None = unknown."""

    op: str
    source: str = "collector"
    pg_name: str | None = None
    pg_desc: str | None = None
    pg_ranks: list[int] | None = None
    group_size: int | None = None
    seq: int | None = None
    in_bytes: int | None = None
    out_bytes: int | None = None
    #: all_to_all: bytes sent to / received from each rank of the group, in group-rank order
    #: (from the split sizes, or the tensors of a list all-to-all); None for other ops.
    in_split_bytes: list[int] | None = None
    out_split_bytes: list[int] | None = None
    dtype: str | None = None
    peer: int | None = None
    enqueue_ns: int | None = None
    start_ns: int | None = None
    end_ns: int | None = None
    step: int | None = None
    window: int | None = None
    #: Host time when the issuing call returned (used to match Flight Recorder entries).
    issued_ns: int | None = field(default=None, repr=False)
    #: CUDA events (start, end) still to be read back; None on gloo/CPU.
    cuda_events: Any = field(default=None, repr=False, compare=False)

    def to_json(self, *, ranks: bool = True) -> str:
        """The record's line; `ranks=False` writes `pg_ranks` as null (a named group's list
        is written on its first record of the file only: docs/capture-format.md)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _PRIVATE}
        if not ranks:
            data["pg_ranks"] = None
        return json.dumps(data, separators=(",", ":"))


_PRIVATE = frozenset({"issued_ns", "cuda_events"})
