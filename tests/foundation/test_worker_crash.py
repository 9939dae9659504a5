"""A conversion worker that dies (a segfault in the C scanner, the out-of-memory killer) costs
the ingest only the file that kills it: the files the broken pool left unconverted are retried
one by one in fresh processes, and the error names the file that killed its process.

CI met this for real: the scanner read one byte past an mmap that ended at a page boundary
(tests/foundation/test_fast_scan.py::test_never_reads_past_the_end_of_its_buffer), and every
file of the pool was reported as "internal error ... BrokenProcessPool", under whichever name.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from pathlib import Path

import pytest

import tracelab.ingest.pool as pool_mod
from tracelab.errors import InternalError
from tracelab.ingest import ingest
from tracelab.store import open_store

from .kineto import run_set

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork start method")

_REAL_CONVERT = pool_mod._convert_one
#: The file whose conversion kills its process.
DEADLY = "rank-2.json"


def _crashing_convert(path: str, out_dir: str):  # type: ignore[no-untyped-def]
    """What a worker runs (forked, so it sees this patch): a real conversion, except that the
    deadly file kills the process with SIGSEGV, as the scanner's bug did."""
    if Path(path).name == DEADLY:
        faulthandler.disable()  # pytest's handler would print the child's stack
        os.kill(os.getpid(), signal.SIGSEGV)
    return _REAL_CONVERT(path, out_dir)


@pytest.fixture
def crashing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_mod, "_convert_one", _crashing_convert)


def test_the_crash_is_blamed_on_its_file_and_nothing_is_written(
    crashing: None, tmp_path: Path
) -> None:
    data = run_set(tmp_path / "set", ranks=4)
    db = tmp_path / "s.duckdb"
    with pytest.raises(InternalError) as err:
        ingest([data], db=db, run="r", workers=2, progress=False)
    assert err.value.path == str(data / DEADLY), str(err.value)
    assert "died abruptly" in str(err.value)
    assert "more files" not in str(err.value), "only the deadly file is reported"
    assert not db.exists() or _runs(db) == []


def test_skip_bad_ingests_every_other_rank(crashing: None, tmp_path: Path) -> None:
    data = run_set(tmp_path / "set", ranks=4)
    db = tmp_path / "s.duckdb"
    report = ingest([data], db=db, run="r", workers=2, skip_bad=True, progress=False)
    assert report.ranks == [0, 1, 3]
    assert [s["file"] for s in report.skipped] == [str(data / DEADLY)]
    assert _runs(db) == ["r"]


def _runs(db: Path) -> list[str]:
    with open_store(db) as con:
        return [r[0] for r in con.execute("SELECT name FROM runs ORDER BY name").fetchall()]
