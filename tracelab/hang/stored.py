"""A run's hang verdict, kept with the run: the Flight Recorder dumps that `tracelab ingest`
finds beside the traces, read and analyzed as `tracelab hang` does, and stored in the
hang_verdicts table (tracelab/store/schema/tables.sql; docs/hang.md, "Stored with the run").

The ingest calls `find_dumps` and `prepare` before it opens the store (reading a dump is
parsing, like converting a trace) and `write` inside the transaction that builds the run (in
its staged store, moved into the store whole), so the verdict lands with the run or not at all. The analyzers read it back with `stored_verdicts`.

Dumps are evidence beside the traces, never a reason to lose them: a dump that cannot be read
is recorded in the run's `skipped` list, naming the file, with or without --skip-bad, and the
traces are ingested. No verdict is stored while a rank's only dumps are unreadable: that rank
would look like one that left no dump, and the verdict would blame it wrongly.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracelab.errors import TracelabError
from tracelab.hang import render
from tracelab.hang.dumps import (
    DUMP_DIR,
    PYTORCH_DUMP_NAME,
    RankDump,
    one_per_rank,
    rank_of,
    read_dump,
)
from tracelab.hang.verdict import analyze
from tracelab.render.text import terminal

if TYPE_CHECKING:
    import duckdb

#: The stored columns that hold JSON, in hang_verdicts' order after run_id and ordinal.
COLUMNS = ("kind", "process_group", "members", "seq", "p2p", "op", "entered", "absent", "dumps")
_JSON = ("members", "entered", "absent", "dumps")


@dataclass(frozen=True, kw_only=True)
class StoredHang:
    """What the ingest keeps from a run's dumps."""

    #: One per divergence, the verdict first: `tracelab hang --format json`'s `verdict` and
    #: `also` objects, each with the `dumps` list added. Empty when the ranks agree, or when
    #: no verdict could be made (see `problems`).
    rows: tuple[dict[str, Any], ...]
    #: Dump files that could not be used: {file, error}, for the run's `skipped` list.
    problems: tuple[dict[str, str], ...]
    #: One line for the ingest's report.
    note: str


def _is_dump(path: Path) -> bool:
    return path.parent.name == DUMP_DIR or PYTORCH_DUMP_NAME.fullmatch(path.name) is not None


def find_dumps(folders: Iterable[Path], loose: Iterable[Path] = ()) -> list[Path]:
    """The dump files of a run: every file in a `flight-recorder/` folder at or below
    `folders` (the capture roots and the folders given), files named as PyTorch names dumps
    (`nccl_trace_rank_N`) below them, and those among `loose` (files the folder scan found to
    be no trace)."""
    found: dict[Path, Path] = {}
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*")):
            parts = path.relative_to(folder).parts
            if path.is_file() and not any(p.startswith(".") for p in parts) and _is_dump(path):
                found.setdefault(path.resolve(), path)
    for path in loose:
        if path.is_file() and _is_dump(path):
            found.setdefault(path.resolve(), path)
    return sorted(found.values())


def _has_traces(folder: Path) -> bool:
    """Whether a folder holds any file a trace could be (`.json`, `.json.gz`) outside its
    dump folders, beside a capture's manifest.json and rank.json parts."""
    for path in folder.rglob("*.json*"):
        if path.name in ("manifest.json", "rank.json") or DUMP_DIR in path.parts:
            continue
        if path.name.endswith((".json", ".json.gz")):
            return True
    return False


def dumps_only_hint(paths: Iterable[Path]) -> str | None:
    """For paths that hold dumps and nothing a trace could be: the command that reads them."""
    for path in paths:
        dumps = find_dumps([path]) if path.is_dir() and not _has_traces(path) else []
        if dumps:
            where = {str(p.parent) for p in dumps}
            return (
                f"{path} holds Flight Recorder dumps but no trace, so there is no run to ingest "
                "(the job hung or died before its profiler wrote one). Read the verdict with "
                f"`tracelab hang {' '.join(sorted(where))}`."
            )
    return None


