"""The HTML report in a real headless Chromium: scripts run without errors, the plotly figures
render offline, and hostile trace text stays text."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tracelab.report import render_html
from tracelab.report.compare import MetricValue, compare
from tracelab.report.thresholds import load_settings

PWN = (
    "<img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">"
    "<script>document.body.setAttribute('data-pwned','2')</script>"
)


@pytest.mark.browser
def test_html_report_opens_offline_without_errors(
    make_run_metrics: Callable[..., Any],
    make_finding: Callable[..., Any],
    open_in_chromium: Callable[[Path], tuple[str, list[str]]],
    tmp_path: Path,
) -> None:
    op = {
        f"op_time[{PWN}]": MetricValue(key=f"op_time[{PWN}]", gate="op_time", label=PWN, value=1.0)
    }
    base = make_run_metrics(f"main{PWN}", seed=1, extra=op)
    cand = make_run_metrics(
        f"pr{PWN}",
        seed=2,
        slowdown=1.1,
        extra=op,
        findings=(make_finding("STRAGGLER", (1,), title=PWN),),
    )
    page = tmp_path / "report.html"
    page.write_text(render_html.render(compare(base, cand, load_settings(search_dir=None))))
    dom, console = open_in_chromium(page)
    assert console == []
    assert "data-pwned" not in dom.split("<body", 1)[1].split(">", 1)[0]
    # Every figure was drawn: plotly.js adds js-plotly-plot to each graph div it renders.
    assert len(re.findall(r'<div [^>]*class="plotly-graph-div js-plotly-plot"', dom)) == 3
    assert dom.count('class="main-svg"') >= 3
    assert "Performance regression" in dom
