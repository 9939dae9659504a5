"""`ProfileConfig`: what `tracelab.profile(...)` was asked to do, validated up front.

The schedule mirrors torch.profiler.schedule (skip_first, wait, warmup, active, repeat) so that
step numbers mean the same thing as torch's `ProfilerStep#N`; `steps=range(a, b)` is the short
form for one window that records steps a..b-1 after `warmup` steps.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tracelab.errors import UsageError

#: Set to 1 (or true/yes/on) to turn every tracelab.profile into a no-op.
DISABLE_ENV = "TRACELAB_DISABLE"
DIMS = ("dp", "tp", "pp", "cp", "ep")

Action = Literal["none", "warmup", "record", "record_and_save"]
RECORDING: frozenset[str] = frozenset({"record", "record_and_save"})
ACTIVE: frozenset[str] = frozenset({"warmup", "record", "record_and_save"})


def disabled_by_env() -> bool:
    return os.environ.get(DISABLE_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


@dataclass(frozen=True, kw_only=True)
class ProfileConfig:
    """Validated options of one `tracelab.profile` (see tracelab.collectors.profile)."""

    dir: Path
    steps: range | None = None
    wait: int = 0
    warmup: int = 1
    active: int | None = None
    repeat: int = 1
    skip_first: int = 0
    run_name: str | None = None
    enabled: bool = True
    mesh: Any = None
    parallelism: Mapping[str, int] | None = None
    coords: Mapping[str, int] | None = None
    pipeline: Any = None
    pp_stage: int | None = None
    model: Any = None
    optimizer: Any = None
    device: Any = None
    comm_timing: bool = True
    flight_recorder: bool = True
    memory: bool = True
    memory_snapshot: bool = False
    clock_sync: bool = True
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    control_timeout_s: float = 30.0
    convert: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", Path(self.dir))
        if self.steps is not None and self.active is not None:
            raise UsageError(
                "tracelab.profile: give either steps=range(...) or active=N "
                "(with wait/warmup/repeat), not both."
            )
        if self.steps is None and self.active is None:
            raise UsageError(
                "tracelab.profile: say which steps to record: steps=range(10, 15), "
                "or wait=..., warmup=..., active=N, repeat=...."
            )
        for name in ("wait", "warmup", "repeat", "skip_first"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise UsageError(
                    f"tracelab.profile: {name} must be an integer >= 0, got {value!r}."
                )
        if self.steps is not None:
            if not isinstance(self.steps, range) or self.steps.step != 1 or len(self.steps) == 0:
                raise UsageError(
                    "tracelab.profile: steps must be a non-empty range of "
                    f"consecutive steps such as range(10, 15), got {self.steps!r}."
                )
            if self.steps.start < self.warmup:
                raise UsageError(
                    f"tracelab.profile: steps={self.steps!r} starts before warmup={self.warmup} "
                    "steps can run; start the range at warmup or later, or pass warmup=0."
                )
            object.__setattr__(self, "skip_first", self.steps.start - self.warmup)
            object.__setattr__(self, "wait", 0)
            object.__setattr__(self, "active", len(self.steps))
            object.__setattr__(self, "repeat", 1)
        if not isinstance(self.active, int) or self.active < 1:
            raise UsageError(
                f"tracelab.profile: active must be an integer >= 1, got {self.active!r}."
            )
        if self.parallelism is not None:
            for key, size in self.parallelism.items():
                if key not in DIMS or not isinstance(size, int) or size < 1:
                    raise UsageError(
                        f"tracelab.profile: parallelism={dict(self.parallelism)!r}: keys must be "
                        f"among {DIMS} and sizes integers >= 1."
                    )
        if self.coords is not None and any(k not in DIMS for k in self.coords):
            raise UsageError(f"tracelab.profile: coords keys must be among {DIMS}.")
        if self.mesh is not None and self.parallelism is not None:
            raise UsageError(
                "tracelab.profile: give mesh= or parallelism=, not both "
                "(the mesh already says the parallelism)."
            )
        if not self.control_timeout_s > 0:
            raise UsageError("tracelab.profile: control_timeout_s must be > 0 seconds.")

    @property
    def cycle(self) -> int:
        assert self.active is not None
        return self.wait + self.warmup + self.active

    def action(self, step: int) -> Action:
        """What the profiler does during `step` (torch.profiler.schedule's rule)."""
        if step < self.skip_first:
            return "none"
        step -= self.skip_first
        if self.repeat > 0 and step // self.cycle >= self.repeat:
            return "none"
        mod = step % self.cycle
        if mod < self.wait:
            return "none"
        if mod < self.wait + self.warmup:
            return "warmup"
        return "record" if mod < self.cycle - 1 else "record_and_save"

    def schedule_dict(self) -> dict[str, int | None]:
        return {
            "skip_first": self.skip_first,
            "wait": self.wait,
            "warmup": self.warmup,
            "active": self.active,
            "repeat": self.repeat,
        }
