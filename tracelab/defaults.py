"""Defaults shared by the CLI and the library, importable without loading DuckDB."""

from __future__ import annotations

#: The store file used when no --db is given.
DEFAULT_DB = "tracelab.duckdb"

#: Warm-up policy, the one setting every surface uses: the first WARMUP_STEPS profiled steps of
#: a run (allocator warm-up, autotuning, compilation) are left out of every steady-state figure,
#: unless the run has no more steps than that (then none is left out). docs/metrics.md.
WARMUP_STEPS = 1


def env_seconds(name: str, default: float) -> float:
    """A number of seconds from the environment variable `name`; a UsageError naming it when
    it is not a non-negative number (read when used, never at import)."""
    import math
    import os

    from tracelab.errors import UsageError

    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise UsageError(f"{name} must be a number of seconds (e.g. 60), not {raw[:40]!r}.")
    return value
