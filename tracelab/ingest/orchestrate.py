"""Ingest: traces and captures in, one run in the store out, all or nothing.

The pipeline runs in one direction: discover files -> convert each (in parallel processes, with
memory bounded by one trace per worker, see tracelab.convert) -> resolve ranks -> one short write
transaction. Parsing happens before the store is opened, so a bad file never leaves a
half-written run, and the write lock is held only for the final load (readers keep working).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tracelab import __version__, load_sql, validate
from tracelab import workers as lifecycle
from tracelab.convert import (
    PARQUET_KINDS,
    TraceInfo,
    convert_trace,
    converted_dir,
    load_converted,
)
from tracelab.defaults import DEFAULT_DB
from tracelab.discover import Capture, Discovery, TraceFile, discover, tensorboard_name
from tracelab.errors import (
    InputError,
    InternalError,
    RankConflictError,
    TracelabError,
    UsageError,
)
from tracelab.records import check_capture_records, load_capture_records

if TYPE_CHECKING:
    import duckdb

IfExists = Literal["refuse", "replace"]
#: Below this much input, files are converted in-process rather than in a pool.
_POOL_MIN_BYTES = 8 << 20


@dataclass(frozen=True, kw_only=True)
class ConvertedRank:
    rank: int
    infos: list[TraceInfo]
    dirs: list[Path]


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


def _convert_one(path: str, out_dir: str) -> TraceInfo:
    return convert_trace(path, out_dir)


class _NoPandas:
    """A meta-path entry that makes `import pandas` fail (see _worker_init)."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> None:
        if name == "pandas":
            raise ImportError("conversion workers do not use pandas")


def _worker_init(parent_pid: int | None = None) -> None:
    """Conversion workers die with their parent (tracelab.workers). They never use pandas, but
    pyarrow imports it (a third of a second per worker) the first time it checks whether an
    argument is a pandas object. Let that check run once while pandas cannot be imported, so
    pyarrow records it as absent in this process."""
    if parent_pid is not None:
        lifecycle.init_worker(parent_pid)
    if "pandas" in sys.modules:
        return
    import pyarrow as pa

    sys.meta_path.insert(0, _NoPandas)
    try:
        pa.scalar(0)
    finally:
        sys.meta_path.remove(_NoPandas)


def _file_error(exc: BaseException, path: Path) -> TracelabError:
    """A per-file failure: input errors as they are, anything else an InternalError naming the
    file (--skip-bad skips either)."""
    if isinstance(exc, TracelabError):
        return exc
    err = InternalError(f"{type(exc).__name__}: {exc}", str(path))
    err.__cause__ = exc
    return err


def _share_groups(info: TraceInfo, seen: dict[str, list[dict[str, Any]]]) -> TraceInfo:
    """One shared copy of each distinct process-group config: every rank's trace repeats the
    groups with all their member ranks, so keeping a copy per rank made the ingest's memory
    grow with ranks squared (2,048 ranks: 158 MB of pg_config lists)."""
    key = json.dumps(info.process_groups, sort_keys=True)
    shared = seen.setdefault(key, info.process_groups)
    return info if shared is info.process_groups else replace(info, process_groups=shared)


