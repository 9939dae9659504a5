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
    rc, doc = _json(
        capsys, ["analyze", "--db", str(db), "--run", "ddp_slow_rank", "--format", "json"]
    )
    assert rc == 0
    step_ns = doc["lost_time"]["step_ns"]
    assert doc["analyzers"]["steps"]["metrics"]["step_ns"] == pytest.approx(step_ns)
    assert doc["analyzers"]["breakdown"]["metrics"]["step_ns_mean"] == pytest.approx(step_ns)
    with open_store(db) as con:
        (table_ns,) = con.execute(
            "SELECT avg(j.dur_ns) FROM job_steps j JOIN runs r USING (run_id) "
            "WHERE r.name = 'ddp_slow_rank' AND j.ordinal >= 1"
        ).fetchall()[0]
        wait_share = con.execute(
            "SELECT sum(wait_ns) / sum(step_ns) FROM step_parts JOIN runs r USING (run_id) "
            "WHERE r.name = 'ddp_slow_rank' AND ordinal >= 1"
        ).fetchall()[0][0]
    assert table_ns == pytest.approx(step_ns)
    assert doc["analyzers"]["breakdown"]["metrics"]["wait_share"] == pytest.approx(wait_share)

    assert main(["analyze", "--db", str(db), "--run", "ddp_slow_rank"]) == 0
    text = capsys.readouterr().out
    assert f"step {duration(step_ns)}" in text

    rc, rep = _json(
        capsys,
        [
            "report",
            "--db",
            str(db),
            "--baseline",
            "ddp",
            "--candidate",
            "ddp_slow_rank",
            "--format",
            "json",
            "--min-steps",
            "5",
        ],
    )
    assert rc in (0, 1) and rep["errors"] == {}
    # The report gates on per-step medians: the same median step as analyze's.
    row = next(m for m in rep["metrics"] if m["key"] == "step_time")
    assert row["candidate"] == pytest.approx(
        doc["analyzers"]["steps"]["metrics"]["step_ns_median"] / 1e6
    )
    with open_store(db) as con:
        median_wait = con.execute(
            "SELECT median(s) FROM (SELECT sum(wait_ns) / sum(step_ns) AS s FROM step_parts "
            "JOIN runs r USING (run_id) WHERE r.name = 'ddp_slow_rank' AND ordinal >= 1 "
            "GROUP BY step)"
        ).fetchall()[0][0]
    wait = next(m for m in rep["metrics"] if m["key"] == "straggler_wait")
    assert wait["candidate"] == pytest.approx(median_wait)
    # The report's new findings come in the runner's order.
    order = [f["code"] for f in doc["findings"]]
    new = [f["code"] for f in rep["new_findings"]]
    assert new == [c for c in order if c in new]
    assert new[0] == order[0] == "STRAGGLER_HOST"

    assert main(
        [
            "report",
            "--db",
            str(db),
            "--baseline",
            "ddp",
            "--candidate",
            "ddp_slow_rank",
            "--min-steps",
            "5",
        ]
    ) in (0, 1)
    md = capsys.readouterr().out
    assert "STRAGGLER_HOST" in md or "straggler" in md.lower()


HTA_TRACES = [
    "df_index_resolver",
    "nccl_parser_config",
    "trace_diff/control",
    "ns_resolution_trace",
    "trace_filter",
    "amd_trace",
]
SAMPLE_NAMES = sorted(p.name for p in SAMPLES.iterdir() if (p / "manifest.json").is_file())


@pytest.fixture(scope="module")
def every_db(tmp_path_factory: pytest.TempPathFactory, hta_traces: Path) -> tuple[Path, list]:
    path = tmp_path_factory.mktemp("surfaces-all") / "s.duckdb"
    names = []
    for name in SAMPLE_NAMES:
        ingest([SAMPLES / name], db=path, run=name, workers=1, progress=False)
        names.append(name)
    for name in HTA_TRACES:
        run_name = "hta-" + name.replace("/", "-")
        ingest(
            sorted((hta_traces / name).glob("*.json.gz")),
            db=path,
            run=run_name,
            workers=1,
            progress=False,
        )
        names.append(run_name)
    return path, names


def test_every_trace_one_value_per_metric(every_db, capsys) -> None:
    """For each sample capture and shared HTA trace: the report's figures (medians over the
    steady steps) equal the ones `tracelab analyze` prints for the same definitions."""
    db, names = every_db
    for name in names:
        rc, doc = _json(capsys, ["analyze", "--db", str(db), "--run", name, "--format", "json"])
        assert rc == 0, (name, doc["errors"])
        rc, rep = _json(
            capsys,
            [
                "report",
                "--db",
                str(db),
                "--baseline",
                name,
                "--candidate",
                name,
                "--format",
                "json",
                "--min-steps",
                "2",
            ],
        )
        assert rc == 0 and rep["errors"] == {}, name
        rows = {m["key"]: m for m in rep["metrics"]}
        st = doc["analyzers"]["steps"]["metrics"]
        bd = doc["analyzers"]["breakdown"]["metrics"]
        assert rows["step_time"]["candidate"] == pytest.approx(st["step_ns_median"] / 1e6), name
        assert (
            rows["step_time"]["n_candidate"] == st["steady_steps"] == rep["candidate"]["steps_used"]
        ), name
        for key, metric in (
            ("exposed_comm_share", "exposed_comm_share_median"),
            ("comm_overlap", "overlap_share_median"),
            ("straggler_wait", "wait_share_median"),
        ):
            if key in rows:
                assert rows[key]["candidate"] == pytest.approx(bd[metric]), (name, key)
        pp = doc["analyzers"]["pipeline"]
        for stage in pp["tables"].get("stages", []):
            key = (
                f"bubble_share[stage={stage['stages'][0]}]"
                if len(stage["stages"]) == 1
                else f"bubble_share[rank={stage['rank']}]"
            )
            if key in rows:
                assert rows[key]["candidate"] == pytest.approx(stage["bubble_share_median"]), (
                    name,
                    key,
                )
        mem = doc["analyzers"]["memory"]
        if "peak_memory" in rows:
            assert rows["peak_memory"]["candidate"] == pytest.approx(
                mem["metrics"]["peak_bytes_max"]
            ), name
        for stage in mem["tables"].get("stages", []):
            key = f"peak_memory[stage={stage['stage']}]"
            assert rows[key]["candidate"] == pytest.approx(stage["peak_bytes"]), (name, key)
