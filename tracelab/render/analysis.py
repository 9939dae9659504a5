"""`tracelab analyze` output: text for a terminal, Markdown, and the JSON document.

Every format renders the same document (tracelab.analyzers.analysis_document): the lost-time
budget, the findings in the one order the runner gave them, each analyzer's metrics, and the
analyzers that failed. Text is stripped of control sequences, Markdown is escaped.
"""

from __future__ import annotations

import json
from typing import Any

from tracelab.render.text import duration, md, md_code, one_line, value
from tracelab.vocabulary import STEP_PARTS as PARTS


def _impact(f: dict[str, Any]) -> str:
    if f["impact_ns_per_step"] is None:
        return "not a time cost"
    return f"{duration(f['impact_ns_per_step'])} per step ({100 * f['impact_share']:.1f}%)"


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return "-"
    return ", ".join(map(str, ranks[:16])) + (
        f" and {len(ranks) - 16} more" if len(ranks) > 16 else ""
    )


def _budget_line(lost: dict[str, Any] | None) -> str:
    if not lost:
        return "no lost-time budget (no steps, or the parts could not be derived)"
    step = lost["step_ns"]
    parts = ", ".join(
        f"{p} {100 * lost['parts_ns'][p] / step:.1f}%"
        for p in PARTS
        if step and lost["parts_ns"].get(p)
    )
    return (
        f"step {duration(step)} (mean of {lost['steps']} steady step(s) x "
        f"{lost['ranks']} rank(s)): {parts}"
    )


def render_text(doc: dict[str, Any]) -> str:
    run = doc["run"]
    out = [
        f"run {one_line(run['name'])}: {run['ranks']} ranks",
        "where the time goes: " + _budget_line(doc["lost_time"]),
        "",
        f"FINDINGS ({len(doc['findings'])}, worst first)",
    ]
    if not doc["findings"]:
        out.append("  none")
    for i, f in enumerate(doc["findings"], 1):
        ev = f["evidence"]
        out.append(f"{i:>3}. [{f['severity'].upper()}] {f['code']}: {one_line(f['title'])}")
        out.append(
            f"     impact: {_impact(f)}; ranks {_ranks(ev['ranks'])}"
            + (f" (waiting: {_ranks(ev['affected_ranks'])})" if ev["affected_ranks"] else "")
            + f"; view: {f['view']}"
        )
        nums = "; ".join(f"{k}: {value(k, v)}" for k, v in ev["numbers"].items())
        if nums:
            out.append(f"     evidence: {one_line(nums)}")
        out.append(f"     fix: {one_line(f['suggestion'])}")
    for name, res in doc["analyzers"].items():
        out += ["", f"{name.upper()} METRICS"]
        out += [f"  {k:<32} {value(k, v)}" for k, v in res["metrics"].items()]
        out += [f"  note: {one_line(n)}" for n in res["notes"]]
    for name, why in doc["errors"].items():
        out += ["", f"FAILED: {name}: {one_line(why)}"]
    return "\n".join(out) + "\n"


def render_markdown(doc: dict[str, Any]) -> str:
    run = doc["run"]
    out = [
        f"# tracelab analysis: {md(run['name'])}",
        "",
        f"{run['ranks']} ranks. Where the time goes: {md(_budget_line(doc['lost_time']))}.",
        "",
        "## Findings",
        "",
    ]
    if not doc["findings"]:
        out.append("No findings.")
    else:
        out += [
            "| # | severity | code | finding | impact per step | share | fix |",
            "|---|---|---|---|---|---|---|",
        ]
        for i, f in enumerate(doc["findings"], 1):
            share = "-" if f["impact_share"] is None else f"{100 * f['impact_share']:.1f}%"
            impact = "-" if f["impact_ns_per_step"] is None else duration(f["impact_ns_per_step"])
            out.append(
                f"| {i} | {f['severity']} | {md_code(f['code'])} | {md(f['title'])} | "
                f"{impact} | {share} | {md(f['suggestion'])} |"
            )
    for name, res in doc["analyzers"].items():
        out += ["", f"## {md(name)}", "", "| metric | value |", "|---|---|"]
        out += [f"| {md(k)} | {md(value(k, v))} |" for k, v in res["metrics"].items()]
        out += [f"\n> {md(n)}" for n in res["notes"]]
    if doc["errors"]:
        out += ["", "## Analyzers that failed", ""]
        out += [f"- {md_code(k)}: {md(v)}" for k, v in doc["errors"].items()]
    return "\n".join(out) + "\n"


def render_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1, default=str) + "\n"
