"""Per-step memory peaks of one rank, and an optional allocator snapshot.

On CUDA the caching allocator's peak counters are read and reset at every active step boundary:
they are host-side counters, so this adds no device synchronization. On every rank the process's
peak resident set of the step is read from /proc (VmHWM, reset through /proc/self/clear_refs
where the kernel allows it; otherwise the current RSS at the step's end is all we have, and
`rss_is_peak` says so). About 20 us per recorded step in all. A trace's own `[memory]` events
only see allocations made after profiling started, so these peaks are the true ones.
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("tracelab.collectors")

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_HWM = re.compile(rb"VmHWM:\s+(\d+) kB")
_RSS = re.compile(rb"VmRSS:\s+(\d+) kB")


class MemoryTracker:
    """Call `begin_step()` when an active step starts and `end_step(step)` when it ends.

    Given the job's modules and optimizers (`model`, `optimizer`, or a pipelining schedule's
    stages), it also counts the rank's model states once: at the first recorded step's start,
    the bytes already live (which a CPU trace's allocator events never see), and at its end,
    the parameter, gradient and optimizer-state bytes (`model_states`, docs/capture-format.md).
    """

    def __init__(
        self,
        *,
        device: torch.device,
        snapshot_dir: Path | None,
        model: Any = None,
        optimizer: Any = None,
        pipeline: Any = None,
    ) -> None:
        self.device = device
        self.peaks: list[dict[str, Any]] = []
        self.model_states: dict[str, Any] | None = None
        self._model, self._optimizer, self._pipeline = model, optimizer, pipeline
        self._live_at_start: int | None = None
        self.snapshot_path: str | None = None
        self._snapshot_dir = snapshot_dir
        self._snapshot_step: int | None = None
        # Both files stay open: re-opening them costs more than reading (~30 us vs ~9 us).
        self._status_fd = _open(_STATUS, os.O_RDONLY)
        self._clear_fd = _open(_CLEAR_REFS, os.O_WRONLY)
        self.rss_is_peak = self._status_fd is not None and self._clear_fd is not None

    @property
    def _cuda(self) -> bool:
        return self.device.type == "cuda" and torch.cuda.is_initialized()

    def begin_step(self, step: int) -> None:
        if self._live_at_start is None and (self._model is not None or self._pipeline is not None):
            self._live_at_start = live_state_bytes(
                modules(self._model, self._pipeline), optimizers(self._optimizer)
            )
        if self._cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        self._reset_rss_peak()
        if (
            self._snapshot_dir is not None
            and self.snapshot_path is None
            and self._snapshot_step is None
            and self._cuda
        ):
            torch.cuda.memory._record_memory_history(max_entries=100_000)
            self._snapshot_step = step

    def end_step(self, step: int) -> None:
        entry: dict[str, Any] = {
            "step": step,
            "ts_ns": time.time_ns(),
            "device_type": self.device.type,
            "device_id": self.device.index if self.device.type == "cuda" else None,
            "peak_allocated_bytes": None,
            "peak_reserved_bytes": None,
            "rss_bytes": self._read_status(_HWM if self.rss_is_peak else _RSS),
            "rss_is_peak": self.rss_is_peak,
        }
        if self._cuda:
            entry["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated(self.device))
            entry["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved(self.device))
        self.peaks.append(entry)
        if self.model_states is None and self._live_at_start is not None:
            self.model_states = count_model_states(
                self._model, self._optimizer, self._pipeline, step=step
            )
            self.model_states["live_at_window_start_bytes"] = self._live_at_start
        if self._snapshot_step == step and self._snapshot_dir is not None:
            self._dump_snapshot(step)

    def _dump_snapshot(self, step: int) -> None:
        assert self._snapshot_dir is not None
        path = self._snapshot_dir / f"memory-snapshot-step-{step}.pickle"
        try:
            torch.cuda.memory._dump_snapshot(str(path))
            self.snapshot_path = path.name
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
            self._snapshot_step = None

    def _reset_rss_peak(self) -> None:
        if self._clear_fd is None:
            return
        try:
            os.write(self._clear_fd, b"5")  # 5: reset the peak RSS (VmHWM) to the current RSS
        except OSError:
            self.close_fd("_clear_fd")
            self.rss_is_peak = False

    def _read_status(self, field: re.Pattern[bytes]) -> int | None:
        if self._status_fd is None:
            return None
        try:
            found = field.search(os.pread(self._status_fd, 8192, 0))
        except OSError:
            return None
        return int(found.group(1)) * 1024 if found else None

    def close_fd(self, name: str) -> None:
        fd = getattr(self, name)
        setattr(self, name, None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def close(self) -> None:
        self.close_fd("_status_fd")
        self.close_fd("_clear_fd")


def _open(path: Path, flags: int) -> int | None:
    try:
        return os.open(path, flags)
    except OSError:
        return None


# -- model states ------------------------------------------------------------------------------


def modules(model: Any, pipeline: Any) -> list[tuple[int | None, torch.nn.Module]]:
    """(stage index or None, module) of everything this rank trains: a pipelining schedule's
    stages' submodules, else `model` (a module or a list of them)."""
    stages = getattr(pipeline, "_stages", None)
    if stages is None and getattr(pipeline, "_stage", None) is not None:
        stages = [pipeline._stage]
    if stages:
        return [(int(s.stage_index), s.submod) for s in stages]
    given = model if isinstance(model, list | tuple) else [model] if model is not None else []
    return [(None, m) for m in given if isinstance(m, torch.nn.Module)]


def optimizers(optimizer: Any) -> list[Any]:
    if optimizer is None:
        return []
    return list(optimizer) if isinstance(optimizer, list | tuple) else [optimizer]


def _local(t: Any) -> torch.Tensor | None:
    """The tensor this rank holds: a DTensor's local shard, else the tensor itself."""
    local = getattr(t, "_local_tensor", None)
    t = local if isinstance(local, torch.Tensor) else t
    return t if isinstance(t, torch.Tensor) else None


def _numel(t: Any) -> int:
    local = _local(t)
    return int(local.numel()) if local is not None else 0


def _storage_bytes(tensors: list[Any], seen: set[int]) -> int:
    """Bytes of the storages behind `tensors` not yet in `seen` (a storage counts once)."""
    total = 0
    for t in tensors:
        local = _local(t)
        if local is None or local.device.type == "meta":
            continue
        storage = local.untyped_storage()
        key = storage.data_ptr()
        if key in seen or storage.nbytes() == 0:
            continue
        seen.add(key)
        total += int(storage.nbytes())
    return total


def _optimizer_tensors(optims: list[Any]) -> list[Any]:
    out: list[Any] = []
    for opt in optims:
        for state in getattr(opt, "state", {}).values():
            if isinstance(state, dict):
                out += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return out


def live_state_bytes(mods: list[tuple[int | None, torch.nn.Module]], optims: list[Any]) -> int:
    """Bytes of parameters, existing gradients and optimizer states live now."""
    params = [p for _, m in mods for p in m.parameters()]
    seen: set[int] = set()
    return (
        _storage_bytes(params, seen)
        + _storage_bytes([p.grad for p in params if p.grad is not None], seen)
        + _storage_bytes(_optimizer_tensors(optims), seen)
    )


def layer_count(module: torch.nn.Module) -> int:
    """Layers of a stage: the entries of its largest ModuleList/ModuleDict (torchtitan's
    `layers`), else its direct children that hold parameters."""
    lists = [
        len(m) for m in module.modules() if isinstance(m, torch.nn.ModuleList | torch.nn.ModuleDict)
    ]
    if lists:
        return max(lists)
    return sum(1 for c in module.children() if any(True for _ in c.parameters()))


def _microbatch_size(pipeline: Any) -> int | None:
    if isinstance(pipeline, dict):
        size = pipeline.get("microbatch_size")
        return int(size) if isinstance(size, int) else None
    stages = getattr(pipeline, "_stages", None) or [getattr(pipeline, "_stage", None)]
    for stage in stages:
        meta = getattr(getattr(stage, "_user_meta", None), "inputs", None) or getattr(
            stage, "inputs_meta", None
        )
        if meta:
            shape = getattr(meta[0], "shape", None)
            if shape:
                return int(shape[0])
    return None


def _meta_bytes(metas: Any) -> int | None:
    """Bytes of one microbatch of a stage's inputs or outputs, from torch's stage metadata."""
    if not metas:
        return None
    total = 0
    for meta in metas:
        shape, dtype = getattr(meta, "shape", None), getattr(meta, "dtype", None)
        if shape is None or dtype is None:
            return None
        total += int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
    return total


def boundary_bytes(pipeline: Any) -> dict[int, dict[str, int | None]]:
    """Per stage index: one microbatch's input and output bytes (what its sends carry)."""
    stages = getattr(pipeline, "_stages", None) or [getattr(pipeline, "_stage", None)]
    out: dict[int, dict[str, int | None]] = {}
    for stage in stages:
        meta = getattr(stage, "_stage_meta", None)
        if stage is None or meta is None:
            continue
        out[int(stage.stage_index)] = {
            "input_bytes": _meta_bytes(getattr(meta, "inputs", None)),
            "output_bytes": _meta_bytes(getattr(meta, "outputs", None)),
        }
    return out


def count_model_states(model: Any, optimizer: Any, pipeline: Any, *, step: int) -> dict[str, Any]:
    """The rank's model states (docs/capture-format.md, `model_states`). A parameter that
    requires a gradient but holds none now (zero_grad(set_to_none=True) ran) is counted at its
    own size: the gradient it holds during backward."""
    mods = modules(model, pipeline)
    optims = optimizers(optimizer)
    edges = boundary_bytes(pipeline) if pipeline is not None else {}
    seen: set[int] = set()
    stages = []
    param_total = 0
    for stage, module in mods:
        params = list(module.parameters())
        nbytes = _storage_bytes(params, seen)
        param_total += nbytes
        stages.append(
            {
                "stage": stage,
                "param_bytes": nbytes,
                "params": int(sum(_numel(p) for p in params)),
                "layers": layer_count(module),
                **edges.get(stage if stage is not None else -1, {}),
                "largest_param_bytes": max(
                    (
                        int(t.numel() * t.element_size())
                        for t in map(_local, params)
                        if t is not None
                    ),
                    default=0,
                ),
            }
        )
    params = [p for _, m in mods for p in m.parameters() if p.requires_grad]
    grads = _storage_bytes([p.grad for p in params if p.grad is not None], seen)
    missing = [_local(p) for p in params if p.grad is None]
    grads += sum(int(t.numel() * t.element_size()) for t in missing if t is not None)
    micro = _microbatch_size(pipeline)
    n_micro = (
        pipeline.get("microbatches")
        if isinstance(pipeline, dict)
        else getattr(pipeline, "_n_microbatches", None)
    )
    return {
        "step": step,
        "param_bytes": param_total,
        "grad_bytes": grads,
        "grads_counted_at_param_size": len(missing),
        "optimizer_bytes": _storage_bytes(_optimizer_tensors(optims), seen),
        "optimizers": [type(o).__name__ for o in optims],
        "stages": stages,
        "microbatch_size": micro,
        "microbatches": int(n_micro) if isinstance(n_micro, int) else None,
    }
