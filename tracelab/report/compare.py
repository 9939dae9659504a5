"""The comparison model: one row per metric, a verdict per row, and the report's verdict.

A row is a regression only when the change is beyond its threshold in the bad direction and,
for metrics measured per step (a distribution), the change is significant: the one-sided
Mann–Whitney U test at `alpha`, Holm-adjusted over the gated per-step metrics of the report
(family-wise: an unchanged run fails on any metric with probability at most alpha), and the
bootstrap CI of the change excludes zero (on a noisy machine the two can disagree, and then
nothing is flagged). Metrics with one value per run
(peak memory) are judged on the threshold alone. Too few steps on either side gives a warning
instead of a verdict.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tracelab.report.stats import (
    Alternative,
    difference_of_medians,
    holm_adjust,
    mann_whitney_u,
    ratio_of_medians,
)
from tracelab.report.thresholds import GATES, Kind, ReportSettings, Threshold
from tracelab.results import Finding
from tracelab.vocabulary import BLOCKING


class Verdict(str, enum.Enum):
    """Outcome of one row; REGRESSION rows fail the report."""

    REGRESSION = "regression"
    WARN = "warn"  # could not judge: too few steps, or missing on one side
    IMPROVED = "improved"
    PASS = "pass"
    INFO = "info"  # not gated (threshold off): shown for context

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, kw_only=True)
class MetricValue:
    """One metric of one run, as extracted for comparison."""

    #: Unique row key: "step_time", "bubble_share[stage=1]", "op_time[aten::mm]".
    key: str
    #: Its family in thresholds.GATES, which sets unit, direction and threshold.
    gate: str
    #: Human label, e.g. "Pipeline bubble, stage 1" (trace text: escape before rendering).
    label: str
    #: The run's value in the gate's unit; None when it cannot be measured (see note).
    #: For metrics with samples, compare() uses the median of the samples instead.
    value: float | None
    #: Per-step values when the metric has a distribution (enables the statistical test).
    samples: tuple[float, ...] = ()
    note: str = ""
    #: False when the value is shown for context but must not gate (the note says why).
    gateable: bool = True
    #: What the value was measured from, where a metric has several sources (peak memory: the
    #: collector's allocator peaks, the trace's [memory] events, process RSS). Values of
    #: different bases are shown, never gated against each other.
    basis: str = ""


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    """What was compared: the run, its size, and the steps that were used."""

    name: str
    run_id: int | None = None
    source: tuple[str, ...] = ()
    ranks: int = 0
    world_size: int | None = None
    steps_used: int = 0
    steps_dropped: int = 0
    #: Warm-up steps asked for but not dropped: the run is no longer than them, so every step
    #: was compared (0 when they were dropped).
    warmup_kept: int = 0

    def steps_text(self) -> str:
        """'10 step(s) compared (2 warm-up dropped)', or why none was dropped."""
        if self.warmup_kept:
            why = f"the run is not longer than the {self.warmup_kept} warm-up steps asked"
            return f"{self.steps_used} step(s) compared (0 warm-up dropped: {why})"
        return f"{self.steps_used} step(s) compared ({self.steps_dropped} warm-up dropped)"


@dataclass(frozen=True, kw_only=True)
class RunMetrics:
    """Everything the report needs from one run."""

    run: RunSummary
    values: dict[str, MetricValue]
    findings: tuple[Finding, ...] = ()
    #: Rows for figures: "per_rank" ({rank, step_time_ms, ...}), "steps" ({step, step_time_ms}).
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    #: Analyzer name -> why it failed on this run (its metrics are missing).
    errors: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """One row of the report."""

    key: str
    gate: str
    label: str
    unit: str
    baseline: float | None
    candidate: float | None
    #: Relative change (candidate/baseline - 1) or change in points, per `delta_kind`.
    delta: float | None
    delta_kind: Kind
    #: Bootstrap CI of the same quantity as `delta` (None without samples).
    ci_low: float | None = None
    ci_high: float | None = None
    #: One-sided Mann–Whitney p-value in the bad direction (None without samples).
    p_value: float | None = None
    #: p_value after the Holm–Bonferroni adjustment over the gated per-step metrics of the
    #: report: the one compared with alpha (None for rows that are not judged on a test).
    p_adjusted: float | None = None
    n_baseline: int = 0
    n_candidate: int = 0
    threshold: str = "off"
    gated: bool = False
    verdict: Verdict = Verdict.INFO
    #: Why this verdict, in words.
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class Report:
    """A candidate run judged against a baseline run."""

    baseline: RunMetrics
    candidate: RunMetrics
    rows: tuple[Comparison, ...]
    new_findings: tuple[Finding, ...]
    resolved_findings: tuple[Finding, ...]
    #: The candidate's findings the baseline had too (as the candidate has them), worst first.
    still_present: tuple[Finding, ...] = ()
    warnings: tuple[str, ...]
    settings: ReportSettings

    @property
    def regressions(self) -> tuple[Comparison, ...]:
        return tuple(r for r in self.rows if r.verdict is Verdict.REGRESSION)

    @property
    def blocking(self) -> tuple[Finding, ...]:
        """The candidate's hang or desync findings (its stored Flight Recorder verdict,
        vocabulary.BLOCKING): the job stopped, so the gate fails whatever the baseline, the
        metrics or their significance say (docs/ci.md, "A hung candidate")."""
        return tuple(f for f in self.candidate.findings if f.code in BLOCKING)

    @property
    def verdict(self) -> str:
        """'hang' (the candidate has a hang or desync verdict), 'error' (an analyzer failed on
        either run: exit 3, never read as a pass), 'regression', 'warn' (nothing failed,
        something could not be judged) or 'pass'; as exit_code orders them."""
        if self.blocking:
            return "hang"
        if self.errors:
            return "error"
        if self.regressions:
            return "regression"
        if any(r.verdict is Verdict.WARN for r in self.rows):
            return "warn"
        return "pass"

    @property
    def errors(self) -> dict[str, str]:
        """'<role>: <analyzer>' -> why it failed: what the report could not judge."""
        return {
            f"{role}: {k}": v
            for role, m in (("baseline", self.baseline), ("candidate", self.candidate))
            for k, v in m.errors.items()
        }

    @property
    def exit_code(self) -> int:
        """0 pass, 1 regression or a hang verdict on the candidate, 3 when an analyzer failed
        on either run (a crash must never read as a regression, nor pass silently). A hang is
        certain whatever else failed: it gives 1, and the failures are still listed."""
        if self.blocking:
            return 1
        if self.errors:
            return 3
        return 1 if self.regressions else 0


def _delta(base: float, cand: float, kind: Kind) -> float:
    if kind is Kind.POINTS:
        return (cand - base) * 100.0
    if base == 0:
        return 0.0 if cand == 0 else math.copysign(math.inf, cand)
    return cand / base - 1.0


def _beyond(delta: float, threshold: Threshold, direction: int) -> bool:
    """Whether `delta` moved past the threshold's limit in `direction` (+1 up, -1 down)."""
    return direction * delta > threshold.limit


