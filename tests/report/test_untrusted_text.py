"""Names from traces on every surface: control characters, Unicode's bidirectional controls and
newlines never reach a terminal, a page or a report; step lists say which steps they are."""

from __future__ import annotations

from tracelab.render.analysis import render_text
from tracelab.render.text import int_ranges, md, one_line, terminal
from tracelab.report.render_html import _e
from tracelab.results import Evidence, Finding, Severity
from tracelab.views.findings import _evidence_text

RLO = "\u202e"  # right-to-left override: reversed the text after it
HOSTILE = f"Distributed{RLO}DataParallel.forward\nFORGED LINE\u2066x\u2069"


def test_bidirectional_controls_are_dropped_everywhere() -> None:
    for shown in (terminal(HOSTILE), one_line(HOSTILE), md(HOSTILE), _e(HOSTILE)):
        assert not any(c in shown for c in (RLO, "\u2066", "\u2069")), repr(shown)
        assert "DataParallel.forward" in shown


def test_a_name_never_forges_a_line_of_the_analysis() -> None:
    finding = Finding(
        code="HOST_BOUND",
        severity=Severity.WARNING,
        title=f"host span {HOSTILE}",
        evidence=Evidence(ranks=(1,), numbers={"host_span_1": HOSTILE}),
        suggestion=f"look at {HOSTILE}",
        impact_ns_per_step=5_000_000,
        impact_share=0.5,
    ).to_dict()
    doc = {
        "run": {"name": f"run{RLO}\nx", "ranks": 2},
        "lost_time": None,
        "findings": [finding],
        "analyzers": {},
        "errors": {},
    }
    text = render_text(doc)
    assert "FORGED LINE" in text and not any(ln.startswith("FORGED") for ln in text.splitlines())
    assert RLO not in text
    assert len(text.splitlines()) == 8, text  # run, budget, blank, heading, four of the finding


def test_steps_are_listed_as_runs_not_as_one_range() -> None:
    """Steps 2, 8 and 9 were shown as "steps 2–9", as if eight steps."""
    f = Finding(
        code="STEP_TIME_OUTLIER",
        severity=Severity.INFO,
        title="t",
        evidence=Evidence(steps=(8, 2, 9)),
        suggestion="s",
    )
    assert "steps 2, 8–9" in _evidence_text(f)
    assert int_ranges([5]) == "5" and int_ranges([1, 2, 3, 7]) == "1–3, 7"


def test_an_unknown_size_does_not_blame_record_shapes() -> None:
    """'(size not in the trace: profile with record_shapes=True)' was said of host ops that
    issue a collective on captures made with record_shapes=True: the finding says why instead."""
    from tracelab.analyzers._common import SIZE_UNKNOWN_WHY, size_str

    assert size_str(None) == "(size unknown)" and size_str(4096) == "4.0 KiB"
    assert "record_shapes=True" in SIZE_UNKNOWN_WHY and "c10d::allreduce_" in SIZE_UNKNOWN_WHY
