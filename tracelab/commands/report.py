"""`tracelab report`: gate a candidate run against a baseline, like a unit test.

Exit codes: 0 no regression, 1 regression, 2 usage error, 3 input error. This path imports
neither dash nor a browser (tests check sys.modules).
"""

from __future__ import annotations

import argparse
import sys

from tracelab.render import formats

FORMATS = formats("report")


def run(args: argparse.Namespace) -> int:
    from tracelab.commands._report_inputs import build_report
    from tracelab.report import formatting
    from tracelab.report.outputs import write_outputs
    from tracelab.report.thresholds import load_settings, parse_cli_thresholds

    settings = load_settings(
        config_file=args.thresholds,
        cli_thresholds=parse_cli_thresholds(args.threshold or []),
        cli_settings={
            "alpha": args.alpha,
            "warmup_steps": args.warmup_steps,
            "min_steps": args.min_steps,
            "seed": args.seed,
        },
    )
    report = build_report(args.baseline, args.candidate, settings=settings, db=args.db)
    written = write_outputs(report, args.format or ["markdown"], args.out)
    icon, headline, detail = formatting.verdict_summary(report)
    files = [w for w in written if w != "-"]
    print(
        f"tracelab report: {headline} {detail}" + (f" -> {', '.join(files)}" if files else ""),
        file=sys.stderr,
    )
    for what, why in report.errors.items():
        print(
            f"tracelab report: {what} failed, its metrics could not be judged: {why}",
            file=sys.stderr,
        )
    return report.exit_code


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "report",
        help="compare a candidate run with a baseline; exit 1 on a regression",
        description=(
            "Compare a candidate run with a baseline and gate on it: exit 0 when nothing "
            "regressed, 1 on a regression, 2 on a usage error, 3 on an input error. BASELINE "
            "and CANDIDATE are run names, named baselines, or trace/capture folders (ingested "
            "on the fly)."
        ),
    )
    p.add_argument(
        "--baseline",
        required=True,
        metavar="A",
        help="baseline: a run or baseline name in the store, or a trace/capture folder",
    )
    p.add_argument(
        "--candidate",
        required=True,
        metavar="B",
        help="candidate: a run name, or a trace/capture folder",
    )
    p.add_argument(
        "--db",
        default=None,
        metavar="FILE",
        help="DuckDB store (default: ./tracelab.duckdb, or a temporary store when "
        "both A and B are folders)",
    )
    p.add_argument(
        "--format",
        action="append",
        choices=FORMATS,
        metavar="FMT",
        help="markdown (default), html, json or junit; repeat for several",
    )
    p.add_argument(
        "--out",
        metavar="PATH",
        help="output file (one format) or folder (several); default: stdout",
    )
    p.add_argument(
        "--thresholds",
        metavar="FILE",
        help="thresholds config (default: ./.tracelab-thresholds.yml when present)",
    )
    p.add_argument(
        "--threshold",
        action="append",
        metavar="NAME=VALUE",
        help="override one threshold, e.g. step_time=+5%% or bubble_share=+2pp",
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=None,
        help="significance level of the Mann-Whitney test (default 0.05)",
    )
    p.add_argument(
        "--warmup-steps",
        type=int,
        default=None,
        metavar="N",
        help="leading steps dropped on every rank (default 1)",
    )
    p.add_argument(
        "--min-steps",
        type=int,
        default=None,
        metavar="N",
        help="fewer steps a side: warn instead of judging (default 9)",
    )
    p.add_argument("--seed", type=int, default=None, help="bootstrap seed (default 0)")
    p.set_defaults(func=run)
