"""Helpers of the golden tests: peers' fixture traces written to a folder, ingested, queried.

The fixtures under fixtures/ are the peers' own test traces, verbatim (see fixtures/PROVENANCE.md).
A fixture that is a bare event list (the TensorBoard plugin's inline traces) is wrapped the way
the plugin's own test wraps it (`{"schemaVersion": 1, "traceEvents": [...]}`), plus the
`distributedInfo` tracelab needs to know the rank (the plugin takes the worker from the file name).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tracelab.ingest import ingest
from tracelab.store import open_store, resolve_run

FIXTURES = Path(__file__).resolve().parent / "fixtures"
US = 1000  # ns per µs: the peers' numbers are in µs, tracelab's in ns


def tb_events(name: str, rank: int = 0) -> list[dict[str, Any]]:
    """A TensorBoard-plugin fixture: tb_plugin/<name>.rank<rank>.json."""
    return json.loads((FIXTURES / "tb_plugin" / f"{name}.rank{rank}.json").read_text())


def write_ranks(
    folder: Path, ranks: dict[int, list[dict[str, Any]]], extra: dict[str, Any] | None = None
) -> list[Path]:
    """One trace file per rank, as the plugin's test wraps its event lists."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank, events in ranks.items():
        doc = {
            "schemaVersion": 1,
            "traceEvents": events,
            "distributedInfo": {"rank": rank, "world_size": len(ranks)},
            **(extra or {}),
        }
        path = folder / f"worker{rank}.pt.trace.json"
        path.write_text(json.dumps(doc))
        paths.append(path)
    return paths


class Store:
    """One ingested run, queried with $run bound."""

    def __init__(self, db: Path, run: str) -> None:
        self.db, self.run = db, run

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        with open_store(self.db, read_only=True) as con:
            rid, _ = resolve_run(con, self.run)
            cur = con.execute(sql, {"run": rid, **(params or {})})
            cols = [d[0] for d in cur.description]
            return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def by_rank(self, sql: str) -> dict[int, dict[str, Any]]:
        return {int(r["rank"]): r for r in self.rows(sql)}


def ingest_ranks(
    tmp: Path,
    ranks: dict[int, list[dict[str, Any]]],
    name: str = "golden",
    extra: dict[str, Any] | None = None,
) -> Store:
    paths = write_ranks(tmp / name, ranks, extra)
    db = tmp / f"{name}.duckdb"
    report = ingest([str(p) for p in paths], db=db, run=name, workers=1, progress=False)
    assert not report.derived_errors, report.derived_errors
    return Store(db, name)


def step_parts_us(store: Store) -> dict[int, dict[str, float]]:
    """step_parts of every rank's steps, in µs, keyed by rank then column (one step each)."""
    out: dict[int, dict[str, float]] = {}
    for r in store.rows("SELECT * FROM step_parts WHERE run_id = $run ORDER BY rank, step"):
        out.setdefault(int(r["rank"]), {})
        out[int(r["rank"])][int(r["step"])] = {
            k: v / US
            for k, v in r.items()  # type: ignore[index]
            if k.endswith("_ns")
        }
    return out


def union_us(intervals: list[tuple[int, int]]) -> float:
    """Length of the union of [a, b) intervals (ns), in µs."""
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total / US
