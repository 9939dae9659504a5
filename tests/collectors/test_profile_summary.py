"""Profile.summary(): where the capture went and what to run next (the examples print it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import tracelab


def _train(prof: Any, steps: int) -> None:
    model = torch.nn.Linear(8, 8)
    for _ in range(steps):
        model(torch.randn(2, 8)).sum().backward()
        prof.step()


def test_summary_names_the_capture_and_the_next_commands(world1: Any, tmp_path: Path) -> None:
    out = tmp_path / "runs" / "exp 42"
    with tracelab.profile(out, steps=range(2, 5)) as prof:
        _train(prof, 6)
    lines = prof.summary().splitlines()
    assert lines[0] == f"tracelab: captured 3 steps on 1 rank into {out}/"
    assert lines[1] == (
        f"next: tracelab open '{out}'   (or: tracelab ingest '{out}' && "
        "tracelab analyze --run 'exp 42')"
    )
    assert (out / "manifest.json").is_file()


def test_summary_when_disabled(tmp_path: Path) -> None:
    with tracelab.profile(tmp_path / "off", steps=range(1, 2), enabled=False) as prof:
        _train(prof, 2)
    assert prof.summary() == "tracelab: profiling was disabled: nothing was captured."
