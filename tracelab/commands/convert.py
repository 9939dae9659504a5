"""`tracelab convert TRACE...`: a trace's columnar form, made where the trace was written.

Run it on each node (or let the collector do it at the end of a window) and `tracelab ingest`
only registers the result, so a 1,000-rank job never funnels through one parser.
"""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from tracelab.ingest.convert import convert_beside
    from tracelab.ingest.converted import converted_dir

    for path in args.traces:
        out = converted_dir(path)
        info = convert_beside(path)
        print(f"{path} -> {out} ({info.event_count:,} events, rank {info.rank})")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "convert",
        help="convert traces to tracelab's columnar form next to them",
        description="Convert Kineto traces into tracelab's columnar form (Parquet), in a folder "
        "beside each trace (window-0.pt.trace.json.gz -> window-0.pt.trace.tracelab/). A later "
        "`tracelab ingest` registers the result without parsing the JSON again, as long as the "
        "trace file is unchanged.",
    )
    p.add_argument("traces", nargs="+", metavar="TRACE", help="trace files (.json or .json.gz)")
    p.set_defaults(func=run)