def prepare(paths: list[Path], world_size: int | None) -> StoredHang | None:
    """Read the dumps at `paths` and find the verdict, as `tracelab hang` would with
    `--world-size world_size`; None when there are no dumps."""
    if not paths:
        return None
    read: list[RankDump] = []
    problems: list[dict[str, str]] = []
    bad_ranks: set[int | None] = set()
    for path in paths:
        try:
            read.append(read_dump(path))
        except Exception as exc:  # noqa: BLE001 (a dump that cannot be read never costs the traces)
            bad_ranks.add(rank_of(path))
            problems.append(
                {"file": str(path), "error": terminal(f"Flight Recorder dump: {_text(exc)}")}
            )
    try:
        dumps = one_per_rank(read)
    except TracelabError as exc:  # two different dumps claim one rank
        problems.append({"file": str(paths[0].parent), "error": terminal(_text(exc))})
        return StoredHang(rows=(), problems=tuple(problems), note=_no_verdict(problems))
    unread = bad_ranks - {d.rank for d in dumps}
    if unread or not dumps:
        return StoredHang(rows=(), problems=tuple(problems), note=_no_verdict(problems))
    try:
        doc = json.loads(render.as_json(analyze(dumps, world_size)))
    except TracelabError as exc:  # the dumps disagree on a group's ranks
        problems.append({"file": str(paths[0].parent), "error": terminal(_text(exc))})
        return StoredHang(rows=(), problems=tuple(problems), note=_no_verdict(problems))
    rows = [doc["verdict"], *doc["also"]] if doc["hang"] else []
    ranks = ", ".join(str(r) for r in doc["ranks"])
    if rows:  # the op's name is the dump's text: printed without control characters
        note = terminal(f"Flight Recorder dumps of ranks {ranks}: {render.headline(rows[0])}")
    else:
        note = f"Flight Recorder dumps of ranks {ranks}: the ranks agree (no hang)."
    return StoredHang(
        rows=tuple({**r, "dumps": doc["dumps"]} for r in rows),
        problems=tuple(problems),
        note=note,
    )


def _text(exc: Exception) -> str:
    if not isinstance(exc, TracelabError):  # not a reason tracelab gave: say what it was
        return f"could not be read ({type(exc).__name__}: {str(exc)[:200]})"
    return str(exc.args[0]) if exc.args else str(exc)


def _no_verdict(problems: list[dict[str, str]]) -> str:
    return (
        f"no hang verdict was stored: {len(problems)} Flight Recorder dump(s) could not be "
        "read (listed as skipped), and without them a rank would look like one that left no "
        "dump. Fix or remove them and run `tracelab hang` on the folder."
    )


def write(con: duckdb.DuckDBPyConnection, run_id: int, hang: StoredHang) -> None:
    """Insert the run's verdict rows (inside the transaction that builds the run)."""
    if not hang.rows:
        return
    con.executemany(
        "INSERT INTO hang_verdicts (run_id, ordinal, "
        + ", ".join(COLUMNS)
        + ") VALUES ("
        + ", ".join("?" for _ in range(len(COLUMNS) + 2))
        + ")",
        [
            [run_id, i] + [json.dumps(r[c]) if c in _JSON else r[c] for c in COLUMNS]
            for i, r in enumerate(hang.rows)
        ],
    )


def stored_verdicts(con: duckdb.DuckDBPyConnection, run_id: int) -> list[dict[str, Any]]:
    """The run's stored divergences, the verdict first, as `tracelab hang --format json`
    writes them (plus `dumps`); empty when the run has none."""
    rows = con.execute(
        "SELECT " + ", ".join(COLUMNS) + " FROM hang_verdicts WHERE run_id = ? ORDER BY ordinal",
        [run_id],
    ).fetchall()
    return [
        {c: json.loads(v) if c in _JSON else v for c, v in zip(COLUMNS, row, strict=True)}
        for row in rows
    ]
