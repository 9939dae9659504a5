"""The four renderers: Markdown, HTML, JSON, JUnit. Hostile trace text must come out inert."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

import pytest

from tracelab.report import render_html, render_json, render_junit, render_markdown
from tracelab.report.compare import MetricValue, Report, compare
from tracelab.report.thresholds import load_settings

HOSTILE = '</script><script>alert("x")</script> | *bold* <img src=x onerror=alert(1)>\x01'


@pytest.fixture
def report(make_run_metrics: Callable[..., Any], make_finding: Callable[..., Any]) -> Report:
    op = {
        f"op_time[{HOSTILE}]": MetricValue(
            key=f"op_time[{HOSTILE}]", gate="op_time", label=HOSTILE, value=2.0
        )
    }
    base = make_run_metrics("main", seed=1, extra=op)
    cand_op = {k: MetricValue(key=k, gate="op_time", label=HOSTILE, value=3.0) for k in op}
    cand = make_run_metrics(
        f"pr-1 {HOSTILE}",
        seed=2,
        slowdown=1.1,
        extra=cand_op,
        findings=(make_finding("STRAGGLER", (2,), title=HOSTILE),),
    )
    return compare(base, cand, load_settings(search_dir=None))


def test_markdown(report: Report) -> None:
    md = render_markdown.render(report)
    lines = md.splitlines()
    assert lines[2].startswith("❌ **Performance regression** in 1 of ")
    assert "| Step time |" in md and "| Exposed communication |" in md
    header = next(line for line in lines if line.startswith("| Metric |"))
    assert header.count("|") == 10
    for line in lines:  # every table row keeps its column count: '|' in names is escaped
        if line.startswith("| ") and not line.startswith("| Metric"):
            assert line.replace("\\|", "").count("|") == 10, line
    assert "<script>" not in md and "<img" not in md and "&lt;script&gt;" in md
    assert "### New findings (1)" in md and "`STRAGGLER`" in md


def test_json_schema(report: Report) -> None:
    data = json.loads(render_json.render(report))
    assert data["schema"] == "tracelab.report/1"
    assert data["verdict"] == "regression" and data["exit_code"] == 1
    assert data["regressions"] == ["step_time"]
    row = next(m for m in data["metrics"] if m["key"] == "step_time")
    assert set(row) == {
        "key",
        "metric",
        "label",
        "unit",
        "baseline",
        "candidate",
        "delta",
        "delta_kind",
        "ci_low",
        "ci_high",
        "p_value",
        "p_adjusted",
        "n_baseline",
        "n_candidate",
        "threshold",
        "gated",
        "verdict",
        "reason",
    }
    assert row["verdict"] == "regression" and row["unit"] == "ms"
    assert data["settings"]["thresholds"]["step_time"]["text"] == "+5%"
    assert data["new_findings"][0]["code"] == "STRAGGLER"
    assert data["candidate"]["name"].startswith("pr-1 ")


def test_junit_parses_with_one_case_per_gated_metric(report: Report) -> None:
    xml = render_junit.render(report)
    root = ET.fromstring(xml.encode())
    suite = root.find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    gated = [r for r in report.rows if r.gated]
    assert len(cases) == len(gated) == int(suite.get("tests", "-1"))
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    assert failed == ["step_time"] and suite.get("failures") == "1"
    assert all(c.get("classname", "").startswith("tracelab.report.") for c in cases)


def test_html_is_self_contained_and_escaped(report: Report) -> None:
    page = render_html.render(report)
    assert page.startswith("<!DOCTYPE html>")
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;/script&gt;" in page
    # plotly.js inline: no script or stylesheet is loaded from anywhere.
    assert not re.search(r"<script[^>]*\ssrc=", page)
    assert not re.search(r"<link[^>]*\shref=", page)
    assert page.count("plotly.js v") >= 1
    assert page.count('<div class="figure">') == 3


def test_html_without_plotly_has_tables_and_says_so(tmp_path: Any) -> None:
    """Runs in a fresh interpreter where importing plotly fails, as when it is not installed."""
    code = (
        "import sys; sys.modules['plotly'] = None\n"
        "from tracelab.report.compare import MetricValue, RunMetrics, RunSummary, compare\n"
        "from tracelab.report.thresholds import load_settings\n"
        "from tracelab.report import render_html\n"
        "v = {'step_time': MetricValue(key='step_time', gate='step_time', label='Step time',"
        " value=1.0, samples=(1.0,) * 10)}\n"
        "m = RunMetrics(run=RunSummary(name='a'), values=v)\n"
        "page = render_html.render(compare(m, m, load_settings(search_dir=None)))\n"
        "assert 'id=\"no-plotly\"' in page and 'Step time' in page, page\n"
        "assert 'plotly.js v' not in page\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
