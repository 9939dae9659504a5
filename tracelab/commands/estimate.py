"""`tracelab estimate`: predict each pipeline rank's peak memory before a job runs.

From a small config (a YAML or JSON file, or flags; flags override the file) it applies the
memory model of tracelab.memory_model (docs/metrics.md, "Memory estimate"): model states,
activations in flight per the schedule, the backward's and the optimizer step's workspace, and
the allowance. The same file given to the memory analyzer (`tracelab analyze --prediction FILE`)
puts the prediction beside a run's measured peaks.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from tracelab.errors import UsageError
from tracelab.tables import print_table

GIB = 1024**3
#: Flags, with their config key and type.
FLAGS: tuple[tuple[str, type], ...] = (
    ("layers", int),
    ("hidden", int),
    ("seq", int),
    ("microbatch", int),
    ("microbatches", int),
    ("heads", int),
    ("vocab", int),
    ("dp", int),
    ("tp", int),
    ("pp", int),
    ("cp", int),
    ("v", int),
    ("zero", int),
    ("schedule", str),
    ("recompute", str),
    ("optimizer", str),
    ("dtype", str),
)


def run(args: argparse.Namespace) -> int:
    from tracelab import memory_model as mm

    # The file's settings (a file that cannot be read, or a value of the wrong kind: exit 3,
    # naming it), then the flags over them: a file may hold some settings, the flags the rest.
    raw: dict[str, Any] = mm.read_config(args.config) if args.config else {}
    if args.capacity_gib is not None and not args.capacity_gib > 0:
        raise UsageError(f"--capacity-gib must be above 0, not {args.capacity_gib:g}.")
    for name, _ in FLAGS:
        value = getattr(args, name)
        if value is not None:
            raw[name] = value
    if args.sp:
        raw["sp"] = True
    missing = [k for k in mm.REQUIRED_KEYS if raw.get(k) is None]
    if missing:
        raise UsageError(
            f"missing {', '.join('--' + k for k in missing)}: give at least --layers, --hidden, "
            "--seq, --microbatch and --heads (as flags or in a config file)."
        )
    try:
        cfg = mm.config_from_mapping(raw, "the flags")  # the file's own were checked on reading
        ranks = mm.predict(cfg)
    except ValueError as exc:
        raise UsageError(f"{exc}.") from exc
    rows = [
        {
            "pp_rank": e.rank,
            "stages": ",".join(str(s) for s in e.stages),
            "in_flight": ",".join(f"{s}:{n}" for s, n in sorted(e.in_flight.items())),
            "states_GiB": round(e.model_states_bytes / GIB, 3),
            "activations_GiB": round(e.activations_bytes / GIB, 3),
            "workspace_GiB": round(
                (e.transient_bytes - e.activations_bytes + e.allowance_bytes) / GIB, 3
            ),
            "peak_phase": e.phase,
            "total_GiB": round(e.total_bytes / GIB, 3),
        }
        for e in ranks
    ]
    if args.capacity_gib:
        for row in rows:
            used = row["total_GiB"] / args.capacity_gib
            row["of_capacity"] = f"{100 * used:.0f}%" + (" (does not fit)" if used > 1 else "")
    if args.format == "json":
        print(json.dumps({"config": raw, "ranks": rows}, indent=1, default=str))
    else:
        print_table(rows, fmt=args.format)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "estimate",
        help="predict per-stage memory of a training configuration",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("config", nargs="?", help="YAML or JSON config (keys as the flags)")
    for name, kind in FLAGS:
        p.add_argument(f"--{name}", type=kind, default=None)
    p.add_argument("--sp", action="store_true", help="sequence parallelism (with --tp)")
    p.add_argument(
        "--capacity-gib",
        type=float,
        default=None,
        metavar="GIB",
        help="device memory per GPU: adds each rank's share of it (above 80%%, fragmentation "
        "and spikes risk out-of-memory)",
    )
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.set_defaults(func=run)
