"""Pipeline runs (synthetic, FACTS.md section 4 oracles): bubble share per stage and stage
memory in the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tracelab.cli import main
from tracelab.testing.synth import build_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pp")
    return {
        name: build_run(root / name, "pipeline", schedule=schedule, p=4, m=m, steps=11).paths[0]
        for name, schedule, m in (("m8", "1f1b", 8), ("m4", "1f1b", 4), ("gpipe", "gpipe", 8))
    }


def _report(tmp_path: Path, base: Path, cand: Path) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "r.json"
    rc = main(
        [
            "report",
            "--baseline",
            str(base),
            "--candidate",
            str(cand),
            "--format",
            "json",
            "--out",
            str(out),
        ]
    )
    return rc, {m["key"]: m for m in json.loads(out.read_text())["metrics"]}


def test_fewer_microbatches_grow_every_stage_bubble(runs: dict[str, Path], tmp_path: Path) -> None:
    """1F1B p=4, 9 time units idle per stage: m=8 -> makespan 33, m=4 -> 21 (the textbook
    3/11 and 3/7 of the makespan). The constructed steps leave 2 units of host time before the
    next step, which tiled steps count in the step: 9/35 -> 9/23 (+13.4 pp), on every stage."""
    rc, rows = _report(tmp_path, runs["m8"], runs["m4"])
    assert rc == 1
    for stage in range(4):
        row = rows[f"bubble_share[stage={stage}]"]
        assert row["baseline"] == pytest.approx(9 / 35, abs=1e-3)
        assert row["candidate"] == pytest.approx(9 / 23, abs=1e-3)
        assert row["delta"] == pytest.approx((9 / 23 - 9 / 35) * 100, abs=0.1)
        assert row["verdict"] == "regression"
    # The step itself got shorter (makespan 33 -> 21 time units): improved, not a regression.
    assert rows["step_time"]["verdict"] == "improved"
    # 1F1B holds min(m, p - s) microbatches: 4, 3, 2, 1 in both runs.
    for stage in range(4):
        assert rows[f"peak_memory[stage={stage}]"]["verdict"] == "pass"
    assert rows["memory_imbalance"]["baseline"] == pytest.approx(1.6, abs=1e-3)


def test_gpipe_holds_every_microbatch_on_every_stage(runs: dict[str, Path], tmp_path: Path) -> None:
    rc, rows = _report(tmp_path, runs["m8"], runs["gpipe"])
    assert rc == 1
    regressed = {k for k, m in rows.items() if m["verdict"] == "regression"}
    assert regressed == {f"peak_memory[stage={s}]" for s in range(4)}
    assert rows["peak_memory[stage=3]"]["delta"] == pytest.approx(7.0)  # 1 -> 8 microbatches
    assert rows["memory_imbalance"]["verdict"] == "improved"  # 1.6 -> 1.0
    assert rows["memory_imbalance"]["candidate"] == pytest.approx(1.0)
