"""What analyzers return: metrics, findings, and the evidence behind each finding.

Results carry raw values: times in integer nanoseconds (`*_ns`), sizes in bytes, shares as
fractions 0..1; only renderers round or convert. `to_dict()` gives the stable JSON schema
documented in docs/json-schema.md (`schema: "tracelab.analysis/2"`).

A finding that costs time says which parts of the lost-time model (tracelab.derived.parts) it
may claim, and how much at most (`Claim`); the runner (tracelab.analyzers.run) hands each lost
nanosecond to one finding, root cause first, so the findings' impacts never add up to more than
the step (docs/metrics.md, "Findings").
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
    #: Ranks affected by the cause (e.g. those that waited for a straggler), for the views.
    affected_ranks: tuple[int, ...] = ()
    steps: tuple[int, ...] = ()
    #: (start_ns, end_ns) ranges on the reference clock, for the timeline to jump to.
    time_ranges_ns: tuple[tuple[int, int], ...] = ()
    #: The figures the finding rests on, raw, with units in their names (`wait_ns`,
    #: `message_bytes`, `overlap_share`); text values are plain sentences.
    numbers: dict[str, float | int | str | None] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Claim:
    """What a finding may take from the lost-time budget per steady step: up to `parts[p]` ns
    of each part p (in order), and at most `cap_ns` in all (its own estimate, e.g. a
    straggler's what-if saving)."""

    parts: tuple[tuple[str, int], ...]
    cap_ns: int | None = None
    #: Claims with the same key share one cap: their impacts together stay within it. Two
    #: findings that blame one rank for one estimate (its what-if saving: an all-to-all
    #: imbalance and the straggler finding of the same rank) must not both be given it.
    cap_key: str | None = None


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One diagnosed problem, quantified, with a concrete fix."""

    #: Stable machine-readable code, e.g. "PIPELINE_BUBBLE"; never renamed once released.
    code: str
    severity: Severity
    #: One line. "{impact_ms}" and "{impact_pct}" are replaced by the allocated impact.
    title: str
    evidence: Evidence
    suggestion: str
    #: Time lost per steady step (ns), allocated by the runner; None for findings that are no
    #: time cost (memory, clocks) or before allocation.
    impact_ns_per_step: int | None = None
    #: The same as a share of the mean steady step, 0..1.
    impact_share: float | None = None
    #: Where the allocated impact came from: (part, ns per steady step) in the claim's order.
    impact_parts: tuple[tuple[str, int], ...] = ()
    #: What the finding may claim (None: it costs no time).
    claim: Claim | None = None
    #: The analyzer that produced it (its registry name), and the app view that shows it.
    analyzer: str = ""
    view: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["severity"] = str(self.severity)
        out["evidence"]["time_ranges_ns"] = [list(r) for r in self.evidence.time_ranges_ns]
        out["evidence"]["ranks"] = list(self.evidence.ranks)
        out["evidence"]["affected_ranks"] = list(self.evidence.affected_ranks)
        out["evidence"]["steps"] = list(self.evidence.steps)
        out["impact_parts"] = dict(self.impact_parts)
        out["claim"] = (
            None
            if self.claim is None
            else {"parts": dict(self.claim.parts), "cap_ns": self.claim.cap_ns}
        )
        return out


@dataclass(frozen=True, kw_only=True)
class Result:
    """An analyzer's output for one run: its metrics, its findings, and the parameters used."""

    analyzer: str
    run: str
    params: dict[str, Any]
    #: Flat, named metrics (units in names, raw values); a value that would mislead is None,
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
