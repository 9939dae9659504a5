"""A finding's impact_parts: where its allocated impact came from, in whole ns adding up to it
(the Overview names each part of the step after the finding given most of it)."""

from __future__ import annotations

from tracelab.results import Evidence, Finding, Severity


def test_impact_parts_add_up_to_the_impact() -> None:
    """Each part rounded on its own made 2 + 2 beside an impact of 5 (a budget of 2.5 ns wait
    and 2.5 ns host): the parts are whole ns, largest remainder first, and add up exactly."""
    from tracelab.analyzers._budget import allocate
    from tracelab.results import Claim

    class Bud:
        step_ns = 100.0
        parts = {"wait": 2.5, "host": 2.5}

    f = Finding(
        code="STRAGGLER_HOST",
        severity=Severity.WARNING,
        title="t {impact_ms}",
        evidence=Evidence(),
        suggestion="s",
        claim=Claim(parts=(("wait", 10), ("host", 10))),
    )
    (got,) = allocate([f], Bud())  # type: ignore[arg-type]
    assert got.impact_ns_per_step == 5
    assert sum(n for _, n in got.impact_parts) == 5 and dict(got.impact_parts)["wait"] == 3
