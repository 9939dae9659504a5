"""A collective with no step still gets one, so it is matched and its straggler named (issue 21
§3): a trace with no ProfilerStep is one step (step 0), and its collectives are in it."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tracelab.analyzers import run
from tracelab.ingest import ingest
from tracelab.store import open_store, resolve_run
from tracelab.testing.synth import build_run


def _without_steps(
    paths: Iterable[str | Path], out: Path, ranks: set[int] | None = None
) -> list[Path]:
    """The traces copied into `out`, those of `ranks` (default all) without ProfilerStep spans."""
    out.mkdir()
    for p in paths:
        d = json.loads(Path(p).read_text())
        if ranks is None or int(Path(p).name.split(".")[0].removeprefix("rank-")) in ranks:
            d["traceEvents"] = [
                e for e in d["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep")
            ]
        (out / Path(p).name).write_text(json.dumps(d))
    return sorted(out.glob("rank-*.json"))


def test_trace_without_profiler_step_names_the_straggler(tmp_path: Path) -> None:
    r = build_run(tmp_path / "synth", "stragglers")  # rank 2 computes longer every step
    db = tmp_path / "s.duckdb"
    traces = _without_steps(r.paths, tmp_path / "nostep")
    ingest(traces, db=db, run="nostep", workers=1, progress=False)
    with open_store(db) as con:
        rid, _ = resolve_run(con, "nostep")
        n, stepped = con.execute(
            "SELECT count(*), count(step) FROM matched_collectives WHERE run_id = ?", [rid]
        ).fetchone() or (0, 0)
        assert n > 0 and stepped == n  # before: every matched collective had step NULL
        findings = run(con, rid).findings
        strag = [f for f in findings if f.code.startswith("STRAGGLER")]
        assert strag, [f.code for f in findings]
        assert "Rank 2" in strag[0].title


def test_a_rank_without_steps_beside_ranks_with_them_is_one_step_over_its_trace(
    tmp_path: Path,
) -> None:
    """step_spans takes the whole-trace bounds of the ranks tracelab.derived.steps names as
    stepless: the rank without ProfilerStep spans is one step over its whole trace, the others
    keep theirs."""
    r = build_run(tmp_path / "synth", "stragglers")
    db = tmp_path / "s.duckdb"
    traces = _without_steps(r.paths, tmp_path / "mixed", ranks={1})
    ingest(traces, db=db, run="mixed", workers=1, progress=False)
    with open_store(db) as con:
        rid, _ = resolve_run(con, "mixed")
        spans = con.execute(
            "SELECT rank, source, count(*), min(host_start_ns), max(host_end_ns) "
            "FROM step_spans WHERE run_id = ? GROUP BY ALL ORDER BY rank",
            [rid],
        ).fetchall()
        bounds = con.execute(
            "SELECT min(ts_ns), max(ts_ns + dur_ns) FROM events WHERE run_id = ? AND rank = 1",
            [rid],
        ).fetchone()
    by_rank = {rank: (source, n, lo, hi) for rank, source, n, lo, hi in spans}
    assert len(by_rank) == len(r.paths) > 2
    assert by_rank[1] == ("whole_trace", 1, *bounds)
    assert all(s == "profiler_step" and n > 1 for k, (s, n, _, _) in by_rank.items() if k != 1)
