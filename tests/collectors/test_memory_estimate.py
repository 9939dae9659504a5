"""The memory estimate against measured peaks on real CPU pipelines (torchrun + gloo, 4 ranks):
collector captures with the model states and the CPU allocator's events, unbalanced stages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tracelab import memory_model as mm
from tracelab.analyzers import memory
from tracelab.analyzers._common import run_context
from tracelab.figures.memory import estimate_figure
from tracelab.ingest import ingest
from tracelab.store import open_store
from tracelab.views.memory import MemoryView

PREDICTION = (
    '{"layers": 8, "hidden": 1024, "seq": 512, "microbatch": 1, "heads": 8, "microbatches": 8, '
    '"pp": 4}'
)

SCRIPT = Path(__file__).parent / "scripts" / "pipeline_memory.py"
pytestmark = pytest.mark.torchrun


def _estimate(
    torchrun: Any, tmp_path: Path, schedule: str, params: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    out = tmp_path / schedule
    torchrun(SCRIPT, str(out), schedule, nproc=4, timeout=300)
    db = tmp_path / "t.duckdb"
    ingest([out], db=db, run=schedule)
    with open_store(db) as con:
        run_id = con.execute("SELECT run_id FROM runs WHERE name = ?", [schedule]).fetchone()[0]
        result = memory.analyze(con, run_context(con, run_id), params or {})
    rows = result.tables["estimate"]
    assert sorted(r["rank"] for r in rows) == [0, 1, 2, 3], result.notes
    # One measured peak per rank: the rank table and the estimate's agree (CPU events plus
    # the collector's baseline, not the events' lower bound).
    assert result.metrics["source"] == "trace_baseline"
    peaks = {r["rank"]: r["peak_bytes"] for r in result.tables["ranks"]}
    assert peaks == {r["rank"]: r["measured_bytes"] for r in rows}
    return rows


def test_1f1b_unbalanced_within_15_percent(torchrun: Any, tmp_path: Path) -> None:
    config = tmp_path / "prediction.json"
    config.write_text(PREDICTION)
    rows = _estimate(torchrun, tmp_path, "1f1b", {"prediction": str(config)})
    by = {r["rank"]: r for r in rows}
    # Schedule1F1B: stage s holds min(m, p - s) microbatches at its peak.
    assert [by[r]["in_flight"] for r in range(4)] == [{"0": 4}, {"1": 3}, {"2": 2}, {"3": 1}]
    # One microbatch keeps one 64 x 256 fp32 tensor per layer (each ReLU's output; the
    # embedding's output on stage 0): stage 0 has 4 layers + the embedding, stages 1 and 2 two.
    act = {r: by[r]["stage_activation_bytes"][str(r)] for r in range(3)}
    assert act == {0: 5 * 65536, 1: 2 * 65536, 2: 2 * 65536}
    for r in rows:
        assert abs(r["error"]) <= 0.15, r
        split = r["diff_model_states_bytes"] + (r["diff_activations_bytes"] or 0)
        assert split + r["diff_rest_bytes"] == pytest.approx(r["diff_bytes"])
    # The prediction of a config sits beside each pipeline rank, in stage order.
    pred = mm.predict(mm.load_config(str(config)))
    assert [by[r]["predicted_bytes"] for r in range(4)] == [e.total_bytes for e in pred]
    # The Memory view draws the estimate's parts and the measured peak per rank, same bytes.
    fig = estimate_figure(MemoryView(available=True, estimate=rows))
    kib = {t["name"]: t["y"] for t in fig["data"]}
    assert kib["estimate: model states"][0] == pytest.approx(by[0]["model_states_bytes"] / 2**20)
    measured = [v for k, v in kib.items() if k.startswith("measured peak")][0]
    assert measured == pytest.approx([by[r]["measured_bytes"] / 2**20 for r in range(4)])
    text = MemoryView(available=True, estimate=rows).estimate_rows()
    assert [t["in_flight"] for t in text] == ["0: 4", "1: 3", "2: 2", "3: 1"]
    assert text[0]["error"] == f"{100 * by[0]['error']:+.1f}%"


def test_interleaved_unbalanced_within_15_percent(torchrun: Any, tmp_path: Path) -> None:
    """Interleaved 1F1B, two stages per rank (rank r holds r and r + 4). The runtime schedule
    waits for its sends at the step's end, so each stage's output and input gradient outlive
    their backward: ranks 1-3 peak in the cool-down holding them, which the model replays."""
    rows = _estimate(torchrun, tmp_path, "interleaved_1f1b")
    by = {r["rank"]: r for r in rows}
    assert [by[r]["stages"] for r in range(4)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # Rank 0 holds 2(p - 1) + (v - 1)p + 1 = 11 chunk-microbatches at its peak (8 + 3).
    assert by[0]["in_flight"] == {"0": 8, "4": 3}
    for r in rows:
        assert abs(r["error"]) <= 0.15, r
        split = r["diff_model_states_bytes"] + (r["diff_activations_bytes"] or 0)
        assert split + r["diff_rest_bytes"] == pytest.approx(r["diff_bytes"])