def _convert_all(
    files: list[TraceFile],
    staging: Path,
    workers: int,
    progress: Callable[[int, int], None] | None,
) -> tuple[dict[int, tuple[TraceInfo, Path]], dict[int, TracelabError]]:
    """Convert every file, in this process (workers == 0) or in a pool of worker processes;
    returns per-file-index results and errors (never raises for input)."""
    done: dict[int, tuple[TraceInfo, Path]] = {}
    errors: dict[int, TracelabError] = {}
    groups: dict[str, list[dict[str, Any]]] = {}
    out_dirs = [staging / f"f{i}" for i in range(len(files))]
    for i, tf in enumerate(files):
        # Converted on its rank already (collector): register it, parse nothing.
        try:
            pre = load_converted(tf.path)
        except Exception as exc:  # noqa: BLE001 (per-file failure policy)
            errors[i] = _file_error(exc, tf.path)
            continue
        if pre is not None:
            done[i] = (
                _share_groups(replace(pre, file=str(tf.path)), groups),
                converted_dir(tf.path),
            )
    todo = [i for i in range(len(files)) if i not in done and i not in errors]
    if workers == 0 or not todo:
        for n, i in enumerate(todo, 1):
            tf = files[i]
            try:
                done[i] = (
                    _share_groups(_convert_one(str(tf.path), str(out_dirs[i])), groups),
                    out_dirs[i],
                )
            except Exception as exc:  # noqa: BLE001 (per-file failure policy)
                errors[i] = _file_error(exc, tf.path)
            if progress:
                progress(n, len(todo))
        return done, errors
    pool = ProcessPoolExecutor(
        max_workers=min(workers, len(todo)), initializer=_worker_init, initargs=(os.getpid(),)
    )
    try:
        futures = {pool.submit(_convert_one, str(files[i].path), str(out_dirs[i])): i for i in todo}
        # While the workers convert, load what the store's load will need (DuckDB: a fifth of
        # a second of imports otherwise spent after the last file is converted).
        import tracelab.store  # noqa: F401

        # Not as_completed, which keeps every future (and its result) until the last: each
        # future is dropped once read, so only the shared process groups stay (_share_groups).
        pending, n = set(futures), 0
        orphaned: list[int] = []
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                i = futures.pop(fut)
                try:
                    done[i] = (_share_groups(fut.result(), groups), out_dirs[i])
                except BrokenProcessPool:
                    orphaned.append(i)  # some worker died: which file killed it is unknown
                    continue
                except Exception as exc:  # noqa: BLE001 (per-file failure policy)
                    errors[i] = _file_error(exc, files[i].path)
                n += 1
                if progress:
                    progress(n, len(todo))
    except BaseException:
        lifecycle.kill_pool(pool)  # Ctrl-C, SIGTERM: stop now, not after the current files
        raise
    pool.shutdown()
    for i in sorted(orphaned):
        try:
            done[i] = (
                _share_groups(_convert_isolated(files[i].path, out_dirs[i]), groups),
                out_dirs[i],
            )
        except Exception as exc:  # noqa: BLE001 (per-file failure policy)
            errors[i] = _file_error(exc, files[i].path)
        n += 1
        if progress:
            progress(n, len(todo))
    return done, errors


def _convert_isolated(path: Path, out_dir: Path) -> TraceInfo:
    """Convert one file alone in a fresh worker process: after a worker died, each file the
    broken pool left unconverted is retried this way, so the others still ingest and only the
    file that kills its process is reported, by name."""
    shutil.rmtree(out_dir, ignore_errors=True)  # what the dead worker may have half-written
    pool = ProcessPoolExecutor(max_workers=1, initializer=_worker_init, initargs=(os.getpid(),))
    try:
        return pool.submit(_convert_one, str(path), str(out_dir)).result()
    except BrokenProcessPool:
        raise InternalError(
            "the process converting this file died abruptly (a crash in tracelab's converter, "
            "or the system's out-of-memory killer), and did again when retried alone",
            str(path),
        ) from None
    except BaseException:
        lifecycle.kill_pool(pool)
        raise
    finally:
        pool.shutdown()


def _match_user_rank(path: Path, ranks: Mapping[str, int]) -> int | None:
    keys = [str(path), path.name, str(path.resolve())]
    tb = tensorboard_name(path)
    if tb is not None:
        keys.append(tb[0])  # --rank WORKER=N maps every window of that worker
    for key in keys:
        if key in ranks:
            return ranks[key]
    return None


def _process_key(path: Path) -> str:
    """Files that one process wrote: a tensorboard_trace_handler worker's windows share its
    worker name; any other file stands alone."""
    tb = tensorboard_name(path)
    return f"worker:{tb[0]}" if tb is not None else f"file:{path.resolve()}"


