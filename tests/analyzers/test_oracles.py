"""Every oracle of FACTS.md section 4, as a constructed multi-rank trace set with a known answer,
through the real ingest and the analyzers; plus combinations of them."""

from __future__ import annotations

import pytest

TOL_MS = 1e-3  # 1 µs: traces store µs with 3 decimals, so answers are exact to the ns
MS = 1e6  # results carry ns
TOL = 2  # ns


def by_rank(rows: list[dict], rank: int) -> dict:
    return next(r for r in rows if r["rank"] == rank)


# -- overlap and time breakdown -------------------------------------------------------------


@pytest.mark.parametrize(
    "params", [{}, {"second_comm_stream": True}, {"backend": "gloo"}, {"steps": 3, "ranks": 3}]
)
def test_overlap_50_percent_exposed_10(analyzed, params):
    run, res = analyzed("overlap", **params)
    bd = res["breakdown"]
    e = run.expected
    assert len(bd.tables["steps"]) == run.world_size * params.get("steps", 1)
    for row in bd.tables["steps"]:
        assert 100 * row["overlap_share"] == pytest.approx(e["overlap_pct"], abs=1e-6)
        # Everyone arrives together: the exposed communication is all transfer, no waiting.
        assert row["transfer_ns"] == pytest.approx(e["exposed_comm_ms"] * MS, abs=TOL)
        assert row["wait_ns"] == 0
        assert row["overlapped_comm_ns"] == pytest.approx(e["overlapped_comm_ms"] * MS, abs=TOL)
        assert row["compute_ns"] == pytest.approx(e["compute_ms"] * MS, abs=TOL)
        assert row["host_ns"] + row["idle_ns"] == pytest.approx(e["idle_ms"] * MS, abs=TOL)
        assert row["step_ns"] == pytest.approx(e["step_ms"] * MS, abs=TOL)
    codes = [f.code for f in bd.findings]
    assert codes == ["EXPOSED_COMM"]
    f = bd.findings[0]
    assert f.impact_ns_per_step == pytest.approx(10.0 * MS, abs=TOL)
    assert f.impact_share == pytest.approx(1 / 3, abs=1e-3)
    assert "all_reduce" in f.title and "33.3%" in f.title and f.suggestion


PARTS = ("compute", "transfer", "memcpy", "wait", "bubble", "stall", "host", "idle")


def test_parts_add_up_to_the_step(analyzed):
    for scenario, params in [
        ("overlap", {}),
        ("stragglers", {}),
        ("bandwidth", {}),
        ("pipeline", {"schedule": "gpipe", "annotate": "gpipe"}),
        ("pipeline", {"schedule": "1f1b", "backend": "gloo", "annotate": "none"}),
    ]:
        _, res = analyzed(scenario, **params)
        for row in res["breakdown"].tables["steps"]:
            assert sum(row[f"{p}_ns"] for p in PARTS) == row["step_ns"], (scenario, row)
        for row in res["breakdown"].tables["ranks"]:
            assert sum(row[f"{p}_ns"] for p in PARTS) == row["window_ns"], (scenario, row)


def test_below_threshold_no_exposed_comm_finding(analyzed):
    _, res = analyzed("overlap", analyzer_params={"breakdown": {"exposed_comm_threshold": 0.5}})
    assert not res["breakdown"].findings
    assert res["breakdown"].params["exposed_comm_threshold"] == 0.5


# -- bandwidth ------------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["legacy", "dev"])
def test_busbw_175(analyzed, style):
    run, res = analyzed("bandwidth", style=style)
    (bw,) = res["breakdown"].tables["bandwidth"]
    assert bw["op"] == "all_reduce" and bw["ranks"] == 8 and bw["bytes"] == 10**9
    assert bw["transfer_ns"] == pytest.approx(10.0 * MS)
    assert bw["algbw_gbps"] == pytest.approx(run.expected["algbw_gbps"])
    assert bw["busbw_gbps"] == pytest.approx(run.expected["busbw_gbps"])
    f = res["breakdown"].findings[0]
    assert "bus bandwidth 175 GB/s" in f.evidence.numbers["collective_1"]


