"""Printing rows as an aligned text table, CSV or JSON lines (CLI output)."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def print_table(
    rows: Sequence[dict[str, Any]],
    *,
    fmt: str = "table",
    columns: Sequence[str] | None = None,
    out: TextIO | None = None,
) -> None:
    out = out or sys.stdout
    cols = list(columns or (rows[0].keys() if rows else []))
    if fmt == "json":
        for row in rows:
            out.write(json.dumps(row, default=str) + "\n")
        return
    if fmt == "csv":
        writer = csv.writer(out)
        writer.writerow(cols)
        for row in rows:
            writer.writerow([_cell(row.get(c)) for c in cols])
        return
    if not rows:
        out.write("(no rows)\n")
        return
    cells = [[_cell(row.get(c)).replace("\n", " ") for c in cols] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
    out.write("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip() + "\n")
    out.write("  ".join("-" * w for w in widths) + "\n")
    for r in cells:
        out.write("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() + "\n")
