"""`tracelab report`'s inputs: from two command-line arguments to a built report.

An argument is a trace file or folder, or a capture folder (ingested on the fly), a named
baseline (`tracelab baseline save`), or a run name in the store, checked in that order. Paths
are ingested under a name derived from the folder, replacing an earlier ingest of the *same*
path, never a different run. Without --db, two paths are compared in a temporary store.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Collection, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import duckdb

from tracelab.defaults import DEFAULT_DB
from tracelab.errors import InputError
from tracelab.ingest import ingest
from tracelab.report.compare import Report, compare
from tracelab.report.metrics import extract
from tracelab.report.thresholds import ReportSettings
from tracelab.store import delete_run, open_store

#: Inputs below this size are converted in-process (no worker pool start-up).
SMALL_INPUT_BYTES = 64 << 20


def _log(msg: str) -> None:
    print(msg, file=sys.stderr)


def _default_name(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name or "run"


def _size_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _runs_by_name(db: str) -> dict[str, list[str]]:
    if not Path(db).exists():
        return {}
    with open_store(db) as con:
        return {
            str(n): json.loads(s)
            for n, s in con.execute("SELECT name, source FROM runs").fetchall()
        }


@dataclass(frozen=True, kw_only=True)
class _Pending:
    """A run this report ingested under a temporary name; it takes `name` only once the
    report has been built, so that a failing report leaves the store as it was."""

    name: str
    temp: str
    source: str


def _ingest_path(
    path: Path,
    role: str,
    db: str,
    claimed: Collection[str] = (),
) -> tuple[str, _Pending]:
    """Ingest `path` as a pending run whose final name is tied to that path (never one of
    `claimed`, the names this report's other pending runs will take: two folders of one name
    both took it, and the store refused the second, exit 70)."""
    source = str(path.resolve())
    existing = _runs_by_name(db)
    base = _default_name(path.resolve())
    digest = hashlib.sha1(source.encode()).hexdigest()[:8]
    for name in (base, f"{base}-{role}", f"{base}-{digest}"):
        if name in claimed:
            continue
        if name not in existing or existing[name] == [source]:
            break
    temp = f"{name}.report-pending-{os.getpid()}-{role}"
    # Small captures convert faster in this process than through a process pool.
    workers = 1 if _size_bytes(path) < SMALL_INPUT_BYTES else None
    result = ingest([source], db=db, run=temp, if_exists="replace", progress=False, workers=workers)
    _log(f"tracelab report: {role} {source} -> run {name!r} ({len(result.ranks)} rank(s))")
    return temp, _Pending(name=name, temp=temp, source=source)


def _content(con: duckdb.DuckDBPyConnection, name: str) -> tuple[int, object] | None:
    """(run_id, what the run was ingested from: per-rank file hashes and skipped files)."""
    row = con.execute("SELECT run_id, skipped FROM runs WHERE name = ?", [name]).fetchone()
    if row is None:
        return None
    hashes = con.execute(
        "SELECT rank, json_extract(trace_metadata, '$.tracelab_sha256')::VARCHAR FROM ranks "
        "WHERE run_id = ? ORDER BY rank",
        [row[0]],
    ).fetchall()
    return int(row[0]), (row[1], hashes)


def _final_ids(
    con: duckdb.DuckDBPyConnection, pending: list[_Pending]
) -> dict[str, tuple[int, int | None]]:
    """temp name -> (the id the run will have, the id of the run it replaces, if any): an
    earlier run from identical files is kept as it is, and the pending copy dropped."""
    out: dict[str, tuple[int, int | None]] = {}
    for p in pending:
        new, old = _content(con, p.temp), _content(con, p.name)
        assert new is not None
        if old is not None and old[1] == new[1]:
            out[p.temp] = (old[0], None)
            _log(f"tracelab report: run {p.name!r} unchanged (identical files)")
        else:
            out[p.temp] = (new[0], old[0] if old is not None else None)
    return out


def _names(
    con: duckdb.DuckDBPyConnection, pending: list[_Pending], ids: dict[str, tuple[int, int | None]]
) -> list[_Pending]:
    """The pending runs with the names they keep. A run that a baseline pins by name is never
    replaced: a failed gate renamed the regressed run to the baseline's run, and the next
    report against that baseline compared the regression with itself and passed. The new run
    takes a name of its own instead (NAME-run<ID>)."""
    pinned = {str(r[0]) for r in con.execute("SELECT run_name FROM baselines").fetchall()}
    out = []
    for p in pending:
        keep, replaced = ids[p.temp]
        if replaced is not None and p.name in pinned:
            name = f"{p.name}-run{keep}"
            _log(
                f"tracelab report: run {p.name!r} is pinned by a baseline and stays as it was; "
                f"the new run from {p.source} is {name!r}"
            )
            ids[p.temp] = (keep, None)
            p = replace(p, name=name)
        out.append(p)
    return out


def _finish(
    store: str, pending: list[_Pending], ids: dict[str, tuple[int, int | None]] | None
) -> None:
    """Give each pending run its name (ids given: the report succeeded), or drop them all."""
    with open_store(store, read_only=False) as con:
        con.execute("BEGIN TRANSACTION")
        for p in pending:
            row = con.execute("SELECT run_id FROM runs WHERE name = ?", [p.temp]).fetchone()
            if row is None:
                continue
            temp_id = int(row[0])
            keep, replaced = ids.get(p.temp, (temp_id, None)) if ids is not None else (-1, None)
            if keep != temp_id:
                delete_run(con, temp_id)
                continue
            if replaced is not None:
                delete_run(con, replaced)
            con.execute("UPDATE runs SET name = ? WHERE run_id = ?", [p.name, temp_id])
        con.execute("COMMIT")


def _lookup(con: duckdb.DuckDBPyConnection, arg: str, role: str, db: str) -> int:
    """run_id for a named baseline or a run name; an InputError naming what exists otherwise.
    A name that is both: the baseline side takes the baseline, the candidate side the run (a
    candidate `pr-123` that a baseline was also named after was judged as the baseline's run,
    and the slow run never at all)."""
    row = con.execute("SELECT run_name FROM baselines WHERE name = ?", [arg]).fetchone()
    if role == "candidate":
        own = con.execute("SELECT run_id FROM runs WHERE name = ?", [arg]).fetchone()
        if own is not None:
            if row is not None and str(row[0]) != arg:
                _log(
                    f"tracelab report: candidate {arg!r} is a run and a baseline's name: the "
                    "run is judged"
                )
            return int(own[0])
    run_name = str(row[0]) if row else arg
    found = con.execute("SELECT run_id FROM runs WHERE name = ?", [run_name]).fetchone()
    if found is not None:
        return int(found[0])
    if row is not None:
        raise InputError(
            f"{role} {arg!r} is a baseline pinned to run {run_name!r}, which is no longer in "
            f"the store. Re-ingest it, or pin another run: tracelab baseline save {arg} --run RUN",
            path=db,
        )
    runs = [r[0] for r in con.execute("SELECT name FROM runs ORDER BY run_id DESC").fetchall()]
    bases = [r[0] for r in con.execute("SELECT name FROM baselines ORDER BY name").fetchall()]
    raise InputError(
        f"{role} {arg!r} is neither a trace file or folder nor a run or baseline in the store. "
        f"Runs: {', '.join(runs[:10]) or 'none'}; baselines: {', '.join(bases[:10]) or 'none'}.",
        path=db,
    )


@contextlib.contextmanager
def _store_for(args: tuple[str, str], db: str | None) -> Iterator[str]:
    if db is not None:
        yield db
    elif all(Path(a).exists() for a in args):
        with tempfile.TemporaryDirectory(prefix="tracelab-report-") as tmp:
            yield str(Path(tmp) / "report.duckdb")
    else:
        yield DEFAULT_DB


def build_report(
    baseline: str, candidate: str, *, settings: ReportSettings, db: str | None = None
) -> Report:
    """Resolve both arguments (ingesting paths), extract their metrics, and compare them."""
    with _store_for((baseline, candidate), db) as store:
        pending: list[_Pending] = []
        try:
            report = _build(baseline, candidate, settings, store, pending)
        except BaseException:
            if pending:
                with contextlib.suppress(Exception):
                    _finish(store, pending, None)
            raise
    return report


def _build(
    baseline: str, candidate: str, settings: ReportSettings, store: str, pending: list[_Pending]
) -> Report:
    names: list[str | None] = []
    for arg, role in ((baseline, "baseline"), (candidate, "candidate")):
        path = Path(arg)
        same = [p for p in pending if path.exists() and p.source == str(path.resolve())]
        if same:  # one folder given twice: one run
            names.append(same[0].temp)
        elif path.exists():
            temp, p = _ingest_path(path, role, store, {q.name for q in pending})
            pending.append(p)
            names.append(temp)
        else:
            names.append(None)
    if not Path(store).exists():
        raise InputError(
            "no store here, and the runs were given by name. Pass --db FILE, or give trace "
            "or capture folders.",
            path=store,
        )
    with open_store(store) as con:
        ids = []
        for arg, role, name in zip(
            (baseline, candidate), ("baseline", "candidate"), names, strict=True
        ):
            ids.append(_lookup(con, name or arg, role, store))
        if ids[0] == ids[1]:
            _log("tracelab report: warning: baseline and candidate are the same run")
        runs = [extract(con, ids[0], settings)]
        runs.append(runs[0] if ids[1] == ids[0] else extract(con, ids[1], settings))
        final = _final_ids(con, pending)
        pending[:] = _names(con, pending, final)
    by_temp = {p.temp: p for p in pending}
    for i, name in enumerate(names):
        if name is not None:  # report the run under the name it keeps
            summary = replace(runs[i].run, name=by_temp[name].name, run_id=final[name][0])
            runs[i] = replace(runs[i], run=summary)
    report = compare(runs[0], runs[1], settings)
    if pending:
        _finish(store, pending, final)
    return report