def _rank_key(path: Path, others: Sequence[Path]) -> str:
    """The shortest --rank key that names `path` (and only its own process's files)."""
    tb = tensorboard_name(path)
    if tb is not None:
        return tb[0]
    same_name = [o for o in others if o.name == path.name and o.resolve() != path.resolve()]
    return str(path) if same_name else path.name


def _missing_ranks_error(
    files: list[TraceFile],
    rankless: list[int],
    taken: set[int],
    paths: Sequence[str | os.PathLike[str]],
) -> RankConflictError:
    """One error for every trace without a rank, with the command that maps them."""
    all_paths = [files[i].path for i in rankless]
    keys = sorted({_rank_key(p, all_paths) for p in all_paths})
    free = (r for r in range(len(keys) + len(taken)) if r not in taken)
    mapping = " ".join(f"--rank {shlex.quote(k)}={r}" for k, r in zip(keys, free))
    command = "tracelab ingest " + " ".join(shlex.quote(str(p)) for p in paths) + f" {mapping}"
    shown = ", ".join(str(p) for p in all_paths[:4]) + (", ..." if len(all_paths) > 4 else "")
    return RankConflictError(
        f"{len(all_paths)} trace{'s have' if len(all_paths) > 1 else ' has'} no rank (no "
        f"distributedInfo.rank, no capture manifest): {shown}. A single trace is taken as rank 0 "
        "of 1, but here ranks cannot be told apart, and tracelab does not guess them. Map each "
        f"to the rank it ran as, e.g.: {command}"
        + (" (numbered in name order here: check them)" if len(keys) > 1 else "")
    )


def _order_windows(files: list[TraceFile], idxs: list[int]) -> list[int] | None:
    """The files of one rank in window order, or None when they cannot be one rank's windows:
    a capture's windows, or one tensorboard_trace_handler worker's files by time stamp."""
    if len(idxs) == 1:
        return idxs
    if all(files[i].rank is not None for i in idxs):
        if len({files[i].window for i in idxs}) == len(idxs):
            return sorted(idxs, key=lambda i: files[i].window)
        return None
    names = [tensorboard_name(files[i].path) for i in idxs]
    if all(n is not None for n in names) and len({n[0] for n in names if n}) == 1:
        stamps = {i: n[1] for i, n in zip(idxs, names) if n}
        if len(set(stamps.values())) == len(idxs):
            return sorted(idxs, key=stamps.__getitem__)
    return None


def _resolve_ranks(
    files: list[TraceFile],
    done: dict[int, tuple[TraceInfo, Path]],
    user_ranks: Mapping[str, int],
    paths: Sequence[str | os.PathLike[str]] = (),
    world_size: int | None = None,
) -> tuple[dict[int, ConvertedRank], dict[int, TracelabError], str | None]:
    """Group converted files by rank; missing or doubly-claimed ranks become per-file errors.

    Traces without a rank that one process wrote (a single file, or one tensorboard worker's
    windows), when nothing else is ingested with them, are rank 0 of 1; the note says so."""
    by_rank: dict[int, list[int]] = {}
    errors: dict[int, TracelabError] = {}
    rankless: list[int] = []
    for i in sorted(done):
        tf = files[i]
        info, _ = done[i]
        rank = _match_user_rank(tf.path, user_ranks)
        if rank is None:
            rank = tf.rank if tf.rank is not None else info.rank
        world = world_size if world_size is not None else info.world_size
        if rank is not None and world is not None and rank >= world:
            errors[i] = RankConflictError(
                f"rank {rank} is not below the world size {world} (ranks are 0..{world - 1}). "
                "Map the file to its rank with --rank FILE=N, or check the capture's "
                "world_size.",
                str(tf.path),
            )
            continue
        if rank is None:
            rankless.append(i)
            continue
        by_rank.setdefault(rank, []).append(i)
    note = None
    if rankless:
        if not by_rank and len({_process_key(tf.path) for tf in files}) == 1:
            by_rank[0] = rankless
            what = (
                f"{files[rankless[0]].path}"
                if len(rankless) == 1
                else f"the {len(rankless)} windows of worker "
                f"{_rank_key(files[rankless[0]].path, [])}"
            )
            note = (
                f"{what} {'has' if len(rankless) == 1 else 'have'} no rank metadata (no distributedInfo): ingested as rank 0 of 1. "
                "If it is one rank of a larger job, re-ingest with --replace --rank "
                f"{shlex.quote(_rank_key(files[rankless[0]].path, []))}=N."
            )
        else:
            exc = _missing_ranks_error(files, rankless, set(by_rank), paths)
            errors.update(dict.fromkeys(rankless, exc))
    out: dict[int, ConvertedRank] = {}
    for rank, idxs in sorted(by_rank.items()):
        ordered = _order_windows(files, idxs)
        if ordered is None:
            names = ", ".join(str(files[i].path) for i in idxs)
            for i in idxs:
                errors[i] = RankConflictError(
                    f"rank {rank} is claimed by {len(idxs)} files: {names}. They are probably "
                    "from different runs: ingest them separately (--run), or map ranks "
                    "explicitly with --rank FILE=N.",
                    str(files[i].path),
                )
            continue
        out[rank] = ConvertedRank(
            rank=rank, infos=[done[i][0] for i in ordered], dirs=[done[i][1] for i in ordered]
        )
    return out, errors, note


