"""`tracelab hang DUMPS...`: where the ranks of a hung job parted, from Flight Recorder dumps."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _manifest_world(paths: list[str]) -> int | None:
    """The world size of the capture the dumps are in (CAPTURE/flight-recorder/), if any."""
    for p in map(Path, paths):
        folder = p if p.is_dir() else p.parent
        manifest = folder.parent / "manifest.json"
        try:
            world = json.loads(manifest.read_text()).get("world_size")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(world, int) and world > 0:
            return world
    return None


def run(args: argparse.Namespace) -> int:
    from tracelab.hang import render
    from tracelab.hang.dumps import read_dumps
    from tracelab.hang.verdict import analyze

    report = analyze(read_dumps(args.dumps), args.world_size or _manifest_world(args.dumps))
    print(render.as_json(report) if args.format == "json" else render.text(report))
    return 1 if report.hung else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "hang",
        help="find where a hung job's ranks parted, from Flight Recorder dumps",
        description="Read each rank's PyTorch Flight Recorder dump (JSON or pickle, NCCL or "
        "gloo; the rank is the number ending each file's name), line the ranks' collectives up "
        "per process group and sequence number, and print first where they diverge: ranks "
        "that never entered a collective or left no dump, different ops, sizes or dtypes, with "
        "the Python stack where the dump has one; then each rank's last ops. Exit codes: 0 the "
        "ranks agree, 1 a hang or desync, 2 usage, 3 an unreadable dump. docs/hang.md.",
    )
    p.add_argument("dumps", nargs="+", metavar="DUMP", help="dump files, or folders of them")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument(
        "--world-size",
        type=int,
        metavar="N",
        help="the job's ranks, where the dumps do not list them (read from the capture's "
        "manifest.json when the dumps are in CAPTURE/flight-recorder/)",
    )
    p.set_defaults(func=run)
