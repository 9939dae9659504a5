"""`tracelab ingest` stores a capture's hang verdict with the run (hang_verdicts), `tracelab
analyze` and `tracelab report` show it as the first finding. The dumps are the real gloo Flight
Recorder fixtures of tests/hang/fixtures, copied into a synthetic 2-rank gloo capture."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.foundation.hostile import cli
from tests.hang.captures import FIX, HOSTILE, capture, hostile_capture
from tracelab.errors import InputError
from tracelab.hang.stored import stored_verdicts
from tracelab.ingest import ingest
from tracelab.store import delete_run, open_store, run_id
from tracelab.testing.synth import write_ranks


def hang_json(dumps: Path) -> dict:  # type: ignore[type-arg]
    res = cli("hang", str(dumps), "--format", "json")
    assert res.code in (0, 1), res.err
    return json.loads(res.out)


def stored(db: Path, run: str) -> list[dict]:  # type: ignore[type-arg]
    with open_store(db) as con:
        return stored_verdicts(con, run_id(con, run))


@pytest.mark.parametrize("case", ["skip", "size", "kill", "none"])
def test_the_stored_verdict_is_tracelab_hangs(tmp_path: Path, case: str) -> None:
    root = capture(tmp_path, case)
    db = tmp_path / "s.duckdb"
    report = ingest([str(root)], db=str(db), workers=1)
    doc = hang_json(root / "flight-recorder")
    rows = stored(db, report.run)
    expected = [doc["verdict"], *doc["also"]] if doc["hang"] else []
    # Row for row: the same objects `tracelab hang --format json` prints, plus the dumps read.
    assert [{k: v for k, v in r.items() if k != "dumps"} for r in rows] == expected
    assert all(r["dumps"] == doc["dumps"] for r in rows)
    assert not report.skipped and not report.ignored
    assert any(n.startswith("Flight Recorder dumps of ranks") for n in report.notes)
    if case == "none":
        assert "the ranks agree" in report.notes[-1]
    else:
        assert rows[0]["seq"] == 5 and rows[0]["op"] == "gloo:all_reduce"


def _findings(db: Path, run: str) -> list[dict]:  # type: ignore[type-arg]
    res = cli("analyze", "--run", run, "--db", str(db), "--format", "json")
    assert res.code == 0, res.err
    return json.loads(res.out)["findings"]


def test_analyze_puts_the_hang_first_with_its_evidence(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    ingest([str(capture(tmp_path / "a", "skip", "skip"))], db=str(db), workers=1)
    ingest([str(capture(tmp_path / "b", "size", "size"))], db=str(db), workers=1)
    ingest([str(capture(tmp_path / "c", "kill", "kill"))], db=str(db), workers=1)
    ingest([str(capture(tmp_path / "d", None, "clean"))], db=str(db), workers=1)

    skip = _findings(db, "skip")
    # First, although other findings cost time and it costs none: the job stopped.
    assert len(skip) > 1 and any(f["impact_ns_per_step"] for f in skip[1:])
    f = skip[0]
    assert (f["code"], f["severity"], f["analyzer"]) == ("HANG", "critical", "hang")
    assert f["title"] == "rank(s) 1 never entered gloo:all_reduce #5"
    ev = f["evidence"]
    assert ev["ranks"] == [1] and ev["affected_ranks"] == [0]
    assert ev["numbers"]["collective"] == "gloo:all_reduce" and ev["numbers"]["seq"] == 5
    assert ev["numbers"]["never_entered"] == "1"
    assert ev["numbers"]["rank_1_last_op"].startswith("#4 gloo:all_reduce")
    assert "hang_job.py:69" in ev["numbers"]["stack"]
    assert "Rank(s) 1 never issued gloo:all_reduce #5" in f["suggestion"]

    size = _findings(db, "size")[0]
    assert size["code"] == "COLLECTIVE_DESYNC" and size["evidence"]["ranks"] == [0, 1]
    assert "[1024] Float" in size["evidence"]["numbers"]["entered"]
    assert "[512] Float" in size["evidence"]["numbers"]["entered"]
    assert "(rank 0: [1024] Float; rank 1: [512] Float)" in size["suggestion"]

    kill = _findings(db, "kill")[0]
    assert kill["code"] == "HANG" and kill["evidence"]["ranks"] == [1]
    assert "left no dump" in kill["title"] and "died or was killed" in kill["suggestion"]
    assert kill["evidence"]["numbers"]["left_no_dump"] == "1"
    assert "[1024] Float" in kill["evidence"]["numbers"]["entered"]

    assert not [f for f in _findings(db, "clean") if f["code"] in ("HANG", "COLLECTIVE_DESYNC")]
    text = cli("analyze", "--run", "skip", "--db", str(db))
    assert "1. [CRITICAL] HANG: rank(s) 1 never entered gloo:all_reduce #5" in text.out

    # The report names the hang as a new finding of the candidate (Markdown-escaped).
    res = cli("report", "--baseline", "clean", "--candidate", "skip", "--db", str(db))
    new = res.out.split("### New findings (1)")[1]
    assert "**CRITICAL** `HANG`: rank(s) 1 never entered gloo:all\\_reduce #5" in new, res.out

    # Deleting the run deletes its verdict.
    with open_store(db, read_only=False) as con:
        rid = run_id(con, "skip")
        delete_run(con, rid)
        left = con.execute("SELECT count(*) FROM hang_verdicts WHERE run_id = ?", [rid])
        assert left.fetchall()[0][0] == 0
    assert stored(db, "size")


def test_a_rank_without_a_dump_is_not_said_to_have_never_entered(tmp_path: Path) -> None:
    """4-rank dumps where rank 1 died on the others' timeout (tests/hang/scripts/hang_job4.py):
    the finding listed it among the ranks that never entered ("Rank(s) 1, 3 never issued ..."),
    and in the size desync, where every rank that dumped entered, as one that never entered."""
    db = tmp_path / "s.duckdb"
    for case, run in (("4ranks_skip_killed", "skip"), ("4ranks_size_killed", "size")):
        ingest([str(capture(tmp_path / run, case, run, ranks=4))], db=str(db), workers=1)
    skip = _findings(db, "skip")[0]
    n = skip["evidence"]["numbers"]
    assert skip["code"] == "HANG" and skip["evidence"]["ranks"] == [3], skip
    assert (n["never_entered"], n["left_no_dump"]) == ("3", "1")
    assert "rank_1_last_op" not in n and n["rank_3_last_op"].startswith("#7 gloo:all_to_all")
    assert "Rank(s) 3 never issued gloo:all_reduce #8" in skip["suggestion"]
    assert "Rank(s) 1 left no dump" in skip["suggestion"]
    size = _findings(db, "size")[0]
    n = size["evidence"]["numbers"]
    assert size["code"] == "COLLECTIVE_DESYNC" and size["evidence"]["ranks"] == [0, 2, 3]
    assert "never_entered" not in n and n["left_no_dump"] == "1"
    assert "Rank(s) 1 left no dump" in size["suggestion"]


def test_an_unreadable_dump_never_fails_the_traces(tmp_path: Path) -> None:
    root = capture(tmp_path, "skip")
    (root / "flight-recorder" / "rank_1.pkl").write_bytes(b"\x80\x04garbage")
    db = tmp_path / "s.duckdb"
    # rank 1's JSON dump still reads: the verdict is made from it, the bad file is skipped.
    report = ingest([str(root)], db=str(db), workers=1)
    assert report.ranks == [0, 1]
    assert [s["file"] for s in report.skipped] == [str(root / "flight-recorder" / "rank_1.pkl")]
    assert "Flight Recorder dump" in report.skipped[0]["error"]
    assert stored(db, report.run)[0]["kind"] == "not_entered"
    with open_store(db) as con:
        kept = con.execute("SELECT skipped FROM runs WHERE name = ?", [report.run])
        assert json.loads(kept.fetchall()[0][0]) == report.skipped

    # Both of rank 1's dumps unreadable: no verdict (rank 1 would look dead), both named.
    (root / "flight-recorder" / "rank_1.json").write_text('{"entries": [')
    report = ingest([str(root)], db=str(db), run="again", workers=1)
    assert report.ranks == [0, 1] and len(report.skipped) == 2
    assert {Path(s["file"]).name for s in report.skipped} == {"rank_1.pkl", "rank_1.json"}
    assert stored(db, "again") == []
    assert any("no hang verdict was stored" in n for n in report.notes)
    res = cli("ingest", str(root), "--db", str(db), "--run", "cli")
    assert res.code == 0 and "skipped " + str(root / "flight-recorder" / "rank_1.json") in res.out


def test_a_capture_of_dumps_only_names_tracelab_hang(tmp_path: Path) -> None:
    folder = tmp_path / "hung"
    shutil.copytree(FIX / "skip", folder / "flight-recorder")
    with pytest.raises(InputError, match=r"holds Flight Recorder dumps but no trace") as exc:
        ingest([str(folder)], db=str(tmp_path / "s.duckdb"), workers=1)
    assert f"tracelab hang {folder / 'flight-recorder'}" in str(exc.value)
    res = cli("ingest", str(folder), "--db", str(tmp_path / "s.duckdb"))
    assert res.code == 3 and "tracelab hang" in res.err
    assert not (tmp_path / "s.duckdb").exists() or "runs" not in res.out
    # A capture whose manifest lists ranks without traces (the job hung before a window ended).
    root = capture(tmp_path / "c", "skip")
    for trace in root.glob("rank-*/window-0.pt.trace.json.gz"):
        trace.unlink()
    with pytest.raises(InputError, match=r"tracelab hang .*flight-recorder"):
        ingest([str(root)], db=str(tmp_path / "s.duckdb"), workers=1)
    # A capture with traces and a broken manifest gets the manifest's error, not the hint.
    broken = capture(tmp_path / "d", "skip")
    (broken / "manifest.json").write_text("{")
    with pytest.raises(InputError) as exc:
        ingest([str(broken)], db=str(tmp_path / "s.duckdb"), workers=1)
    assert "manifest.json" in str(exc.value) and "tracelab hang" not in str(exc.value)


def test_pytorch_named_dumps_next_to_traces(tmp_path: Path) -> None:
    """Plain traces with PyTorch's default dump names beside them (TORCH_FR_DUMP_TEMP_FILE:
    nccl_trace_rank_N), and a flight-recorder/ folder whose JSON dumps are never traces."""
    from tracelab.testing.synth import MS, RankTrace

    traces = []
    for rank in range(2):
        t = RankTrace(rank, 2, backend="gloo")
        for k in range(3):
            t.step(k + 1, k * 20 * MS, k * 20 * MS + 15 * MS)
            t.kernel("mm", k * 20 * MS + MS, k * 20 * MS + 9 * MS)
        traces.append(t)
    folder = tmp_path / "plain"
    write_ranks(folder, traces)
    for r in (0, 1):
        shutil.copy(FIX / "skip" / f"rank_{r}.pkl", folder / f"nccl_trace_rank_{r}")
    report = ingest([str(folder)], db=str(tmp_path / "s.duckdb"), run="plain", workers=1)
    assert report.ignored == [] and report.skipped == []
    assert stored(tmp_path / "s.duckdb", "plain")[0]["kind"] == "not_entered"

    other = tmp_path / "other"
    write_ranks(other, traces)
    shutil.copytree(FIX / "size", other / "flight-recorder")
    report = ingest([str(other)], db=str(tmp_path / "s.duckdb"), run="other", workers=1)
    assert report.ranks == [0, 1] and report.ignored == []
    assert stored(tmp_path / "s.duckdb", "other")[0]["kind"] == "size_mismatch"


def test_hostile_dump_text_is_stored_as_is_and_escaped_in_html(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    ingest([str(hostile_capture(tmp_path))], db=str(db), workers=1)
    ingest([str(capture(tmp_path / "c", None, "clean"))], db=str(db), workers=1)
    assert stored(db, "hostile")[0]["op"] == HOSTILE
    out = tmp_path / "r.html"
    cli("report", "--baseline", "clean", "--candidate", "hostile", "--db", str(db),
        "--format", "html", "--out", str(out))  # fmt: skip
    html = out.read_text()
    assert "never entered &lt;script&gt;window.hacked=1&lt;/script&gt;" in html
    assert "<script>window.hacked" not in html
    # Terminal escapes in a dump never reach the terminal through the ingest's note.
    esc = hostile_capture(tmp_path / "e", "gloo:all_reduce\x1b[2J\x07", "escapes")
    res = cli("ingest", str(esc), "--db", str(db))
    assert res.code == 0 and "never entered gloo:all_reduce #5" in res.out
    assert "\x1b" not in res.out and "\x07" not in res.out


@pytest.mark.torchrun
def test_a_collector_capture_of_a_hung_job(tmp_path: Path) -> None:
    """End to end: tracelab.profile around a 2-rank gloo loop in which rank 1 skips an
    all-reduce (tests/hang/scripts/collector_hang.py); the capture's verdict is stored, and its
    stack names the user's line, not the collector's hook."""
    import os
    import subprocess
    import sys

    out = tmp_path / "capture"
    script = Path(__file__).parent / "scripts" / "collector_hang.py"
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(script), "--out", str(out)],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, timeout=180,
    )  # fmt: skip
    # Rank 0 wrote the manifest when its collective timed out, before rank 1 (asleep) wrote
    # its rank.json: rank 1 added itself afterwards, so both ranks' traces are in the run.
    manifest = json.loads((out / "manifest.json").read_text())
    assert [r["rank"] for r in manifest["ranks"]] == [0, 1]
    assert all(r["traces"] for r in manifest["ranks"])
    db = tmp_path / "s.duckdb"
    report = ingest([str(out)], db=str(db), workers=1)
    assert report.ranks == [0, 1]
    # The timed-out step (4 s in one all-reduce) is derived: its wait once overflowed BIGINT.
    assert report.derived_errors == {}
    doc = hang_json(out / "flight-recorder")
    rows = stored(db, report.run)
    assert [{k: v for k, v in r.items() if k != "dumps"} for r in rows] == [doc["verdict"]]
    v = rows[0]
    assert (
        v["kind"] == "missing_rank" and v["op"] == "gloo:all_reduce" and list(v["absent"]) == ["1"]
    )
    assert v["entered"]["0"]["stack"][0].startswith("<module> at ")
    assert v["entered"]["0"]["stack"][0].endswith("collector_hang.py:28")
    # Every analyzer runs (the parts are derived); the hang finding comes first.
    from tracelab.analyzers import run

    with open_store(db) as con:
        analysis = run(con, run_id(con, report.run))
        transfer = con.execute(
            "SELECT max(transfer_ns) FROM step_parts WHERE run_id = ? AND rank = 0",
            [run_id(con, report.run)],
        ).fetchall()[0][0]
    assert analysis.errors == {}
    found = analysis.findings
    assert found[0].code == "HANG" and "collector_hang.py:28" in str(
        found[0].evidence.numbers["stack"]
    )
    # The step of the hang: rank 0's collector recorded all-reduce #4 in step 3.
    assert found[0].evidence.steps == (3,)
    assert transfer >= 4_000_000_000  # rank 0's all-reduce waited out the 4 s timeout


def test_a_malformed_or_disagreeing_dump_never_fails_the_traces(tmp_path: Path) -> None:
    """A dump with a malformed value stopped the ingest with an internal error (exit 70): the
    traces were not ingested. It is skipped and named, as an unreadable dump is; dumps that
    disagree on a group's ranks store no verdict, with the reason."""
    root = capture(tmp_path, "skip")
    dump = root / "flight-recorder" / "rank_1.json"
    doc = json.loads(dump.read_text())
    doc["entries"][0]["input_sizes"] = [["x"]]
    dump.write_text(json.dumps(doc))
    (root / "flight-recorder" / "rank_1.pkl").unlink(missing_ok=True)
    db = tmp_path / "s.duckdb"
    res = cli("ingest", str(root), "--db", str(db), "--run", "bad")
    assert res.code == 0 and f"skipped {dump}" in res.out, res.err
    assert stored(db, "bad") == []

    doc["entries"][0]["input_sizes"] = [[1024]]
    doc["pg_config"] = {"": {"desc": "", "name": "", "ranks": "[0, 1, 2]"}}
    dump.write_text(json.dumps(doc))
    report = ingest([str(root)], db=str(db), run="mixed", workers=1)
    assert report.ranks == [0, 1] and stored(db, "mixed") == []
    assert any("disagree on the ranks" in s["error"] for s in report.skipped), report.skipped
