"""Issue 15 items 6, 10, 11, 13 and the CLI's last line of defence: bad options and settings
exit 2 with a message, a failing report or a demo never changes runs it did not make, the
server checks its port before starting anything, and terminals get no escape sequences."""

from __future__ import annotations

import os
import pty
import select
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tracelab.ingest import ingest

from .hostile import REPO, cli, snapshot, still_works, store  # noqa: F401 (fixture)
from .kineto import run_set, trace, write

SAMPLES = REPO / "sample_traces"


@pytest.mark.parametrize(
    "args, words",
    [
        (("report", "--baseline", "good", "--candidate", "good", "--seed", "-1"), "seed"),
        (("report", "--baseline", "good", "--candidate", "good", "--alpha", "2"), "alpha"),
        (("analyze", "--run", "\udcff"), "not valid UTF-8"),
        (("analyze", "--run", ""), "non-empty run name"),
        (("ingest", "{good}", "--run", ""), "non-empty run name"),
        (("ingest", "{good}", "--run", "a\x1b[2Jb"), "control characters"),
        (("ingest", "{good}", "--run", "x", "--rank", "rank-0.json=99999999999"), "--rank"),
        (("ingest", "{good}", "--run", "x", "--rank", "rank-0.json=5"), "not below the world size"),
        (("sql", ""), "no SQL statement"),
        (("serve", "--port", "99999"), "--port must be 1..65535"),
        (("serve", "--port", "0"), "--port must be 1..65535"),
        (
            ("report", "--baseline", "good", "--candidate", "good", "--out", "/proc/x/r.md"),
            "cannot",
        ),
    ],
)
def test_bad_options_exit_cleanly(
    args: tuple[str, ...], words: str, store: Path, tmp_path: Path
) -> None:
    good = run_set(tmp_path / "in", ranks=2)
    before = snapshot(store)
    res = cli(*(a.format(good=good) for a in args), "--db", str(store))
    assert res.code in (2, 3), res.err
    assert words in res.err and "Traceback" not in res.err, res.err
    assert snapshot(store) == before
    still_works(store)


def test_thresholds_file_not_utf8(store: Path, tmp_path: Path) -> None:
    path = tmp_path / "t.yml"
    path.write_bytes(b"step_time: +5%\n# caf\xe9\n")
    res = cli(
        "report",
        "--baseline",
        "good",
        "--candidate",
        "good",
        "--thresholds",
        str(path),
        "--db",
        str(store),
    )
    assert res.code == 3 and str(path) in res.err and "UTF-8" in res.err


