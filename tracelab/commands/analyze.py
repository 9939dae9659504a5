"""`tracelab analyze`: run every analyzer on one run; findings worst first, then the metrics."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from tracelab.commands._common import add_db_option, add_run_option
from tracelab.results import Finding, Result


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return "-" if value is None else str(value)


def _impact(f: Finding) -> str:
    if f.impact_ms_per_step is None:
        return "impact: not a time cost"
    share = f" ({100 * f.impact_share:.1f}% of the step)" if f.impact_share is not None else ""
    return f"impact: {f.impact_ms_per_step:.3f} ms per step{share}"


def render_text(run: dict[str, Any], findings: list[Finding], results: list[Result],
                out: TextIO) -> None:
    out.write(f"run {run['name']}: {run['ranks']} ranks\n\n")
    out.write(f"FINDINGS ({len(findings)}, worst first)\n")
    if not findings:
        out.write("  none\n")
    for i, f in enumerate(findings, 1):
        out.write(f"{i:>3}. [{str(f.severity).upper()}] {f.code}: {f.title}\n")
        out.write(f"     {_impact(f)}; ranks {list(f.evidence.ranks) or '-'}; "
                  f"steps {list(f.evidence.steps) or '-'}; view: {f.view}\n")
        nums = ", ".join(f"{k}={_fmt(v)}" for k, v in f.evidence.numbers.items())
        if nums:
            out.write(f"     evidence: {nums}\n")
        out.write(f"     fix: {f.suggestion}\n")
    for res in results:
        out.write(f"\n{res.analyzer.upper()} METRICS\n")
        out.writelines(f"  {k:<32} {_fmt(v)}\n" for k, v in res.metrics.items())
        out.writelines(f"  note: {note}\n" for note in res.notes)


def render_markdown(run: dict[str, Any], findings: list[Finding], results: list[Result],
                    out: TextIO) -> None:
    def cell(v: Any) -> str:
        return _fmt(v).replace("|", "\\|").replace("\n", " ")

    out.write(f"# tracelab analysis: {cell(run['name'])}\n\n{run['ranks']} ranks.\n\n")
    out.write("## Findings\n\n")
    if not findings:
        out.write("No findings.\n")
    else:
        out.write("| # | severity | code | finding | ms/step | share | fix |\n")
        out.write("|---|---|---|---|---|---|---|\n")
        for i, f in enumerate(findings, 1):
            share = f"{100 * f.impact_share:.1f}%" if f.impact_share is not None else "-"
            out.write(f"| {i} | {f.severity} | `{f.code}` | {cell(f.title)} | "
                      f"{cell(f.impact_ms_per_step)} | {share} | {cell(f.suggestion)} |\n")
    for res in results:
        out.write(f"\n## {res.analyzer}\n\n| metric | value |\n|---|---|\n")
        out.writelines(f"| {k} | {cell(v)} |\n" for k, v in res.metrics.items())
        out.writelines(f"\n> {cell(note)}\n" for note in res.notes)


def run(args: argparse.Namespace) -> int:
    from tracelab.analyzers import all_findings, analysis_document, run_all
    from tracelab.store import open_store, resolve_run

    only = [a.strip() for a in args.only.split(",")] if args.only else None
    with open_store(args.db) as con:
        rid, name = resolve_run(con, args.run)
        ranks = con.execute("SELECT rank_count, world_size FROM runs WHERE run_id = ?",
                            [rid]).fetchone()
        results = run_all(con, rid, only=only)
    run_info = {"name": name, "run_id": rid, "ranks": ranks[0] if ranks else None,
                "world_size": ranks[1] if ranks else None}
    findings = all_findings(results)
    out = sys.stdout
    if args.format == "json":
        json.dump(analysis_document(run_info, results), out, indent=1, default=str)
        out.write("\n")
    elif args.format == "markdown":
        render_markdown(run_info, findings, results, out)
    else:
        render_text(run_info, findings, results, out)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "analyze", help="diagnose a run: findings worst first, then metrics",
        description="Run every analyzer on one run of the store and print its findings, worst "
                    "impact first, then each analyzer's metrics. --format json gives the "
                    "stable document described in docs/json-schema.md.")
    add_db_option(p)
    add_run_option(p)
    p.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    p.add_argument("--only", metavar="NAMES",
                   help="comma-separated analyzers to run (default: all): steps, breakdown, "
                        "clocks, stragglers, pipeline, memory")
    p.set_defaults(func=run)
