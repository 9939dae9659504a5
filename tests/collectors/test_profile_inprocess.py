"""tracelab.profile in the test process, on a real one-rank gloo group (no torchrun).

Covers what does not need several ranks: the schedule matches torch.profiler's, the disabled
path touches nothing, hooks exist only inside windows, the loop's own exception passes through
unchanged after a flush, internal errors stay inside, and torch.compile still traces c10d calls.
"""

from __future__ import annotations

import importlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch._C._autograd import _profiler_enabled as _is_profiler_enabled
from torch._C._distributed_c10d import ProcessGroup
from torch.profiler import ProfilerAction

import tracelab
from tracelab.collectors import DISABLE_ENV, ProfileConfig
from tracelab.collectors.comm_timing import _METHODS
from tracelab.errors import UsageError


def _pg_methods() -> dict[str, Any]:
    return {name: ProcessGroup.__dict__.get(name) for name in _METHODS}


@pytest.mark.parametrize(
    ("kwargs", "torch_kwargs"),
    [
        (
            {"steps": range(10, 15)},
            {"skip_first": 9, "wait": 0, "warmup": 1, "active": 5, "repeat": 1},
        ),
        (
            {"steps": range(3, 4), "warmup": 0},
            {"skip_first": 3, "wait": 0, "warmup": 0, "active": 1, "repeat": 1},
        ),
        (
            {"wait": 2, "warmup": 1, "active": 3, "repeat": 2},
            {"wait": 2, "warmup": 1, "active": 3, "repeat": 2},
        ),
        (
            {"wait": 1, "warmup": 0, "active": 2, "repeat": 0, "skip_first": 4},
            {"wait": 1, "warmup": 0, "active": 2, "repeat": 0, "skip_first": 4},
        ),
    ],
)
def test_schedule_matches_torch(kwargs: dict[str, Any], torch_kwargs: dict[str, int]) -> None:
    cfg = ProfileConfig(dir=Path("unused"), **kwargs)
    reference = torch.profiler.schedule(**torch_kwargs)
    names = {
        ProfilerAction.NONE: "none",
        ProfilerAction.WARMUP: "warmup",
        ProfilerAction.RECORD: "record",
        ProfilerAction.RECORD_AND_SAVE: "record_and_save",
    }
    assert [cfg.action(s) for s in range(40)] == [names[reference(s)] for s in range(40)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "say which steps"),
        ({"steps": range(3, 5), "active": 2}, "not both"),
        ({"steps": range(3)}, "starts before warmup"),
        ({"steps": range(5, 10, 2)}, "consecutive"),
        ({"active": 0}, "active must be"),
        ({"active": 2, "wait": -1}, "wait must be"),
        ({"active": 2, "parallelism": {"dp": 2, "xp": 2}}, "keys must be"),
        ({"active": 2, "control_timeout_s": 0}, "control_timeout_s"),
    ],
)
def test_config_errors_name_the_setting(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        ProfileConfig(dir=Path("x"), **kwargs)


def _loop(prof: Any, steps: int, seen: list[Any]) -> torch.Tensor:
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    total = torch.zeros(())
    for _ in range(steps):
        loss = (w @ torch.randn(8, 8)).pow(2).mean()
        loss.backward()
        t = loss.detach().clone()
        dist.all_reduce(t)
        total += t
        seen.append((_pg_methods(), _is_profiler_enabled()))
        prof.step()
    return total


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_disabled_is_a_no_op(
    world1: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    baseline_seen: list[Any] = []
    with tracelab.profile(tmp_path / "a", steps=range(1, 3), enabled=False) as off_for_reference:
        expected = _loop(off_for_reference, 4, baseline_seen)
    before = _pg_methods()
    if how == "environment":
        monkeypatch.setenv(DISABLE_ENV, "1")
    seen: list[Any] = []
    out = tmp_path / "run"
    with tracelab.profile(out, steps=range(1, 3), enabled=how != "argument") as prof:
        got = _loop(prof, 4, seen)
    assert not prof.enabled
    assert torch.equal(got, expected)
    assert not out.exists() and not (tmp_path / "a").exists()
    assert all(methods == before and not profiling for methods, profiling in seen)
    assert prof.step_num == 4


def test_hooks_and_profiler_only_inside_windows(world1: Any, tmp_path: Path) -> None:
    before = _pg_methods()
    seen: list[Any] = []
    with tracelab.profile(tmp_path / "run", wait=1, warmup=1, active=2, repeat=2) as prof:
        _loop(prof, 10, seen)
    assert _pg_methods() == before
    # steps 0..9: cycle of 4 (wait, warmup, record, record) twice, then nothing
    recording = [s for s, (m, _) in enumerate(seen) if m != before]
    assert recording == [2, 3, 6, 7]
    # warm-up steps only prepare Kineto; the profiler records during the window's steps only
    assert [s for s, (_, on) in enumerate(seen) if on] == [2, 3, 6, 7]
    rank = json.loads((tmp_path / "run" / "rank-0" / "rank.json").read_text())
    assert rank["traces"] == [
        "rank-0/window-0.pt.trace.json.gz",
        "rank-0/window-1.pt.trace.json.gz",
    ]
    assert [w["first_step"] for w in rank["windows"]] == [2, 6]
    records = (tmp_path / "run" / "rank-0" / "collectives.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in records] == [2, 3, 6, 7]
    assert [json.loads(r)["seq"] for r in records] == [1, 2, 3, 4]
    # The named group's rank list on its first line of the file only, across windows.
    assert [json.loads(r)["pg_ranks"] for r in records] == [[0], None, None, None]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["world_size"] == 1 and manifest["ranks"][0]["clock"]["offset_ns"] == 0


def test_loop_exception_passes_through_after_a_flush(world1: Any, tmp_path: Path) -> None:
    before = _pg_methods()
    out = tmp_path / "run"
    seen: list[Any] = []

    class Boom(RuntimeError):
        pass

    with pytest.raises(Boom, match="data loader broke"):
        with tracelab.profile(out, steps=range(1, 5)) as prof:
            _loop(prof, 2, seen)  # steps 0 and 1; step 2 is recording when the loop raises
            raise Boom("data loader broke")
    assert _pg_methods() == before and not _is_profiler_enabled()
    rank = json.loads((out / "rank-0" / "rank.json").read_text())
    assert rank["traces"] == ["rank-0/window-0.pt.trace.json.gz"]
    assert (out / rank["traces"][0]).stat().st_size > 0
    assert [
        json.loads(r)["step"]
        for r in (out / "rank-0" / "collectives.jsonl").read_text().splitlines()
    ] == [1]
    assert json.loads((out / "manifest.json").read_text())["ranks"][0]["rank"] == 0


def test_internal_error_is_logged_once_and_disables(
    world1: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "run"
    # a real fault: a folder stands where the first window's trace must be written
    (out / "rank-0" / "window-0.pt.trace.json.gz").mkdir(parents=True)
    before = _pg_methods()
    seen: list[Any] = []
    with caplog.at_level(logging.ERROR, logger="tracelab.collectors"):
        with tracelab.profile(out, wait=0, warmup=1, active=2, repeat=3) as prof:
            total = _loop(prof, 12, seen)
    assert total.shape == ()
    assert prof.error is not None and "IsADirectoryError" in prof.error
    assert len([r for r in caplog.records if "internal error" in r.getMessage()]) == 1
    assert _pg_methods() == before and not _is_profiler_enabled()
    # after the fault (end of step 2) nothing is hooked or profiled any more
    assert all(m == before and not on for m, on in seen[3:])
    rank = json.loads((out / "rank-0" / "rank.json").read_text())
    assert "IsADirectoryError" in rank["collector_error"] and rank["traces"] == []


def test_torch_compile_fullgraph_inside_a_window(world1: Any, tmp_path: Path) -> None:
    def step_fn(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        dist.all_reduce(y)
        return y + 1

    compiled = torch.compile(step_fn, backend="aot_eager", fullgraph=True)
    with tracelab.profile(tmp_path / "run", steps=range(1, 3)) as prof:
        for _ in range(4):
            out = compiled(torch.ones(4))
            prof.step()
    assert torch.equal(out, torch.full((4,), 3.0))
    assert prof.error is None


def test_convert_in_a_child_process(world1: Any, tmp_path: Path) -> None:
    from tracelab.ingest.converted import converted_dir, load_converted

    out = tmp_path / "run"
    with tracelab.profile(out, steps=range(1, 3), convert=True) as prof:
        _loop(prof, 4, [])
    trace = out / "rank-0" / "window-0.pt.trace.json.gz"
    assert (converted_dir(trace) / "events.parquet").is_file()
    info = load_converted(trace)  # what `tracelab ingest` registers instead of parsing
    assert info is not None and info.rank == 0 and info.event_count > 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"wait": 1, "warmup": 1, "active": 2, "repeat": 3},
        {"wait": 0, "warmup": 0, "active": 1, "repeat": 4},
        {"steps": range(2, 6)},
    ],
)
def test_a_failed_rank_keeps_answering_the_clock_exchanges(
    world1: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any]
) -> None:
    """The exchanges are collective: a rank whose collector failed must still take part in
    each one the live ranks run, at the same point, or rank 0 waits out the timeout for it."""
    profile_mod = importlib.import_module("tracelab.collectors.profile")
    calls: list[tuple[Any, str]] = []
    phase: list[Any] = ["enter"]
    real = profile_mod.Profile._exchange_clocks

    def spy(self: Any, when: str) -> None:
        calls.append((phase[0], when))
        real(self, when)

    monkeypatch.setattr(profile_mod.Profile, "_exchange_clocks", spy)

    configs: list[Any] = []

    def run(out: Path, steps: int) -> list[tuple[Any, str]]:
        calls.clear()
        phase[0] = "enter"
        with tracelab.profile(out, **kwargs) as prof:
            for i in range(steps):
                phase[0] = i
                dist.all_reduce(torch.ones(1))
                prof.step()
            phase[0] = "exit"
        configs.append(prof.config)
        return list(calls)

    steps = 10  # the first schedule ends inside a window: the exit exchange is checked too
    live = run(tmp_path / "live", steps)
    cfg = configs[0]
    expected = (
        [("enter", "window_start")]
        if cfg.action(0) in ("warmup", "record", "record_and_save")
        else []
    )
    expected += [(i, w) for i in range(steps) if (w := profile_mod._exchange_at(cfg, i))]
    if cfg.action(steps) in ("record", "record_and_save"):
        expected.append(("exit", "window_end"))
    assert live == expected

    failed = tmp_path / "failed"
    (failed / "rank-0" / "window-0.pt.trace.json.gz").mkdir(parents=True)  # the first export fails
    assert run(failed, steps) == live
    rank = json.loads((failed / "rank-0" / "rank.json").read_text())
    assert "IsADirectoryError" in rank["collector_error"]
