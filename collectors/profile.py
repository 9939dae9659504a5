"""`tracelab.profile`: one context manager that captures everything the analyzers need.

    with tracelab.profile("runs/exp42", steps=range(10, 15)) as prof:
        for batch in loader:
            train_step(batch)
            prof.step()

Per rank and per window it writes a Kineto trace, the window's collective records (hooked
c10d calls plus the Flight Recorder), per-step memory peaks and clock-offset samples; at exit
rank 0 writes `manifest.json` (docs/capture-format.md).

It never breaks training: disabled (enabled=False or TRACELAB_DISABLE=1) it does nothing; outside
active windows `step()` only counts; any internal error is logged once and disables the
collector while the loop goes on; `__exit__` flushes what it has and never swallows or replaces
the loop's own exception.
"""

from __future__ import annotations

import bisect
import logging
import shlex
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerAction, ProfilerActivity

from tracelab.collectors import flight_recorder as fr
from tracelab.collectors import manifest as mf
from tracelab.collectors import store_gather
from tracelab.collectors.background import BackgroundConverter
from tracelab.collectors.clocks import ClockSync, control_group
from tracelab.collectors.comm_timing import CommTimer
from tracelab.collectors.config import ACTIVE, RECORDING, ProfileConfig, disabled_by_env
from tracelab.collectors.memory import MemoryTracker
from tracelab.collectors.records import CollectiveRecord

log = logging.getLogger("tracelab.collectors")

_TORCH_ACTIONS = {
    "none": ProfilerAction.NONE,
    "warmup": ProfilerAction.WARMUP,
    "record": ProfilerAction.RECORD,
    "record_and_save": ProfilerAction.RECORD_AND_SAVE,
}
COLLECTIVES_FILE = "collectives.jsonl"


