"""A folder of capture folders (`tracelab ingest sample_traces`) ingests as one run per capture,
named after its folder; where that cannot work, the error says what to do."""

from __future__ import annotations

import shutil
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


def _copy(sample: str, to: Path) -> Path:
    shutil.copytree(REPO / "sample_traces" / sample, to)
    return to


def _runs(db: Path) -> dict[str, int]:
    with open_store(db) as con:
        return {r["name"]: r["ranks"] for r in list_runs(con)}


def test_two_captures_of_one_name_are_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each would be a run named `exp`: the second replaced the first (--replace), or was
    # refused after the first had landed, with advice (--run) the command refuses.
    folder = tmp_path / "e"
    _copy("ddp", folder / "a" / "exp")
    _copy("ddp_slow_rank", folder / "b" / "exp")
    db = tmp_path / "s.duckdb"
    assert main(["ingest", str(folder), "--db", str(db), "--replace"]) == 3
    err = capsys.readouterr().err
    assert "2 capture folders are named 'exp'" in err and "--run NAME" in err
    assert not db.exists()


def test_a_rank_the_manifest_does_not_list_is_ingested(tmp_path: Path) -> None:
    # Rank 0 died before it wrote its part (and so the manifest): its window was left out
    # without a word, though it is the rank a diagnosis needs.
    capture = _copy("ddp", tmp_path / "ddp")
    (capture / "manifest.json").unlink()
    (capture / "rank-0" / "rank.json").unlink()
    report = ingest([capture], db=tmp_path / "s.duckdb", run="a", progress=False)
    assert report.ranks == [0, 1, 2, 3] and not report.skipped


def test_the_windows_of_a_killed_job_are_each_ranks_windows(tmp_path: Path) -> None:
    # No manifest and no rank.json: rank-N/window-K.pt.trace.json.gz are rank N's windows in
    # order (each rank was "claimed by 2 files", and --rank could not help).
    capture = _copy("ddp", tmp_path / "ddp")
    (capture / "manifest.json").unlink()
    for r in range(4):
        (capture / f"rank-{r}" / "rank.json").unlink()
        shutil.copyfile(
            capture / f"rank-{r}" / "window-0.pt.trace.json.gz",
            capture / f"rank-{r}" / "window-1.pt.trace.json.gz",
        )
    db = tmp_path / "s.duckdb"
    report = ingest([capture], db=db, run="a", progress=False)
    assert report.ranks == [0, 1, 2, 3]
    with open_store(db) as con:
        files = con.execute(
            "SELECT rank, count(*) FROM parquet_files WHERE kind = 'events' GROUP BY rank"
        ).fetchall()
    assert sorted(files) == [(r, 2) for r in range(4)]


def test_a_loose_trace_beside_one_capture_is_refused(tmp_path: Path) -> None:
    capture = _copy("ddp", tmp_path / "f" / "ddp")
    shutil.rmtree(capture / "rank-3")  # another job's rank 3 would have filled the gap
    loose = write(tmp_path / "f" / "other_job" / "rank-3.json", trace(rank=3, world=4))
    with pytest.raises(InputError, match="Ingest the loose traces apart from the capture"):
        ingest([tmp_path / "f"], db=tmp_path / "s.duckdb", progress=False)
    assert not (tmp_path / "s.duckdb").exists() and loose.is_file()


def test_another_tools_manifest_is_not_a_capture(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    for r in range(2):
        write(folder / f"rank-{r}.json", trace(rank=r, world=2))
    write(folder / "web" / "manifest.json", {"name": "app"})
    report = ingest([folder], db=tmp_path / "s.duckdb", run="a", progress=False)
    assert report.ranks == [0, 1] and report.ignored == [str(folder / "web" / "manifest.json")]
