"""The ingest's write: the run's rows, its converted events files, its small tables and the
derived layer, built together in a staged store, then moved into the store in one short
transaction (tracelab.store.staged), whole or not at all."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tracelab import __version__
from tracelab.derived.sqlfiles import insert_rows
from tracelab.errors import (
    UsageError,
)
from tracelab.ingest import load as load_sql
from tracelab.ingest.converted import PARQUET_KINDS
from tracelab.ingest.discover import Capture, Discovery
from tracelab.ingest.ranks import ConvertedRank
from tracelab.ingest.records import load_capture_records

if TYPE_CHECKING:
    import duckdb

    from tracelab.derived.part_batches import Runner

IfExists = Literal["refuse", "replace"]


@dataclass(kw_only=True)
class IngestReport:
    """What an ingest did; printed by the CLI."""

    run: str
    run_id: int | None
    ranks: list[int]
    world_size: int | None
    events: int
    skipped: list[dict[str, str]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    unchanged: bool = False
    #: Derived components that failed on the run (component -> reason): its other numbers
    #: are there, these are not.
    derived_errors: dict[str, str] = field(default_factory=dict)
    #: What the ingest decided for the user (e.g. a lone rank-less trace taken as rank 0 of 1).
    notes: list[str] = field(default_factory=list)


def staging_parent(db_path: Path) -> str | None:
    parent = db_path.resolve().parent if str(db_path) != ":memory:" else None
    if parent is not None and parent.is_dir() and os.access(parent, os.W_OK):
        return str(parent)
    return None


def _identical(con: duckdb.DuckDBPyConnection, rid: int, by_rank: dict[int, ConvertedRank]) -> bool:
    stored = {
        int(r): sorted(json.loads(h))
        for r, h in con.execute(
            "SELECT rank, json_extract(trace_metadata, '$.tracelab_sha256') FROM ranks WHERE run_id = ?",
            [rid],
        ).fetchall()
        if h is not None
    }
    new = {rank: sorted(i.sha256 for i in cr.infos) for rank, cr in by_rank.items()}
    return stored == new


#: runs.metadata keys that must match for a re-ingest to be the same run (with the traces'
#: hashes): the `--mesh` given, and the digest of the inputs besides the traces
#: (tracelab.ingest.orchestrate.inputs_digest: a capture's manifest and records, the dumps).
SAME_RUN_KEYS = ("mesh", "inputs_sha256")


def _same_metadata(con: duckdb.DuckDBPyConnection, rid: int, extra: dict[str, Any] | None) -> bool:
    """Whether the stored run was ingested with the same SAME_RUN_KEYS (or none of them)."""
    row = con.execute("SELECT metadata FROM runs WHERE run_id = ?", [rid]).fetchall()
    stored = json.loads(row[0][0]) if row and row[0][0] is not None else {}
    return all(stored.get(k) == (extra or {}).get(k) for k in SAME_RUN_KEYS)


def write_run(
    db_path: Path,
    staging: Path,
    name: str,
    paths: Sequence[str | os.PathLike[str]],
    capture: Capture | None,
    by_rank: dict[int, ConvertedRank],
    skipped: list[dict[str, str]],
    found: Discovery,
    if_exists: IfExists,
    world: int | None = None,
    extra: Callable[[duckdb.DuckDBPyConnection, int], None] | None = None,
    extra_metadata: dict[str, Any] | None = None,
    runner: Runner | None = None,
) -> IngestReport:
    """Write the run: built in a staged store in `staging`, then moved into the store in one
    short transaction (tracelab.store.staged), so that readers wait for the move only.
    `extra(con, run_id)` adds more of its rows (the hang verdict, tracelab.hang.stored).
    `world`: the job's world size (world_size_of, or 1 for one rank read alone). `runner`:
    where the derived layer's per-rank batches run (tracelab.derived.part_batches; default
    this process)."""
    from tracelab.derived import errors as derived_errors
    from tracelab.derived import in_transaction
    from tracelab.store import open_store
    from tracelab.store.files import register_files
    from tracelab.store.staged import move_run, staged_store
    from tracelab.store_folder import make_root, run_folder

    report = IngestReport(
        run=name,
        run_id=None,
        ranks=sorted(by_rank),
        world_size=world,
        events=sum(i.event_count for cr in by_rank.values() for i in cr.infos),
        skipped=skipped,
        ignored=[str(p) for p in found.ignored],
    )
    # The run's id, handed out by the store (its sequence never hands one out twice), unless
    # the run is there already: a few milliseconds of the store's lock.
    with open_store(db_path, read_only=False) as con:
        old, unchanged = _existing(con, name, by_rank, skipped, extra_metadata, if_exists)
        if unchanged:
            report.run_id, report.unchanged = old, True
            return report
        rid = int(con.execute("SELECT nextval('run_id_seq')").fetchall()[0][0])
    # The run, whole, in a staged store (no lock held on the store): its rows, its events files
    # linked into its folder and listed, its small tables loaded, and the derived layer,
    # committed together. A derived component that fails inside DuckDB aborts the transaction:
    # the whole build is tried again without it (recorded in derived_errors: in_transaction).
    staged = staging / "run.duckdb"
    with staged_store(staged) as sc:
        files, memory = _link_files(make_root(sc) / run_folder(rid), by_rank)

        def build(skip: dict[str, str]) -> None:
            _insert_run(sc, rid, name, paths, capture, by_rank, skipped, world, extra_metadata)
            register_files(sc, rid, files, memory)
            _load(sc, rid, by_rank, capture, skip, runner)
            if extra is not None:
                extra(sc, rid)
            report.derived_errors = derived_errors(sc, rid)

        in_transaction(sc, build)
    with open_store(db_path, read_only=False) as con:
        # Another ingest may have written a run of this name meanwhile: decided again.
        old, unchanged = _existing(con, name, by_rank, skipped, extra_metadata, if_exists)
        if unchanged:
            report.run_id, report.unchanged, report.derived_errors = old, True, {}
            return report
        move_run(con, staged, rid, replacing=old)
    report.run_id = rid
    return report


def _existing(
    con: duckdb.DuckDBPyConnection,
    name: str,
    by_rank: dict[int, ConvertedRank],
    skipped: list[dict[str, str]],
    extra_metadata: dict[str, Any] | None,
    if_exists: IfExists,
) -> tuple[int | None, bool]:
    """The stored run of this name (None if none) and whether it is this one unchanged (the
    same traces' hashes, nothing skipped, the same SAME_RUN_KEYS); a different one is refused
    unless `if_exists` is "replace"."""
    row = con.execute("SELECT run_id FROM runs WHERE name = ?", [name]).fetchall()
    if not row:
        return None, False
    old = int(row[0][0])
    if _identical(con, old, by_rank) and not skipped and _same_metadata(con, old, extra_metadata):
        return old, True
    if if_exists == "refuse":
        raise UsageError(
            f"a run named {name!r} already exists with different content. "
            "Use --replace to overwrite it, or --run NEW_NAME to keep both."
        )
    return old, False


def _link_files(
    run_folder: Path, by_rank: dict[int, ConvertedRank]
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """The run's events files, and its trace memory files of at least one instant, laid out as
    the store folder holds them in the run's folder `run_folder` (run_rank_file), linked from the converted folders (copied where a link cannot be made,
    e.g. a collector's folder on another file system): (rank, offset, rows) per file, of each
    kind. The memory instants grow with the events (28k a rank of the 8-rank set's 123k): as
    rows they were loaded into the staged store and copied again under the store's lock."""
    from tracelab.store.files import run_rank_file

    files, memory = [], []
    for rank, cr in sorted(by_rank.items()):
        offset = instants = 0
        for info, folder in zip(cr.infos, cr.dirs, strict=True):
            _link(folder / "events.parquet", run_rank_file(run_folder, rank, "events", offset))
            files.append((rank, offset, info.event_count))
            if info.memory_event_count:
                _link(
                    folder / "memory.parquet", run_rank_file(run_folder, rank, "memory", instants)
                )
                memory.append((rank, instants, info.memory_event_count))
            offset += info.event_count
            instants += info.memory_event_count
    return files, memory


def _link(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def world_size_of(capture: Capture | None, by_rank: Mapping[int, ConvertedRank]) -> int | None:
    """The job's world size: the capture's manifest's, else the largest its traces name."""
    if capture is not None and isinstance(capture.manifest.get("world_size"), int):
        return int(capture.manifest["world_size"])
    sizes = {i.world_size for cr in by_rank.values() for i in cr.infos if i.world_size}
    return max(sizes) if sizes else None


def _insert_run(
    con: duckdb.DuckDBPyConnection,
    rid: int,
    name: str,
    paths: Sequence[str | os.PathLike[str]],
    capture: Capture | None,
    by_rank: dict[int, ConvertedRank],
    skipped: list[dict[str, str]],
    world: int | None,
    extra_metadata: dict[str, Any] | None = None,
) -> None:
    meta: dict[str, Any] = {"tracelab_version": __version__, **(extra_metadata or {})}
    if capture is not None:
        meta["manifest"] = capture.manifest
        meta["pipeline"] = capture.manifest.get("pipeline")
    con.execute(
        "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            rid,
            name,
            json.dumps([str(p) for p in paths]),
            dt.datetime.now(dt.timezone.utc).replace(tzinfo=None),
            world,
            len(by_rank),
            json.dumps(meta),
            json.dumps(skipped),
        ],
    )
    rows = []
    # Every rank of a job usually holds the same process-group configuration (one object, shared
    # by the pool: tracelab.ingest.pool), at 10,000 ranks a 59 KB list each: dumped once per
    # object and stored once per run (process_group_configs), each rank naming its number.
    dumped: dict[int, str] = {}
    configs: dict[str, int] = {}
    for rank, cr in sorted(by_rank.items()):
        first = cr.infos[0]
        entry = capture.ranks.get(rank, {}) if capture is not None else {}
        clock = entry.get("clock") or {}
        trace_meta = dict(first.metadata)
        trace_meta["tracelab_sha256"] = [i.sha256 for i in cr.infos]
        groups = entry.get("process_groups") or first.process_groups
        text = dumped.get(id(groups))
        if text is None:
            text = dumped[id(groups)] = json.dumps(groups)
        rows.append(
            (
                rid,
                rank,
                entry.get("host") or first.host,
                first.world_size or world,
                entry.get("backend") or first.backend,
                entry.get("device")
                or first.device
                or ("cpu" if first.device_properties is None else None),
                entry.get("device_memory_bytes") or first.device_memory_bytes,
                json.dumps([i.file for i in cr.infos]),
                sum(i.file_bytes for i in cr.infos),
                first.base_time_ns,
                clock.get("offset_ns"),
                clock.get("uncertainty_ns"),
                entry.get("pp_stage"),
                json.dumps(entry.get("coords")) if entry.get("coords") else None,
                json.dumps(first.device_properties) if first.device_properties else None,
                json.dumps(trace_meta),
                sum(i.event_count for i in cr.infos),
                configs.setdefault(text, len(configs)),
            )
        )
    insert_rows(con, "ranks", _RANK_COLUMNS, rows)
    insert_rows(
        con,
        "process_group_configs",
        ("run_id", "config", "process_groups"),
        [(rid, n, text) for text, n in configs.items()],
    )


#: The ranks table's columns, in the order of the rows _insert_run builds.
_RANK_COLUMNS = (
    "run_id",
    "rank",
    "host",
    "world_size",
    "backend",
    "device",
    "device_memory_bytes",
    "files",
    "file_bytes",
    "base_time_ns",
    "clock_offset_ns",
    "clock_uncertainty_ns",
    "pp_stage",
    "coords",
    "device_properties",
    "trace_metadata",
    "event_count",
    "process_groups_config",
)


def _parts(
    by_rank: dict[int, ConvertedRank],
) -> tuple[dict[str, list[str]], list[tuple[str, int, int]]]:
    """The converted files of each kind but the events and memory instants, which stay files
    (kind -> paths), and every file's (path, rank, offset of idx) for load_sql.part_files."""
    from tracelab.store.files import FILE_KINDS

    out: dict[str, list[str]] = {kind: [] for kind in PARQUET_KINDS if kind not in FILE_KINDS}
    entries: list[tuple[str, int, int]] = []
    for rank, cr in sorted(by_rank.items()):
        offset = 0
        for info, folder in zip(cr.infos, cr.dirs, strict=True):
            for kind in out:
                path = str(folder / f"{kind}.parquet")
                out[kind].append(path)
                entries.append((path, rank, offset))
            offset += info.event_count
    return out, entries


def _load(
    con: duckdb.DuckDBPyConnection,
    rid: int,
    by_rank: dict[int, ConvertedRank],
    capture: Capture | None,
    skip: dict[str, str],
    runner: Runner | None = None,
) -> None:
    parts, entries = _parts(by_rank)
    with load_sql.part_files(con, entries):
        _load_parts(con, rid, parts, by_rank)
    if capture is not None:
        load_capture_records(con, rid, capture, set(by_rank))
    from tracelab.derived import derive

    derive(con, rid, skip, runner)


def _load_parts(
    con: duckdb.DuckDBPyConnection,
    rid: int,
    parts: dict[str, list[str]],
    by_rank: dict[int, ConvertedRank],
) -> None:
    """The steps, lanes and collectives of the converted files (load_sql.PARTS); their memory
    instants stay in their files (_link_files)."""
    load_sql.load_steps(con, rid, parts["steps"])
    loaded = dict(
        con.execute(
            "SELECT rank, count(*) FROM events WHERE run_id = ? GROUP BY rank", [rid]
        ).fetchall()
    )
    expected = {rank: sum(i.event_count for i in cr.infos) for rank, cr in by_rank.items()}
    if loaded != expected:  # a bug, never an input error: the transaction rolls back
        raise RuntimeError(f"events landed on the wrong ranks: {loaded} != {expected}")
    load_sql.load_lanes(con, rid, parts["lanes"])
    load_sql.load_trace_collectives(con, rid, parts["collectives"])