def _delta_kind(gate: str, threshold: Threshold) -> Kind:
    if threshold.kind is not None:
        return threshold.kind
    return Kind.POINTS if GATES[gate].unit == "share" else Kind.RELATIVE


def _bad_alternative(t: Threshold) -> Alternative:
    return "greater" if t.direction > 0 else "less"


def _sampled_row(
    b: MetricValue,
    c: MetricValue,
    t: Threshold,
    kind: Kind,
    s: ReportSettings,
    off: str,
    p_family: float | None,
    **row: Any,
) -> Comparison:
    xb, xc = np.asarray(b.samples, dtype=float), np.asarray(c.samples, dtype=float)
    base, cand = float(np.median(xb)), float(np.median(xc))
    delta = _delta(base, cand, kind)
    row |= dict(
        baseline=base,
        candidate=cand,
        delta=delta,
        delta_kind=kind,
        n_baseline=xb.size,
        n_candidate=xc.size,
    )
    bad = _bad_alternative(t)
    good: Alternative = "less" if bad == "greater" else "greater"
    p_bad = mann_whitney_u(xc, xb, alternative=bad).p_value
    p_good = mann_whitney_u(xc, xb, alternative=good).p_value
    ci_low = ci_high = None
    if kind is Kind.RELATIVE and base > 0:
        ci = ratio_of_medians(xb, xc, confidence=s.confidence, resamples=s.resamples, seed=s.seed)
        ci_low, ci_high = ci.low - 1.0, ci.high - 1.0
    elif kind is Kind.POINTS:
        ci = difference_of_medians(
            xb, xc, confidence=s.confidence, resamples=s.resamples, seed=s.seed
        )
        ci_low, ci_high = ci.low * 100.0, ci.high * 100.0
    row |= dict(ci_low=ci_low, ci_high=ci_high, p_value=p_bad)
    if min(xb.size, xc.size) < s.min_steps:  # shown, not judged
        return Comparison(
            **row,
            verdict=Verdict.WARN if t.gated else Verdict.INFO,
            reason=f"too few steps to judge ({xb.size} vs {xc.size}, fewer than "
            f"{s.min_steps} a side): profile more active steps",
        )
    if not t.gated:
        return Comparison(**row, verdict=Verdict.INFO, reason=off)
    p_adj = p_bad if p_family is None else p_family
    row["p_adjusted"] = p_adj
    beyond_bad, beyond_good = _beyond(delta, t, t.direction), _beyond(delta, t, -t.direction)
    # The CI of the change must exclude "no change" on the same side as the test says.
    ci_bad = (
        ci_low is not None
        and ci_high is not None
        and (ci_low > 0 if t.direction > 0 else ci_high < 0)
    )
    ci_good = (
        ci_low is not None
        and ci_high is not None
        and (ci_high < 0 if t.direction > 0 else ci_low > 0)
    )
    if beyond_bad and p_adj < s.alpha and ci_bad:
        verdict, reason = Verdict.REGRESSION, f"beyond {t.text} and significant (p={p_adj:.2g})"
    elif beyond_good and p_good < s.alpha and ci_good:
        verdict, reason = (
            Verdict.IMPROVED,
            f"improved beyond {t.text} (p={p_good:.2g} for an improvement)",
        )
    elif beyond_bad and p_adj < s.alpha:
        verdict, reason = (
            Verdict.PASS,
            (
                f"beyond {t.text} with p={p_adj:.2g}, but the "
                f"{s.confidence:.0%} CI includes no change: noisy"
            ),
        )
    elif beyond_bad:
        verdict, reason = Verdict.PASS, f"beyond {t.text} but not significant (p={p_adj:.2g})"
    elif p_adj < s.alpha:
        verdict, reason = Verdict.PASS, f"significant (p={p_adj:.2g}) but within {t.text}"
    else:
        verdict, reason = Verdict.PASS, f"within {t.text}"
    return Comparison(**row, verdict=verdict, reason=reason)


