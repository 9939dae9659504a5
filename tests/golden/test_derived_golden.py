"""Golden rows of the derived layer (Perfetto diff-test style): tiny synthetic runs built with
tracelab.testing.synth, one query per derived table or view, the expected rows as CSV under
tests/golden/derived/<scenario>/<table>.csv. They pin every derived number row by row, so a
change to how a table is written (SQL files, inserts by name) must leave them identical. A
change to a definition changes them: review the diff, then regenerate with

    TRACELAB_REGENERATE_GOLDEN=1 python -m pytest tests/golden/test_derived_golden.py

and commit the files with the change that explains them (docs/metrics.md, DERIVED_VERSION).
"""

from __future__ import annotations

import csv
import io
import os
import re
from pathlib import Path
from typing import Any

import pytest

from tracelab.ingest import ingest
from tracelab.store import list_runs, open_store, resolve_run
from tracelab.testing.synth import build_run

GOLDEN = Path(__file__).parent / "derived"
REGENERATE = os.environ.get("TRACELAB_REGENERATE_GOLDEN") == "1"
#: Scenario name -> (synth scenario, parameters): skewed clocks and stragglers (clock offsets by
#: causality, waits), host-only gloo ranks (host compute), a pipeline with a stall (p2p ops,
#: pipeline tables, bubble and stall) and one without annotations on gloo (host_ops actions).
SCENARIOS: dict[str, tuple[str, dict[str, Any]]] = {
    "stragglers_skewed": ("stragglers", {"steps": 2, "clock_offsets_ms": (0, 2, -1, 1.5)}),
    "overlap_gloo": ("overlap", {"backend": "gloo", "steps": 2}),
    "pipeline_1f1b": (
        "pipeline",
        {"schedule": "1f1b", "p": 2, "m": 2, "steps": 2, "stall_ms": 1, "capture": True},
    ),
    "pipeline_host_ops_gloo": (
        "pipeline",
        {"schedule": "1f1b", "p": 2, "m": 2, "steps": 1, "backend": "gloo", "annotate": "none"},
    ),
}
#: Every derived table and view, in the order derive() fills them.
TABLES = (
    "process_groups",
    "collective_groups",
    "clock_offsets",
    "step_spans",
    "matched_collectives",
    "p2p_ops",
    "pipeline_actions",
    "pipeline_runs",
    "pipeline_ranks",
    "time_parts",
    "step_parts",
    "comm_attribution",
    "rank_extents",
    "op_totals",
    "derived_errors",
    "job_steps",
    "job_step_shares",
    "job_step_dim_shares",
)
NULL = r"\N"


def _csv(cols: list[str], rows: list[tuple[Any, ...]]) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(cols)
    for row in rows:
        w.writerow([NULL if v is None else repr(v) if isinstance(v, float) else v for v in row])
    return out.getvalue()


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    out = {}
    for name, (scenario, params) in SCENARIOS.items():
        folder = tmp_path_factory.mktemp(name)
        run = build_run(folder / "traces", scenario, **params)
        db = folder / "s.duckdb"
        ingest(run.paths, db=db, run=name)
        out[name] = (db, name)
    return out


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_derived_rows(scenario: str, stores: dict[str, tuple[Path, str]]) -> None:
    db, run = stores[scenario]
    failures = []
    with open_store(db, read_only=True) as con:
        rid, _ = resolve_run(con, run)
        for table in TABLES:
            cur = con.execute(
                f"SELECT * EXCLUDE (run_id) FROM {table} WHERE run_id = $run ORDER BY ALL",
                {"run": rid},
            )
            text = _csv([d[0] for d in cur.description], cur.fetchall())
            path = GOLDEN / scenario / f"{table}.csv"
            if REGENERATE:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
                continue
            assert path.is_file(), f"{path} is missing: regenerate (see this module's docstring)"
            if path.read_text(encoding="utf-8") != text:
                failures.append(table)
    assert not failures, (
        f"{scenario}: derived rows of {', '.join(failures)} differ from tests/golden/derived/: "
        "review the change, then regenerate (see tests/golden/test_derived_golden.py)"
    )


