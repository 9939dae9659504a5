"""What every analyzer gets about its run, and small helpers for parameters, rows and wording."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb

from tracelab.defaults import WARMUP_STEPS
from tracelab.derived.sqlrows import first
from tracelab.errors import RunNotFoundError, UsageError
from tracelab.vocabulary import STEP_PARTS

NS_PER_MS = 1_000_000
#: The parts of the lost-time model, as step_parts names them (docs/metrics.md).
PARTS = STEP_PARTS


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """One run as the analyzers see it: its identity, metadata, and the steady-state steps."""

    run_id: int
    name: str
    world_size: int | None
    rank_count: int
    metadata: dict[str, Any]
    #: Warm-up steps left out (the setting), and the lowest steady ordinal it gives this run.
    warmup_steps: int
    min_ordinal: int
    steps_total: int
    #: Derived components that failed on this run (component -> reason).
    derived_errors: dict[str, str] = field(default_factory=dict)

    @property
    def params(self) -> dict[str, Any]:
        """Bind parameters every steady-state query uses: $run and $min_ordinal."""
        return {"run": self.run_id, "min_ordinal": self.min_ordinal}


def run_context(
    con: duckdb.DuckDBPyConnection, run_id: int, warmup_steps: int = WARMUP_STEPS
) -> RunContext:
    """The context of run `run_id`; `warmup_steps` leading steps are warm-up unless the run has
    no more steps than that (then every step is steady, as in step_spans.steady)."""
    row = first(
        con.execute(
            "SELECT name, world_size, rank_count, metadata FROM runs WHERE run_id = ?", [run_id]
        )
    )
    if row is None:
        raise RunNotFoundError(f"no run with id {run_id} in the store.")
    steps = first(
        con.execute("SELECT count(DISTINCT ordinal) FROM step_spans WHERE run_id = ?", [run_id])
    )
    total = int(steps[0]) if steps else 0
    errors = dict(
        con.execute(
            "SELECT component, message FROM derived_errors WHERE run_id = ?", [run_id]
        ).fetchall()
    )
    meta = json.loads(row[3]) if row[3] else {}
    return RunContext(
        run_id=run_id,
        name=str(row[0]),
        world_size=row[1],
        rank_count=int(row[2]),
        metadata=meta if isinstance(meta, dict) else {},
        warmup_steps=warmup_steps,
        min_ordinal=warmup_steps if total > warmup_steps else 0,
        steps_total=total,
        derived_errors=errors,
    )


def merge_params(
    name: str, defaults: Mapping[str, Any], given: Mapping[str, Any]
) -> dict[str, Any]:
    """Defaults overridden by `given`; an unknown key is a usage error naming the known ones."""
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise UsageError(
            f"analyzer {name!r} has no parameter(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(defaults))}."
        )
    return {**defaults, **given}


def rows(
    con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] | Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Run a query and return its rows as dicts."""
    cur = con.execute(sql, dict(params) if isinstance(params, Mapping) else list(params))
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]


def ms(ns: float | None) -> str:
    """Nanoseconds as milliseconds for a sentence ('12.3 ms'); the wording's only rounding."""
    if ns is None:
        return "unknown"
    v = float(ns) / NS_PER_MS
    return f"{v:,.3g} ms" if abs(v) < 100 else f"{v:,.0f} ms"


def pct(share: float | None) -> str:
    return "unknown" if share is None else f"{100 * share:.1f}%"


def ranks_str(ranks: Sequence[int]) -> str:
    """'rank 3', 'ranks 1, 2 and 5', or 'ranks 0-127' for a long consecutive run."""
    rs = sorted(set(ranks))
    if not rs:
        return "no rank"
    if len(rs) == 1:
        return f"rank {rs[0]}"
    if len(rs) > 3 and rs[-1] - rs[0] == len(rs) - 1:
        return f"ranks {rs[0]}-{rs[-1]}"
    if len(rs) > 8:
        return "ranks " + ", ".join(map(str, rs[:6])) + f" and {len(rs) - 6} more"
    return "ranks " + ", ".join(map(str, rs[:-1])) + f" and {rs[-1]}"


#: Why a collective's size can be unknown, for a finding that shows one.
SIZE_UNKNOWN_WHY = (
    "A size is unknown where the trace gives none: gloo's collectives record theirs only when "
    "profiled with record_shapes=True, and a host op that issues a collective (c10d::allreduce_ "
    "on the main thread) or waits for one is matched to no collective of its own."
)


def size_str(nbytes: int | None) -> str:
    """A message size in words ('4.0 MiB'); '(size unknown)' when the trace does not say (the
    finding that shows it says why: SIZE_UNKNOWN_WHY)."""
    if nbytes is None:
        return "(size unknown)"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"