def _threshold_for(
    b: MetricValue | None, c: MetricValue | None, settings: ReportSettings
) -> tuple[Threshold, str]:
    """The row's threshold (off when either side is not gateable) and why it is off."""
    some = c or b
    assert some is not None
    t = settings.threshold(some.gate)
    ungated = next((v for v in (b, c) if v is not None and not v.gateable), None)
    if ungated is not None:
        return replace(t, kind=None), f"not gated: {ungated.note or 'not comparable here'}"
    if b is not None and c is not None and b.basis != c.basis:
        return replace(t, kind=None), (
            f"not gated: measured from {b.basis or 'another source'} in the baseline and "
            f"{c.basis or 'another source'} in the candidate"
        )
    return t, "not gated (threshold off)"


def _tested_p(
    b: MetricValue | None, c: MetricValue | None, settings: ReportSettings
) -> float | None:
    """The raw one-sided p of a row that will be judged on a test, else None."""
    if b is None or c is None or min(len(b.samples), len(c.samples)) < settings.min_steps:
        return None
    t, _ = _threshold_for(b, c, settings)
    if not t.gated:
        return None
    return mann_whitney_u(c.samples, b.samples, alternative=_bad_alternative(t)).p_value


def compare_values(
    b: MetricValue | None,
    c: MetricValue | None,
    settings: ReportSettings,
    *,
    p_family: float | None = None,
) -> Comparison:
    """Judge one metric of the candidate against the same metric of the baseline.

    `p_family` is the row's Holm-adjusted p when it is judged together with other rows
    (compare() passes it); alone, the raw p is compared with alpha.
    """
    some = c or b
    assert some is not None
    gate = GATES[some.gate]
    t, off = _threshold_for(b, c, settings)
    kind = _delta_kind(some.gate, t)
    row: dict[str, Any] = dict(
        key=some.key,
        gate=some.gate,
        label=some.label,
        unit=gate.unit,
        threshold=t.text,
        gated=t.gated,
    )
    if b is not None and c is not None and b.samples and c.samples:
        return _sampled_row(b, c, t, kind, settings, off, p_family, **row)
    base = b.value if b is not None else None
    cand = c.value if c is not None else None
    if base is None or cand is None:
        side = "baseline" if base is None else "candidate"
        note = b if side == "baseline" else c
        why = f": {note.note}" if note is not None and note.note else ""
        return Comparison(
            **row,
            baseline=base,
            candidate=cand,
            delta=None,
            delta_kind=kind,
            verdict=Verdict.WARN if t.gated else Verdict.INFO,
            reason=f"not measured in the {side}{why}",
        )
    delta = _delta(base, cand, kind)
    row |= dict(
        baseline=base, candidate=cand, delta=delta, delta_kind=kind, n_baseline=1, n_candidate=1
    )
    if not t.gated:
        return Comparison(**row, verdict=Verdict.INFO, reason=off)
    if _beyond(delta, t, t.direction):
        return Comparison(
            **row,
            verdict=Verdict.REGRESSION,
            reason=f"beyond {t.text} (one value per run: threshold only)",
        )
    if _beyond(delta, t, -t.direction):
        return Comparison(**row, verdict=Verdict.IMPROVED, reason=f"improved beyond {t.text}")
    return Comparison(**row, verdict=Verdict.PASS, reason=f"within {t.text}")


