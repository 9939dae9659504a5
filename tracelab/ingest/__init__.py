"""Ingest: traces and captures in, one run in the store out, all or nothing.

discover (which files, which capture) -> pool (convert each file: decode with the C scanner,
validate, columns, Parquet) -> ranks (which rank each file is) -> write (one transaction: load
the Parquet files, derive). `orchestrate.ingest` runs them in that order.

The entry points are loaded lazily: the submodules import each other through this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracelab.ingest.orchestrate import ingest
    from tracelab.ingest.write import IngestReport

__all__ = ["IngestReport", "ingest"]


def __getattr__(name: str) -> Any:
    if name == "ingest":
        from tracelab.ingest.orchestrate import ingest

        return ingest
    if name == "IngestReport":
        from tracelab.ingest.write import IngestReport

        return IngestReport
    raise AttributeError(f"module 'tracelab.ingest' has no attribute {name!r}")
