"""Traces without rank metadata: a lone one is rank 0 of 1 (the AMD MI250 trace, a CPU
torch.profiler trace, one tensorboard_trace_handler worker's windows); several need a mapping,
and the error gives the command that maps them."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tracelab.cli import main
from tracelab.errors import RankConflictError
from tracelab.ingest import ingest
from tracelab.ingest.discover import tensorboard_name
from tracelab.store import open_store

from .kineto import trace, write

AMD = "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"


def _ranks(db: Path, run: str) -> list[tuple[int, int | None]]:
    with open_store(db) as con:
        return con.execute(
            "SELECT k.rank, k.world_size FROM ranks k JOIN runs r USING (run_id) WHERE r.name = ? "
            "ORDER BY k.rank",
            [run],
        ).fetchall()


def test_the_amd_trace_alone_is_rank_0_of_1(
    hta_traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.duckdb"
    path = hta_traces / AMD
    assert main(["ingest", str(path), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "1 rank (0) of 1" in out
    assert f"note: {path} has no rank metadata (no distributedInfo): ingested as rank 0 of 1" in out
    assert _ranks(db, "mi250_minitoy_train_ROCm6_2_kineto") == [(0, 1)]
    with open_store(db) as con:
        assert con.execute("SELECT world_size, rank_count FROM runs").fetchone() == (1, 1)
    # The folder that holds it: the same, named after the folder.
    report = ingest([path.parent], db=db, progress=False)
    assert report.run == "amd_trace" and report.ranks == [0] and report.world_size == 1
    assert report.notes and "rank 0 of 1" in report.notes[0]


def _torch_profile(steps: int, **kw: object) -> None:
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Linear(16, 16)
    with profile(activities=[ProfilerActivity.CPU], **kw) as prof:  # type: ignore[arg-type]
        for _ in range(steps):
            model(torch.randn(4, 16)).sum().backward()
            prof.step()
    return prof  # type: ignore[return-value]


def test_a_plain_cpu_torch_profiler_trace_is_rank_0_of_1(tmp_path: Path) -> None:
    prof = _torch_profile(2)
    path = tmp_path / "plain_trace.json"
    prof.export_chrome_trace(str(path))
    report = ingest([path], db=tmp_path / "s.duckdb", progress=False)
    assert report.run == "plain_trace" and report.ranks == [0] and report.world_size == 1
    assert report.events > 0 and "rank 0 of 1" in report.notes[0]


def test_one_tensorboard_workers_windows_are_one_rank_in_time_order(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.profiler import schedule, tensorboard_trace_handler

    out = tmp_path / "tb"
    _torch_profile(
        6,
        schedule=schedule(wait=0, warmup=1, active=2, repeat=2),
        on_trace_ready=tensorboard_trace_handler(str(out)),
    )
    files = sorted(out.iterdir())
    assert len(files) == 2 and all(tensorboard_name(f) for f in files)
    worker = tensorboard_name(files[0])[0]  # type: ignore[index]
    db = tmp_path / "s.duckdb"
    report = ingest([out], db=db, progress=False)
    assert report.ranks == [0] and report.world_size == 1
    assert f"the 2 windows of worker {worker} have no rank metadata" in report.notes[0]
    single = ingest([files[0]], db=db, progress=False)
    assert single.run == worker  # host_pid, not host_pid.<time>.pt.trace
    with open_store(db) as con:
        steps = [
            s
            for (s,) in con.execute(
                "SELECT DISTINCT step FROM steps JOIN runs USING (run_id) WHERE name = 'tb' "
                "ORDER BY step"
            ).fetchall()
        ]
    assert steps == sorted(steps) and len(steps) == 4
    del torch


def test_tensorboard_names() -> None:
    assert tensorboard_name(Path("vm_8976.1796308723015068791.pt.trace.json")) == (
        "vm_8976",
        1796308723015068791,
    )
    assert tensorboard_name(Path("host.a_12.17.pt.trace.json.gz")) == ("host.a_12", 17)
    assert tensorboard_name(Path("rank-0.json")) is None
    assert tensorboard_name(Path("x.pt.trace.json")) is None


def test_several_rankless_traces_need_the_mapping_the_error_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "job"
    write(folder / "host_11.100.pt.trace.json", trace(rank=None))
    write(folder / "host_11.200.pt.trace.json", trace(rank=None))
    write(folder / "host_22.150.pt.trace.json.gz", trace(rank=None))
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "s.duckdb"
    with pytest.raises(RankConflictError) as err:
        ingest(["job"], db=db, progress=False)
    text = str(err.value)
    assert "3 traces have no rank" in text and "bad" not in text
    command = text.split("e.g.: ")[1].split(" (numbered")[0]
    assert command == "tracelab ingest job --rank host_11=0 --rank host_22=1"
    assert not db.exists()
    assert main([*shlex.split(command)[1:], "--db", str(db)]) == 0
    assert "2 ranks (0..1)" in capsys.readouterr().out
    assert _ranks(db, "job") == [(0, None), (1, None)]  # the world size is not known


def test_a_rankless_trace_beside_ranked_ones_is_not_guessed(tmp_path: Path) -> None:
    folder = tmp_path / "mixed"
    write(folder / "rank-0.json", trace(rank=0, world=2))
    write(folder / "rank-1.json", trace(rank=1, world=2))
    write(folder / "extra.json", trace(rank=None))
    with pytest.raises(RankConflictError, match="--rank extra.json=2"):
        ingest([folder], db=tmp_path / "s.duckdb", progress=False)
    report = ingest([folder], db=tmp_path / "s.duckdb", skip_bad=True, progress=False)
    assert report.ranks == [0, 1] and report.skipped[0]["file"].endswith("extra.json")


def test_traces_that_disagree_on_the_job_size_are_not_one_run(tmp_path: Path) -> None:
    # rank 0 of 2 and rank 1 of 8 were merged as "2 ranks of 8".
    folder = tmp_path / "t"
    write(folder / "rank-0.json", trace(rank=0, world=2))
    write(folder / "rank-1.json", trace(rank=1, world=8))
    write(folder / "rank-2.json", trace(rank=2, world=8))
    db = tmp_path / "s.duckdb"
    with pytest.raises(RankConflictError, match="its job has 2 ranks, but 2 of the others say 8"):
        ingest([folder], db=db, run="a", progress=False)
    report = ingest([folder], db=db, run="a", skip_bad=True, progress=False)
    assert report.ranks == [1, 2] and report.world_size == 8
    assert [s["file"] for s in report.skipped] == [str(folder / "rank-0.json")]
