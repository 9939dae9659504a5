"""Markdown for a pull-request comment: verdict line, metrics table, new findings.

Trace text (op names, run names, finding titles) is untrusted: it is HTML-escaped (GitHub
renders inline HTML) and Markdown's table and emphasis characters are backslash-escaped.
"""

from __future__ import annotations

from tracelab.render.text import duration, int_ranges, md, md_code
from tracelab.report import formatting as fmt
from tracelab.report.compare import Comparison, Report, RunMetrics, Verdict
from tracelab.results import Finding

_ICON = {
    Verdict.REGRESSION: "❌",
    Verdict.WARN: "⚠️",
    Verdict.IMPROVED: "🟢",
    Verdict.PASS: "✅",
    Verdict.INFO: "ℹ️",
}


def _run_line(role: str, m: RunMetrics) -> str:
    r = m.run
    world = f" of {r.world_size}" if r.world_size and r.world_size != r.ranks else ""
    return f"**{role}** _{md(r.name)}_: {r.ranks} rank(s){world}, {r.steps_text()}"


def verdict_line(report: Report) -> str:
    icon, headline, detail = fmt.verdict_summary(report)
    return f"{icon} **{headline}** {md(detail)}"


def _table(rows: list[Comparison]) -> list[str]:
    out = [
        "| Metric | Baseline | Candidate | Change | 95% CI | p | n | Threshold | Verdict |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        out.append(
            f"| {md(r.label)} | {fmt.value(r.baseline, r.unit)} | "
            f"{fmt.value(r.candidate, r.unit)} | {fmt.delta(r.delta, r.delta_kind)} | "
            f"{fmt.ci(r)} | {fmt.p_shown(r)} | {fmt.samples(r)} | {md(r.threshold)} | "
            f"{_ICON[r.verdict]} {fmt.VERDICT_WORDS[r.verdict]} |"
        )
    return out


def _finding(f: Finding) -> str:
    where = []
    if f.evidence.ranks:
        where.append("ranks " + ", ".join(str(r) for r in f.evidence.ranks))
    if f.evidence.steps:
        where.append("steps " + int_ranges(f.evidence.steps))
    impact = ""
    if f.impact_ns_per_step is not None:
        impact = f" Impact: {duration(f.impact_ns_per_step)} per step"
        if f.impact_share is not None:
            impact += f" ({f.impact_share * 100:.1f}% of the step)"
        impact += "."
    place = f" ({'; '.join(where)})" if where else ""
    return (
        f"- **{str(f.severity).upper()}** {md_code(f.code)}: {md(f.title)}{place}.{impact} "
        f"_Fix:_ {md(f.suggestion)}"
    )


def _blocking(f: Finding) -> list[str]:
    """A hang or desync verdict, shown before everything else: a heading and one bullet a
    field (every value escaped to one line)."""
    lines = [
        f"### 🛑 {md_code(f.code)}: {md(f.title)}",
        "",
        "The job stopped (Flight Recorder verdict stored with the candidate run): this fails "
        "the gate whatever the metrics say.",
        "",
    ]
    lines += [f"- **{md(label)}**: {md(value)}" for label, value in fmt.blocking_fields(f)]
    return [*lines, ""]


def render(report: Report) -> str:
    lines = [
        "## tracelab performance report",
        "",
        verdict_line(report),
        "",
    ]
    for f in report.blocking:
        lines += _blocking(f)
    lines += [
        _run_line("Baseline", report.baseline) + "  ",
        _run_line("Candidate", report.candidate),
        "",
    ]
    main = [r for r in report.rows if r.gate != "op_time"]
    ops = [r for r in report.rows if r.gate == "op_time"]
    lines += _table(main)
    if ops:
        lines += [
            "",
            f"<details><summary>Ops and kernels that moved most ({len(ops)}): {fmt.OPS_MEASURE}</summary>",
            "",
        ]
        lines += _table(ops)
        lines += ["", "</details>"]
    lines += ["", f"### New findings ({len(report.new_findings)})", ""]
    lines += [_finding(f) for f in report.new_findings] or ["None."]
    if report.still_present:
        lines += [
            "",
            f"<details><summary>Still present, in both runs ({len(report.still_present)})"
            "</summary>",
            "",
        ]
        lines += [_finding(f) for f in report.still_present]
        lines += ["", "</details>"]
    if report.resolved_findings:
        lines += [
            "",
            f"<details><summary>Resolved findings ({len(report.resolved_findings)})</summary>",
            "",
        ]
        lines += [_finding(f) for f in report.resolved_findings]
        lines += ["", "</details>"]
    if report.errors:
        lines += ["", "### Could not be judged", ""]
        lines += [f"- {md(k)} failed: {md(v)}" for k, v in report.errors.items()]
    if report.warnings:
        lines += ["", "### Warnings", ""]
        lines += [f"- {md(w)}" for w in report.warnings]
    s = report.settings
    cfg = f", thresholds from {md(s.config_file)}" if s.config_file else ""
    lines += [
        "",
        f"<sub>Regression = beyond threshold in the bad direction and, for per-step "
        f"metrics, one-sided Mann–Whitney U p &lt; {s.alpha} (p Holm-adjusted over the "
        "gated per-step metrics) with a CI that excludes no change. CI: bootstrap "
        f"{s.confidence:.0%} of the ratio (or difference) of medians, {s.resamples} "
        f"resamples, seed {s.seed}. Warm-up steps dropped: {s.warmup_steps}; at least "
        f"{s.min_steps} steps a side to judge{cfg}.</sub>",
        "",
    ]
    return "\n".join(lines)
