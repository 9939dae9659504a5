"""Helpers of the hostile-input tests (issue 15): the CLI run in this process, and a
snapshot of every table of a store, to prove a refused command changed nothing."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tracelab.cli import main
from tracelab.ingest import ingest
from tracelab.store import open_store

from .kineto import run_set

REPO = Path(__file__).resolve().parents[2]
#: The base tables that hold a run's rows (an ingest that fails must leave none).
RUN_BASE_TABLES = (
    "runs",
    "ranks",
    "process_group_configs",
    "events",
    "steps",
    "lanes",
    "collectives",
    "memory",
)
TABLES = (*RUN_BASE_TABLES, "baselines")
#: Exit codes a command may end with on any input: ok, usage error, input error.
CLEAN_EXITS = (0, 2, 3)


@dataclass
class Result:
    code: int
    out: str
    err: str


def cli(*args: str) -> Result:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse
            code = int(exc.code or 0)
    return Result(code, out.getvalue(), err.getvalue())


def snapshot(db: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every table (small stores only), in a stable order."""
    with open_store(db) as con:
        return {t: sorted(map(repr, con.execute(f"SELECT * FROM {t}").fetchall())) for t in TABLES}


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    db = tmp_path / "store.duckdb"
    ingest([run_set(tmp_path / "good")], db=db, run="good", progress=False)
    return db


def still_works(db: Path) -> None:
    """The commands every user runs still succeed on the store."""
    for args in (("runs",), ("analyze", "--run", "good"), ("sql", "SELECT count(*) FROM events")):
        res = cli(*args, "--db", str(db))
        assert res.code == 0, (args, res.err)


@contextlib.contextmanager
def unwritable(folder: Path) -> Iterator[None]:
    """`folder` made unwritable while inside: its mode for a user, its immutable attribute
    for root (whom modes do not stop); skipped where neither can be had."""
    import os
    import subprocess

    if os.geteuid() != 0:
        mode = folder.stat().st_mode
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(mode)
        return
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("cannot make a folder unwritable for root here (chattr +i)")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
