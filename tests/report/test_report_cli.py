"""`tracelab report` and `tracelab baseline` end to end on synthetic captures (no torch).

Each capture is a 4-rank gloo-shaped run with known timing (conftest.write_training_run), so the
metrics that must move, and the ones that must not, are known in advance.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tracelab.cli import main


def _report(tmp: Path, *args: str) -> tuple[int, dict[str, Any]]:
    out = tmp / "r.json"
    out.unlink(missing_ok=True)
    rc = main(["report", *args, "--format", "json", "--out", str(out)])
    return rc, json.loads(out.read_text()) if out.exists() else {}


def _gated(data: dict[str, Any]) -> dict[str, str]:
    return {m["key"]: m["verdict"] for m in data["metrics"] if m["gated"]}


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory, training_run: Callable[..., Path]
) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    return {
        "base": training_run(root / "base", seed=1),
        "rerun": training_run(root / "rerun", seed=2),
        "slow": training_run(root / "slow", seed=3, compute_slowdown=1.12),
        "comm": training_run(root / "comm", seed=4, exposed_comm_ms=4.0),
        "short": training_run(root / "short", seed=5, steps=6),
        "straggler": training_run(root / "straggler", seed=9, slow_rank=2),
        "gpu": training_run(root / "gpu", seed=6, backend="nccl"),
        "gpu_rerun": training_run(root / "gpu_rerun", seed=7, backend="nccl"),
        "gpu_comm": training_run(root / "gpu_comm", seed=8, backend="nccl", exposed_comm_ms=4.0),
    }


@pytest.fixture(scope="module")
def db(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> str:
    """One store holding every run under its key, for the reports that compare by name."""
    path = str(tmp_path_factory.mktemp("store") / "runs.duckdb")
    for name, folder in runs.items():
        assert main(["ingest", str(folder), "--db", path, "--run", name]) == 0
    return path


def test_aa_rerun_passes(db: str, tmp_path: Path) -> None:
    rc, data = _report(tmp_path, "--baseline", "base", "--candidate", "rerun", "--db", db)
    assert rc == 0, data
    assert data["verdict"] == "pass"
    assert set(_gated(data).values()) == {"pass"}
    assert {"step_time", "exposed_comm_share", "straggler_wait"} <= set(_gated(data))
    # gloo collectives are host-timed: their bandwidth is shown, never gated.
    bw = next(m for m in data["metrics"] if m["key"] == "collective_bandwidth[all_reduce]")
    assert bw["verdict"] == "info" and "host-timed" in bw["reason"]


def test_compute_slowdown_flags_step_time_only(db: str, tmp_path: Path) -> None:
    rc, data = _report(tmp_path, "--baseline", "base", "--candidate", "slow", "--db", db)
    assert rc == 1
    assert data["regressions"] == ["step_time"]
    step = next(m for m in data["metrics"] if m["key"] == "step_time")
    assert 0.08 < step["delta"] < 0.16 and step["p_value"] < 1e-3
    assert step["ci_low"] > 0.05
    ops = {m["label"]: m for m in data["metrics"] if m["metric"] == "op_time"}
    assert ops["op aten::mm"]["delta"] > 0.10  # the op that moved is listed, not gated


def test_exposed_comm_flags_comm_and_step(db: str, tmp_path: Path) -> None:
    rc, data = _report(tmp_path, "--baseline", "base", "--candidate", "comm", "--db", db)
    assert rc == 1
    assert set(data["regressions"]) == {"step_time", "exposed_comm_share"}
    share = next(m for m in data["metrics"] if m["key"] == "exposed_comm_share")
    assert share["delta_kind"] == "points" and share["delta"] > 10


def test_slow_rank_flags_wait_and_reports_the_straggler(db: str, tmp_path: Path) -> None:
    rc, data = _report(tmp_path, "--baseline", "base", "--candidate", "straggler", "--db", db)
    assert rc == 1
    assert set(data["regressions"]) == {"step_time", "exposed_comm_share", "straggler_wait"}
    new = {(f["code"], tuple(f["evidence"]["ranks"])) for f in data["new_findings"]}
    assert ("STRAGGLER_COMPUTE", (2,)) in new


def test_gpu_runs_gate_bandwidth(db: str, tmp_path: Path) -> None:
    rc, data = _report(tmp_path, "--baseline", "gpu", "--candidate", "gpu_rerun", "--db", db)
    assert rc == 0, data["regressions"]
    assert _gated(data)["collective_bandwidth[all_reduce]"] == "pass"
    assert data["verdict"] == "pass"
    ops = [m for m in data["metrics"] if m["metric"] == "op_time"]
    assert {m["label"].split(" ", 1)[0] for m in ops} == {"kernel"}
    rc, data = _report(tmp_path, "--baseline", "gpu", "--candidate", "gpu_comm", "--db", db)
    assert rc == 1
    assert set(data["regressions"]) == {
        "step_time",
        "exposed_comm_share",
        "collective_bandwidth[all_reduce]",
    }
    bw = next(m for m in data["metrics"] if m["key"] == "collective_bandwidth[all_reduce]")
    assert bw["delta"] < -0.4  # 4 ms -> 8 ms per all-reduce: about half the bandwidth


def test_too_few_steps_warns_and_passes(db: str, tmp_path: Path) -> None:
    rc, data = _report(tmp_path, "--baseline", "base", "--candidate", "short", "--db", db)
    assert rc == 0
    assert data["verdict"] == "warn"
    assert _gated(data)["step_time"] == "warn"
    assert any("too few steps" in w for w in data["warnings"])


def test_a_run_no_longer_than_its_warmup_says_every_step_was_kept(db: str, tmp_path: Path) -> None:
    """--warmup-steps 20 on 6- and 10-step runs compared every step, warm-up included, and read
    "0 warm-up dropped" as though nothing had been asked."""
    rc, data = _report(
        tmp_path, "--baseline", "base", "--candidate", "short", "--db", db, "--warmup-steps", "20"
    )
    for side in ("baseline", "candidate"):
        assert data[side]["warmup_kept"] == 20 and data[side]["steps_dropped"] == 0, data[side]
        assert any("warm-up included" in n for n in data[side]["notes"]), data[side]["notes"]
    md = tmp_path / "r.md"
    assert main(
        [
            "report",
            "--baseline",
            "base",
            "--candidate",
            "short",
            "--db",
            db,
            "--warmup-steps",
            "20",
            "--format",
            "markdown",
            "--out",
            str(md),
        ]
    ) in (0, 1)
    assert "not longer than the 20 warm-up steps asked" in md.read_text()
    rc, data = _report(tmp_path, "--baseline", "base", "--candidate", "short", "--db", db)
    assert data["candidate"]["warmup_kept"] == 0


def test_all_formats_to_a_folder(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    rc = main(
        [
            "report",
            "--baseline",
            str(runs["base"]),
            "--candidate",
            str(runs["slow"]),
            "--format",
            "markdown",
            "--format",
            "html",
            "--format",
            "json",
            "--format",
            "junit",
            "--out",
            str(out),
        ]
    )
    assert rc == 1
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "tracelab-report.html",
        "tracelab-report.json",
        "tracelab-report.junit.xml",
        "tracelab-report.md",
    ]
    suite = ET.parse(out / "tracelab-report.junit.xml").getroot().find("testsuite")
    assert suite is not None
    failed = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None]
    assert failed == ["step_time"]
    assert (out / "tracelab-report.md").read_text().splitlines()[2].startswith("❌")


def test_baseline_save_and_report_by_name(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "s.duckdb")
    assert main(["ingest", str(runs["base"]), "--db", db, "--run", "nightly-1"]) == 0
    assert main(["baseline", "save", "main", "--db", db]) == 0
    assert "baseline 'main' -> run 'nightly-1'" in capsys.readouterr().out
    rc, data = _report(tmp_path, "--baseline", "main", "--candidate", str(runs["slow"]), "--db", db)
    assert rc == 1 and data["baseline"]["name"] == "nightly-1"
    assert data["candidate"]["name"] == "slow"
    # The candidate was ingested into the store under its folder's name; reports by name work.
    rc, data = _report(tmp_path, "--baseline", "main", "--candidate", "slow", "--db", db)
    assert rc == 1
    assert main(["baseline", "list", "--db", db, "--format", "csv"]) == 0
    assert "main,nightly-1" in capsys.readouterr().out
    assert main(["baseline", "delete", "main", "--db", db]) == 0
    assert main(["baseline", "delete", "main", "--db", db]) == 2


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--baseline", "nope", "--candidate", "nope2"], 3, "baseline 'nope' is neither"),
        (["--threshold", "step_tme=+5%"], 2, "unknown metric 'step_tme'"),
        (["--threshold", "collective_bandwidth=+5%"], 2, "Write '-5%'"),
        (["--thresholds", "missing.yml"], 3, "thresholds file not found"),
        (["--format", "pdf"], 2, "invalid choice"),
    ],
)
def test_errors_exit_codes(
    runs: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    code: int,
    message: str,
) -> None:
    full = ["report", "--baseline", str(runs["base"]), "--candidate", str(runs["rerun"])]
    if "--baseline" in args:  # names that are in neither the store nor on disk
        db = str(tmp_path / "s.duckdb")
        assert main(["ingest", str(runs["base"]), "--db", db]) == 0
        full = ["report", "--db", db]
    try:
        rc = main([*full, *args])
    except SystemExit as exc:  # argparse usage errors
        rc = int(exc.code or 0)
    assert rc == code
    assert message in capsys.readouterr().err


def test_bad_trace_file_exits_3(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "rank-0.json").write_text('{"traceEvents": [')
    rc = main(["report", "--baseline", str(runs["base"]), "--candidate", str(bad)])
    assert rc == 3
    assert "rank-0.json" in capsys.readouterr().err


def test_report_path_imports_no_dash_browser_or_torch(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    code = (
        "import sys\n"
        "from tracelab.cli import main\n"
        f"rc = main(['report', '--baseline', {str(runs['base'])!r}, '--candidate', "
        f"{str(runs['slow'])!r}, '--format', 'html', '--format', 'junit', '--out', "
        f"{str(tmp_path / 'o')!r}])\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('dash', 'selenium', 'playwright', 'torch', 'flask'))\n"
        "print(rc, bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.stdout.strip() == "1 []", out.stderr


def test_a_failed_gate_never_moves_the_pinned_baseline(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # CI reports the same folder every night: the baseline pins its good night by name. A
    # regressed night used to replace that run under its name, and the next report against
    # the baseline compared the regression with itself and passed.
    ci = tmp_path / "ci"
    shutil.copytree(runs["base"], ci)
    db = str(tmp_path / "s.duckdb")
    assert main(["ingest", str(ci), "--db", db, "--run", "ci"]) == 0
    assert main(["baseline", "save", "main", "--run", "ci", "--db", db]) == 0
    shutil.rmtree(ci)
    shutil.copytree(runs["slow"], ci)
    rc, data = _report(tmp_path, "--baseline", "main", "--candidate", str(ci), "--db", db)
    assert rc == 1 and data["baseline"]["name"] == "ci"
    assert data["candidate"]["name"].startswith("ci-run")
    assert "pinned by a baseline" in capsys.readouterr().err
    rc, data = _report(tmp_path, "--baseline", "main", "--candidate", str(ci), "--db", db)
    assert rc == 1  # still judged against the good night


def test_two_folders_of_one_name_are_both_reported(runs: dict[str, Path], tmp_path: Path) -> None:
    shutil.copytree(runs["base"], tmp_path / "a" / "run")
    shutil.copytree(runs["slow"], tmp_path / "b" / "run")
    rc, data = _report(
        tmp_path,
        "--baseline",
        str(tmp_path / "a" / "run"),
        "--candidate",
        str(tmp_path / "b" / "run"),
    )
    assert rc == 1, data
    assert data["baseline"]["name"] == "run" and data["candidate"]["name"] == "run-candidate"


def test_a_report_with_a_failed_analyzer_never_reads_as_a_pass(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Exit 3, but JSON said "pass", JUnit had 0 errors and HTML a green box.
    import dataclasses

    from tracelab.analyzers import registry

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("broken on purpose")

    reg = registry()
    monkeypatch.setitem(reg, "stragglers", dataclasses.replace(reg["stragglers"], analyze=broken))
    out = tmp_path / "out"
    fmts = [x for f in ("markdown", "html", "json", "junit") for x in ("--format", f)]
    rc = main(
        ["report", "--baseline", str(runs["base"]), "--candidate", str(runs["rerun"]),
         *fmts, "--out", str(out)]
    )  # fmt: skip
    assert rc == 3
    data = json.loads((out / "tracelab-report.json").read_text())
    assert data["verdict"] == "error" and data["exit_code"] == 3, data["errors"]
    suite = ET.parse(out / "tracelab-report.junit.xml").getroot().find("testsuite")
    assert suite is not None and int(suite.get("errors") or 0) == len(data["errors"]) > 0
    html = (out / "tracelab-report.html").read_text()
    assert "Could not be judged" in html and "No performance regression" not in html
    assert "No performance regression" not in (out / "tracelab-report.md").read_text()


def test_a_candidate_named_like_a_baseline_is_the_run(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = str(tmp_path / "s.duckdb")
    shutil.copyfile(db, store)
    shutil.copytree(Path(db).with_suffix(".parquet"), Path(store).with_suffix(".parquet"))
    assert main(["baseline", "save", "slow", "--run", "base", "--db", store]) == 0
    rc, data = _report(tmp_path, "--baseline", "base", "--candidate", "slow", "--db", store)
    assert rc == 1 and data["candidate"]["name"] == "slow"
    assert "the run is judged" in capsys.readouterr().err