def _default_run_name(paths: Sequence[str | os.PathLike[str]], capture: Capture | None) -> str:
    if capture is not None and capture.manifest.get("run_name"):
        return str(capture.manifest["run_name"])
    first = Path(paths[0]).resolve()
    tb = tensorboard_name(first) if len(paths) == 1 else None
    if tb is not None:
        return tb[0]  # host_pid, not host_pid.<time stamp>.pt.trace
    name = first.name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name or "run"


def _progress_printer() -> Callable[[int, int], None] | None:
    if not sys.stderr.isatty():
        return None

    def show(n: int, total: int) -> None:
        width = 30
        filled = int(width * n / total)
        sys.stderr.write(f"\rconverting [{'#' * filled}{'.' * (width - filled)}] {n}/{total} files")
        if n == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show


def ingest(
    paths: Sequence[str | os.PathLike[str]],
    db: str | os.PathLike[str] = DEFAULT_DB,
    *,
    run: str | None = None,
    ranks: Mapping[str, int] | None = None,
    if_exists: IfExists = "refuse",
    skip_bad: bool = False,
    workers: int | None = None,
    progress: bool | None = None,
) -> IngestReport:
    """Ingest trace files, folders or a capture folder into the store as one run.

    if_exists: "refuse" (default) errors when a run of that name exists, unless it was ingested
    from byte-identical files, in which case nothing changes; "replace" swaps it atomically.
    skip_bad: ingest the good ranks and record the bad files in the run; by default any bad
    file aborts and the store is left unchanged.
    """
    if not paths:
        raise UsageError("give at least one trace file or folder.")
    if if_exists not in ("refuse", "replace"):
        raise UsageError(f"if_exists must be 'refuse' or 'replace', not {if_exists!r}.")
    found: Discovery = discover(list(paths))
    if found.problems and not skip_bad:
        raise found.problems[0]
    capture = found.captures[0] if found.captures else None
    named_by = (
        capture.root / "manifest.json"
        if capture is not None and capture.manifest.get("run_name")
        else paths[0]
    )
    name = (
        validate.run_name(run)
        if run is not None
        else validate.ingest_run_name(_default_run_name(paths, capture), str(named_by))
    )
    for key, rank in (ranks or {}).items():
        validate.integer(
            rank, f"--rank {key}", "--rank", lo=0, hi=validate.INT32_MAX - 1, optional=False
        )
    if workers is None:
        total = sum(tf.path.stat().st_size for tf in found.files)
        # A process pool costs more than it saves on small inputs; on large ones it is used
        # even for one file, which keeps this process free of the conversion's imports.
        workers_n = 0 if total < _POOL_MIN_BYTES else min(os.cpu_count() or 1, len(found.files))
    else:
        workers_n = 0 if workers <= 1 else workers
    show = _progress_printer() if progress is None or progress else None
    db_path = Path(db)
    staging = lifecycle.make_staging(_staging_parent(db_path))
    try:
        done, errors = _convert_all(found.files, staging, workers_n, show)
        manifest_world = capture.manifest.get("world_size") if capture is not None else None
        by_rank, rank_errors, note = _resolve_ranks(
            found.files, done, ranks or {}, paths, manifest_world
        )
        errors.update(rank_errors)
        if errors and not skip_bad:
            exc = errors[min(errors)]
            others = [i for i in sorted(errors) if errors[i] is not exc]
            if others:
                listed = ", ".join(str(found.files[i].path) for i in others[:3])
                exc.args = (
                    f"{exc.args[0]} ({len(others)} more files could not be ingested: {listed}"
                    f"{', ...' if len(others) > 3 else ''}). Nothing was written; "
                    "--skip-bad ingests the good ranks and records the others.",
                )
            raise exc
        if not by_rank:
            first = errors[min(errors)] if errors else None
            raise InputError(
                "no rank could be ingested, nothing was written" + (f": {first}" if first else ".")
            )
        skipped = [{"file": p.path or "", "error": str(p)} for p in found.problems] + [
            {"file": str(found.files[i].path), "error": str(errors[i])} for i in sorted(errors)
        ]
        if capture is not None:
            capture, bad_records = _drop_bad_records(capture, set(by_rank), skip_bad)
            skipped += bad_records
        report = _write(
            db_path,
            staging,
            name,
            paths,
            capture,
            by_rank,
            skipped,
            found,
            if_exists,
            world=1 if note else None,
        )
        if note:
            report.notes.append(note)
        return report
    finally:
        lifecycle.remove_staging(staging)


