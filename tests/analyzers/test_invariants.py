"""Invariants of the lost-time model on every trace the suite holds that was not constructed for
it: the sample captures, the shared HTA traces (GPU, AMD, CPU-only, Triton, critical-path) and
the constructed scenarios. (tests/diagnosis checks the same on the plain torch.profiler
captures.)

- per rank and step, the parts add up to the step exactly;
- the time_parts segments tile each step: no overlap, no gap;
- the findings' impacts add up to at most the mean steady step;
- one metric has one value: the steps analyzer's step time is the budget's, and every surface
  that prints it (analyze text, report) derives it from the same rows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tracelab.analyzers import run
from tracelab.ingest import ingest
from tracelab.store import open_store, resolve_run
from tracelab.testing.synth import build_run

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("compute", "transfer", "memcpy", "wait", "bubble", "stall", "host", "idle")
#: Shared HTA traces, each one run (folders with several ranks' files are one run).
HTA = [
    "df_index_resolver",
    "nccl_parser_config",
    "trace_diff/control",
    "trace_diff/test",
    "ns_resolution_trace",
    "negative_queue_length_values_check",
    "trace_filter",
    "amd_trace",
    "cpu_only",
    "triton_example",
    "critical_path/alexnet",
    "critical_path/simple_add",
    "critical_path/cuda_event_sync",
]
SYNTH = [
    ("overlap", {}),
    ("stragglers", {}),
    ("whatif", {}),
    ("bandwidth", {}),
    ("clock_offset", {}),
    ("pipeline", {"schedule": "interleaved_1f1b", "v": 2}),
    ("pipeline", {"schedule": "1f1b", "slow_stage": 2, "slow_factor": 1.5, "stall_ms": 3}),
]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, hta_traces: Path) -> tuple[Path, list[str]]:
    tmp = tmp_path_factory.mktemp("invariants")
    db = tmp / "store.duckdb"
    names = []
    for folder in sorted(
        p for p in (ROOT / "sample_traces").iterdir() if (p / "manifest.json").is_file()
    ):
        ingest([folder], db=db, run=folder.name, workers=1, progress=False)
        names.append(folder.name)
    for name in HTA:
        files = sorted((hta_traces / name).rglob("*.json.gz"))
        if not files:
            continue
        run_name = "hta-" + name.replace("/", "-")
        ingest(files, db=db, run=run_name, workers=1, progress=False)
        names.append(run_name)
    for i, (scenario, params) in enumerate(SYNTH):
        r = build_run(tmp / f"synth{i}", scenario, **params)
        ingest(r.paths, db=db, run=f"synth{i}-{r.name}", workers=1, progress=False)
        names.append(f"synth{i}-{r.name}")
    return db, names


def test_parts_add_up_and_tile_every_step(store: tuple[Path, list[str]]) -> None:
    db, names = store
    with open_store(db) as con:
        bad = con.execute(f"""
            SELECT r.name, p.rank, p.step, p.step_ns, {" + ".join(f"p.{x}_ns" for x in PARTS)}
            FROM step_parts p JOIN runs r USING (run_id)
            WHERE {" + ".join(f"p.{x}_ns" for x in PARTS)} <> p.step_ns
               OR least({", ".join(f"p.{x}_ns" for x in PARTS)}) < 0""").fetchall()
        assert not bad, bad[:5]
        # Segments tile their step: sorted by start, each starts where the previous ended.
        gaps = con.execute("""
            WITH t AS (SELECT run_id, rank, step, start_ns, end_ns,
                              lag(end_ns) OVER (PARTITION BY run_id, rank, step
                                                ORDER BY start_ns) AS prev
                       FROM time_parts)
            SELECT count(*) FROM t WHERE prev IS NOT NULL AND prev <> start_ns""").fetchall()
        assert gaps[0][0] == 0
        covered = con.execute("""
            SELECT count(*) FROM step_spans s
            JOIN (SELECT run_id, rank, step, min(start_ns) AS a, max(end_ns) AS b,
                         sum(end_ns - start_ns) AS n FROM time_parts GROUP BY ALL) t
              USING (run_id, rank, step)
            WHERE t.a <> s.start_ns OR t.b <> s.end_ns OR t.n <> s.dur_ns""").fetchall()
        assert covered[0][0] == 0
        derived = {
            r
            for (r,) in con.execute(
                "SELECT DISTINCT r.name FROM step_parts JOIN runs r USING (run_id)"
            ).fetchall()
        }
    assert set(names) <= derived | {n for n in names if n.startswith("hta-memory")}


def test_impacts_add_up_to_at_most_the_step(store: tuple[Path, list[str]]) -> None:
    db, names = store
    with open_store(db) as con:
        for name in names:
            rid, _ = resolve_run(con, name)
            analysis = run(con, rid)
            assert not analysis.errors, (name, analysis.errors)
            bud = analysis.budget
            assert bud is not None, name
            assert sum(bud.parts.values()) == pytest.approx(bud.step_ns, rel=1e-9), name
            impacts = [
                f.impact_ns_per_step for f in analysis.findings if f.impact_ns_per_step is not None
            ]
            assert sum(impacts) <= bud.step_ns * (1 + 1e-9), (name, impacts, bud.step_ns)
            assert impacts == sorted(impacts, reverse=True), name
            steps = analysis.get("steps")
            assert steps is not None
            assert steps.metrics["step_ns"] == pytest.approx(bud.step_ns), name
            for f in analysis.findings:
                assert "{impact" not in f.title + f.suggestion, (name, f.code)
                for text in [f.title, f.suggestion, *map(str, f.evidence.numbers.values())]:
                    assert "None" not in text and "group ?" not in text, (name, f.code, text)
