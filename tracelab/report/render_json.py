"""JSON report with a stable schema, `tracelab.report/1` (documented in docs/ci.md).

Field names never change within a schema version; fields may be added. Non-finite numbers
(a change from a zero baseline) are written as null, with the reason in the row's `reason`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import Any

from tracelab import __version__
from tracelab.report import formatting as fmt
from tracelab.report.compare import Comparison, Report, RunMetrics

SCHEMA = "tracelab.report/1"


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _row(r: Comparison) -> dict[str, Any]:
    return {
        "key": r.key,
        "metric": r.gate,
        "label": r.label,
        "unit": r.unit,
        "baseline": r.baseline,
        "candidate": r.candidate,
        "delta": r.delta,
        "delta_kind": str(r.delta_kind),
        "ci_low": r.ci_low,
        "ci_high": r.ci_high,
        "p_value": r.p_value,
        "p_adjusted": r.p_adjusted,
        "n_baseline": r.n_baseline,
        "n_candidate": r.n_candidate,
        "threshold": r.threshold,
        "gated": r.gated,
        "verdict": str(r.verdict),
        "reason": r.reason,
    }


def _run(m: RunMetrics) -> dict[str, Any]:
    out = asdict(m.run)
    out["source"] = list(m.run.source)
    out["notes"] = list(m.notes)
    return out


def to_dict(report: Report) -> dict[str, Any]:
    """The report as plain JSON-ready data."""
    s = report.settings
    out: dict[str, Any] = _finite(
        {
            "schema": SCHEMA,
            "tracelab_version": __version__,
            "verdict": report.verdict,
            "exit_code": report.exit_code,
            "regressions": [r.key for r in report.regressions],
            "baseline": _run(report.baseline),
            "candidate": _run(report.candidate),
            "settings": {
                "alpha": s.alpha,
                "warmup_steps": s.warmup_steps,
                "min_steps": s.min_steps,
                "confidence": s.confidence,
                "resamples": s.resamples,
                "seed": s.seed,
                "top_ops": s.top_ops,
                "config_file": s.config_file,
                "thresholds": {
                    name: {
                        "text": t.text,
                        "kind": str(t.kind) if t.kind else None,
                        "limit": t.limit,
                        "direction": t.direction,
                        "source": t.source,
                    }
                    for name, t in s.thresholds.items()
                },
            },
            "metrics": [_row(r) for r in report.rows],
            "new_findings": [f.to_dict() for f in report.new_findings],
            "resolved_findings": [f.to_dict() for f in report.resolved_findings],
            "still_present": [f.to_dict() for f in report.still_present],
            "warnings": list(report.warnings),
            "errors": dict(report.errors),
        }
    )
    if report.blocking:  # only then: a report without a hang verdict is unchanged
        hang = report.blocking[0]
        out["hang"] = _finite(
            {
                **hang.to_dict(),
                "fields": [{"label": k, "value": v} for k, v in fmt.blocking_fields(hang)],
            }
        )
    return out


def render(report: Report) -> str:
    return json.dumps(to_dict(report), indent=2, sort_keys=False, allow_nan=False) + "\n"