# -- stragglers -----------------------------------------------------------------------------

WAITS_SQL = """SELECT match_key, rank, wait_ns, transfer_ns, last_rank
               FROM matched_collectives WHERE run_id = $run ORDER BY match_key, rank"""


def waits_by_match(analyzed, run) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for x in analyzed.query(run, WAITS_SQL):
        out.setdefault(x["match_key"], {})[x["rank"]] = x["wait_ns"] / MS
    return out


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_straggler_rank2_waits_5403(analyzed, backend):
    run, res = analyzed("stragglers", backend=backend)
    st = res["stragglers"]
    e = run.expected
    assert st.metrics["stragglers"] == [e["straggler_rank"]]
    assert st.metrics["matched"] == e["steps"]
    waits = waits_by_match(analyzed, run)
    assert len(waits) == e["steps"]
    for by_rank_ in waits.values():
        assert [by_rank_[r] for r in range(4)] == pytest.approx(e["waits_ms"], abs=TOL_MS)
    for c in st.tables["collectives"]:
        assert c["last_rank"] == 2 and c["transfer_ns"] == pytest.approx(e["transfer_ms"] * MS)
    (f,) = st.findings
    assert f.code == "STRAGGLER_COMPUTE" and f.evidence.ranks == (2,)
    assert f.evidence.affected_ranks == (0, 1, 3)
    assert f.impact_ns_per_step == pytest.approx(e["saved_ms_straggler"] * MS, abs=TOL)
    # The what-if replay: at the median compute every step ends saved_ms sooner.
    for s in st.tables["steps"]:
        assert s["saved_ns"] == pytest.approx(e["saved_ms"] * MS, abs=TOL)
        assert s["ideal_step_ns"] == pytest.approx(s["step_ns"] - e["saved_ms"] * MS, abs=TOL)
    # The lost-time parts: compute before the all-reduce is 10 + arrival, then the wait.
    parts = analyzed.query(run, "SELECT * FROM step_parts WHERE run_id = $run")
    assert len(parts) == 4 * e["steps"]
    for row in parts:
        assert row["compute_ns"] == pytest.approx((10 + (0, 1, 5, 2)[row["rank"]]) * MS, abs=TOL)
        assert row["wait_ns"] == pytest.approx(e["waits_ms"][row["rank"]] * MS, abs=TOL)
        assert row["transfer_ns"] == pytest.approx(e["transfer_ms"] * MS, abs=TOL)


def test_whatif_two_ranks_slowdown_1111(analyzed):
    run, res = analyzed("whatif")
    st = res["stragglers"]
    last = st.tables["steps"][-1]  # the last step ends at its span: 15 ms, 13.5 at the median
    assert last["step_ns"] == pytest.approx(15.0 * MS, abs=TOL)
    assert last["ideal_step_ns"] == pytest.approx(13.5 * MS, abs=TOL)
    assert last["slowdown"] == pytest.approx(1.111, abs=1e-3)
    for s in st.tables["steps"]:
        assert s["saved_ns"] == pytest.approx(1.5 * MS, abs=TOL)
    f = next(f for f in st.findings if f.code.startswith("STRAGGLER_"))
    assert f.evidence.ranks == (1,)
    # Rank 1 alone at its peer's speed (10 ms, not the median of both, 11.5) saves its whole
    # 3 ms lead; the ideal above (every rank at the median of both) is the published oracle's.
    assert f.impact_ns_per_step == pytest.approx(3.0 * MS, abs=TOL)


def test_no_straggler_when_all_arrive_together(analyzed):
    _, res = analyzed("stragglers", arrivals_ms=(2, 2, 2, 2), name="even")
    assert res["stragglers"].metrics["stragglers"] == []
    assert not res["stragglers"].findings


# -- clocks ---------------------------------------------------------------------------------