def test_every_definition_inserts_by_name_with_named_parameters() -> None:
    """Each derived table's file holds its DDL and an INSERT INTO <table> BY NAME (never by
    position), and no file of tracelab/derived/sql binds positionally."""
    from tracelab.derived import sqlfiles

    sql_dir = Path(sqlfiles.__file__).parent / "sql"
    for path in sorted(sql_dir.glob("*.sql")):
        assert "?" not in path.read_text(), f"{path.name} binds a positional parameter"
    for name in sqlfiles.DEFINITIONS:
        ddl = sqlfiles.ddl(name)
        assert re.search(rf"^CREATE (TABLE IF NOT EXISTS|OR REPLACE VIEW) {name}\b", ddl, re.M), (
            name
        )
        if "CREATE OR REPLACE VIEW" in ddl:
            continue
        statement = sqlfiles.statement(name)
        assert statement.startswith(f"INSERT INTO {name} BY NAME\n"), name


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_rank_extents_are_the_events_own(
    scenario: str, stores: dict[str, tuple[Path, str]]
) -> None:
    """rank_extents holds what a scan of every rank's events gives (the scan it replaces in
    the views' context and the breakdown): count, first start, last end, device activity."""
    db, run = stores[scenario]
    with open_store(db, read_only=True) as con:
        rid, _ = resolve_run(con, run)
        stored = con.execute(
            "SELECT rank, events, first_ns, end_ns, device FROM rank_extents "
            "WHERE run_id = $run ORDER BY rank",
            {"run": rid},
        ).fetchall()
        scanned = con.execute(
            "SELECT rank, count(*), min(ts_ns), max(ts_ns + dur_ns), "
            "rank IN (SELECT DISTINCT rank FROM events WHERE run_id = $run AND on_device "
            "         AND category IN ('compute', 'communication')) "
            "FROM events WHERE run_id = $run GROUP BY rank ORDER BY rank",
            {"run": rid},
        ).fetchall()
    assert stored == scanned and len(stored) >= 2
    # The runs list's duration reads it; from the events where a run has none.
    with open_store(db, read_only=True) as con:
        rid, _ = resolve_run(con, run)
        (whole,) = con.execute(
            "SELECT max(ts_ns + dur_ns) - min(ts_ns) FROM events WHERE run_id = $run", {"run": rid}
        ).fetchall()[0]
        assert [x["span_ns"] for x in list_runs(con) if x["run_id"] == rid] == [whole]
        con.execute("CREATE TEMP TABLE rank_extents AS SELECT * FROM rank_extents LIMIT 0")
        assert con.execute("SELECT count(*) FROM rank_extents").fetchall() == [(0,)]  # shadowed
        assert [x["span_ns"] for x in list_runs(con) if x["run_id"] == rid] == [whole]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_op_totals_give_the_report_the_events_own_op_times(
    scenario: str, stores: dict[str, tuple[Path, str]]
) -> None:
    """The report's per-op times from op_totals equal those summed from the events (its
    fallback for a run without them), with and without a warm-up step dropped."""
    from tracelab.report.metrics import _op_times

    db, run = stores[scenario]
    with open_store(db, read_only=True) as con:
        rid, _ = resolve_run(con, run)
        derived = [_op_times(con, rid, warmup) for warmup in (0, 1)]
        con.execute("CREATE TEMP TABLE op_totals AS SELECT * FROM op_totals LIMIT 0")
        assert con.execute("SELECT count(*) FROM op_totals").fetchall() == [(0,)]  # shadowed
        scanned = [_op_times(con, rid, warmup) for warmup in (0, 1)]
    assert derived == scanned and derived[0] and derived[0] != derived[1]


def test_op_totals_hold_sums_past_int64(tmp_path: Path) -> None:
    """Four ranks of one operator 2.8e18 ns long in one step (the ingest accepts durations up
    to 2^62 ns): their sum passes 2^63, and a BIGINT op_totals failed the run's whole parts
    component (found by a review)."""
    from tracelab.testing.synth import RankTrace, write_ranks

    d = 2_800_000_000_000_000_000
    traces = []
    for r in range(4):
        t = RankTrace(r, 4, backend="gloo", device=None)
        t.step(1, 0, d)
        t.cpu_op("aten::big", 0, d - 1000)
        traces.append(t)
    db = tmp_path / "s.duckdb"
    ingest(write_ranks(tmp_path / "traces", traces), db=db, run="big")
    with open_store(db, read_only=True) as con:
        assert con.execute("SELECT * FROM derived_errors").fetchall() == []
        assert con.execute("SELECT count(*) FROM step_parts").fetchall() == [(4,)]
        assert con.execute(
            "SELECT dur_ns, calls FROM op_totals WHERE name = 'aten::big'"
        ).fetchall() == [(4 * (d - 1000), 4)]
