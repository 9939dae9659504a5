"""Number formatting shared by the renderers (units in, human text out)."""

from __future__ import annotations

import math
import re

from tracelab.report.compare import Comparison, Report, Verdict
from tracelab.report.thresholds import Kind
from tracelab.results import Finding
from tracelab.vocabulary import Code

VERDICT_WORDS = {
    Verdict.REGRESSION: "regression",
    Verdict.WARN: "warning",
    Verdict.IMPROVED: "improved",
    Verdict.PASS: "pass",
    Verdict.INFO: "info",
}


def value(v: float | None, unit: str) -> str:
    """A metric value in its unit, e.g. '101.2 ms', '12.3%', '1.50 GiB'; '—' when missing."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if unit == "share":
        return f"{v * 100:.1f}%"
    if unit == "ms":
        return f"{v:.3g} ms" if abs(v) < 100 else f"{v:,.1f} ms"
    if unit == "bytes":
        size = float(v)
        for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
            if abs(size) < 1024 or suffix == "TiB":
                return f"{size:.0f} {suffix}" if suffix == "B" else f"{size:.2f} {suffix}"
            size /= 1024
    if unit == "ratio":
        return f"{v:.3f}"
    if unit == "GB/s":
        return f"{v:.3g} GB/s"
    return f"{v:.4g} {unit}"


def delta(d: float | None, kind: Kind) -> str:
    """A change: '+5.2%' (relative) or '+2.1 pp' (points); '—' when missing."""
    if d is None:
        return "—"
    if math.isinf(d):
        return "+∞%" if d > 0 else "−∞%"
    if kind is Kind.POINTS:
        return f"{d:+.2f} pp"
    return f"{d * 100:+.1f}%"


def ci(row: Comparison) -> str:
    if row.ci_low is None or row.ci_high is None:
        return "—"
    return f"[{delta(row.ci_low, row.delta_kind)}, {delta(row.ci_high, row.delta_kind)}]"


def p_value(p: float | None) -> str:
    if p is None:
        return "—"
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


def p_shown(row: Comparison) -> str:
    """The p the verdict used: Holm-adjusted for judged rows, else the raw one-sided p."""
    return p_value(row.p_adjusted if row.p_adjusted is not None else row.p_value)


def samples(row: Comparison) -> str:
    if row.n_baseline <= 1 and row.n_candidate <= 1:
        return "—"
    return f"{row.n_baseline} / {row.n_candidate}"


def verdict_summary(report: Report) -> tuple[str, str, str]:
    """(icon, headline, detail) of the report, as plain text (escape before rendering)."""
    if report.blocking:
        f = report.blocking[0]
        what = "Hang" if f.code == Code.HANG else "Collective desync"
        return ("🛑", f"{what} in the candidate", f"(Flight Recorder): {f.title}")
    gated = [r for r in report.rows if r.gated]
    if report.verdict == "error":
        names = ", ".join(report.errors)
        also = (
            f", and {len(report.regressions)} regression(s) among the metrics judged"
            if report.regressions
            else ""
        )
        return (
            "❌",
            "Not judged:",
            f"{len(report.errors)} analyzer run(s) failed ({names}){also}; see Could not be judged",
        )
    if report.regressions:
        names = ", ".join(r.label for r in report.regressions)
        return (
            "❌",
            "Performance regression",
            f"in {len(report.regressions)} of {len(gated)} gated metrics: {names}",
        )
    if report.verdict == "warn":
        n = sum(r.verdict is Verdict.WARN for r in gated)
        return (
            "⚠️",
            "No regression found",
            f"but {n} of {len(gated)} gated metrics could not be judged (see warnings)",
        )
    return ("✅", "No performance regression", f"({len(gated)} gated metrics)")


#: Labels of a hang finding's evidence (tracelab.analyzers.hang), in the order shown.
_HANG_LABELS = {
    "collective": "Collective",
    "seq": "Sequence number",
    "process_group": "Process group",
    "never_entered": "Never entered it (ranks)",
    "left_no_dump": "Left no dump (ranks)",
    "entered": "Entered it",
    "stack": "Where (first frame outside PyTorch)",
}
_LAST_OP = re.compile(r"rank_(\d+)_last_op")


def blocking_fields(f: Finding) -> list[tuple[str, str]]:
    """A hang or desync finding as (label, value) pairs, as plain text (escape before
    rendering): the collective, its sequence number and group, the ranks that never entered
    it each with its last op (or that left no dump), what the others entered, where, and the
    fix. Every renderer shows these first."""
    out: list[tuple[str, str]] = []
    for key, val in f.evidence.numbers.items():
        last = _LAST_OP.fullmatch(key)
        label = f"Rank {last.group(1)}'s last op" if last else _HANG_LABELS.get(key, key)
        out.append((label, "—" if val is None else str(val)))
    out.append(("Fix", f.suggestion))
    return out


#: What the op and kernel rows measure (the Operators page shows self time per rank and step,
#: a mean: another figure).
OPS_MEASURE = (
    "time inside each op or kernel per step (inclusive), mean over ranks, median over steps"
)
