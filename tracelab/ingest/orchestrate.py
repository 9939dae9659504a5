"""Ingest: traces and captures in, one run in the store out, all or nothing.

The pipeline runs in one direction: discover files -> convert each (in parallel processes, with
memory bounded by one trace per worker, see tracelab.ingest.convert) -> resolve ranks -> build
the run in a staged store and move it into the store in one short transaction
(tracelab.ingest.write). Parsing happens before the store is opened, so a bad file never leaves
a half-written run, and the write lock is held only to take the run's id and for the move
(readers keep working).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracelab.defaults import DEFAULT_DB
from tracelab.derived import part_batches
from tracelab.errors import InputError, TracelabError, UsageError
from tracelab.hang import stored as hang_store
from tracelab.ingest import validate
from tracelab.ingest import workers as lifecycle
from tracelab.ingest.discover import (
    Capture,
    Discovery,
    capture_path,
    discover,
    tensorboard_name,
)
from tracelab.ingest.pool import Engine, convert_all
from tracelab.ingest.ranks import ConvertedRank, resolve_ranks
from tracelab.ingest.records import check_capture_records
from tracelab.ingest.write import (
    IfExists,
    IngestReport,
    staging_parent,
    world_size_of,
    write_run,
)
from tracelab.store_folder import prepare_store_path

if TYPE_CHECKING:
    pass

#: Below this much input, files are converted in-process rather than in a pool.
_POOL_MIN_BYTES = 8 << 20


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
    engine: Engine | None = None,
    mesh: Mapping[str, Any] | None = None,
) -> IngestReport:
    """Ingest trace files, folders or a capture folder into the store as one run.

    if_exists: "refuse" (default) errors when a run of that name exists, unless it was ingested
    from byte-identical files, in which case nothing changes; "replace" swaps it atomically.
    skip_bad: ingest the good ranks and record the bad files in the run; by default any bad
    file aborts and the store is left unchanged.
    mesh: the job's device mesh, {"names": [...], "shape": [...]} (`--mesh`), kept in the
    run's metadata; it names the process groups' parallel dimensions.
    """
    if not paths:
        raise UsageError("give at least one trace file or folder.")
    if if_exists not in ("refuse", "replace"):
        raise UsageError(f"if_exists must be 'refuse' or 'replace', not {if_exists!r}.")
    found: Discovery = _discover(paths)
    if found.problems and not skip_bad:
        raise found.problems[0]
    capture = found.captures[0] if found.captures else None
    name = _run_name(paths, run, capture)
    for key, rank in (ranks or {}).items():
        validate.integer(
            rank, f"--rank {key}", "--rank", lo=0, hi=validate.INT32_MAX - 1, optional=False
        )
    workers_n = _worker_count(found, workers)
    show = _progress_printer() if progress is None or progress else None
    db_path = Path(db)
    prepare_store_path(db_path)  # a path that cannot hold the store fails now, not converted
    _check_existing_store(db_path)
    staging = lifecycle.make_staging(staging_parent(db_path))
    try:
        with ExitStack() as session:
            runner, checked = _batch_runner(session, engine, workers_n, found, staging)
            done, errors = convert_all(found.files, staging, workers_n, show, engine)
            manifest_world = capture.manifest.get("world_size") if capture is not None else None
            by_rank, rank_errors, note = resolve_ranks(
                found.files, done, ranks or {}, paths, manifest_world
            )
            errors.update(rank_errors)
            if errors and not skip_bad:
                raise _first_error(errors, found)
            if not by_rank:
                first = errors[min(errors)] if errors else None
                raise InputError(
                    "no rank could be ingested, nothing was written"
                    + (f": {first}" if first else ".")
                )
            skipped = [{"file": p.path or "", "error": str(p)} for p in found.problems] + [
                {"file": str(found.files[i].path), "error": str(errors[i])} for i in sorted(errors)
            ]
            if capture is not None:
                capture, bad_records = _drop_bad_records(capture, set(by_rank), skip_bad)
                skipped += bad_records
            # (one rank read alone, `note`: a world of one)
            world = 1 if note else world_size_of(capture, by_rank)
            if mesh:
                _check_mesh(mesh, world, by_rank)
            hang, dumps = _hang_verdict(paths, found, capture, by_rank)
            skipped += hang.problems if hang is not None else ()
            digest = inputs_digest(capture, set(by_rank), dumps)
            metadata = {
                **({"mesh": dict(mesh)} if mesh else {}),
                **({"inputs_sha256": digest} if digest else {}),
            }
            report = write_run(
                db_path,
                staging,
                name,
                paths,
                capture,
                by_rank,
                skipped,
                found,
                if_exists,
                world=world,
                extra=None if hang is None else partial(hang_store.write, hang=hang),
                extra_metadata=metadata or None,
                runner=runner,
            )
            report.notes.extend(checked)
            if note:
                report.notes.append(note)
            if hang is not None:
                report.notes.append(hang.note)
            return report
    finally:
        lifecycle.remove_staging(staging)


def _check_existing_store(db: Path) -> None:
    """A store the write would refuse (another schema or derived version, not a tracelab
    store, a listed file gone from its folder) is refused before any trace is converted: it was refused after every conversion
    (2.6 s of a 16-rank ingest, the whole ingest's conversions at scale). A store another
    process holds now is left to the write's own open, which waits for it."""
    if not db.is_file():
        return  # (a new store: nothing to check, and DuckDB's import stays beside the workers)
    import duckdb

    from tracelab.connections import connect
    from tracelab.store.files import check_files_present
    from tracelab.store.versions import check_version

    try:
        con = connect(str(db), read_only=True)
    except duckdb.Error:
        return
    try:
        check_version(con, str(db))
        check_files_present(con)  # (a store missing a listed file fails the move, or later)
    finally:
        con.close()


def _check_mesh(
    mesh: Mapping[str, Any], world: int | None, by_rank: Mapping[int, ConvertedRank]
) -> None:
    """`--mesh` must cover the job's ranks, as the traces say them: one that does not was
    stored, and the run's analysis failed later (after printing findings matched across the
    mesh's wrong groups)."""
    size = math.prod(int(s) for s in mesh.get("shape") or [])
    ranks = max(world or 0, max(by_rank) + 1)
    if size != ranks:
        given = ",".join(f"{n}={s}" for n, s in zip(mesh["names"], mesh["shape"], strict=False))
        raise UsageError(
            f"--mesh {given} covers {size:,} ranks, but the traces are of a job of {ranks}: give "
            "the job's whole mesh, outermost dimension first (init_device_mesh's order), whose "
            f"sizes multiply to {ranks}."
        )


def _batch_runner(
    session: ExitStack, engine: Engine | None, workers: int, found: Discovery, staging: Path
) -> tuple[part_batches.Runner | None, list[str]]:
    """Where the derived layer's per-rank batches run: on the Ray cluster that converts the
    files (its session kept open for the write, in `session`), else in this process. A
    cluster this ingest joins (an address, or a caller's own session) is first checked to
    see the traces and the staging folder from every node (ray_engine.check_shared, whose
    notes come back); a local instance of the ingest's own runs on this machine only."""
    if engine is None or engine.name != "ray":
        return None, []
    from tracelab.ingest.ray_engine import batch_runner, check_shared, connected, import_ray

    joined = engine.address is not None or import_ray().is_initialized()
    ray = session.enter_context(connected(engine.address, workers or None))
    notes = (
        check_shared(ray, engine.address, [f.path for f in found.files], staging) if joined else []
    )
    return batch_runner(ray), notes


def _discover(paths: Sequence[str | os.PathLike[str]]) -> Discovery:
    """discover(), with the `tracelab hang` command named when the paths hold Flight Recorder
    dumps and no trace (a job that hung before its profiler wrote one: no run to make)."""
    try:
        return discover(list(paths))
    except InputError as exc:
        hint = hang_store.dumps_only_hint(Path(p) for p in paths)
        if hint is None:
            raise
        raise InputError(f"{hint} ({exc})") from exc


def _hang_verdict(
    paths: Sequence[str | os.PathLike[str]],
    found: Discovery,
    capture: Capture | None,
    by_rank: Mapping[int, ConvertedRank],
) -> tuple[hang_store.StoredHang | None, list[Path]]:
    """The verdict of the run's Flight Recorder dumps (a capture's flight-recorder/, PyTorch's
    nccl_trace_rank_N next to the traces), read before the store opens (None without dumps),
    and the dumps. The dumps found are no longer listed as ignored files."""
    folders = [c.root for c in found.captures] + [Path(p) for p in paths if Path(p).is_dir()]
    dumps = hang_store.find_dumps(folders, found.ignored)
    used = {p.resolve() for p in dumps}
    found.ignored = [p for p in found.ignored if p.resolve() not in used]
    world = capture.manifest.get("world_size") if capture is not None else None
    sizes = [i.world_size for cr in by_rank.values() for i in cr.infos if i.world_size]
    world = world if isinstance(world, int) else max(sizes, default=None)
    return hang_store.prepare(dumps, world), dumps


def inputs_digest(capture: Capture | None, ranks: set[int], dumps: Sequence[Path]) -> str | None:
    """SHA-256 of what a run is made of besides its traces (whose hashes each rank keeps): a
    capture's manifest (with its memory peaks), the collectives records of `ranks`, and the
    Flight Recorder dumps; None when there is none of it. A re-ingest of the same traces with
    any of these changed is a different run, not "nothing to do\"."""
    parts: list[tuple[str, bytes]] = []
    if capture is not None:
        parts.append(("manifest", json.dumps(capture.manifest, sort_keys=True).encode()))
        for rank in sorted(ranks):
            rel = capture.ranks.get(rank, {}).get("collectives")
            if rel:
                path = capture_path(capture, rel, f"rank {rank}'s collectives")
                parts.append((f"collectives {rank}", path.read_bytes() if path.is_file() else b""))
    for dump in sorted(dumps):
        parts.append((f"dump {dump.name}", dump.read_bytes()))
    if not parts:
        return None
    h = hashlib.sha256()
    for label, data in parts:
        h.update(f"{label}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def _run_name(
    paths: Sequence[str | os.PathLike[str]], run: str | None, capture: Capture | None
) -> str:
    """The run's name: `run` when given, else one made from the capture or the paths."""
    if run is not None:
        return validate.run_name(run)
    named_by = (
        capture.root / "manifest.json"
        if capture is not None and capture.manifest.get("run_name")
        else paths[0]
    )
    return validate.ingest_run_name(_default_run_name(paths, capture), str(named_by))


def _worker_count(found: Discovery, workers: int | None) -> int:
    """Worker processes for the conversion (0: convert in this process)."""
    if workers is not None:
        return 0 if workers <= 1 else workers
    total = sum(tf.path.stat().st_size for tf in found.files)
    # A process pool costs more than it saves on small inputs; on large ones it is used
    # even for one file, which keeps this process free of the conversion's imports.
    return 0 if total < _POOL_MIN_BYTES else min(os.cpu_count() or 1, len(found.files))


def _first_error(errors: dict[int, TracelabError], found: Discovery) -> TracelabError:
    """The first file's error, naming how many other files failed too (without --skip-bad)."""
    exc = errors[min(errors)]
    others = [i for i in sorted(errors) if errors[i] is not exc]
    if others:
        listed = ", ".join(str(found.files[i].path) for i in others[:3])
        exc.args = (
            f"{exc.args[0]} ({len(others)} more files could not be ingested: {listed}"
            f"{', ...' if len(others) > 3 else ''}). Nothing was written; "
            "--skip-bad ingests the good ranks and records the others.",
        )
    return exc


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