def test_clock_offset_3ms_recovered(analyzed):
    run, res = analyzed("clock_offset")
    ck = res["clocks"]
    r1 = by_rank(ck.tables["ranks"], 1)
    assert r1["method"] == "collectives"
    assert r1["offset_ns"] == pytest.approx(3.0 * MS, abs=TOL)
    # Uncorrected, rank 1 looks 3 ms late at every collective: the false straggler.
    assert r1["raw_skew_ns"] == pytest.approx(run.expected["false_lateness_ms"] * MS, abs=100)
    assert r1["skew_ns"] == pytest.approx(0.0, abs=TOL)
    assert ck.metrics["causality_violations"] == 0
    assert [f.code for f in ck.findings] == ["CLOCK_SKEW"]
    assert res["stragglers"].metrics["stragglers"] == []


def test_clock_offset_from_collector_exchange(analyzed):
    _, res = analyzed("clock_offset", capture=True)
    r1 = by_rank(res["clocks"].tables["ranks"], 1)
    assert r1["method"] == "collector"
    assert r1["offset_ns"] == pytest.approx(3.0 * MS)
    assert r1["uncertainty_ns"] == pytest.approx(0.02 * MS)
    assert res["clocks"].metrics["methods"] == ["collector"]
    assert res["stragglers"].metrics["stragglers"] == []


def test_straggler_found_through_a_skewed_clock(analyzed):
    # Rank 1's clock is 3 ms ahead (it would look late) and rank 2 really is late.
    run, res = analyzed("stragglers", clock_offsets_ms=(0, 3, 0, 0), name="skewed")
    assert by_rank(res["clocks"].tables["ranks"], 1)["offset_ns"] == pytest.approx(3.0 * MS)
    assert res["stragglers"].metrics["stragglers"] == [2]
    for by_rank_ in waits_by_match(analyzed, run).values():
        assert [by_rank_[r] for r in range(4)] == pytest.approx(
            run.expected["waits_ms"], abs=TOL_MS
        )


# -- pipelines ------------------------------------------------------------------------------

PIPELINES = [
    # (params, share of the step, megatron form, idle per stage ms, makespan ms)
    ({"schedule": "gpipe", "annotate": "gpipe"}, 3 / 11, 3 / 8, 9.0, 33.0),
    ({"schedule": "gpipe", "annotate": "gpipe", "backend": "gloo"}, 3 / 11, 3 / 8, 9.0, 33.0),
    ({"schedule": "1f1b"}, 3 / 11, 3 / 8, 9.0, 33.0),
    ({"schedule": "1f1b", "backend": "gloo", "annotate": "none"}, 3 / 11, 3 / 8, 9.0, 33.0),
    ({"schedule": "1f1b", "p": 8, "m": 32}, 7 / 39, 7 / 32, 21.0, 117.0),
    ({"schedule": "interleaved_1f1b", "v": 2}, 3 / 19, 3 / 16, 4.5, 28.5),
    ({"schedule": "interleaved_1f1b", "v": 2, "backend": "gloo"}, 3 / 19, 3 / 16, 4.5, 28.5),
    ({"schedule": "zb_h1", "tf_ms": 1.0}, 1 / 9, 1 / 8, 3.0, 27.0),
]


@pytest.mark.parametrize(
    "params,share,megatron,idle,makespan", PIPELINES, ids=[str(p[0]) for p in PIPELINES]
)
def test_pipeline_bubbles(analyzed, params, share, megatron, idle, makespan):
    run, res = analyzed("pipeline", **params)
    pp = res["pipeline"]
    assert pp.metrics["schedule"] == params["schedule"]
    assert pp.metrics["window_ns_mean"] == pytest.approx(makespan * MS, abs=TOL)
    assert len(pp.tables["stages"]) == run.expected["p"]
    for s in pp.tables["stages"]:
        assert s["bubble_share"] == pytest.approx(share, abs=1e-4)
        assert s["bubble_share_megatron"] == pytest.approx(megatron, abs=1e-4)
        assert s["idle_ns"] == pytest.approx(idle * MS, abs=TOL)
        assert s["inherent_idle_ns"] == pytest.approx(idle * MS, abs=TOL)
        assert s["bubble_ns"] == pytest.approx(idle * MS, abs=TOL)
        assert s["stall_ns"] == pytest.approx(0.0, abs=TOL)
        assert s["leading_ns"] == pytest.approx(
            run.expected["leading_idle_ms"][s["rank"]] * MS, abs=TOL
        )
    assert pp.metrics["textbook_bubble_share"] == pytest.approx(share, abs=1e-4)
    codes = [f.code for f in pp.findings]
    assert codes == ["PIPELINE_BUBBLE"]
    assert pp.findings[0].impact_ns_per_step == pytest.approx(idle * MS, abs=TOL)
    assert "%" in pp.findings[0].suggestion


