"""`tracelab analyze`: text, Markdown and the documented JSON document, through the real CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tracelab.analyzers import REGISTRY, SCHEMA
from tracelab.cli import main
from tracelab.testing.synth import build_run

from .conftest import store_of

DOC = Path(__file__).resolve().parents[2] / "docs" / "json-schema.md"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("cli")
    run = build_run(tmp, "pipeline", schedule="1f1b", slow_stage=2, slow_factor=1.5, stall_ms=3)
    return store_of(tmp, run)


def test_json_document(store, capsys):
    assert main(["analyze", "--db", str(store), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == SCHEMA == "tracelab.analysis/2"
    assert doc["run"]["ranks"] == 4
    assert list(doc["analyzers"]) == list(REGISTRY)
    assert doc["errors"] == {}
    impacts = [f["impact_ns_per_step"] for f in doc["findings"]]
    known = [i for i in impacts if i is not None]
    assert known == sorted(known, reverse=True)
    assert impacts[: len(known)] == known  # findings without a time cost come last
    lost = doc["lost_time"]
    assert sum(lost["parts_ns"].values()) == pytest.approx(lost["step_ns"])
    assert sum(known) <= lost["step_ns"]
    assert doc["analyzers"]["steps"]["metrics"]["step_ns"] == pytest.approx(lost["step_ns"])
    for f in doc["findings"]:
        assert set(f) == {
            "code",
            "severity",
            "title",
            "evidence",
            "impact_ns_per_step",
            "impact_share",
            "impact_parts",
            "claim",
            "suggestion",
            "analyzer",
            "view",
        }
        assert set(f["evidence"]) == {
            "ranks",
            "affected_ranks",
            "steps",
            "time_ranges_ns",
            "numbers",
        }
        assert "{impact" not in f["title"] + f["suggestion"]
        assert f["severity"] in ("info", "warning", "critical")
        assert f["view"] in ("overview", "timeline", "pipeline", "stragglers", "memory")
        assert f["suggestion"]
    for name, res in doc["analyzers"].items():
        assert set(res) == {"analyzer", "run", "params", "metrics", "tables", "findings", "notes"}
        assert res["params"] == dict(REGISTRY[name].defaults)


def test_every_code_and_metric_is_documented(store, capsys):
    text = DOC.read_text()
    main(["analyze", "--db", str(store), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    for f in doc["findings"]:
        assert f"`{f['code']}`" in text
    for name, res in doc["analyzers"].items():
        section = text.split(f"### `{name}`")[1].split("###")[0]
        for key in res["metrics"]:
            assert f"`{key}" in section or key in section, (name, key)
        for table in res["tables"]:
            assert f"`{table}`" in section, (name, table)


def test_text_and_markdown(store, capsys):
    assert main(["analyze", "--db", str(store)]) == 0
    text = capsys.readouterr().out
    codes = re.findall(r"\] ([A-Z_]+):", text)
    assert codes[0] == "PIPELINE_BUBBLE" and "PIPELINE_STALL" in codes
    assert "PIPELINE METRICS" in text and "fix:" in text
    assert (
        main(["analyze", "--db", str(store), "--format", "markdown", "--only", "pipeline,memory"])
        == 0
    )
    md = capsys.readouterr().out
    assert md.startswith("# tracelab analysis") and "| `PIPELINE_BUBBLE` |" in md
    assert "## memory" in md and "## steps" not in md


def test_usage_errors(store, capsys):
    assert main(["analyze", "--db", str(store), "--run", "nope"]) == 2
    assert "no run named 'nope'" in capsys.readouterr().err
    assert main(["analyze", "--db", str(store), "--only", "bubbles"]) == 2
    assert "unknown analyzer" in capsys.readouterr().err


def test_console_script_runs_in_a_fresh_process(store):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tracelab.cli",
            "analyze",
            "--db",
            str(store),
            "--format",
            "json",
            "--only",
            "steps",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout)["analyzers"]["steps"]["metrics"]["steps"] == 2
