"""Whose staging folder is whose: an ingest removes the staging folders left beside the store
by ingests that died, and never a live one. The owner's pid in a folder's name decided it: an
ingest in another pid namespace (a container sharing the store's folder) or on another host has
a pid that is no process here, and its live folder was removed under it. Now the owner holds a
lock on the folder's OWNER_FILE while it lives (tracelab.ingest.workers)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tracelab.ingest import ingest
from tracelab.ingest.workers import OWNER_FILE, STAGING_PREFIX, UNLOCKED_GRACE_S

from .kineto import run_set

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="flock")

#: A pid no process of this namespace can have (above Linux's largest pid_max, 2**22).
FOREIGN_PID = 9_999_999

#: Another namespace's live ingest: its staging folder, named after its pid there, locked.
_OWNER = textwrap.dedent(
    """
    import fcntl, os, sys
    folder = sys.argv[1]
    os.mkdir(folder)
    fd = os.open(os.path.join(folder, sys.argv[2]), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    open(os.path.join(folder, "work"), "w").write("x")
    print("ready", flush=True)
    sys.stdin.read()  # lives until the test closes its stdin
    """
)


def test_a_live_ingest_of_another_pid_namespace_keeps_its_folder(tmp_path: Path) -> None:
    folder = tmp_path / f"{STAGING_PREFIX}{FOREIGN_PID}-abc"
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER, str(folder), OWNER_FILE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "ready"
        ingest([run_set(tmp_path / "t", ranks=1)], db=tmp_path / "s.duckdb", progress=False)
        assert (folder / "work").is_file(), "a live ingest's staging folder was removed"
    finally:
        owner.communicate(input="", timeout=30)
    # Its owner gone (the lock with it), the next ingest removes what it left.
    ingest([run_set(tmp_path / "u", ranks=1)], db=tmp_path / "s.duckdb", run="u", progress=False)
    assert not folder.exists()
    assert not list(tmp_path.glob(STAGING_PREFIX + "*")), "an ingest leaves no staging folder"


def test_an_older_tracelabs_folder_is_judged_by_its_pid(tmp_path: Path) -> None:
    """A folder without OWNER_FILE (an older tracelab's): removed when the pid in its name is
    no process here and it is not new (one just made may be about to be locked)."""
    dead_old = tmp_path / f"{STAGING_PREFIX}{FOREIGN_PID}-old"
    dead_new = tmp_path / f"{STAGING_PREFIX}{FOREIGN_PID}-new"
    live_old = tmp_path / f"{STAGING_PREFIX}{os.getppid()}-old"
    for folder in (dead_old, dead_new, live_old):
        folder.mkdir()
    past = time.time() - 2 * UNLOCKED_GRACE_S
    for folder in (dead_old, live_old):
        os.utime(folder, (past, past))
    ingest([run_set(tmp_path / "t", ranks=1)], db=tmp_path / "s.duckdb", progress=False)
    assert not dead_old.exists()
    assert dead_new.is_dir() and live_old.is_dir()
