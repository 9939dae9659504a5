"""Every torch.distributed.pipelining schedule on plain torch.profiler traces.

Captures (conftest.PIPELINE_SCHEDULES, one torchrun launch): 4 ranks, gloo on CPU, 8
microbatches, every stage the same module (2 x Linear(512, 512) + ReLU), 10 recorded steps.

For every schedule: `tracelab analyze` exits 0 with no analyzer error; the pipeline analyzer
finds the pipeline, names the schedule, its ranks, stages per rank and microbatches, replays
the schedule's own need (so idle splits into bubble and stall) and reports a bubble.

Textbook bubble (GPipe and 1F1B only, where it is known in closed form): with p stages and m
microbatches of equal stages the schedule idles each rank (p-1)/(m+p-1) of the step. What is
asserted, and why:
1. tracelab's `textbook_bubble_share` is exactly (p-1)/(m+p-1) = 3/11.
2. Its replay of the observed order with every stage at the mean op time (balanced_makespan_ns,
   op_ns) has the textbook bubble: 1 - m (F + B) / balanced makespan = 3/11 within 0.01.
3. The bubble it measures for this run (mean over ranks of the inherent idle / the replayed
   makespan; stalls from p2p latency are not part of it) matches the closed form for the
   measured stage times within 0.05. The stages are the same module, but 4 ranks on 2 shared
   cores do not run at the same speed (measured: backward medians from 2 to 6 ms, or 8 to 19 ms
   in a busier minute, for the same matmuls), and the bubble is very sensitive to the slowest
   stage (0.42 instead of 0.27 for one stage 1.9x the fastest). For identical microbatches
   and per-stage times F_s, B_s the schedule (GPipe exactly, as a flow shop; 1F1B to within a
   few % when the backward dominates) takes T = sum F_s + (m-1) max F_s + sum B_s
   + (m-1) max B_s, and rank s idles T - m (F_s + B_s). With equal stages this is (p-1)/(m+p-1).
   The stage times are the medians tracelab measured per (stage, kind) (pipeline_actions).
The raw idle share of the window (`bubble_share_mean`, bubble + stall) is not compared with
the textbook: on 2 shared cores each gloo send/recv round trip costs milliseconds of
scheduling latency, which is real stall, not bubble.
"""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from .conftest import PIPELINE, PIPELINE_SCHEDULES, STAGES_PER_RANK, WORLD, Diagnosis

pytestmark = pytest.mark.torchrun

SCHEDULES = list(PIPELINE_SCHEDULES)
TEXTBOOK = ["gpipe", "1f1b"]
#: Balanced replay vs textbook (both exact up to op-time rounding).
BALANCED_TOLERANCE = 0.01
#: Measured bubble vs the closed form for the measured stage times.
MEASURED_TOLERANCE = 0.05


def _ok(d: Diagnosis) -> dict[str, Any]:
    assert d.rc == 0 and d.doc, f"{d.name}: analyze exited {d.rc}\n{d.stderr[-3000:]}"
    assert "Traceback" not in d.stderr, d.stderr[-3000:]
    assert d.doc["errors"] == {}, d.doc["errors"]
    return d.doc["analyzers"]["pipeline"]["metrics"]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_analyze_succeeds(diagnose: Any, schedule: str) -> None:
    _ok(diagnose(f"pp_{schedule}"))


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_bubble_reported(diagnose: Any, schedule: str) -> None:
    d = diagnose(f"pp_{schedule}")
    m = _ok(d)
    assert m["pipeline"] is True, d.doc["analyzers"]["pipeline"]["notes"]
    assert m["bubble_ns_mean"] and m["bubble_ns_mean"] > 0, m
    assert m["bubble_share_mean"] and 0 < m["bubble_share_mean"] < 1, m


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_schedule_identified(diagnose: Any, schedule: str) -> None:
    d = diagnose(f"pp_{schedule}")
    m = _ok(d)
    got = {k: m.get(k) for k in ("schedule", "ranks", "stages_per_rank", "microbatches")}
    assert got == {
        "schedule": PIPELINE_SCHEDULES[schedule],
        "ranks": WORLD,
        "stages_per_rank": STAGES_PER_RANK[schedule],
        "microbatches": PIPELINE["microbatches"],
    }


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_schedule_need_replayed(diagnose: Any, schedule: str) -> None:
    """Without a replay of the schedule's own need every idle ns is called bubble and no stall
    can be told apart."""
    d = diagnose(f"pp_{schedule}")
    m = _ok(d)
    assert m["inherent_order"] in ("observed order", "textbook order"), m
    assert m["inherent_makespan_ns"] and m["inherent_idle_ns_mean"] is not None, m


def _textbook(p: int, mb: int) -> float:
    return (p - 1) / (mb + p - 1)


@pytest.mark.parametrize("schedule", TEXTBOOK)
def test_textbook_bubble_formula(diagnose: Any, schedule: str) -> None:
    d = diagnose(f"pp_{schedule}")
    m = _ok(d)
    assert m["textbook_bubble_share"] == pytest.approx(_textbook(WORLD, PIPELINE["microbatches"]))


@pytest.mark.parametrize("schedule", TEXTBOOK)
def test_balanced_replay_has_textbook_bubble(diagnose: Any, schedule: str) -> None:
    d = diagnose(f"pp_{schedule}")
    m = _ok(d)
    mb = PIPELINE["microbatches"]
    busy = mb * (m["op_ns"]["F"] + m["op_ns"]["B"])
    share = 1 - busy / m["balanced_makespan_ns"]
    assert share == pytest.approx(_textbook(WORLD, mb), abs=BALANCED_TOLERANCE), m


@pytest.mark.parametrize("schedule", TEXTBOOK)
def test_measured_bubble_matches_closed_form(diagnose: Any, schedule: str) -> None:
    d = diagnose(f"pp_{schedule}")
    m = _ok(d)
    mb = PIPELINE["microbatches"]
    med = {
        (r["stage"], r["kind"]): r["med"]
        for r in d.sql(
            "SELECT stage, kind, median(busy_ns) AS med FROM pipeline_actions WHERE run_id = $run "
            "GROUP BY stage, kind"
        )
    }
    stages = range(WORLD)
    f = [med[(s, "F")] for s in stages]
    b = [med[(s, "B")] for s in stages]
    makespan = sum(f) + (mb - 1) * max(f) + sum(b) + (mb - 1) * max(b)
    expected = statistics.mean(1 - mb * (f[s] + b[s]) / makespan for s in stages)
    measured = m["inherent_idle_ns_mean"] / m["inherent_makespan_ns"]
    assert measured == pytest.approx(expected, abs=MEASURED_TOLERANCE), (
        f"measured {measured:.3f}, closed form {expected:.3f} (equal stages "
        f"{_textbook(WORLD, mb):.3f}); stage F {[round(x / 1e6, 2) for x in f]} ms, "
        f"B {[round(x / 1e6, 2) for x in b]} ms"
    )
