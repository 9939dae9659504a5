"""NTP-style clock offsets of every rank relative to rank 0.

At each window's start and end, rank 0 exchanges a few tiny messages with every other rank in
turn. For one exchange the client (rank r) notes t1 when it sends, rank 0 notes t2 on receipt and
t3 on reply, and rank r notes t4 on receipt. Then rank 0's clock minus rank r's is
theta = ((t2 - t1) + (t3 - t4)) / 2, and the round trip is delta = (t4 - t1) - (t3 - t2). The
true offset lies within delta / 2 of theta, so the exchange with the smallest round trip wins.

The messages travel on a private gloo group (CPU tensors, no device in the path even on NCCL
jobs) created once by `profile.__enter__`, with a short timeout: a rank that stops answering
costs the others one timeout, after which they stop measuring, and it can never consume a
message meant for the training loop.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger("tracelab.collectors")

SAMPLES_PER_EXCHANGE = 8


def control_group(timeout_s: float) -> Any:
    """tracelab's private gloo group over all ranks (clock exchanges).

    Collective: every rank of the default group must call it at the same point. None when the
    job is not distributed or has a single rank.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))


@dataclass(frozen=True, kw_only=True, slots=True)
class ClockSample:
    """The best of one exchange: this rank's clock minus rank 0's, and its round trip."""

    when: str
    window: int
    offset_ns: int
    rtt_ns: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "when": self.when,
            "window": self.window,
            "offset_ns": self.offset_ns,
            "rtt_ns": self.rtt_ns,
        }


@dataclass(kw_only=True)
class ClockSync:
    """Runs exchanges over `group` and keeps this rank's samples."""

    group: Any
    rank: int
    world_size: int
    samples: list[ClockSample] = field(default_factory=list)
    failed: bool = False

    def exchange(self, when: str, window: int) -> ClockSample | None:
        """Collective over the group. Returns this rank's best sample (rank 0: offset 0)."""
        if self.failed:
            return None
        if self.world_size == 1 or self.rank == 0:
            if self.world_size > 1:
                try:
                    self._serve()
                except Exception as exc:
                    self._fail(exc)
                    return None
            sample = ClockSample(when=when, window=window, offset_ns=0, rtt_ns=0)
        else:
            try:
                theta, rtt = self._ask()
            except Exception as exc:
                self._fail(exc)
                return None
            sample = ClockSample(when=when, window=window, offset_ns=-theta, rtt_ns=rtt)
        self.samples.append(sample)
        return sample

    def summary(self) -> dict[str, Any]:
        """The manifest's `clock` object: offset/uncertainty of the tightest sample."""
        if self.rank == 0:
            return {
                "offset_ns": 0,
                "uncertainty_ns": 0,
                "reference_rank": 0,
                "samples": [s.to_dict() for s in self.samples],
            }
        if not self.samples:
            return {"offset_ns": None, "uncertainty_ns": None, "reference_rank": 0, "samples": []}
        best = min(self.samples, key=lambda s: s.rtt_ns)
        return {
            "offset_ns": best.offset_ns,
            "uncertainty_ns": best.rtt_ns // 2,
            "reference_rank": 0,
            "samples": [s.to_dict() for s in self.samples],
        }

    # -- protocol ----------------------------------------------------------------------------

    def _serve(self) -> None:
        ping = torch.zeros(1, dtype=torch.int64)
        pong = torch.zeros(2, dtype=torch.int64)
        for peer in range(1, self.world_size):
            for _ in range(SAMPLES_PER_EXCHANGE):
                dist.recv(ping, src=peer, group=self.group)
                t2 = time.time_ns()
                pong[0] = t2
                pong[1] = time.time_ns()
                dist.send(pong, dst=peer, group=self.group)

    def _ask(self) -> tuple[int, int]:
        ping = torch.zeros(1, dtype=torch.int64)
        pong = torch.zeros(2, dtype=torch.int64)
        best: tuple[int, int] | None = None
        for _ in range(SAMPLES_PER_EXCHANGE):
            t1 = time.time_ns()
            dist.send(ping, dst=0, group=self.group)
            dist.recv(pong, src=0, group=self.group)
            t4 = time.time_ns()
            t2, t3 = int(pong[0]), int(pong[1])
            theta = ((t2 - t1) + (t3 - t4)) // 2
            rtt = (t4 - t1) - (t3 - t2)
            if best is None or rtt < best[1]:
                best = (theta, rtt)
        assert best is not None
        return best

    def _fail(self, exc: BaseException) -> None:
        self.failed = True
        log.warning(
            "tracelab: clock exchange failed on rank %d (%s); clock offsets of this "
            "rank stay unmeasured from here on.",
            self.rank,
            exc,
        )
