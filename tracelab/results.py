"""What analyzers return: metrics, findings, and the evidence behind each finding.

The CLI, the reports and the app all read these objects; `to_dict()` gives the stable JSON
schema documented in docs/json-schema.md (`schema: "tracelab.analysis/1"`).
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class Severity(enum.IntEnum):
    """How much a finding matters. Ordered so that `max()` picks the worst."""

    INFO = 0
    WARNING = 1
    CRITICAL = 2

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """Where a finding shows: the ranks and steps involved, time ranges, and the numbers."""

    ranks: tuple[int, ...] = ()
    steps: tuple[int, ...] = ()
    #: (start_ns, end_ns) ranges on the aligned clock, for the timeline to jump to.
    time_ranges_ns: tuple[tuple[int, int], ...] = ()
    #: The figures the finding rests on, with units in their names (e.g. "wait_ms").
    numbers: dict[str, float | int | str | None] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One diagnosed problem, quantified, with a concrete fix."""

    #: Stable machine-readable code, e.g. "PIPELINE_BUBBLE"; never renamed once released.
    code: str
    severity: Severity
    title: str
    evidence: Evidence
    #: Time lost per step in ms (None when it cannot be estimated honestly).
    impact_ms_per_step: float | None
    #: The same as a share of the step time, 0..1.
    impact_share: float | None
    suggestion: str
    #: The analyzer that produced it (its registry name), and the app view that shows it.
    analyzer: str = ""
    view: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["severity"] = str(self.severity)
        out["evidence"]["time_ranges_ns"] = [list(r) for r in self.evidence.time_ranges_ns]
        out["evidence"]["ranks"] = list(self.evidence.ranks)
        out["evidence"]["steps"] = list(self.evidence.steps)
        return out


@dataclass(frozen=True, kw_only=True)
class Result:
    """An analyzer's output for one run: its metrics, its findings, and the parameters used."""

    analyzer: str
    run: str
    params: dict[str, Any]
    #: Flat, named metrics (units in names); a value that would mislead is None,
    #: with the reason in `notes`.
    metrics: dict[str, Any]
    #: Tabular detail (per rank, per step, ...) as lists of row dicts.
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "analyzer": self.analyzer,
            "run": self.run,
            "params": self.params,
            "metrics": self.metrics,
            "tables": self.tables,
            "findings": [f.to_dict() for f in self.findings],
            "notes": list(self.notes),
        }