def test_pipeline_stall_and_slow_stage(analyzed):
    run, res = analyzed("pipeline", schedule="1f1b", slow_stage=2, slow_factor=1.5, stall_ms=3)
    pp = res["pipeline"]
    codes = {f.code for f in pp.findings}
    assert codes == {"PIPELINE_BUBBLE", "PIPELINE_STALL", "PIPELINE_STAGE_IMBALANCE"}
    stall = next(f for f in pp.findings if f.code == "PIPELINE_STALL")
    assert stall.impact_ns_per_step == pytest.approx(3.0 * MS, abs=TOL)
    for s in pp.tables["stages"]:
        exp = run.expected
        assert s["idle_ns"] == pytest.approx(exp["idle_ms"][s["rank"]] * MS, abs=TOL)
        assert s["inherent_idle_ns"] == pytest.approx(
            exp["inherent_idle_ms"][s["rank"]] * MS, abs=TOL
        )
    imb = next(f for f in pp.findings if f.code == "PIPELINE_STAGE_IMBALANCE")
    assert imb.evidence.ranks == (2,)


def test_no_pipeline_in_a_data_parallel_run(analyzed):
    _, res = analyzed("stragglers")
    assert res["pipeline"].metrics == {"pipeline": False}
    assert not res["pipeline"].findings


# -- memory ---------------------------------------------------------------------------------


def test_1f1b_activation_peaks_max_over_mean_16(analyzed):
    run, res = analyzed("pipeline", schedule="1f1b")
    mem = res["memory"]
    assert mem.metrics["source"] == "step_peak" and not mem.metrics["peak_is_lower_bound"]
    assert [s["peak_bytes"] / 2**30 for s in mem.tables["stages"]] == [4.0, 3.0, 2.0, 1.0]
    assert [s["expected_microbatches"] for s in mem.tables["stages"]] == [4, 3, 2, 1]
    assert mem.metrics["max_over_mean"] == pytest.approx(1.6)
    assert mem.metrics["expected_max_over_mean"] == pytest.approx(1.6)
    (f,) = mem.findings
    assert f.code == "STAGE_MEMORY_IMBALANCE" and f.severity.name == "INFO"


def test_memory_from_trace_events_is_a_lower_bound(analyzed):
    run, res = analyzed("pipeline", schedule="1f1b", capture=False)
    mem = res["memory"]
    assert mem.metrics["source"] == "trace" and mem.metrics["peak_is_lower_bound"]
    assert [r["peak_bytes"] / 2**30 for r in mem.tables["ranks"]] == run.expected[
        "peak_microbatches"
    ]
    assert mem.notes and "lower bound" in mem.notes[0]


def test_gpipe_memory_is_balanced(analyzed):
    _, res = analyzed("pipeline", schedule="gpipe", annotate="gpipe")
    assert res["memory"].metrics["max_over_mean"] == pytest.approx(1.0)
    assert not res["memory"].findings


# -- steps ----------------------------------------------------------------------------------


def test_step_summary(analyzed):
    run, res = analyzed("stragglers")
    st = res["steps"]
    assert st.metrics["steps"] == 4 and st.metrics["ranks"] == 4
    # Steps tile: each takes its 17 ms span and the 5 ms gap to the next (the last ends at
    # its span); the steady state leaves out the first.
    assert st.metrics["step_ns"] == pytest.approx((22 + 22 + 17) / 3 * MS, abs=TOL)
    assert st.metrics["step_ns_median"] == pytest.approx(22.0 * MS, abs=TOL)
    assert st.metrics["outlier_steps"] == [] and not st.findings