def test_lock_timeout_env_is_checked_when_used(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRACELAB_LOCK_TIMEOUT_S", "abc")
    res = cli("runs", "--db", str(store))
    assert res.code == 2 and "TRACELAB_LOCK_TIMEOUT_S" in res.err
    code = "import tracelab.store, tracelab.ingest, tracelab.cli"  # import never fails on it
    env = {**os.environ, "TRACELAB_LOCK_TIMEOUT_S": "abc"}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


def test_corrupt_store_is_an_error_not_a_traceback(store: Path) -> None:
    data = bytearray(store.read_bytes())
    for at in range(8192, len(data), 4096):  # every block after the headers
        data[at : at + 64] = b"\xa5" * 64
    store.write_bytes(bytes(data))
    for args in (("runs",), ("analyze",), ("sql", "SELECT count(*) FROM events")):
        res = cli(*args, "--db", str(store))
        assert res.code in (2, 3), (args, res.err)
        assert "Traceback" not in res.err


def test_unexpected_errors_are_one_line(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tracelab.store

    def boom(*a: object, **k: object) -> None:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(tracelab.store, "list_runs", boom)
    res = cli("runs", "--db", str(store))
    assert res.code == 70
    assert res.err.count("\n") == 1 and "ZeroDivisionError: boom" in res.err
    assert "report it" in res.err and "TRACELAB_DEBUG=1" in res.err
    monkeypatch.setenv("TRACELAB_DEBUG", "1")
    assert "Traceback" in cli("runs", "--db", str(store)).err


def test_closed_pipe_exits_quietly(store: Path) -> None:
    cmd = (
        f"{sys.executable} -m tracelab.cli sql 'SELECT * FROM range(200000)' --limit 0 "
        f"--db {store} | head -1"
    )
    res = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True)
    assert res.returncode == 0 and res.stderr == "", res.stderr


def test_busy_port_exits_2_before_any_thread(store: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "tracelab.cli",
                "serve",
                "--db",
                str(store),
                "--port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert res.returncode == 2 and "in use" in res.stderr and "terminate" not in res.stderr


def test_failing_report_leaves_the_store_as_it_was(store: Path, tmp_path: Path) -> None:
    before = snapshot(store)
    res = cli(
        "report",
        "--baseline",
        "no-such-run",
        "--candidate",
        str(SAMPLES / "ddp"),
        "--db",
        str(store),
    )
    assert res.code == 3, res.err
    assert snapshot(store) == before
    ok = cli(
        "report", "--baseline", "good", "--candidate", str(SAMPLES / "ddp"), "--db", str(store)
    )
    assert ok.code in (0, 1), ok.err
    names = cli(
        "sql", "SELECT name FROM runs ORDER BY name", "--db", str(store), "--format", "csv"
    ).out.split()
    assert names == ["name", "ddp", "good"]


def test_demo_never_replaces_runs_it_did_not_make(tmp_path: Path) -> None:
    db = tmp_path / "mine.duckdb"
    ingest([run_set(tmp_path / "mine")], db=db, run="ddp", progress=False)
    before = snapshot(db)["ranks"]
    res = cli("demo", "--traces", str(SAMPLES), "--db", str(db), "--no-serve")
    assert res.code == 0, res.err
    assert "'ddp' is already in" in res.out
    assert snapshot(db)["ranks"][: len(before)] == before or all(
        r in snapshot(db)["ranks"] for r in before
    )


def _on_a_terminal(args: list[str]) -> str:
    """What a command writes to a pseudo-terminal."""
    main, sub = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracelab.cli", *args],
        stdout=sub,
        stderr=sub,
        stdin=subprocess.DEVNULL,
    )
    os.close(sub)
    out = b""
    while True:
        ready, _, _ = select.select([main], [], [], 60)
        if not ready:
            break
        try:
            chunk = os.read(main, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    proc.wait(timeout=60)
    os.close(main)
    return out.decode("utf-8", "replace")


def test_terminal_output_has_no_escape_sequences(tmp_path: Path) -> None:
    hostile = "evil\x1b[2J\x1b]0;owned\x07\rFAKE LINE\x9b31m"
    doc = trace(rank=0)
    doc["traceEvents"][1]["name"] = hostile
    doc["traceEvents"][0]["name"] = "ProfilerStep#1"
    write(tmp_path / "t" / "rank-0.json", doc)
    db = tmp_path / "s.duckdb"
    ingest([tmp_path / "t"], db=db, run="t", progress=False)
    for args in (["sql", "SELECT name FROM events"], ["runs"], ["analyze", "--format", "text"]):
        shown = _on_a_terminal([*args, "--db", str(db)])
        assert "\x1b" not in shown and "\x9b" not in shown and "\x07" not in shown, args
    assert "evil" in _on_a_terminal(["sql", "SELECT name FROM events", "--db", str(db)])
    piped = cli("sql", "SELECT name FROM events", "--db", str(db), "--format", "json").out
    assert "\\u001b[2J" in piped  # data for programs keeps the text, escaped by JSON


def test_delete_removes_one_run_and_leaves_the_others(store: Path, tmp_path: Path) -> None:
    """Item 1: a run can be removed (there was no delete command)."""
    before = snapshot(store)
    ingest([run_set(tmp_path / "other")], db=store, run="other", progress=False)
    assert cli("delete", "other", "--db", str(store)).code == 0
    assert snapshot(store) == before
    res = cli("delete", "other", "--db", str(store))
    assert res.code == 2 and "no run named 'other'" in res.err
    still_works(store)


def test_skip_bad_skips_any_per_file_failure(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 7: a failure that is not an input error (a bug met on one file) is skipped and
    recorded with --skip-bad, and without it is one line naming the file (exit 70)."""
    import tracelab.ingest.pool

    folder = run_set(tmp_path / "three", ranks=3)
    real = tracelab.ingest.pool._convert_one

    def flaky(path: str, out: str) -> object:
        if path.endswith("rank-1.json"):
            raise KeyError("sentinel")
        return real(path, out)

    monkeypatch.setattr(tracelab.ingest.pool, "_convert_one", flaky)
    before = snapshot(store)
    res = cli("ingest", str(folder), "--db", str(store), "--workers", "1")
    assert res.code == 70 and "rank-1.json" in res.err and "KeyError" in res.err
    assert snapshot(store) == before
    res = cli("ingest", str(folder), "--db", str(store), "--workers", "1", "--skip-bad")
    assert res.code == 0, res.err
    assert "skipped" in res.out and "rank-1.json" in res.out and "KeyError" in res.out
    assert "2/3" in cli("runs", "--db", str(store)).out


@pytest.mark.parametrize(
    "argv",
    [
        ["rederive"],
        ["delete", "a"],
        ["baseline", "save", "b", "--run", "a"],
        ["baseline", "delete", "b"],
    ],
)
def test_commands_that_change_a_store_never_create_one(tmp_path: Path, argv) -> None:
    typo = tmp_path / "typo.duckdb"
    res = cli(*argv, "--db", str(typo))
    assert res.code == 3 and "no store here" in res.err and "Traceback" not in res.err, res.err
    assert not typo.exists() and not (tmp_path / "typo.parquet").exists()


def test_ingest_creates_the_folder_of_a_new_store(tmp_path: Path) -> None:
    good = run_set(tmp_path / "in", ranks=2)
    db = tmp_path / "stores" / "ci" / "s.duckdb"
    res = cli("ingest", str(good), "--db", str(db))
    assert res.code == 0, res.err
    assert "2/2" in cli("runs", "--db", str(db)).out


@pytest.mark.parametrize(
    "kind", ["folder", "not duckdb", "empty", "dangling link", "under a file", "? in a folder"]
)
def test_a_path_that_cannot_hold_the_store_is_refused_before_any_conversion(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was found only when the store was opened, after every trace had been converted
    (2.0-2.4 s of wasted work on the 8-rank set)."""
    import tracelab.ingest.orchestrate as orchestrate

    def converted(*args, **kwargs):
        raise AssertionError("converted before the store's path was checked")

    monkeypatch.setattr(orchestrate, "convert_all", converted)
    good = run_set(tmp_path / "in", ranks=2)
    if kind == "folder":
        db = tmp_path / "stores"
        db.mkdir()
        words = "is a folder, not a store file"
    elif kind == "not duckdb":
        db = tmp_path / "notes.duckdb"
        db.write_text("my notes\n")
        words = "not a tracelab store"
    elif kind == "empty":  # `--db $(mktemp --suffix .duckdb)`: DuckDB refuses an empty file
        db = tmp_path / "tmp.duckdb"
        db.touch()
        words = "the file is empty"
    elif kind == "dangling link":
        db = tmp_path / "link.duckdb"
        db.symlink_to(tmp_path / "gone.duckdb")
        words = "symbolic link"
    elif kind == "? in a folder":  # DuckDB misnamed the log: every commit failed, exit 70
        db = tmp_path / "q?x" / "s.duckdb"
        words = "whose path holds '?'"
    else:
        (tmp_path / "f").write_text("x")
        db = tmp_path / "f" / "s.duckdb"
        words = "is a file, not a folder"
    res = cli("ingest", str(good), "--db", str(db))
    assert res.code == 3 and words in res.err and str(db) in res.err, res.err
    assert "Traceback" not in res.err
    if kind == "not duckdb":
        assert db.read_text() == "my notes\n"
        assert not (tmp_path / "notes.parquet").exists()


def test_convert_beside_an_unwritable_trace_names_it(tmp_path: Path) -> None:
    """`tracelab convert` (as the collector and Ray's tasks do) writes beside the trace: a
    folder it cannot write was an internal error, exit 70."""
    from .hostile import unwritable

    traces = run_set(tmp_path / "t", ranks=1)
    with unwritable(traces):
        res = cli("convert", str(traces / "rank-0.json"))
    assert res.code == 3, res.err
    assert "rank-0.json: cannot write the converted files beside this trace" in res.err, res.err
    assert not [p for p in traces.iterdir() if p.name != "rank-0.json"]
