"""From two command-line arguments to a written report.

An argument is a trace file or folder, or a capture folder (ingested on the fly), a named
baseline (`tracelab baseline save`), or a run name in the store, checked in that order. Paths
are ingested under a name derived from the folder, replacing an earlier ingest of the *same*
path, never a different run. Without --db, two paths are compared in a temporary store.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import duckdb

from tracelab.errors import InputError, UsageError
from tracelab.render import renderer
from tracelab.report.compare import Report, compare
from tracelab.report.metrics import extract
from tracelab.report.thresholds import ReportSettings
from tracelab.store import DEFAULT_DB, open_store

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
        return {str(n): json.loads(s) for n, s in
                con.execute("SELECT name, source FROM runs").fetchall()}


def _ingest_path(path: Path, role: str, db: str) -> str:
    """Ingest `path` as a run whose name is tied to that path; returns the run name."""
    from tracelab.ingest import ingest

    source = str(path.resolve())
    existing = _runs_by_name(db)
    base = _default_name(path.resolve())
    digest = hashlib.sha1(source.encode()).hexdigest()[:8]
    for name in (base, f"{base}-{role}", f"{base}-{digest}"):
        if name not in existing or existing[name] == [source]:
            break
    # Small captures convert faster in this process than through a process pool.
    workers = 1 if _size_bytes(path) < SMALL_INPUT_BYTES else None
    result = ingest([source], db=db, run=name, if_exists="replace", progress=False,
                    workers=workers)
    state = "unchanged" if result.unchanged else f"{len(result.ranks)} rank(s)"
    _log(f"tracelab report: {role} {source} -> run {name!r} ({state})")
    return name


def _lookup(con: duckdb.DuckDBPyConnection, arg: str, role: str, db: str) -> int:
    """run_id for a named baseline or a run name; an InputError naming what exists otherwise."""
    row = con.execute("SELECT run_name FROM baselines WHERE name = ?", [arg]).fetchone()
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
        names = []
        for arg, role in ((baseline, "baseline"), (candidate, "candidate")):
            path = Path(arg)
            names.append(_ingest_path(path, role, store) if path.exists() else None)
        if not Path(store).exists():
            raise InputError(
                "no store here, and the runs were given by name. Pass --db FILE, or give trace "
                "or capture folders.", path=store)
        with open_store(store) as con:
            ids = []
            for arg, role, name in zip((baseline, candidate), ("baseline", "candidate"), names,
                                       strict=True):
                ids.append(_lookup(con, name or arg, role, store))
            if ids[0] == ids[1]:
                _log("tracelab report: warning: baseline and candidate are the same run")
            runs = [extract(con, rid, settings) for rid in ids]
    return compare(runs[0], runs[1], settings)


def write_outputs(report: Report, formats: list[str], out: str | None) -> list[str]:
    """Render each format; one format goes to `out` (a file) or stdout, several to folder `out`.

    Returns the paths written ("-" for stdout).
    """
    renderers = {f: renderer("report", f) for f in dict.fromkeys(formats)}
    formats = list(renderers)
    if len(formats) > 1 and out is None:
        raise UsageError("several --format values need --out FOLDER to write them into")
    written = []
    for fmt in formats:
        text = renderers[fmt].render(report)
        if out is None or out == "-":
            sys.stdout.write(text)
            written.append("-")
            continue
        target = Path(out)
        if len(formats) > 1 or target.is_dir() or out.endswith(("/", "\\")):
            target.mkdir(parents=True, exist_ok=True)
            target = target / renderers[fmt].filename
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        written.append(str(target))
    return written