def _drop_bad_records(
    capture: Capture, ranks: set[int], skip_bad: bool
) -> tuple[Capture, list[dict[str, str]]]:
    """Check the capture's collectives.jsonl files before anything is written: the first bad
    one raises, or with skip_bad it is left out (its rank's traces are kept) and recorded."""
    bad = check_capture_records(capture, ranks)
    if not bad:
        return capture, []
    if not skip_bad:
        raise bad[min(bad)]
    kept = {
        r: ({k: v for k, v in e.items() if k != "collectives"} if r in bad else e)
        for r, e in capture.ranks.items()
    }
    return replace(capture, ranks=kept), [
        {"file": exc.path or "", "error": str(exc)} for _, exc in sorted(bad.items())
    ]


def _staging_parent(db_path: Path) -> str | None:
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


def _write(
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
) -> IngestReport:
    from tracelab.store import delete_run, open_store

    world = world or _world_size(capture, by_rank)
    report = IngestReport(
        run=name,
        run_id=None,
        ranks=sorted(by_rank),
        world_size=world,
        events=sum(i.event_count for cr in by_rank.values() for i in cr.infos),
        skipped=skipped,
        ignored=[str(p) for p in found.ignored],
    )
    from tracelab.derived import ComponentFailed
    from tracelab.derived import errors as derived_errors

    # A derived component that fails inside DuckDB aborts the transaction: the whole write is
    # tried again without it (its failure recorded in derived_errors), so the run still lands.
    skip: dict[str, str] = {}
    with open_store(db_path, read_only=False) as con:
        while True:
            con.execute("BEGIN TRANSACTION")
            try:
                row = con.execute("SELECT run_id FROM runs WHERE name = ?", [name]).fetchone()
                if row is not None:
                    if _identical(con, int(row[0]), by_rank) and not skipped:
                        con.execute("ROLLBACK")
                        report.run_id, report.unchanged = int(row[0]), True
                        return report
                    if if_exists == "refuse":
                        raise UsageError(
                            f"a run named {name!r} already exists with different content. "
                            "Use --replace to overwrite it, or --run NEW_NAME to keep both."
                        )
                    delete_run(con, int(row[0]))
                rid = int(con.execute("SELECT nextval('run_id_seq')").fetchall()[0][0])
                _insert_run(con, rid, name, paths, capture, by_rank, skipped, world)
                _load(con, rid, staging, by_rank, capture, skip)
                report.derived_errors = derived_errors(con, rid)
                con.execute("COMMIT")
                break
            except ComponentFailed as exc:
                con.execute("ROLLBACK")
                skip[exc.component] = exc.reason
            except BaseException:
                con.execute("ROLLBACK")
                raise
    report.run_id = rid
    return report


