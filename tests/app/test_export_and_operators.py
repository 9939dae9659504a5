"""`tracelab export --format perfetto` (one aligned multi-rank Chrome trace) and the operators
and kernels view, on the app test store."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tracelab.store import open_store, run_id
from tracelab.views.operators import TOP_ROWS, operators_view


def test_perfetto_export_is_one_aligned_trace(app_store: Path, tmp_path: Path) -> None:
    """On a run whose ranks' clocks differ (the collector measured the offsets)."""
    with open_store(app_store, read_only=True) as con:
        found = con.execute(
            "SELECT r.name FROM runs r JOIN clock_offsets o USING (run_id) WHERE o.offset_ns <> 0 "
            "AND r.rank_count = 4 ORDER BY r.run_id LIMIT 1"
        ).fetchone()
    if found is None:
        pytest.skip("no 4-rank run with clock offsets in the store (sample_traces/ missing?)")
    run = str(found[0])
    out = tmp_path / "run.json.gz"
    cmd = [
        sys.executable,
        "-m",
        "tracelab.cli",
        "export",
        "--db",
        str(app_store),
        "--run",
        run,
        "--format",
        "perfetto",
        "--out",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    doc = json.loads(gzip.decompress(out.read_bytes()))
    events = doc["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert sorted(procs) == [0, 1, 2, 3]
    with open_store(app_store, read_only=True) as con:
        rid = run_id(con, run)
        offsets = dict(
            con.execute(
                "SELECT rank, offset_ns FROM clock_offsets WHERE run_id = ?", [rid]
            ).fetchall()
        )
        rows = con.execute(
            "SELECT rank, name, ts_ns FROM events WHERE run_id = ? AND category = 'communication'",
            [rid],
        ).fetchall()
        count = con.execute("SELECT count(*) FROM events WHERE run_id = ?", [rid]).fetchone()[0]
        parts = con.execute("SELECT count(*) FROM time_parts WHERE run_id = ?", [rid]).fetchone()[0]
    origin = doc["otherData"]["origin_ns"]
    xs = [e for e in events if e.get("ph") == "X"]
    assert len(xs) == count + parts
    # Every rank's events are on the reference clock: its offset removed.
    by_key = {(e["pid"], e["name"], e["ts"]) for e in xs}
    for rank, name, ts in rows:
        want = round((ts - offsets.get(rank, 0) - origin) / 1000.0, 3)
        assert (rank, name, want) in by_key
    # The run's first event is at 0; the lost-time track is there for every rank.
    assert min(e["ts"] for e in xs) == pytest.approx(0.0, abs=1e-3)
    assert {e["pid"] for e in xs if e["cat"] == "tracelab.lost_time"} == {0, 1, 2, 3}
    # An existing file is not overwritten without --overwrite (exit 2, a usage error).
    again = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert again.returncode == 2 and "--overwrite" in again.stderr


def test_operators_view_is_bounded_and_adds_up(app_store: Path) -> None:
    with open_store(app_store, read_only=True) as con:
        rid = run_id(con, "stragglers")
        v = operators_view(con, rid)
        steady = con.execute(
            "SELECT count(DISTINCT step), sum(dur_ns) FROM step_spans WHERE run_id = ? AND steady",
            [rid],
        ).fetchone()
        kernels = con.execute(
            "SELECT count(*), sum(e.dur_ns) FROM events e JOIN step_spans s USING (run_id, rank, step) "
            "WHERE e.run_id = ? AND s.steady AND e.on_device AND e.category IN "
            "('compute', 'communication', 'memcpy', 'memset')",
            [rid],
        ).fetchone()
        one = operators_view(con, rid, ranks=(2,), steps=(2,))
        tiny = operators_view(con, rid, limit=1)
    assert v.ranks == 4 and len(v.steps) == steady[0] and v.step_ns == steady[1]
    assert sum(k["n"] for k in v.kernels) == kernels[0]
    assert sum(k["total_ns"] for k in v.kernels) == kernels[1]
    assert len(v.operators) <= TOP_ROWS and len(tiny.kernels) == 1 and len(tiny.operators) <= 1
    assert one.ranks == 1 and one.steps == [2]
    assert all(0 <= k["share"] <= 1 for k in v.kernels)
