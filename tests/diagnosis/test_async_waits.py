"""Waiting where it happens (issue 20 part 1, issue 21 section 3): plain torch.profiler captures
of FSDP2, DTensor tensor parallelism and many-bucket DDP, one rank slower in each.

- fsdp_compute / tp_compute: rank 1 computes ~70 / ~55 ms more a step (conftest.ASYNC_SCENARIOS).
  The others block for it in `_c10d_functional::wait_tensor` (TP) or in a work's untraced
  wait() inside an autograd hook (FSDP2 in backward), not in the collective's own span on the
  gloo worker thread. That waiting must be read as waiting for rank 1 (comm_attribution's
  culprit), and the top finding must be STRAGGLER_COMPUTE blaming rank 1, at its measured cost
  +-30%, with EXPOSED_COMM below it.
- ddp_sleep_buckets: rank 2 sleeps 50 ms a step before backward in a DDP job with seven
  gradient buckets (conftest.SLEEP_BUCKETS). Its buckets then queue on its gloo threads behind one another; the others'
  waiting must not be read as transfer: the top finding is STRAGGLER_HOST blaming rank 2.

The invariants (parts add up to the step, impacts to at most the step) are test_invariants.py's,
over these captures too (conftest.CAPTURES).
"""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from .conftest import BUCKET_SLEEP, FSDP_COMPUTE, MS, TP_COMPUTE, Diagnosis

pytestmark = pytest.mark.torchrun

#: Allowed relative error of a straggler's impact against the injected delay (issue 11).
IMPACT_TOLERANCE = 0.30

CASES = {
    "fsdp_compute": ("STRAGGLER_COMPUTE", FSDP_COMPUTE["rank"]),
    "tp_compute": ("STRAGGLER_COMPUTE", TP_COMPUTE["rank"]),
    "ddp_sleep_buckets": ("STRAGGLER_HOST", BUCKET_SLEEP["rank"]),
}


def _ok(d: Diagnosis) -> None:
    assert d.rc == 0 and d.doc, f"{d.name}: analyze exited {d.rc}\n{d.stderr[-3000:]}"
    assert d.doc["errors"] == {}, d.doc["errors"]
    assert d.findings, f"{d.name}: no findings"


@pytest.mark.parametrize("name", list(CASES))
def test_top_finding_is_the_injected_straggler(diagnose: Any, name: str) -> None:
    d = diagnose(name)
    _ok(d)
    code, rank = CASES[name]
    top = d.findings[0]
    assert top["code"] == code, d.summary()
    assert top["evidence"]["ranks"] == [rank], d.summary()
    codes = d.codes()
    if "EXPOSED_COMM" in codes:
        assert codes.index("EXPOSED_COMM") > codes.index(code), d.summary(5)


@pytest.mark.parametrize("name", list(CASES))
def test_impact_is_the_injected_cost(diagnose: Any, name: str) -> None:
    """The fault's wall time, timed by the faulty rank itself, is what the others wait for.
    (That the straggler ranks first is test_top_finding_is_the_injected_straggler's.)"""
    d = diagnose(name)
    _ok(d)
    code, rank = CASES[name]
    found = [f for f in d.findings if f["code"] == code and f["evidence"]["ranks"] == [rank]]
    assert found, d.summary()
    top = found[0]
    measured = statistics.median(d.fault["recorded_ns"])
    assert top["impact_ns_per_step"] == pytest.approx(measured, rel=IMPACT_TOLERANCE), (
        f"{d.summary()}; measured fault {measured / MS:.1f} ms"
    )


def test_wait_tensor_is_waiting_for_the_late_rank(diagnose: Any) -> None:
    """TP's healthy ranks block in wait_tensor: that time is attributed through the all-reduce
    it waits for (never as an 'unknown' or 'wait_tensor' transfer), mostly to rank 1."""
    d = diagnose("tp_compute")
    _ok(d)
    names = d.sql(
        "SELECT count(*) AS n FROM events WHERE run_id = $run AND name ILIKE '%wait_tensor%'"
    )
    assert names[0]["n"] > 0, "the capture has no wait_tensor: nothing was tested"
    ops = d.sql(
        "SELECT DISTINCT op FROM comm_attribution WHERE run_id = $run AND part = 'transfer'"
    )
    assert {r["op"] for r in ops} == {"all_reduce"}, ops
    waits = d.sql(
        "SELECT culprit_rank, sum(exposed_ns) AS ns FROM comm_attribution "
        "WHERE run_id = $run AND part = 'wait' AND rank <> $slow GROUP BY culprit_rank "
        "ORDER BY ns DESC".replace("$slow", str(TP_COMPUTE["rank"]))
    )
    assert waits and waits[0]["culprit_rank"] == TP_COMPUTE["rank"], waits


@pytest.mark.parametrize("name", list(CASES))
def test_slow_rank_causes_most_of_the_waiting(diagnose: Any, name: str) -> None:
    """The healthy ranks' waiting, wherever they block, is blamed on the injected rank: it
    causes at least half of it, and at least half its measured cost per step and rank."""
    d = diagnose(name)
    _ok(d)
    slow = CASES[name][1]
    rows = d.sql(
        "SELECT culprit_rank, sum(exposed_ns) AS ns, "
        "count(DISTINCT (rank, step)) AS n FROM comm_attribution "
        "WHERE run_id = $run AND part = 'wait' AND rank <> $slow "
        "AND step IN (SELECT step FROM step_spans WHERE run_id = $run AND ordinal >= 1) "
        "GROUP BY culprit_rank".replace("$slow", str(slow))
    )
    total = sum(r["ns"] for r in rows)
    mine = sum(r["ns"] for r in rows if r["culprit_rank"] == slow)
    assert total > 0 and mine >= 0.5 * total, rows
    pairs = d.sql(
        "SELECT count(*) AS n FROM step_parts WHERE run_id = $run AND ordinal >= 1 "
        "AND rank <> $slow".replace("$slow", str(slow))
    )[0]["n"]
    measured = statistics.median(d.fault["recorded_ns"])
    assert mine / pairs >= 0.5 * measured, (mine / pairs / MS, measured / MS)
