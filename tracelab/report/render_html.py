"""One self-contained HTML file that opens offline: tables, findings and plotly figures.

plotly.js is embedded inline (about 4.6 MB) so the file needs no network. plotly is the optional
[app] extra: without it the page has the tables only and says so. Every piece of trace or user
text goes through html.escape; figure labels are escaped too, because plotly renders a subset of
HTML inside labels.
"""

from __future__ import annotations

import html
from typing import Any

from tracelab import __version__
from tracelab.render.text import duration, terminal
from tracelab.report import formatting as fmt
from tracelab.report.compare import Comparison, Report, RunMetrics
from tracelab.results import Finding

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem;color:#1f2328}
h1{font-size:1.4rem} h2{font-size:1.15rem;margin-top:2rem}
.verdict{padding:.8rem 1rem;border-radius:6px;font-weight:600}
.v-regression{background:#ffebe9;border:1px solid #cf222e}
.v-warn{background:#fff8c5;border:1px solid #bf8700}
.v-pass{background:#dafbe1;border:1px solid #1a7f37}
table{border-collapse:collapse;margin:.5rem 0;font-size:.9rem}
th,td{border:1px solid #d0d7de;padding:.3rem .6rem;text-align:right}
th:first-child,td:first-child{text-align:left}
tr.regression td{background:#ffebe9} tr.warn td{background:#fff8c5}
tr.improved td{background:#dafbe1} tr.info td{color:#57606a}
.note{color:#57606a;font-size:.85rem} code{background:#f6f8fa;padding:0 .2rem}
"""

#: Added only to a report with a hang verdict (a report without one is unchanged).
_HANG_CSS = """
.v-hang{background:#cf222e;color:#fff;border:1px solid #82071e}
.hang{border:2px solid #cf222e;border-radius:6px;padding:.4rem 1rem;margin:1rem 0}
.hang dt{font-weight:600;margin-top:.3rem} .hang dd{margin-left:1rem;white-space:pre-wrap}
"""


def _e(text: object) -> str:
    """Text for the page: control and bidirectional characters dropped (render.text.terminal),
    then escaped."""
    return html.escape(terminal(str(text)), quote=True)


def _rows_table(rows: list[Comparison]) -> str:
    head = (
        "<tr><th>Metric</th><th>Baseline</th><th>Candidate</th><th>Change</th>"
        "<th>95% CI</th><th>p</th><th>n</th><th>Threshold</th><th>Verdict</th></tr>"
    )
    body = []
    for r in rows:
        body.append(
            f'<tr class="{_e(r.verdict)}"><td title="{_e(r.key)}">{_e(r.label)}</td>'
            f"<td>{_e(fmt.value(r.baseline, r.unit))}</td>"
            f"<td>{_e(fmt.value(r.candidate, r.unit))}</td>"
            f"<td>{_e(fmt.delta(r.delta, r.delta_kind))}</td><td>{_e(fmt.ci(r))}</td>"
            f"<td>{_e(fmt.p_shown(r))}</td><td>{_e(fmt.samples(r))}</td>"
            f"<td>{_e(r.threshold)}</td>"
            f'<td title="{_e(r.reason)}">{_e(fmt.VERDICT_WORDS[r.verdict])}</td></tr>'
        )
    return f"<table>{head}{''.join(body)}</table>"


def _finding_html(f: Finding) -> str:
    parts = [f"<b>{_e(str(f.severity).upper())}</b> <code>{_e(f.code)}</code>: {_e(f.title)}"]
    if f.evidence.ranks:
        parts.append(f" (ranks {_e(', '.join(map(str, f.evidence.ranks)))})")
    if f.impact_ns_per_step is not None:
        parts.append(f". Impact {duration(f.impact_ns_per_step)} per step")
    parts.append(f". <i>Fix:</i> {_e(f.suggestion)}")
    return f"<li>{''.join(parts)}</li>"


def _blocking_html(f: Finding) -> str:
    """A hang or desync verdict, shown before everything else; every value escaped."""
    fields = "".join(
        f"<dt>{_e(label)}</dt><dd>{_e(value)}</dd>" for label, value in fmt.blocking_fields(f)
    )
    return (
        f'<section class="hang" id="hang"><h2>{_e(f.code)}: {_e(f.title)}</h2>'
        "<p>The job stopped (Flight Recorder verdict stored with the candidate run): this "
        f"fails the gate whatever the metrics say.</p><dl>{fields}</dl></section>"
    )


def _run_html(role: str, m: RunMetrics) -> str:
    r = m.run
    return (
        f"<p><b>{role}</b> <code>{_e(r.name)}</code>: {r.ranks} rank(s), {_e(r.steps_text())}.</p>"
    )


def _figures(report: Report) -> tuple[list[str], str | None]:
    """HTML snippets of the figures (plotly.js inline in the first), or a note without plotly."""
    try:
        import plotly.graph_objects as go
        import plotly.io as pio
        from plotly.subplots import make_subplots
    except ImportError:
        return [], (
            "plotly is not installed, so this report has tables only. "
            "Install the extra: pip install 'tracelab[app]'."
        )
    figs: list[Any] = []
    runs = (("baseline", report.baseline), ("candidate", report.candidate))
    b, c = (m.values.get("step_time") for _, m in runs)
    if b is not None and c is not None and (b.samples or c.samples):
        fig = go.Figure()
        for (role, m), mv in zip(runs, (b, c), strict=True):
            fig.add_trace(
                go.Box(
                    y=list(mv.samples),
                    name=_e(f"{role}: {m.run.name}"),
                    boxpoints="all",
                    jitter=0.4,
                    pointpos=0,
                )
            )
        fig.update_layout(
            title="Step time per step (slowest rank, warm-up dropped)",
            yaxis_title="ms",
            height=420,
            showlegend=False,
        )
        figs.append(fig)
        steps = go.Figure()
        for (role, m), mv in zip(runs, (b, c), strict=True):
            steps.add_trace(
                go.Scatter(
                    y=list(mv.samples), mode="lines+markers", name=_e(f"{role}: {m.run.name}")
                )
            )
        steps.update_layout(
            title="Step time in step order",
            xaxis_title="step (after warm-up)",
            yaxis_title="ms",
            height=360,
        )
        figs.append(steps)
    per_rank = [m.tables.get("per_rank", []) for _, m in runs]
    if any(per_rank):
        cols = sorted(
            {
                k
                for rows in per_rank
                for row in rows
                for k in row
                if k != "rank" and k.endswith("_ms")
            }
        )
        fig = make_subplots(rows=1, cols=len(cols) or 1, subplot_titles=[_e(c) for c in cols])
        for i, col in enumerate(cols, start=1):
            for (role, _), rows in zip(runs, per_rank, strict=True):
                pts = [(r["rank"], r[col]) for r in rows if r.get(col) is not None]
                fig.add_trace(
                    go.Bar(
                        x=[f"rank {p[0]}" for p in pts],
                        y=[p[1] for p in pts],
                        name=_e(role),
                        legendgroup=role,
                        showlegend=i == 1,
                        marker_color="#6e7781" if role == "baseline" else "#0969da",
                    ),
                    row=1,
                    col=i,
                )
        fig.update_layout(
            title="Per-rank breakdown (median per step, ms)", barmode="group", height=420
        )
        figs.append(fig)
    config = {"displaylogo": False, "responsive": True}
    out = [
        pio.to_html(f, full_html=False, include_plotlyjs=(i == 0), config=config)
        for i, f in enumerate(figs)
    ]
    return out, None


def render(report: Report) -> str:
    cls = {
        "hang": "v-hang",
        "error": "v-regression",
        "regression": "v-regression",
        "warn": "v-warn",
    }.get(report.verdict, "v-pass")
    icon, headline, detail = fmt.verdict_summary(report)
    main = [r for r in report.rows if r.gate != "op_time"]
    ops = [r for r in report.rows if r.gate == "op_time"]
    figures, no_plotly = _figures(report)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>tracelab report: {_e(report.candidate.run.name)} vs "
        f"{_e(report.baseline.run.name)}</title>",
        f"<style>{_CSS}{_HANG_CSS if report.blocking else ''}</style></head><body>",
        "<h1>tracelab performance report</h1>",
        f'<div class="verdict {cls}" id="verdict">{icon} {_e(headline)} {_e(detail)}</div>',
        *(_blocking_html(f) for f in report.blocking),
        _run_html("Baseline", report.baseline),
        _run_html("Candidate", report.candidate),
        "<h2>Metrics</h2>",
        _rows_table(main),
    ]
    if ops:
        parts += [
            "<h2>Ops and kernels that moved most</h2>",
            f"<p>{_e(fmt.OPS_MEASURE)}.</p>",
            _rows_table(ops),
        ]
    parts.append(f"<h2>New findings ({len(report.new_findings)})</h2>")
    parts.append(
        "<ul>" + "".join(_finding_html(f) for f in report.new_findings) + "</ul>"
        if report.new_findings
        else "<p>None.</p>"
    )
    if report.still_present:
        parts.append(
            f"<h2>Still present, in both runs ({len(report.still_present)})</h2><ul>"
            + "".join(_finding_html(f) for f in report.still_present)
            + "</ul>"
        )
    if report.resolved_findings:
        parts.append(
            f"<h2>Resolved findings ({len(report.resolved_findings)})</h2><ul>"
            + "".join(_finding_html(f) for f in report.resolved_findings)
            + "</ul>"
        )
    if report.errors:
        parts.append(
            '<h2 id="errors">Could not be judged</h2><ul>'
            + "".join(f"<li>{_e(k)} failed: {_e(v)}</li>" for k, v in report.errors.items())
            + "</ul>"
        )
    if report.warnings:
        parts.append(
            "<h2>Warnings</h2><ul>"
            + "".join(f"<li>{_e(w)}</li>" for w in report.warnings)
            + "</ul>"
        )
    parts.append("<h2>Figures</h2>")
    if no_plotly:
        parts.append(f'<p class="note" id="no-plotly">{_e(no_plotly)}</p>')
    elif not figures:
        parts.append('<p class="note">No step samples or per-rank data to plot.</p>')
    parts += [f'<div class="figure">{f}</div>' for f in figures]
    s = report.settings
    parts.append(
        f'<p class="note">Regression = beyond the threshold in the bad direction and, for '
        f"per-step metrics, one-sided Mann–Whitney U p &lt; {s.alpha} (p Holm-adjusted over "
        "the gated per-step metrics) with a CI that excludes no change. CI: bootstrap "
        f"{s.confidence:.0%} of the ratio (or difference) of medians ({s.resamples} resamples, "
        f"seed {s.seed}). Warm-up steps dropped: {s.warmup_steps}. Config: "
        f"{_e(s.config_file or 'defaults')}. tracelab {_e(__version__)}.</p>"
    )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
