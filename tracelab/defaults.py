"""Defaults shared by the CLI and the library, importable without loading DuckDB."""

from __future__ import annotations

#: The store file used when no --db is given.
DEFAULT_DB = "tracelab.duckdb"

#: Warm-up policy, the one setting every surface uses: the first WARMUP_STEPS profiled steps of
#: a run (allocator warm-up, autotuning, compilation) are left out of every steady-state figure,
#: unless the run has no more steps than that (then none is left out). docs/metrics.md.
WARMUP_STEPS = 1
