"""JUnit XML: one test case per gated metric, so CI systems list regressions natively.

A regression is a <failure>; a metric that could not be judged (too few steps, missing on one
side) is <skipped> with the reason; everything else passes. Ungated rows are left out. A hang
or desync verdict of the candidate is a failed case of its own (classname
`tracelab.report.hang`), first.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from tracelab.render.text import terminal
from tracelab.report import formatting as fmt
from tracelab.report.compare import Comparison, Report, Verdict
from tracelab.results import Finding

SUITE = "tracelab.report"
#: Characters XML 1.0 cannot hold at all, even escaped (trace names may contain them).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _clean(text: str) -> str:
    return _NOT_XML.sub("\ufffd", terminal(text))


def _detail(r: Comparison) -> str:
    return _clean(
        f"{r.label}: baseline {fmt.value(r.baseline, r.unit)}, candidate "
        f"{fmt.value(r.candidate, r.unit)}, change {fmt.delta(r.delta, r.delta_kind)}, "
        f"95% CI {fmt.ci(r)}, p {fmt.p_value(r.p_value)} (Holm {fmt.p_value(r.p_adjusted)}), "
        f"samples {fmt.samples(r)}, "
        f"threshold {r.threshold}: {r.reason}"
    )


def _blocking_case(suite: ET.Element, f: Finding) -> None:
    """A hang or desync verdict as a failed test case, before the metrics' cases."""
    case = ET.SubElement(
        suite, "testcase", classname=f"{SUITE}.hang", name=_clean(f.code), time="0"
    )
    failure = ET.SubElement(case, "failure", type="Hang", message=_clean(f"{f.code}: {f.title}"))
    failure.text = _clean("\n".join(f"{label}: {value}" for label, value in fmt.blocking_fields(f)))


def render(report: Report) -> str:
    rows = [r for r in report.rows if r.gated]
    failures = sum(r.verdict is Verdict.REGRESSION for r in rows) + len(report.blocking)
    skipped = sum(r.verdict is Verdict.WARN for r in rows)
    errors = len(report.errors)
    tests = len(rows) + len(report.blocking) + errors
    root = ET.Element(
        "testsuites",
        name="tracelab",
        tests=str(tests),
        failures=str(failures),
        errors=str(errors),
        skipped=str(skipped),
    )
    suite = ET.SubElement(
        root,
        "testsuite",
        name=SUITE,
        tests=str(tests),
        failures=str(failures),
        errors=str(errors),
        skipped=str(skipped),
        time="0",
    )
    props = ET.SubElement(suite, "properties")
    for name, val in (
        ("baseline", report.baseline.run.name),
        ("candidate", report.candidate.run.name),
        ("verdict", report.verdict),
        ("alpha", str(report.settings.alpha)),
    ):
        ET.SubElement(props, "property", name=name, value=_clean(val))
    for f in report.blocking:
        _blocking_case(suite, f)
    for what, why in report.errors.items():  # an analyzer that failed: the gate is broken
        case = ET.SubElement(
            suite, "testcase", classname=f"{SUITE}.analyzer", name=_clean(what), time="0"
        )
        ET.SubElement(case, "error", type="AnalyzerFailed", message=_clean(f"{what}: {why}"))
    for r in rows:
        case = ET.SubElement(
            suite, "testcase", classname=f"{SUITE}.{r.gate}", name=_clean(r.key), time="0"
        )
        if r.verdict is Verdict.REGRESSION:
            failure = ET.SubElement(
                case,
                "failure",
                type="PerformanceRegression",
                message=_clean(
                    f"{r.label}: {fmt.delta(r.delta, r.delta_kind)} "
                    f"(threshold {r.threshold}): {r.reason}"
                ),
            )
            failure.text = _detail(r)
        elif r.verdict is Verdict.WARN:
            ET.SubElement(case, "skipped", message=_clean(f"{r.label}: {r.reason}"))
        out = ET.SubElement(case, "system-out")
        out.text = _detail(r)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
