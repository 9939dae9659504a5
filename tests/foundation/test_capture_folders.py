"""A folder of capture folders (`tracelab ingest sample_traces`) ingests as one run per capture,
named after its folder; where that cannot work, the error says what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracelab.cli import main
from tracelab.errors import InputError
from tracelab.ingest import ingest
from tracelab.ingest.discover import capture_runs
from tracelab.store import list_runs, open_store
from tracelab.testing.synth import build_run

from .kineto import trace, write

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def captures(tmp_path: Path) -> Path:
    folder = tmp_path / "captures"
    build_run(folder, "stragglers", capture=True)
    build_run(folder / "nested", "pipeline", capture=True)
    return folder


def test_a_folder_of_captures_is_one_run_each(
    captures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert [name for name, _ in capture_runs([captures]) or []] == [
        "pipeline_1f1b_p4_m8_nccl",
        "stragglers_nccl",
    ]
    db = tmp_path / "s.duckdb"
    assert main(["ingest", str(captures), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "2 capture folders: one run each" in out and "bad" not in out
    with open_store(db) as con:
        runs = {r["name"]: r["ranks"] for r in list_runs(con)}
    assert runs == {"stragglers_nccl": 4, "pipeline_1f1b_p4_m8_nccl": 4}
    assert main(["ingest", str(captures), "--db", str(db)]) == 0  # again: nothing to do
    assert capsys.readouterr().out.count("nothing to do") == 2


def test_run_with_several_captures_says_what_to_do(
    captures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ingest", str(captures), "--db", str(tmp_path / "s.duckdb"), "--run", "x"]) == 2
    err = capsys.readouterr().err
    assert "holds 2 capture folders" in err and "Drop --run" in err
    assert f"tracelab ingest {captures / 'nested' / 'pipeline_1f1b_p4_m8_nccl'} --run x" in err
    # The library takes one run per call, and says so.
    with pytest.raises(InputError, match=r"capture_runs\(\)"):
        ingest([captures], db=tmp_path / "s.duckdb", progress=False)


def test_captures_beside_loose_traces_are_named(captures: Path, tmp_path: Path) -> None:
    loose = write(captures / "stray" / "rank-0.json", trace(rank=0))
    assert capture_runs([captures]) is None
    with pytest.raises(InputError) as err:
        ingest([captures], db=tmp_path / "s.duckdb", progress=False)
    assert "Ingest the loose traces apart from the captures" in str(err.value)
    assert str(loose) in str(err.value)


def test_the_sample_traces_folder_is_a_folder_of_captures() -> None:
    samples = REPO / "sample_traces"
    found = capture_runs([samples]) or []
    assert sorted(name for name, _ in found) == sorted(
        p.parent.name for p in samples.glob("*/manifest.json")
    )
    assert len(found) >= 8
