"""One metric, one value, on every surface: `tracelab analyze` (JSON and text), `tracelab
report` (JSON and Markdown) and the derived tables give the same step time, shares and findings
order for one capture, because all of them read the derived layer through one runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracelab.cli import main
from tracelab.ingest import ingest
from tracelab.render.text import duration
from tracelab.store import open_store

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("surfaces") / "s.duckdb"
    for name in ("ddp", "ddp_slow_rank"):
        ingest([SAMPLES / name], db=path, run=name, workers=1, progress=False)
    return path


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict]:
    rc = main(argv)
    return rc, json.loads(capsys.readouterr().out)


def test_step_time_and_findings_agree_everywhere(db: Path, capsys) -> None:
    rc, doc = _json(capsys, ["analyze", "--db", str(db), "--run", "ddp_slow_rank",
                             "--format", "json"])
    assert rc == 0
    step_ns = doc["lost_time"]["step_ns"]
    assert doc["analyzers"]["steps"]["metrics"]["step_ns"] == pytest.approx(step_ns)
    assert doc["analyzers"]["breakdown"]["metrics"]["step_ns_mean"] == pytest.approx(step_ns)
    with open_store(db) as con:
        (table_ns,) = con.execute(
            "SELECT avg(j.dur_ns) FROM job_steps j JOIN runs r USING (run_id) "
            "WHERE r.name = 'ddp_slow_rank' AND j.ordinal >= 1").fetchall()[0]
        wait_share = con.execute(
            "SELECT sum(wait_ns) / sum(step_ns) FROM step_parts JOIN runs r USING (run_id) "
            "WHERE r.name = 'ddp_slow_rank' AND ordinal >= 1").fetchall()[0][0]
    assert table_ns == pytest.approx(step_ns)
    assert doc["analyzers"]["breakdown"]["metrics"]["wait_share"] == pytest.approx(wait_share)

    assert main(["analyze", "--db", str(db), "--run", "ddp_slow_rank"]) == 0
    text = capsys.readouterr().out
    assert f"step {duration(step_ns)}" in text

    rc, rep = _json(capsys, ["report", "--db", str(db), "--baseline", "ddp", "--candidate",
                             "ddp_slow_rank", "--format", "json", "--min-steps", "5"])
    assert rc in (0, 1) and rep["errors"] == {}
    # The report gates on per-step medians: the same median step as analyze's.
    row = next(m for m in rep["metrics"] if m["key"] == "step_time")
    assert row["candidate"] == pytest.approx(
        doc["analyzers"]["steps"]["metrics"]["step_ns_median"] / 1e6)
    with open_store(db) as con:
        median_wait = con.execute(
            "SELECT median(s) FROM (SELECT sum(wait_ns) / sum(step_ns) AS s FROM step_parts "
            "JOIN runs r USING (run_id) WHERE r.name = 'ddp_slow_rank' AND ordinal >= 1 "
            "GROUP BY step)").fetchall()[0][0]
    wait = next(m for m in rep["metrics"] if m["key"] == "straggler_wait")
    assert wait["candidate"] == pytest.approx(median_wait)
    # The report's new findings come in the runner's order.
    order = [f["code"] for f in doc["findings"]]
    new = [f["code"] for f in rep["new_findings"]]
    assert new == [c for c in order if c in new]
    assert new[0] == order[0] == "STRAGGLER_HOST"

    assert main(["report", "--db", str(db), "--baseline", "ddp", "--candidate",
                 "ddp_slow_rank", "--min-steps", "5"]) in (0, 1)
    md = capsys.readouterr().out
    assert "STRAGGLER_HOST" in md or "straggler" in md.lower()