class Profile:
    """The context manager returned by `tracelab.profile(...)`; call `step()` once per step."""

    def __init__(self, config: ProfileConfig) -> None:
        self.config = config
        self.enabled = bool(config.enabled) and not disabled_by_env()
        self.step_num = 0
        self.rank = 0
        self.world_size = 1
        self.error: str | None = None
        self._live = False
        self._started = False
        self._prof: Any = None
        self._comm: CommTimer | None = None
        self._memory: MemoryTracker | None = None
        self._clock: ClockSync | None = None
        self._group: Any = None
        self._meta_key = ""
        self._fr_on = False
        self._windows: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the window being recorded
        self._step_spans: list[tuple[int, int]] = []  # (start_ns, step) of recorded steps
        self._gloo_events: list[tuple[str, int, int]] = []
        self._step_start_ns = 0
        self._n_records = 0
        #: Named groups whose rank list collectives.jsonl already holds (_list_ranks).
        self._groups_listed: set[str] = set()
        self._in_torch = False
        self._converter: BackgroundConverter | None = None
        self._exchanged: list[str] = []  # clock exchanges done in the current step() call

    # -- public API ----------------------------------------------------------------------------

    def __enter__(self) -> Profile:
        if self.enabled:
            self._exchanged = []
            try:
                self._start()
            except Exception as exc:
                self._fail(exc)
            if not self._live and self.config.action(0) in ACTIVE:
                self._answer_clock("window_start")
        return self

    def step(self) -> None:
        """Mark the end of one training step (like torch.profiler.profile.step)."""
        current = self.step_num
        self._exchanged = []
        if self._live:
            try:
                self._step(current)
            except Exception as exc:
                self._fail(exc)
        if not self._live:
            self._answer_clock(_exchange_at(self.config, current))
        self.step_num = current + 1

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._started:
            return
        clean = exc_type is None
        self._exchanged = []
        if not clean and self._fr_on:
            # A collective's timeout (or any error) ends the loop: leave this rank's recorder
            # for `tracelab hang` before anything else can fail.
            fr.write_dumps(self.root, self.rank)
        try:
            if self._live:
                self._stop(clean)
        except Exception as err:
            self._fail(err)
        if not self._live and clean and self.config.action(self.step_num) in RECORDING:
            self._answer_clock("window_end")  # the others close their open window with one
        try:
            self._write_metadata(clean)
        except Exception as err:
            self._fail(err)
        self._live = False
        self._close_control_group()

    def _close_control_group(self) -> None:
        """Destroy tracelab's gloo group after the last clock exchange. Left to the job's
        `destroy_process_group()` and the interpreter's exit, a rank other than 0 aborted at
        exit now and then ("terminate called without an active exception", SIGABRT): 5 of 135
        2-rank runs of tests/collectors/scripts/internal_fault.py and of a fault-free copy, two
        at a time with output to a pipe; 0 of 30 of the same loop without tracelab, and 0 of
        120 with the group destroyed here."""
        group, self._group = self._group, None
        if self._clock is not None:
            self._clock.group = None
        if group is None:
            return
        try:
            dist.destroy_process_group(group)
        except Exception:  # already destroyed by the job, or torch without the group any more
            pass

    @property
    def root(self) -> Path:
        return self.config.dir

    def summary(self) -> str:
        """Where the capture went and the commands to run next: two lines for the end of a
        training script (the examples print it on rank 0, after the `with` block)."""
        if not self.enabled:
            return "tracelab: profiling was disabled: nothing was captured."
        if self.error is not None:
            return (
                f"tracelab: the collector failed on rank {self.rank} ({self.error}); what it "
                f"wrote is in {self.root}."
            )
        windows = [w for w in self._windows if w.get("last_step") is not None]
        steps = sum(int(w["last_step"]) - int(w["first_step"]) + 1 for w in windows)
        where = shlex.quote(str(self.root))
        name = self.config.run_name or self.root.resolve().name
        return (
            f"tracelab: captured {steps} steps on {self.world_size} "
            f"rank{'s' if self.world_size != 1 else ''} into {self.root}/\n"
            f"next: tracelab open {where}   "
            f"(or: tracelab ingest {where} && tracelab analyze --run {shlex.quote(name)})"
        )

    @property
    def rank_dir(self) -> Path:
        return mf.rank_dir(self.config.dir, self.rank)

    # -- lifecycle -----------------------------------------------------------------------------

    def _start(self) -> None:
        cfg = self.config
        distributed = dist.is_available() and dist.is_initialized()
        if distributed:
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.rank_dir.mkdir(parents=True, exist_ok=True)
        (self.rank_dir / COLLECTIVES_FILE).write_text("")
        self._started = True
        self.device = _device(cfg.device)
        if cfg.mesh is not None:
            self._parallelism, self._coords = mf.parallelism_from_mesh(cfg.mesh)
        else:
            self._parallelism, self._coords = mf.parallelism_from_user(
                cfg.parallelism, cfg.coords, cfg.pp_stage
            )
        self._pipeline, self._rank_stages = mf.pipeline_info(cfg.pipeline)
        if cfg.convert:
            self._converter = BackgroundConverter()
        # tracelab's own gloo group carries only the clock exchanges (the metadata gather goes
        # through the store), so a job without clock sync does not create one.
        self._group = (
            control_group(cfg.control_timeout_s) if distributed and cfg.clock_sync else None
        )
        self._meta_key = store_gather.next_key()
        if cfg.clock_sync and distributed:
            self._clock = ClockSync(group=self._group, rank=self.rank, world_size=self.world_size)
        if cfg.comm_timing and distributed:
            self._comm = CommTimer(rank=self.rank, on_error=self._fail)
            if self._group is not None:
                self._comm.exclude(self._group)
        if cfg.memory:
            snap = self.rank_dir if cfg.memory_snapshot else None
            self._memory = MemoryTracker(
                device=self.device,
                snapshot_dir=snap,
                model=cfg.model,
                optimizer=cfg.optimizer,
                pipeline=cfg.pipeline,
            )
        self._fr_on = bool(cfg.flight_recorder and distributed and fr.is_armed())
        if self._fr_on:
            fr.dump_on_signal(self.root, self.rank)  # kill -USR1: dumps for `tracelab hang`
        if cfg.flight_recorder and distributed and not self._fr_on and self.rank == 0:
            log.warning(
                "tracelab: the Flight Recorder is not armed, so collectives issued from "
                "C++ (the DDP reducer, functional collectives) are not captured. Call "
                "tracelab.collectors.arm_flight_recorder() before init_process_group."
            )
        self._live = True
        first = cfg.action(0)
        if first in ACTIVE:
            self._exchange_clocks("window_start")
            self._start_torch(0)
        if first in RECORDING:
            self._open_window()
            self._begin_step()

    def _step(self, current: int) -> None:
        cfg = self.config
        cur, nxt = cfg.action(current), cfg.action(current + 1)
        if cur == "none" and nxt == "none":
            return  # between windows: nothing runs, not even torch.profiler
        if cur in RECORDING:
            self._end_step()
        if cur == "record_and_save":
            self._close_window()
        if self._prof is None:  # a window (its warm-up or its first step) starts
            self.step_num = current + 1
            self._exchange_clocks("window_start")
            self._start_torch(current + 1)
        else:
            self._in_torch = True
            try:
                self._prof.step()
            finally:
                self._in_torch = False
            self.step_num = current + 1
            if not self._live:  # failed inside torch's callback: stop now that torch is done
                self._stop_profiler()
                return
        if cur == "record_and_save":
            self._finish_window(exchange=True)
        if nxt == "none":
            self._stop_profiler()  # idle until the next window
        elif nxt in RECORDING and cur != "record":
            self._open_window()
        if nxt in RECORDING:
            self._begin_step()

    def _start_torch(self, step: int) -> None:
        """A torch.profiler for one window, started at `step` with torch's own step numbering
        (its `ProfilerStep#N` annotations carry the global step number)."""
        cfg = self.config
        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        prof = torch.profiler.profile(
            activities=activities,
            schedule=lambda s: _TORCH_ACTIONS[cfg.action(s)],
            on_trace_ready=self._on_trace_ready,
            record_shapes=cfg.record_shapes,
            profile_memory=cfg.profile_memory,
            with_stack=cfg.with_stack,
        )
        action: Any = _TORCH_ACTIONS[cfg.action(step)]
        prof.step_num = step
        prof.current_action = action
        if hasattr(prof, "_prev_schedule_action"):
            prof._prev_schedule_action = action
        self._prof = prof
        self._in_torch = True
        try:
            prof.__enter__()
        finally:
            self._in_torch = False

    def _stop(self, clean: bool) -> None:
        """Exit inside or outside a window: flush what there is."""
        recording = self._open is not None
        if recording:
            self._end_step()
            self._close_window()
        if self._prof is not None:
            self._in_torch = True
            try:
                self._prof.__exit__(None, None, None)  # exports a partial window's trace
            finally:
                self._in_torch = False
            self._prof = None
        if recording and self._live:
            self._finish_window(exchange=clean)

    # -- windows -------------------------------------------------------------------------------

    def _open_window(self) -> None:
        index = len(self._windows)
        self._open = {
            "index": index,
            "first_step": self.step_num,
            "last_step": None,
            "start_ns": time.time_ns(),
            "end_ns": None,
            "trace": None,
            "collectives": 0,
            "flight_recorder_records": 0,
        }
        self._windows.append(self._open)
        self._step_spans = []
        self._gloo_events = []
        if self._comm is not None:
            self._comm.install(index)

    def _close_window(self) -> None:
        if self._comm is not None:
            self._comm.uninstall()
        if self._open is not None:
            self._open["end_ns"] = time.time_ns()
            self._open["last_step"] = self.step_num

    def _begin_step(self) -> None:
        self._step_start_ns = time.time_ns()
        self._step_spans.append((self._step_start_ns, self.step_num))
        if self._comm is not None:
            self._comm.step = self.step_num
        if self._memory is not None:
            self._memory.begin_step(self.step_num)

    def _end_step(self) -> None:
        if self._memory is not None:
            self._memory.end_step(self.step_num)
        if self._comm is not None:
            self._comm.poll()

    def _on_trace_ready(self, prof: Any) -> None:
        window = self._windows[-1] if self._windows else None
        if window is None or not self._live:
            return
        try:
            name = f"window-{window['index']}.pt.trace.json.gz"
            prof.export_chrome_trace(str(self.rank_dir / name))
            window["trace"] = f"{self.rank_dir.name}/{name}"
            if self._converter is not None:
                self._converter.submit(self.rank_dir / name)
            if self._fr_on:
                self._gloo_events = [
                    (e.name(), int(e.start_ns()), int(e.duration_ns()))
                    for e in prof.profiler.kineto_results.events()
                    if e.name().startswith("gloo:")
                ]
        except Exception as exc:
            self._fail(exc)

    def _finish_window(self, *, exchange: bool) -> None:
        window, self._open = self._open, None
        if window is None:
            return
        records = self._comm.drain() if self._comm is not None else []
        fr_records: list[CollectiveRecord] = []
        if self._fr_on:
            fr_records = self._flight_recorder_records(window, records)
        lines = sorted(records + fr_records, key=lambda r: r.enqueue_ns or 0)
        with (self.rank_dir / COLLECTIVES_FILE).open("a") as fh:
            for rec in lines:
                fh.write(rec.to_json(ranks=self._list_ranks(rec)) + "\n")
        window["collectives"] = len(lines)
        window["flight_recorder_records"] = len(fr_records)
        self._n_records += len(lines)
        if exchange:
            self._exchange_clocks("window_end")

    def _list_ranks(self, rec: CollectiveRecord) -> bool:
        """Whether `rec`'s line carries its group's rank list: a named group's on its first
        line of the file only (a 10,000-rank group's list on every call would make the file
        grow as calls x group size), a group without a name's always (its ranks are its
        identity)."""
        if rec.pg_name is None or not rec.pg_ranks:
            return True
        if rec.pg_name in self._groups_listed:
            return False
        self._groups_listed.add(rec.pg_name)
        return True

    def _flight_recorder_records(
        self, window: dict[str, Any], records: list[CollectiveRecord]
    ) -> list[CollectiveRecord]:
        excluded = [str(self._group.group_name)] if self._group is not None else []
        groups = {g["pg_name"]: g["ranks"] for g in mf.process_groups(self._group)}
        return fr.window_records(
            records,
            start_ns=window["start_ns"],
            end_ns=window["end_ns"],
            window=window["index"],
            exclude_pgs=excluded,
            groups=groups,
            step_of=self._step_of,
            gloo_events=self._gloo_events,
            rank=self.rank,
        )

    def _step_of(self, ts_ns: int) -> int | None:
        starts = [s for s, _ in self._step_spans]
        i = bisect.bisect_right(starts, ts_ns) - 1
        return self._step_spans[i][1] if i >= 0 else None

    def _exchange_clocks(self, when: str) -> None:
        if self._clock is not None:
            self._exchanged.append(when)
            self._clock.exchange(when, len(self._windows) - (when == "window_end"))

    def _answer_clock(self, when: str | None) -> None:
        """On a rank whose collector failed: still take part in the clock exchange that the
        live ranks run at this point, unless this step already did. The exchanges are
        collective; a rank that skipped one would leave rank 0 waiting out the control timeout
        (training stalls that long), and gloo's pair to it after a timed-out receive, which
        once aborted the failed rank at exit. ClockSync.exchange never raises: a failed
        exchange is logged and switches clock sync off."""
        if when is not None and when not in self._exchanged:
            self._exchange_clocks(when)

    # -- metadata ------------------------------------------------------------------------------

    def _rank_entry(self) -> dict[str, Any]:
        name, capacity = mf.device_info(self.device) if hasattr(self, "device") else ("cpu", None)
        stages = getattr(self, "_rank_stages", None)
        pp_stage = self.config.pp_stage
        if pp_stage is None and stages:
            pp_stage = min(stages)
        traces = [w["trace"] for w in self._windows if w.get("trace")]
        return {
            "rank": self.rank,
            "host": mf.host_name(),
            "device": name,
            "device_memory_bytes": capacity,
            "backend": dist.get_backend()
            if dist.is_available() and dist.is_initialized()
            else None,
            "coords": getattr(self, "_coords", None),
            "pp_stage": pp_stage,
            "pp_stages": stages,
            "process_groups": mf.process_groups(self._group),
            "traces": traces,
            "collectives": f"{self.rank_dir.name}/{COLLECTIVES_FILE}"
            if self._comm is not None or self._fr_on
            else None,
            "collective_seq": "flight_recorder" if self._fr_on else "collector",
            "memory": self._memory.peaks if self._memory is not None else [],
            "model_states": self._memory.model_states if self._memory is not None else None,
            "memory_snapshot": (
                f"{self.rank_dir.name}/{self._memory.snapshot_path}"
                if self._memory is not None and self._memory.snapshot_path
                else None
            ),
            "clock": self._clock.summary()
            if self._clock is not None
            else {
                "offset_ns": 0 if self.world_size == 1 else None,
                "uncertainty_ns": 0 if self.world_size == 1 else None,
                "reference_rank": 0,
                "samples": [],
            },
            "windows": self._windows,
            "collector_error": self.error,
        }

    def _write_metadata(self, clean: bool) -> None:
        if self._memory is not None:
            self._memory.close()
        if self._converter is not None:
            self._converter.wait(timeout_s=600)
        entry = self._rank_entry()
        mf.write_json(self.rank_dir / mf.RANK_FILE, entry)
        gathered: list[Any] | None = None
        store = store_gather.default_store() if self.world_size > 1 else None
        if clean and store is not None:
            try:
                gathered = store_gather.gather_json(
                    store,
                    self._meta_key,
                    entry,
                    rank=self.rank,
                    world_size=self.world_size,
                    timeout_s=self.config.control_timeout_s,
                )
            except Exception as exc:
                log.warning(
                    "tracelab: rank %d could not gather the ranks' metadata (%s); rank 0 "
                    "builds the manifest from the rank.json files it can see.",
                    self.rank,
                    exc,
                )
                gathered = None
        ranks = [g for g in gathered or [] if isinstance(g, dict)]
        if self.rank != 0:
            if len(ranks) != self.world_size:  # rank 0 may have written the manifest already
                mf.add_rank(self.root, entry)
            return
        with mf.manifest_lock(self.root):
            if len(ranks) != self.world_size:
                ranks = mf.read_rank_parts(self.root)
            manifest = mf.build_manifest(
                run_name=self.config.run_name or self.root.resolve().name,
                world_size=self.world_size,
                parallelism=getattr(self, "_parallelism", {}),
                pipeline=getattr(self, "_pipeline", None),
                schedule=self.config.schedule_dict(),
                windows=[
                    {k: w[k] for k in ("index", "first_step", "last_step")} for w in self._windows
                ],
                ranks=ranks,
            )
            mf.write_json(self.root / mf.MANIFEST, manifest)

    # -- failure -------------------------------------------------------------------------------

    def _fail(self, exc: BaseException) -> None:
        """Log once, switch everything off, let the training loop go on."""
        if self.error is None:
            self.error = f"{type(exc).__name__}: {exc}"
            log.error(
                "tracelab: internal error on rank %d; the collector is disabled and "
                "training continues.",
                self.rank,
                exc_info=exc,
            )
        self._live = False
        if self._comm is not None:
            try:
                self._comm.uninstall()
            except Exception:
                pass
        if not self._in_torch:  # never stop torch's profiler from inside its own callback
            self._stop_profiler()

    def _stop_profiler(self) -> None:
        prof, self._prof = self._prof, None
        if prof is not None:
            try:
                prof.on_trace_ready = None
                prof.__exit__(None, None, None)
            except Exception:
                pass


def _exchange_at(cfg: ProfileConfig, step: int) -> str | None:
    """The clock exchange the live path runs in `step()` at the end of `step`: "window_end"
    when that step saves a window, "window_start" when the next step opens one after idle
    steps (see Profile._step), else None."""
    cur, nxt = cfg.action(step), cfg.action(step + 1)
    if cur == "record_and_save":
        return "window_end"
    if cur == "none" and nxt != "none":
        return "window_start"
    return None


def _device(requested: Any) -> torch.device:
    if requested is not None:
        return torch.device(requested)
    backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else ""
    if torch.cuda.is_available() and ("nccl" in str(backend) or torch.cuda.is_initialized()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
