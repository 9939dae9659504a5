"""Golden files: the store schema (every table, view and column with its comment) and the
analysis JSON document on fixed constructed traces. A change to either is a change to a public
contract (docs/json-schema.md, docs/metrics.md): review the diff, then regenerate with

    TRACELAB_REGENERATE_GOLDEN=1 python -m pytest tests/golden/test_golden_files.py

and commit the files under tests/golden/files/ with the change that explains them.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path

import duckdb
import pytest

from tracelab.analyzers import analysis_document, run
from tracelab.ingest import ingest
from tracelab.store import open_store, resolve_run
from tracelab.testing.synth import build_run

FILES = Path(__file__).parent / "files"
REGENERATE = os.environ.get("TRACELAB_REGENERATE_GOLDEN") == "1"
SCENARIOS = {
    "stragglers": ("stragglers", {}),
    "overlap": ("overlap", {"steps": 3}),
    "pipeline_1f1b_stall": (
        "pipeline",
        {"schedule": "1f1b", "slow_stage": 2, "slow_factor": 1.5, "stall_ms": 3},
    ),
}


def _check(name: str, text: str) -> None:
    path = FILES / name
    if REGENERATE:
        path.write_text(text, encoding="utf-8")
        return
    assert path.is_file(), f"{path} is missing: regenerate (see this module's docstring)"
    want = path.read_text(encoding="utf-8")
    diff = "\n".join(
        list(
            difflib.unified_diff(want.splitlines(), text.splitlines(), "golden", "now", lineterm="")
        )[:60]
    )
    assert text == want, (
        f"{name} differs from its golden file: review the change, then "
        f"regenerate (see tests/golden/test_golden_files.py)\n{diff}"
    )


def test_store_schema(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    with open_store(db, read_only=False):
        pass
    with duckdb.connect(str(db), read_only=True) as con:
        tables = con.execute("""SELECT table_name, CASE WHEN table_type = 'VIEW' THEN 'view'
                                       ELSE 'table' END
                                FROM information_schema.tables ORDER BY table_name""").fetchall()
        comments = dict(
            con.execute(
                "SELECT table_name, comment FROM duckdb_tables() UNION ALL "
                "SELECT view_name, comment FROM duckdb_views() WHERE NOT internal"
            ).fetchall()
        )
        lines = []
        for table, kind in tables:
            lines.append(f"{kind} {table}: {comments.get(table) or ''}".rstrip())
            for col, typ, comment in con.execute(
                "SELECT column_name, data_type, comment FROM duckdb_columns() "
                "WHERE table_name = ? ORDER BY column_index",
                [table],
            ).fetchall():
                lines.append(f"  {col} {typ}: {comment or ''}".rstrip())
    _check("store_schema.txt", "\n".join(lines) + "\n")


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_analysis_document(name: str, tmp_path: Path) -> None:
    scenario, params = SCENARIOS[name]
    r = build_run(tmp_path, scenario, **params)
    db = tmp_path / "s.duckdb"
    ingest(r.paths, db=db, run=r.name, workers=1, progress=False)
    with open_store(db) as con:
        rid, run_name = resolve_run(con, r.name)
        doc = analysis_document({"name": run_name, "run_id": rid}, run(con, rid))
    doc.pop("tracelab_version")
    _check(
        f"analysis_{name}.json",
        json.dumps(_rounded(doc), indent=1, sort_keys=True, default=str) + "\n",
    )


def _rounded(x: object) -> object:
    """Floats to 10 significant digits: DuckDB's parallel sums may add in another order from
    run to run, which moves the last bits of a mean; the contract is the value, not its ulp."""
    if isinstance(x, float):
        return float(f"{x:.10g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_rounded(v) for v in x]
    return x
