"""The analyzers on the real captures in sample_traces/ (torchrun + gloo, 4 ranks, CPU).

Timings on a shared 2-core machine are noisy, so these tests check structure: who is blamed,
which schedule the trace shows, which stage is heavy; not absolute times. A missing capture skips
its test, naming the capture and the command that makes it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tracelab.analyzers import run_all
from tracelab.ingest import ingest
from tracelab.results import Result
from tracelab.store import open_store, resolve_run

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


@pytest.fixture(scope="module")
def analyze_sample(tmp_path_factory: pytest.TempPathFactory):
    db = tmp_path_factory.mktemp("samples") / "store.duckdb"
    cache: dict[str, dict[str, Result]] = {}

    def get(name: str) -> dict[str, Result]:
        folder = SAMPLES / name
        if not (folder / "manifest.json").is_file():
            pytest.skip(
                f"sample capture {folder} is missing: make it with "
                f"`bash sample_traces/regenerate.sh {name}`"
            )
        if name not in cache:
            ingest([folder], db=db, run=name, workers=1, progress=False)
            with open_store(db) as con:
                rid, _ = resolve_run(con, name)
                cache[name] = {r.analyzer: r for r in run_all(con, rid)}
        return cache[name]

    return get


def test_slow_rank_run_names_the_injected_rank(analyze_sample):
    res = analyze_sample("ddp_slow_rank")
    st = res["stragglers"]
    assert st.metrics["stragglers"] == [2]
    (f,) = [f for f in st.findings if f.code.startswith("STRAGGLER_")]
    assert f.evidence.ranks == (2,)
    # It sleeps 40 ms between forward and backward (the `injected_delay` span): a host-bound
    # straggler, late by tens of ms, costing about the sleep.
    assert f.code == "STRAGGLER_HOST"
    assert f.evidence.affected_ranks == (0, 1, 3)
    assert f.evidence.numbers["lateness_ns_median"] > 15e6
    assert 0.7 * 40e6 <= f.impact_ns_per_step <= 1.3 * 40e6
    assert "injected_delay" in str(f.evidence.numbers["host_span_1"])
    row = next(r for r in st.tables["ranks"] if r["rank"] == 2)
    assert row["share_last"] >= 0.5
    assert res["pipeline"].metrics == {"pipeline": False}


def test_healthy_ddp_has_no_pipeline_and_aligned_clocks(analyze_sample):
    res = analyze_sample("ddp")
    assert res["pipeline"].metrics == {"pipeline": False}
    assert res["clocks"].metrics["methods"] == ["collector"]
    assert res["clocks"].metrics["causality_violations"] == 0
    assert res["steps"].metrics["steps"] == 10


def _warmups(res: Result) -> dict[int, int]:
    """Forwards each rank runs before its first backward, in the first profiled step."""
    acts = res.tables["actions"]
    first = min(a["step"] for a in acts)
    out = {}
    for rank in sorted({a["rank"] for a in acts}):
        seq = sorted(
            (a for a in acts if a["rank"] == rank and a["step"] == first),
            key=lambda a: a["start_ns"],
        )
        out[rank] = next(i for i, a in enumerate(seq) if a["kind"] != "F")
    return out


def test_1f1b_capture_reconstructs_the_schedule(analyze_sample):
    pp = analyze_sample("pipeline_1f1b")["pipeline"]
    m = pp.metrics
    assert (m["source"], m["schedule"], m["ranks"], m["microbatches"]) == ("host_ops", "1f1b", 4, 8)
    assert m["inherent_order"] == "observed order"
    # Schedule1F1B: stage s runs min(m, p - s) forwards first, then alternates.
    assert _warmups(pp) == {0: 4, 1: 3, 2: 2, 3: 1}
    per_step = len(pp.tables["actions"]) / m["steps"]
    assert per_step == 4 * 2 * 8
    # Later stages start later: leading idle grows with the stage.
    lead = [s["leading_ns"] for s in sorted(pp.tables["stages"], key=lambda s: s["rank"])]
    assert lead == sorted(lead) and lead[-1] > lead[0]
    # Four gloo ranks on two cores: stages wait on each other's blocking send/recv far longer
    # than the schedule needs, so the stall (not the schedule's own bubble) is the finding.
    codes = {f.code for f in pp.findings}
    assert "PIPELINE_STALL" in codes or "PIPELINE_BUBBLE" in codes
    for s in pp.tables["stages"]:
        assert s["bubble_ns"] <= s["inherent_idle_ns"] + 1
        assert 0 <= s["bubble_share"] <= 1


def test_schedules_rank_by_inherent_bubble(analyze_sample):
    """With the measured op times, the schedules' own bubbles order as theory says:
    zero-bubble < interleaved 1F1B < 1F1B."""
    share = {}
    for name in ("pipeline_1f1b", "pipeline_interleaved_1f1b", "pipeline_zero_bubble"):
        m = analyze_sample(name)["pipeline"].metrics
        share[name] = m["inherent_idle_ns_mean"] / m["inherent_makespan_ns"]
    assert (
        share["pipeline_zero_bubble"] < share["pipeline_interleaved_1f1b"] < share["pipeline_1f1b"]
    )
    inter = analyze_sample("pipeline_interleaved_1f1b")["pipeline"].metrics
    assert (inter["source"], inter["schedule"], inter["stages_per_rank"]) == (
        "pp",
        "interleaved_1f1b",
        2,
    )
    zb = analyze_sample("pipeline_zero_bubble")["pipeline"].metrics
    assert set(zb["op_ns"]) == {"F", "I", "W"}


def test_unbalanced_pipeline_is_flagged(analyze_sample):
    res = analyze_sample("pipeline_unbalanced")
    imb = [f for f in res["pipeline"].findings if f.code == "PIPELINE_STAGE_IMBALANCE"]
    assert imb and imb[0].evidence.ranks == (0,)
    (mem,) = [f for f in res["memory"].findings if f.code == "STAGE_MEMORY_IMBALANCE"]
    assert mem.evidence.numbers["heaviest_stage"] == 0
    # Beyond what 1F1B's activation pattern explains (1.6), hence a warning.
    assert mem.severity.name == "WARNING"
    assert res["memory"].metrics["max_over_mean"] > res["memory"].metrics["expected_max_over_mean"]
