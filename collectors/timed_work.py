"""`TimedWork`: the `dist.Work` handed back to callers while a window is active.

It forwards every method of `dist.Work` to the real work object (a Python subclass of the C++
class would otherwise answer with the base class's own, empty state) and, when the caller waits,
notes the end of its records: a host timestamp on gloo, a CUDA event on the current stream for
NCCL (that stream has just been made to wait for the collective).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from tracelab.collectors.comm_timing import CommTimer
    from tracelab.collectors.records import CollectiveRecord


class TimedWork(dist.Work):
    """A `dist.Work` that marks its records' end when waited on."""

    def __init__(self, inner: Any, records: list[CollectiveRecord], timer: CommTimer) -> None:
        super().__init__()
        self._inner = inner
        self._records = records
        self._timer = timer

    def _finished(self) -> None:
        try:
            now = time.time_ns()
            for rec in self._records:
                if rec.cuda_events is not None:
                    if rec.cuda_events[1] is None:
                        end = torch.cuda.Event(enable_timing=True)
                        end.record()
                        rec.cuda_events[1] = end
                else:
                    self._timer.mark_end(rec, now)
                if rec.op == "recv" and rec.peer is None:
                    rec.peer = self._timer.global_peer(rec, int(self._inner._source_rank()))
        except Exception as exc:
            self._timer._on_error(exc)

    def wait(self, timeout: Any = None) -> bool:
        ok = self._inner.wait() if timeout is None else self._inner.wait(timeout)
        self._finished()
        return bool(ok)

    def synchronize(self) -> None:
        self._inner.synchronize()
        self._finished()

    def block_current_stream(self) -> None:
        self._inner.block_current_stream()
        self._finished()

    def is_completed(self) -> bool:
        return bool(self._inner.is_completed())

    def is_success(self) -> bool:
        return bool(self._inner.is_success())

    def exception(self) -> Any:
        return self._inner.exception()

    def source_rank(self) -> int:
        return int(self._inner.source_rank())

    def _source_rank(self) -> int:
        return int(self._inner._source_rank())

    def result(self) -> list[torch.Tensor]:
        return list(self._inner.result())

    def get_future(self) -> Any:
        return self._inner.get_future()

    def get_future_result(self) -> Any:
        return self._inner.get_future_result()

    def _get_duration(self) -> float:
        return float(self._inner._get_duration())

    def _get_op_type(self) -> Any:
        return self._inner._get_op_type()

    def boxed(self) -> Any:
        return self._inner.boxed()


def describe(x: Any) -> tuple[int | None, torch.Tensor | None]:
    """(bytes, first tensor) of a tensor or a (nested) list of tensors, in one pass; bytes is
    None when `x` holds no tensor at all (an empty list holds 0 bytes)."""
    if isinstance(x, torch.Tensor):
        return x.nbytes, x
    if isinstance(x, (list, tuple)):
        total, first, seen = 0, None, not x
        for item in x:
            n, t = describe(item)
            if n is not None:
                total += n
                seen = True
            if first is None:
                first = t
        return (total if seen else None), first
    return None, None


_DTYPE_NAMES: dict[torch.dtype, str] = {}


def dtype_name(t: torch.Tensor | None) -> str | None:
    """'float32' for a float32 tensor (cached: this runs on every hooked op)."""
    if t is None:
        return None
    name = _DTYPE_NAMES.get(t.dtype)
    if name is None:
        name = _DTYPE_NAMES[t.dtype] = str(t.dtype).removeprefix("torch.")
    return name


def wall_ns_of(anchor: tuple[int, Any, int], event: Any) -> int:
    """Wall-clock ns of a completed CUDA event, from the window's anchor event."""
    _, anchor_event, anchor_ns = anchor
    return anchor_ns + round(anchor_event.elapsed_time(event) * 1e6)
