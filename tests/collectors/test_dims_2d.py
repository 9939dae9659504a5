"""A real 2-D FSDP x TP job (2x2 DeviceMesh: dp_shard=2 via fully_shard, tp=2 via
parallelize_module; 4 ranks, gloo, 6 steps) and what tracelab makes of its process groups.

The plain capture is torch.profiler alone, no tracelab code in the job: the `gloo:*` spans name
no group, so tracelab infers which group each collective ran on, and (with the trace's
pg_config removed, as older PyTorch writes it) the groups themselves and their dimensions from
the collectives' pattern. The oracles are the mesh's own groups: tp = {0,1},{2,3} and
dp_shard = {0,2},{1,3} (init_device_mesh's row-major layout), and causality: no rank's
collective ends before its group's last rank arrived (clock_offsets.causality_violations),
which matching across groups breaks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.collectors.conftest import SCRIPTS, free_port
from tracelab.analyzers import run as run_analyzers
from tracelab.ingest import ingest
from tracelab.store import open_store, resolve_run

pytestmark = pytest.mark.torchrun

SCRIPT = SCRIPTS / "fsdp_tp_2d.py"
TP = {(0, 1), (2, 3)}
DP_SHARD = {(0, 2), (1, 3)}


def _torchrun_standalone(out: Path, *args: str) -> None:
    """`torchrun --standalone --nproc-per-node 4` on CPU, OMP_NUM_THREADS=1."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "4", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", str(SCRIPT), "--out", str(out),
           *args]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    if proc.returncode != 0:
        pytest.fail(f"{SCRIPT.name} failed ({proc.returncode}):\n{proc.stderr[-6000:]}")


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("plain2d") / "traces"
    _torchrun_standalone(out)
    return out


@pytest.fixture(scope="module")
def bare(plain: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plain traces without distributedInfo.pg_config: no group anywhere."""
    out = tmp_path_factory.mktemp("bare2d")
    for path in sorted(plain.glob("rank-*.json")):
        doc = json.loads(path.read_text())
        doc["distributedInfo"].pop("pg_config", None)
        doc["distributedInfo"].pop("pg_count", None)
        (out / path.name).write_text(json.dumps(doc))
    return out


def _ingest(paths: list[Path], db: Path, run: str, **kw: Any) -> None:
    ingest(paths, db=db, run=run, workers=1, progress=False, **kw)


def _groups(db: Path, run: str) -> dict[tuple[int, ...], tuple[str, str | None, str]]:
    with open_store(db) as con:
        rid, _ = resolve_run(con, run)
        rows = con.execute(
            "SELECT ranks, dim, source, members_from FROM process_groups WHERE run_id = $r",
            {"r": rid},
        ).fetchall()
    return {tuple(r): (d, s, m) for r, d, s, m in rows}


def _violations(db: Path, run: str) -> int:
    with open_store(db) as con:
        rid, _ = resolve_run(con, run)
        return int(
            con.execute(
                "SELECT sum(causality_violations) FROM clock_offsets WHERE run_id = $r",
                {"r": rid},
            ).fetchall()[0][0]
        )


def _naive_violations(db: Path, run: str) -> int:
    """Matches that fail to overlap when every rank's n-th collective of an op in a step is
    matched with every other rank's (no group: tracelab's matching before groups)."""
    with open_store(db) as con:
        rid, _ = resolve_run(con, run)
        return int(
            con.execute(
                """
                WITH k AS (SELECT rank, op, step, start_ns, end_ns,
                                  row_number() OVER (PARTITION BY rank, op, step
                                                     ORDER BY start_ns) AS occ
                           FROM collectives WHERE run_id = $r AND source = 'host')
                SELECT count(*) FROM (
                    SELECT op, step, occ, max(start_ns) AS last, min(end_ns) AS first_end
                    FROM k GROUP BY ALL) WHERE first_end + 1000 < last
                """,
                {"r": rid},
            ).fetchall()[0][0]
        )


def _check_split(db: Path, run: str) -> dict[str, Any]:
    """The parts add up to the step; per (rank, step, part) the dims' rows add up to the part;
    the breakdown's per-dim shares add up to its transfer and wait shares."""
    with open_store(db) as con:
        rid, _ = resolve_run(con, run)
        p = {"r": rid}
        (bad_steps,) = con.execute(
            "SELECT count(*) FROM step_parts WHERE run_id = $r AND compute_ns + transfer_ns "
            "+ memcpy_ns + wait_ns + bubble_ns + stall_ns + host_ns + idle_ns <> step_ns",
            p,
        ).fetchall()[0]
        assert bad_steps == 0
        (diff,) = con.execute(
            """
            WITH a AS (SELECT rank, step, part, sum(exposed_ns) AS e FROM comm_attribution
                       WHERE run_id = $r AND part IN ('transfer', 'wait') GROUP BY ALL)
            SELECT max(abs(e - CASE part WHEN 'transfer' THEN s.transfer_ns
                                         ELSE s.wait_ns END))
            FROM a JOIN step_parts s ON s.run_id = $r AND s.rank = a.rank AND s.step = a.step
            """,
            p,
        ).fetchall()[0]
        assert diff == 0
        res = run_analyzers(con, rid, on_error="raise")
    brk = res.get("breakdown")
    assert brk is not None
    m = brk.metrics
    dims = {x["dim"] for x in brk.tables["by_dim"]}
    assert sum(m[f"transfer_share[{d}]"] for d in dims) == pytest.approx(m["transfer_share"])
    assert sum(m[f"wait_share[{d}]"] for d in dims) == pytest.approx(m["wait_share"])
    return {"dims": dims, "metrics": m, "findings": res.findings}


