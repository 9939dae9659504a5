"""Converting an ingest's files: in-process for small inputs, else a process pool of one trace
per worker (memory bounded by one trace); a worker that dies costs only the file that kills it."""

from __future__ import annotations

import os
import queue
import shutil
import sys
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tracelab.errors import (
    InternalError,
    TracelabError,
)
from tracelab.ingest import workers as lifecycle
from tracelab.ingest.convert import convert_trace
from tracelab.ingest.converted import TraceInfo, converted_dir, load_converted
from tracelab.ingest.discover import TraceFile

if TYPE_CHECKING:
    pass


@dataclass(frozen=True, kw_only=True)
class Engine:
    """Where the files are converted: "local" (this machine's process pool, the default) or
    "ray" (Ray tasks on the cluster at `address`, or on a local Ray instance)."""

    name: Literal["local", "ray"] = "local"
    address: str | None = None


def _convert_one(path: str, out_dir: str) -> TraceInfo:
    """Convert one file into the ingest's staging folder `out_dir` (its TraceInfo travels back
    as the result, not as a file)."""
    return convert_trace(path, out_dir, info_file=False)


class _NoPandas:
    """A meta-path entry that makes `import pandas` fail (pyarrow_without_pandas)."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> None:
        if name == "pandas":
            raise ImportError("this process does not use pandas")


def _worker_init(parent_pid: int | None = None) -> None:
    """Conversion workers die with their parent (tracelab.ingest.workers) and never use
    pandas (pyarrow_without_pandas)."""
    if parent_pid is not None:
        lifecycle.init_worker(parent_pid)
    pyarrow_without_pandas()


def pyarrow_without_pandas() -> None:
    """pyarrow imports pandas (a quarter to a third of a second) the first time it checks
    whether an argument is a pandas object (pa.array of a list). In a process that never
    hands pyarrow a pandas object, let that check run once while pandas cannot be imported,
    so pyarrow records it as absent: the conversion workers, and `tracelab ingest`'s own
    process (not `tracelab open`'s, whose app uses pandas; not the Python API's, whose caller
    may). No-op where pandas is already imported."""
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


def _share_groups(info: TraceInfo, seen: Groups) -> TraceInfo:
    """One shared copy of each distinct process-group config: every rank's trace repeats the
    groups with all their member ranks, so keeping a copy per rank made the ingest's memory
    grow with ranks squared (2,048 ranks: 158 MB of pg_config lists). Configs are compared
    by value (==, in C) among those of the same outline (names, sizes, list lengths): a JSON
    dump per rank as the key took 1.8 ms a rank at 10,000 ranks (3.6 s of 2,000 ranks)."""
    groups = info.process_groups
    outline = tuple(_outline(g) for g in groups)
    same = seen.setdefault(outline, [])
    for shared in same:
        if shared == groups:
            return info if shared is groups else replace(info, process_groups=shared)
    same.append(groups)
    return info


Done = dict[int, tuple[TraceInfo, Path]]
Errors = dict[int, TracelabError]


def _outline(group: Any) -> tuple[str, str, int]:
    """A group's name, size and length of its rank list, whatever the trace put there."""
    if not isinstance(group, dict):
        return (type(group).__name__, "", -1)
    members = group.get("ranks")
    return (
        str(group.get("pg_name")),
        str(group.get("pg_size")),
        len(members) if isinstance(members, list) else -1,
    )


#: Distinct process-group configs seen, by outline (_share_groups).
Groups = dict[tuple[tuple[str, str, int], ...], list[list[dict[str, Any]]]]
Progress = Callable[[int, int], None] | None


def convert_all(
    files: list[TraceFile],
    staging: Path,
    workers: int,
    progress: Progress,
    engine: Engine | None = None,
) -> tuple[Done, Errors]:
    """Convert every file, in this process (workers == 0), in a pool of worker processes, or
    as Ray tasks (`engine`); returns per-file-index results and errors (never raises for
    input)."""
    done: Done = {}
    errors: Errors = {}
    groups: Groups = {}
    out_dirs = [staging / f"f{i}" for i in range(len(files))]
    on_ray = engine if engine is not None and engine.name == "ray" else None
    if on_ray is None:  # (Ray's tasks register what is converted, where the traces are read)
        _register_converted(files, done, errors, groups, workers)
    todo = [i for i in range(len(files)) if i not in done and i not in errors]
    if on_ray is not None and todo:
        from tracelab.ingest.ray_engine import convert_on_ray

        got, failed = convert_on_ray(
            [files[i].path for i in todo],
            address=on_ray.address,
            workers=workers or None,
            progress=progress,
        )
        for j, (info, folder) in got.items():
            done[todo[j]] = (_share_groups(info, groups), folder)
        errors.update({todo[j]: err for j, err in failed.items()})
        return done, errors
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
    orphaned, n = _convert_in_pool(files, out_dirs, todo, workers, progress, done, errors, groups)
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


def _register_converted(
    files: list[TraceFile], done: Done, errors: Errors, groups: Groups, workers: int
) -> None:
    """Files converted on their rank already (collector): register them, parse nothing. Each
    folder's trace is hashed to prove it unchanged (load_converted), on `workers` threads at
    once (hashlib and file reads release the GIL): one after another, the 8-rank set's 430 MB
    took 0.34 s of a 0.40 s registration."""

    def check(tf: TraceFile) -> TraceInfo | BaseException | None:
        try:
            return load_converted(tf.path)
        except Exception as exc:  # noqa: BLE001 (per-file failure policy)
            return exc

    threads = ThreadPoolExecutor(max(1, min(workers, len(files))), "tracelab-register")
    try:
        # A chunk of files at a time, so the results waiting to share their process groups
        # (_share_groups: 60 KB a rank at 10,000 ranks) are a chunk's, never every file's.
        for lo in range(0, len(files), _REGISTER_CHUNK):
            chunk = files[lo : lo + _REGISTER_CHUNK]
            for i, (tf, pre) in enumerate(zip(chunk, threads.map(check, chunk), strict=True), lo):
                if isinstance(pre, BaseException):
                    errors[i] = _file_error(pre, tf.path)
                elif pre is not None:
                    done[i] = (
                        _share_groups(replace(pre, file=str(tf.path)), groups),
                        converted_dir(tf.path),
                    )
    finally:  # (on Ctrl-C, the chunk's files not yet begun are dropped, not hashed first)
        threads.shutdown(wait=True, cancel_futures=True)


#: Files whose converted folders are checked at once (_register_converted).
_REGISTER_CHUNK = 256


def _convert_in_pool(
    files: list[TraceFile],
    out_dirs: list[Path],
    todo: list[int],
    workers: int,
    progress: Progress,
    done: Done,
    errors: Errors,
    groups: Groups,
) -> tuple[list[int], int]:
    """Convert the files `todo` in a pool of worker processes, into `done` and `errors`;
    returns the files a dying worker left unconverted, and how many files were finished."""
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
        # Nor wait(FIRST_COMPLETED) in a loop, which visits every pending future on each call
        # (quadratic: 10,000 files): each future puts itself on a queue when it is done.
        finished_q: queue.SimpleQueue[Future[TraceInfo]] = queue.SimpleQueue()
        for fut in futures:
            fut.add_done_callback(finished_q.put)
        n = 0
        orphaned: list[int] = []
        while futures:
            fut = finished_q.get()
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
    return orphaned, n


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
