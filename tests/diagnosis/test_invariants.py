"""The lost-time model's invariants on every real capture of this package.

- For each rank and step, the parts add up to the step exactly: compute + transfer + memcpy +
  wait + bubble + stall + host + idle = step_ns (step_parts), and step_ns is the step's span
  (step_spans.dur_ns).
- The findings' impacts never add up to more than the step: sum of impact_ns_per_step over
  all findings <= lost_time.step_ns of the document.
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import CAPTURES, DDP2_SCENARIOS, MS

pytestmark = pytest.mark.torchrun

PARTS = (
    "compute_ns",
    "transfer_ns",
    "memcpy_ns",
    "wait_ns",
    "bubble_ns",
    "stall_ns",
    "host_ns",
    "idle_ns",
)


@pytest.mark.parametrize("name", CAPTURES)
def test_parts_add_up_to_the_step(diagnose: Any, name: str) -> None:
    d = diagnose(name)
    got = d.sql(f"""
        SELECT p.rank, p.step, p.step_ns, s.dur_ns, {" + ".join("p." + c for c in PARTS)} AS parts,
               least({", ".join("p." + c for c in PARTS)}) AS smallest
        FROM step_parts p JOIN step_spans s USING (run_id, rank, step)
        WHERE p.run_id = $run ORDER BY p.rank, p.step""")
    assert got, f"{name}: no step_parts"
    ranks = {r["rank"] for r in got}
    assert ranks == set(range(2 if name in DDP2_SCENARIOS else 4)), ranks
    bad = [
        r
        for r in got
        if r["parts"] != r["step_ns"] or r["step_ns"] != r["dur_ns"] or r["smallest"] < 0
    ]
    assert not bad, bad[:5]


@pytest.mark.parametrize("name", CAPTURES)
def test_impacts_at_most_the_step(diagnose: Any, name: str) -> None:
    d = diagnose(name)
    assert d.doc, f"{name}: no analysis document (exit {d.rc})\n{d.stderr[-2000:]}"
    step = d.doc["lost_time"]["step_ns"]
    total = sum(f["impact_ns_per_step"] or 0 for f in d.findings)
    assert total <= step, (
        f"{name}: impacts add up to {total / MS:.1f} ms, step {step / MS:.1f} ms; {d.summary(10)}"
    )


@pytest.mark.parametrize("name", CAPTURES)
def test_each_impact_is_the_sum_of_its_parts(diagnose: Any, name: str) -> None:
    """Finding.impact_parts says which parts a finding's impact was allocated from (the
    Overview names each part after the finding given most of it): they add up to the impact."""
    d = diagnose(name)
    for f in d.findings:
        parts = f["impact_parts"]
        if f["impact_ns_per_step"] is None:
            assert parts == {}, f
            continue
        assert sum(parts.values()) == f["impact_ns_per_step"], f


@pytest.mark.parametrize("name", CAPTURES)
def test_no_rank_waits_for_itself(diagnose: Any, name: str) -> None:
    """A wait is for a collective's last rank: the last rank's own wait_ns and linked waits are
    its transfer. They were filed as waiting for itself (7 ms a step of a late rank's
    all-to-alls on gloo, found on a capture outside this package), inflating the wait it
    "caused"."""
    d = diagnose(name)
    got = d.sql(
        "SELECT rank, step, op, exposed_ns FROM comm_attribution "
        "WHERE run_id = $run AND part = 'wait' AND culprit_rank = rank"
    )
    assert not got, got[:5]