def _finding_key(f: Finding) -> tuple[str, str, tuple[int, ...]]:
    return (f.analyzer, f.code, tuple(sorted(f.evidence.ranks)))


def _order(key: str) -> tuple[int, str]:
    gate = key.split("[", 1)[0]
    names = list(GATES)
    return (names.index(gate) if gate in names else len(names), key)


def _point(v: MetricValue | None) -> float:
    if v is None:
        return 0.0
    if v.samples:
        return float(np.median(v.samples))
    return v.value or 0.0


def _top_movers(baseline: RunMetrics, candidate: RunMetrics, keys: list[str], n: int) -> list[str]:
    """The `n` op/kernel keys whose median time per step moved most (absent counts as 0)."""
    ops = [k for k in keys if k.startswith("op_time[")]
    moved = sorted(
        ops, key=lambda k: -abs(_point(candidate.values.get(k)) - _point(baseline.values.get(k)))
    )
    return moved[:n]


def compare(baseline: RunMetrics, candidate: RunMetrics, settings: ReportSettings) -> Report:
    """Judge every metric present in either run, and diff the findings."""
    keys = sorted(set(baseline.values) | set(candidate.values), key=_order)
    if not settings.threshold("op_time").gated:  # only the top movers are shown: judge those
        top = set(_top_movers(baseline, candidate, keys, settings.top_ops))
        keys = [k for k in keys if not k.startswith("op_time[") or k in top]
    raw = {
        k: p
        for k in keys
        if (p := _tested_p(baseline.values.get(k), candidate.values.get(k), settings)) is not None
    }
    adjusted = dict(zip(raw, holm_adjust(list(raw.values())).tolist(), strict=True))
    rows = [
        compare_values(
            baseline.values.get(k), candidate.values.get(k), settings, p_family=adjusted.get(k)
        )
        for k in keys
    ]
    # Op/kernel rows: keep the top movers (largest absolute change) plus any regression.
    keep = set(_top_movers(baseline, candidate, keys, settings.top_ops))
    keep |= {r.key for r in rows if r.gate == "op_time" and r.verdict is Verdict.REGRESSION}
    rows = [r for r in rows if r.gate != "op_time" or r.key in keep]
    rows = sorted(
        rows,
        key=lambda r: (
            _order(r.key)[0],
            -abs((r.candidate or 0.0) - (r.baseline or 0.0)) if r.gate == "op_time" else 0.0,
            r.key,
        ),
    )
    base_keys = {_finding_key(f) for f in baseline.findings}
    cand_keys = {_finding_key(f) for f in candidate.findings}
    new = tuple(
        sorted(
            (f for f in candidate.findings if _finding_key(f) not in base_keys),
            key=lambda f: (-int(f.severity), f.code),
        )
    )
    resolved = tuple(f for f in baseline.findings if _finding_key(f) not in cand_keys)
    # The candidate's findings the baseline had too: a critical one is no regression, but a
    # reviewer who reads only the new ones never learns the job still loses 29% to it.
    still = tuple(f for f in candidate.findings if _finding_key(f) in base_keys)
    warnings = [f"{r.label}: {r.reason}" for r in rows if r.verdict is Verdict.WARN]
    b_run, c_run = baseline.run, candidate.run
    if (b_run.ranks, b_run.world_size) != (c_run.ranks, c_run.world_size):
        warnings.insert(
            0,
            f"the runs differ in shape: baseline {b_run.ranks} rank(s) of "
            f"{b_run.world_size or '?'}, candidate {c_run.ranks} of "
            f"{c_run.world_size or '?'}; per-rank and per-stage metrics may not "
            "be comparable",
        )
    warnings += [f"baseline: {n}" for n in baseline.notes]
    warnings += [f"candidate: {n}" for n in candidate.notes]
    return Report(
        baseline=baseline,
        candidate=candidate,
        rows=tuple(rows),
        new_findings=new,
        resolved_findings=resolved,
        still_present=still,
        warnings=tuple(warnings),
        settings=settings,
    )