def _world_size(capture: Capture | None, by_rank: dict[int, ConvertedRank]) -> int | None:
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
) -> None:
    meta: dict[str, Any] = {"tracelab_version": __version__}
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
    for rank, cr in sorted(by_rank.items()):
        first = cr.infos[0]
        entry = capture.ranks.get(rank, {}) if capture is not None else {}
        clock = entry.get("clock") or {}
        trace_meta = dict(first.metadata)
        trace_meta["tracelab_sha256"] = [i.sha256 for i in cr.infos]
        rows.append(
            [
                rid,
                rank,
                entry.get("host") or first.host,
                first.world_size or world,
                entry.get("backend") or first.backend,
                entry.get("device")
                or first.device
                or ("cpu" if first.device_properties is None else None),
                entry.get("device_memory_bytes") or first.device_memory_bytes,
                json.dumps(entry.get("process_groups") or first.process_groups),
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
            ]
        )
    con.executemany("INSERT INTO ranks VALUES (" + ", ".join("?" for _ in range(18)) + ")", rows)


def _parts(staging: Path, by_rank: dict[int, ConvertedRank]) -> dict[str, list[str]]:
    """Each converted file linked as `parts/rR-oK.KIND.parquet` (load_sql.PARTS), so that the
    load reads a file's rank and idx offset from its name: kind -> paths."""
    out: dict[str, list[str]] = {kind: [] for kind in PARQUET_KINDS}
    parts = staging / "parts"
    shutil.rmtree(parts, ignore_errors=True)  # a retried write links them again
    parts.mkdir()
    for rank, cr in sorted(by_rank.items()):
        offset = 0
        for info, folder in zip(cr.infos, cr.dirs, strict=True):
            for kind in PARQUET_KINDS:
                link = parts / f"r{rank}-o{offset}.{kind}.parquet"
                try:
                    link.symlink_to((folder / f"{kind}.parquet").resolve())
                except OSError:  # no symlinks here: copy
                    shutil.copyfile(folder / f"{kind}.parquet", link)
                out[kind].append(str(link))
            offset += info.event_count
    return out


def _load(
    con: duckdb.DuckDBPyConnection,
    rid: int,
    staging: Path,
    by_rank: dict[int, ConvertedRank],
    capture: Capture | None,
    skip: dict[str, str],
) -> None:
    parts = _parts(staging, by_rank)
    load_sql.load_events(con, rid, parts["events"], parts["steps"])
    loaded = dict(
        con.execute(
            "SELECT rank, count(*) FROM events WHERE run_id = ? GROUP BY rank", [rid]
        ).fetchall()
    )
    expected = {rank: sum(i.event_count for i in cr.infos) for rank, cr in by_rank.items()}
    if loaded != expected:  # a bug, never an input error: the transaction rolls back
        raise RuntimeError(f"events landed on the wrong ranks: {loaded} != {expected}")
    load_sql.load_trace_memory(con, rid, parts["memory"])
    load_sql.load_lanes(con, rid, parts["lanes"])
    load_sql.load_trace_collectives(con, rid)
    if capture is not None:
        load_capture_records(con, rid, capture, set(by_rank))
    from tracelab.derived import derive

    derive(con, rid, skip)