def test_plain_capture_groups_from_the_trace(plain: Path, tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    _ingest([plain], db, "plain")
    got = _groups(db, "plain")
    assert {g for g, (d, _, _) in got.items() if d == "tp"} == TP
    assert {g for g, (d, _, _) in got.items() if d == "dp_shard"} == DP_SHARD
    # DeviceMesh names its groups mesh_tp / mesh_dp_shard in pg_config.
    assert {got[g][1] for g in TP | DP_SHARD} == {"trace"}
    naive = _naive_violations(db, "plain")
    print(f"causality violations: {naive} matching across groups, 0 within")
    assert _violations(db, "plain") == 0
    split = _check_split(db, "plain")
    assert {"tp", "dp_shard"} <= split["dims"]
    exposed = [f for f in split["findings"] if f.code == "EXPOSED_COMM"]
    for f in exposed:
        assert f.evidence.numbers["dim"] in ("tp", "dp_shard")


def test_plain_capture_without_groups_is_inferred(bare: Path, tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    _ingest([bare], db, "bare")
    got = _groups(db, "bare")
    assert set(got) == TP | DP_SHARD
    for g in TP:
        assert got[g] == ("tp", "inferred", "inferred")
    for g in DP_SHARD:
        assert got[g] == ("dp_shard", "inferred", "inferred")
    assert _violations(db, "bare") == 0
    split = _check_split(db, "bare")
    assert {"tp", "dp_shard"} <= split["dims"]


def test_mesh_at_ingest_names_the_dimensions(bare: Path, tmp_path: Path) -> None:
    """--mesh states the layout; its dims win over the inferred pattern, a wrong one is
    flagged in the evidence."""
    db = tmp_path / "s.duckdb"
    _ingest([bare], db, "mesh", mesh={"names": ["dp_shard", "tp"], "shape": [2, 2]})
    got = _groups(db, "mesh")
    assert {g for g, v in got.items() if v[:2] == ("tp", "mesh")} == TP
    assert {g for g, v in got.items() if v[:2] == ("dp_shard", "mesh")} == DP_SHARD
    assert _violations(db, "mesh") == 0
    with open_store(db) as con:
        (meta,) = con.execute("SELECT metadata FROM runs WHERE name = 'mesh'").fetchall()[0]
    assert json.loads(meta)["mesh"] == {"names": ["dp_shard", "tp"], "shape": [2, 2]}
    _ingest([bare], db, "swapped", mesh={"names": ["tp", "dp_shard"], "shape": [2, 2]})
    with open_store(db) as con:
        rid, _ = resolve_run(con, "swapped")
        ev = con.execute(
            "SELECT evidence FROM process_groups WHERE run_id = $r AND ranks = [0, 2]",
            {"r": rid},
        ).fetchall()[0][0]
    assert "but its collectives look like dp_shard" in ev


def test_collector_records_the_mesh(tmp_path: Path) -> None:
    out = tmp_path / "capture"
    _torchrun_standalone(out, "--collector")
    manifest = json.loads((out / "manifest.json").read_text())
    mesh = manifest["parallelism"]["mesh"]
    assert mesh == {"names": ["dp_shard", "tp"], "shape": [2, 2], "ranks": [[0, 1], [2, 3]]}
    db = tmp_path / "s.duckdb"
    _ingest([out], db, "col")
    got = _groups(db, "col")
    assert {g for g, v in got.items() if v[:2] == ("tp", "collector")} == TP
    assert {g for g, v in got.items() if v[:2] == ("dp_shard", "collector")} == DP_SHARD
    assert _violations(db, "col") == 0
    _check_split(db, "col")


def test_one_value_per_dimension_on_every_surface(bare: Path, tmp_path: Path) -> None:
    """The breakdown, the report's metrics and the Overview's table give one value per
    dimension."""
    from tracelab.report.metrics import extract
    from tracelab.report.thresholds import ReportSettings
    from tracelab.views.analysis import analyze_run
    from tracelab.views.overview import dim_split

    db = tmp_path / "s.duckdb"
    _ingest([bare], db, "surfaces")
    with open_store(db) as con:
        rid, _ = resolve_run(con, "surfaces")
        analysis = analyze_run(con, rid)
        report = extract(con, rid, ReportSettings())
        rows = {r.dim: r for r in dim_split(con, rid, analysis)}
    brk = analysis.get("breakdown")
    assert brk is not None
    assert {"tp", "dp_shard"} <= set(rows)
    for dim, row in rows.items():
        assert row.transfer_share == pytest.approx(brk.metrics[f"transfer_share[{dim}]"])
        assert row.wait_share == pytest.approx(brk.metrics[f"wait_share[{dim}]"])
        assert report.values[f"dim_comm_share[{dim}]"].value == pytest.approx(
            brk.metrics[f"dim_comm_share_median[{dim}]"]
        )
    assert rows["tp"].label == "tensor parallel (tp)" and rows["tp"].sources == ["inferred"]
    # Groups the trace does not name are shown by their ranks.
    assert sorted(rows["tp"].group_labels) == [
        "unnamed group (ranks 0, 1)",
        "unnamed group (ranks 2, 3)",
    ]
