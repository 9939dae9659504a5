"""Timing every torch.distributed collective and point-to-point op while a window is active.

Every Python-level c10d call (`dist.all_reduce`, `all_gather_into_tensor`, `isend`,
`batch_isend_irecv`, FSDP2's and pipelining's calls, ...) ends in one method of the C++
`ProcessGroup` class. While a window is active those methods are replaced on the class by thin
wrappers, and the originals are put back when it ends. Hooking the methods rather than the
module functions keeps `dist.isend is distributed_c10d.isend` (batch_isend_irecv and pipelining
compare them by identity) and leaves Dynamo's rewriting of `dist.*` calls untouched.

Each wrapper notes the host enqueue time, then starts the op, then returns a `TimedWork`: a
`dist.Work` that forwards everything to the real work and notes the end when it is waited on.

- gloo (CPU): start = host clock just before the op is issued; end = host clock when the
  waiting call returns. Synchronous calls wait at once, so that is the completion; for
  async_op=True / isend / irecv it is when the caller waited (an upper bound). A future
  callback would be exact but runs Python on gloo's worker thread, and the GIL hand-off cost
  ~20 us per op here, four times the rest of the hook.
- NCCL (CUDA tensors): start = a CUDA event recorded on the current stream before the op (the
  collective's stream waits on that point); end = an event recorded on the current stream after
  the waiter's `wait()`, which makes that stream wait for the collective. No host
  synchronization is added: events are read back lazily at `step()`, and only the window's end
  waits for the last ones. Times become wall clock through one anchor event per window.

The DDP reducer and functional collectives run in C++ and never reach these wrappers; the
Flight Recorder covers them (see flight_recorder.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

from tracelab.collectors.records import P2P_OPS, CollectiveRecord
from tracelab.collectors.timed_work import TimedWork, describe, dtype_name, wall_ns_of

log = logging.getLogger("tracelab.collectors")

#: ProcessGroup method -> (op, index of the input argument, index of the output argument).
#: Indices count positional arguments after `self`; None = nothing moves that way.
_METHODS: dict[str, tuple[str, int | None, int | None]] = {
    "allreduce": ("all_reduce", 0, 0),
    "allreduce_coalesced": ("all_reduce", 0, 0),
    "broadcast": ("broadcast", 0, 0),
    "reduce": ("reduce", 0, 0),
    "allgather": ("all_gather", 1, 0),
    "all_gather_single": ("all_gather", 1, 0),
    "_allgather_base": ("all_gather", 1, 0),
    "allgather_coalesced": ("all_gather", 1, 0),
    "allgather_into_tensor_coalesced": ("all_gather", 1, 0),
    "all_gather_single_coalesced": ("all_gather", 1, 0),
    "reduce_scatter": ("reduce_scatter", 1, 0),
    "reduce_scatter_single": ("reduce_scatter", 1, 0),
    "_reduce_scatter_base": ("reduce_scatter", 1, 0),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", 1, 0),
    "reduce_scatter_single_coalesced": ("reduce_scatter", 1, 0),
    "alltoall": ("all_to_all", 1, 0),
    "alltoall_base": ("all_to_all", 1, 0),
    "all_to_all_single": ("all_to_all", 1, 0),
    "gather": ("gather", 1, 0),
    "scatter": ("scatter", 1, 0),
    "barrier": ("barrier", None, None),
    "send": ("send", 0, None),
    "recv": ("recv", None, 0),
    "recv_anysource": ("recv", None, 0),
}


class CommTimer:
    """Collects `CollectiveRecord`s of one rank while installed. Not reentrant across windows:
    `install()` / `uninstall()` bracket each window and `drain()` hands over its records."""

    def __init__(self, *, rank: int, on_error: Callable[[BaseException], None]) -> None:
        self.rank = rank
        self.step = 0
        self.window = 0
        self._on_error = on_error
        self._live = False
        self._originals: dict[str, Any] = {}
        self._records: list[CollectiveRecord] = []
        self._pending_cuda: list[CollectiveRecord] = []
        self._seq: dict[str, int] = {}
        self._p2p_seq: dict[tuple[str, int, int], int] = {}
        self._pg_info: dict[int, tuple[str, str, list[int] | None]] = {}
        self._excluded: set[int] = set()
        self._coalescing: dict[int, list[CollectiveRecord]] = {}
        self._anchor: tuple[int, Any, int] | None = None  # (device index, event, wall ns)

    # -- lifecycle ---------------------------------------------------------------------------

    def exclude(self, group: Any) -> None:
        """Never record ops on `group` (tracelab's own clock-exchange group)."""
        self._excluded.add(id(group))

    def install(self, window: int) -> None:
        self.window = window
        self._anchor = _cuda_anchor()
        for name in (*_METHODS, "_start_coalescing", "_end_coalescing"):
            orig = ProcessGroup.__dict__.get(name)
            if orig is None or name in self._originals:
                continue
            self._originals[name] = orig
            setattr(ProcessGroup, name, self._make_hook(name, orig))
        self._live = True

    def uninstall(self) -> None:
        self._live = False
        for name, orig in self._originals.items():
            setattr(ProcessGroup, name, orig)
        self._originals.clear()
        self._coalescing.clear()

    @property
    def installed(self) -> bool:
        return bool(self._originals)

    def poll(self) -> None:
        """Read back CUDA events that have completed; never blocks."""
        if self._pending_cuda:
            self._pending_cuda = [
                r for r in self._pending_cuda if not self._resolve(r, block=False)
            ]

    def drain(self) -> list[CollectiveRecord]:
        """The window's records, with every CUDA event read back (this may wait for the
        device: it runs at the window's end only)."""
        for rec in self._pending_cuda:
            self._resolve(rec, block=True)
        self._pending_cuda = []
        out, self._records = self._records, []
        return out

    # -- the hooks ---------------------------------------------------------------------------

    def _make_hook(self, name: str, orig: Any) -> Callable[..., Any]:
        timer = self
        if name == "_start_coalescing":

            def start_coalescing(pg: Any, *args: Any, **kwargs: Any) -> Any:
                if timer._live and id(pg) not in timer._excluded:
                    timer._coalescing[id(pg)] = []
                return orig(pg, *args, **kwargs)

            return start_coalescing
        if name == "_end_coalescing":

            def end_coalescing(pg: Any, *args: Any, **kwargs: Any) -> Any:
                work = orig(pg, *args, **kwargs)
                recs = timer._coalescing.pop(id(pg), None)
                if recs and work is not None and timer._live:
                    return TimedWork(work, recs, timer)
                return work

            return end_coalescing

        op, in_idx, out_idx = _METHODS[name]

        def hook(pg: Any, *args: Any, **kwargs: Any) -> Any:
            if not timer._live or id(pg) in timer._excluded or torch.compiler.is_compiling():
                return orig(pg, *args, **kwargs)
            rec = timer._begin(pg, name, op, in_idx, out_idx, args)
            work = orig(pg, *args, **kwargs)
            if rec is None:
                return work
            return timer._issued(rec, work)

        hook.__name__ = name
        hook.__qualname__ = f"ProcessGroup.{name}"
        hook.__doc__ = getattr(orig, "__doc__", None)
        return hook

    def _begin(
        self,
        pg: Any,
        name: str,
        op: str,
        in_idx: int | None,
        out_idx: int | None,
        args: tuple[Any, ...],
    ) -> CollectiveRecord | None:
        try:
            enqueue = time.time_ns()
            pg_name, pg_desc, ranks = self._group(pg)
            in_bytes, first = _side(args, in_idx)
            out_bytes, first_out = _side(args, out_idx)
            if first is None:
                first = first_out
            rec = CollectiveRecord(
                op=op,
                pg_name=pg_name,
                pg_desc=pg_desc,
                pg_ranks=ranks,
                group_size=len(ranks) if ranks is not None else pg.size(),
                in_bytes=in_bytes,
                out_bytes=out_bytes,
                dtype=dtype_name(first),
                enqueue_ns=enqueue,
                step=self.step,
                window=self.window,
            )
            if op == "all_to_all":
                rec.in_split_bytes, rec.out_split_bytes = _split_bytes(name, args, rec.group_size)
            if op in P2P_OPS:
                self._p2p_peer_and_seq(rec, name, args, ranks)
            else:
                self._seq[pg_name] = self._seq.get(pg_name, 0) + 1
                rec.seq = self._seq[pg_name]
            if (
                first is not None
                and first.is_cuda
                and self._anchor is not None
                and first.device.index == self._anchor[0]
            ):
                start = torch.cuda.Event(enable_timing=True)
                start.record()
                rec.cuda_events = [start, None]
            else:
                rec.start_ns = time.time_ns()
            self._records.append(rec)  # list.append is atomic: no lock on the hot path
            coalesced = self._coalescing.get(id(pg))
            if coalesced is not None:
                coalesced.append(rec)
            return rec
        except Exception as exc:  # never let timing break the op
            self._on_error(exc)
            return None

    def _issued(self, rec: CollectiveRecord, work: Any) -> Any:
        try:
            rec.issued_ns = time.time_ns()
            if work is None:
                return work
            if rec.cuda_events is not None:
                self._pending_cuda.append(rec)
            return TimedWork(work, [rec], self)
        except Exception as exc:
            self._on_error(exc)
            return work

    # -- helpers -----------------------------------------------------------------------------

    def _group(self, pg: Any) -> tuple[str, str, list[int] | None]:
        info = self._pg_info.get(id(pg))
        if info is None:
            try:
                ranks: list[int] | None = list(dist.get_process_group_ranks(pg))
            except Exception:
                ranks = None
            info = (str(pg.group_name), str(pg.group_desc), ranks)
            self._pg_info[id(pg)] = info
        return info

    def _p2p_peer_and_seq(
        self, rec: CollectiveRecord, name: str, args: tuple[Any, ...], ranks: list[int] | None
    ) -> None:
        if name == "recv_anysource" or len(args) < 2:
            return  # peer known only once the work completes (TimedWork fills it)
        group_peer = int(args[1])
        rec.peer = ranks[group_peer] if ranks is not None else group_peer
        src, dst = (self.rank, rec.peer) if rec.op == "send" else (rec.peer, self.rank)
        key = (rec.pg_name or "", src, dst)
        self._p2p_seq[key] = self._p2p_seq.get(key, 0) + 1
        rec.seq = self._p2p_seq[key]

    def global_peer(self, rec: CollectiveRecord, group_rank: int) -> int:
        return rec.pg_ranks[group_rank] if rec.pg_ranks else group_rank

    def mark_end(self, rec: CollectiveRecord, when_ns: int) -> None:
        """The op completed no later than `when_ns` (keeps the earliest evidence)."""
        if rec.end_ns is None or when_ns < rec.end_ns:
            rec.end_ns = when_ns

    def _resolve(self, rec: CollectiveRecord, *, block: bool) -> bool:
        """Turn a record's CUDA events into wall-clock times; False if not complete yet."""
        events = rec.cuda_events
        anchor = self._anchor
        if events is None or anchor is None:
            return True
        start, end = events
        try:
            last = end if end is not None else start
            if block:
                last.synchronize()
            elif not last.query():
                return False
            rec.start_ns = wall_ns_of(anchor, start)
            if end is not None:
                rec.end_ns = wall_ns_of(anchor, end)
        except Exception as exc:
            self._on_error(exc)
        rec.cuda_events = None
        return True


def _side(args: tuple[Any, ...], index: int | None) -> tuple[int | None, Any]:
    """(bytes, first tensor) of one direction of an op: 0 when nothing moves that way."""
    if index is None:
        return 0, None
    if index >= len(args):
        return None, None
    return describe(args[index])


def _split_bytes(
    name: str, args: tuple[Any, ...], group_size: int | None
) -> tuple[list[int] | None, list[int] | None]:
    """Bytes per peer of an all-to-all, (sent to, received from): `alltoall` takes a tensor per
    peer (output list, input list); `alltoall_base` and `all_to_all_single` take (output,
    input, output_split_sizes, input_split_sizes), splits in rows of dim 0, empty when even."""
    if name == "alltoall":
        if len(args) < 2 or not isinstance(args[0], (list, tuple)):
            return None, None
        sizes = [[int(t.nbytes) for t in side] for side in (args[1], args[0])]
        return sizes[0], sizes[1]
    if len(args) < 2 or not all(isinstance(t, torch.Tensor) for t in args[:2]):
        return None, None
    out_t, in_t = args[0], args[1]
    out_splits = list(args[2]) if len(args) > 2 and args[2] is not None else []
    in_splits = list(args[3]) if len(args) > 3 and args[3] is not None else []

    def per_peer(t: torch.Tensor, splits: list[int]) -> list[int] | None:
        rows = int(t.shape[0]) if t.dim() else 0
        if splits:
            row_bytes = t.nbytes // rows if rows else 0
            return [int(x) * row_bytes for x in splits]
        if not group_size:
            return None
        return [t.nbytes // group_size] * group_size

    return per_peer(in_t, in_splits), per_peer(out_t, out_splits)


def _cuda_anchor() -> tuple[int, Any, int] | None:
    """One CUDA event whose wall-clock time is known, to turn event times into wall clock.
    Synchronizes the device once, at a window's start (never outside a window)."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    device = torch.cuda.current_device()
    torch.cuda.synchronize(device)
    event = torch.cuda.Event(enable_timing=True)
    before = time.time_ns()
    event.record()
    after = time.time_ns()
    event.synchronize()
    return (device, event, (before + after) // 2)
