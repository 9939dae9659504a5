"""Finding trace files and their ranks: plain folders, single files, and capture folders.

A capture folder (docs/capture-format.md) names every rank's files in `manifest.json`. Elsewhere
the rank comes from the trace's `distributedInfo`, read later by the converter. Files that are
not traces are never taken silently: a folder scan lists what it ignored, and a file named on the
command line must be a trace.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracelab.errors import InputError
from tracelab.hang.dumps import DUMP_DIR
from tracelab.ingest import validate as v

#: Suffix of a trace's pre-converted columnar folder (see tracelab.ingest.converted.converted_dir).
CONVERTED_SUFFIX = ".tracelab"

TRACE_SUFFIXES = (".json", ".json.gz")
MANIFEST = "manifest.json"
CAPTURE_FORMAT = "tracelab.capture"
CAPTURE_FORMAT_VERSION = 1

#: What each field of the capture's JSON may hold (docs/capture-format.md; tracelab.ingest.validate).
MANIFEST_FIELDS = {
    "run_name": v.TEXT,
    "world_size": ("int", 1, v.INT32_MAX),
    "created_unix_ns": v.TIME,
    "versions": v.OBJECT,
    "parallelism": v.OBJECT,
    "pipeline": v.OBJECT,
    "schedule": v.OBJECT,
    "windows": v.ARRAY,
    "argv": v.ARRAY,
    "ranks": v.ARRAY,
}
PIPELINE_FIELDS = {
    "schedule": v.TEXT,
    "stages": ("int", 1, v.INT32_MAX),
    "microbatches": ("int", 1, v.INT32_MAX),
}
RANK_FIELDS = {
    "rank": v.RANK_ID,
    "host": v.TEXT,
    "device": v.TEXT,
    "device_memory_bytes": v.SIZE,
    "backend": v.TEXT,
    "coords": v.OBJECT,
    "pp_stage": ("int", 0, v.INT32_MAX),
    "pp_stages": ("ints", 0, v.INT32_MAX),
    "process_groups": v.ARRAY,
    "traces": v.TEXTS,
    "collectives": v.TEXT,
    "collective_seq": v.TEXT,
    "memory": v.ARRAY,
    "memory_snapshot": v.TEXT,
    "clock": v.OBJECT,
    "windows": v.ARRAY,
    "collector_error": v.TEXT,
}
MEMORY_FIELDS = {
    "step": v.STEP,
    "ts_ns": v.TIME,
    "device_type": v.TEXT,
    "device_id": v.INT32,
    "peak_allocated_bytes": v.SIZE,
    "peak_reserved_bytes": v.SIZE,
    "rss_bytes": v.SIZE,
    "rss_is_peak": v.BOOL,
}
CLOCK_FIELDS = {"offset_ns": v.TIME, "uncertainty_ns": v.TIME, "reference_rank": v.RANK_ID}
GROUP_FIELDS = {
    "pg_name": v.TEXT,
    "pg_desc": v.TEXT,
    "ranks": ("ints", 0, v.INT32_MAX - 1),
    "backend": v.TEXT,
}


@dataclass(frozen=True, kw_only=True)
class TraceFile:
    """One trace file to convert, with what the capture (if any) says about it."""

    path: Path
    #: Rank from the capture manifest or an explicit user mapping; None = read distributedInfo.
    rank: int | None = None
    #: Order of this file among the rank's windows (0 for plain traces).
    window: int = 0


@dataclass(frozen=True, kw_only=True)
class Capture:
    """A capture folder's manifest, resolved to absolute paths."""

    root: Path
    manifest: dict[str, Any]
    #: rank -> that rank's manifest entry.
    ranks: dict[int, dict[str, Any]]


@dataclass(kw_only=True)
class Discovery:
    files: list[TraceFile] = field(default_factory=list)
    captures: list[Capture] = field(default_factory=list)
    #: Files seen in scanned folders that are not traces (reported, never ingested).
    ignored: list[Path] = field(default_factory=list)
    #: Ranks a capture lists but cannot deliver (no trace, missing file): skippable errors.
    problems: list[InputError] = field(default_factory=list)


#: torch.profiler.tensorboard_trace_handler's file names: `<worker>.<time ns>.pt.trace.json`,
#: `.json.gz` with use_gzip=True; the worker defaults to `<host>_<pid>`.
TENSORBOARD_NAME = re.compile(r"(?P<worker>.+)\.(?P<time>\d+)\.pt\.trace\.json(?:\.gz)?")


#: The collector's file names inside a capture: `rank-<N>/window-<K>.pt.trace.json(.gz)`.
COLLECTOR_RANK_DIR = re.compile(r"rank-(?P<rank>\d+)")
COLLECTOR_WINDOW = re.compile(r"window-(?P<window>\d+)\.pt\.trace\.json(?:\.gz)?")


def collector_window(path: Path) -> int | None:
    """The window number of a file named as the collector names its windows, else None."""
    found = COLLECTOR_WINDOW.fullmatch(path.name)
    return int(found["window"]) if found else None


def tensorboard_name(path: Path) -> tuple[str, int] | None:
    """(worker, time stamp) of a file named as tensorboard_trace_handler names it, else None."""
    found = TENSORBOARD_NAME.fullmatch(path.name)
    return (found["worker"], int(found["time"])) if found else None


def is_trace_name(path: Path) -> bool:
    return path.name.endswith(TRACE_SUFFIXES) and path.name != MANIFEST


def check_rank_entry(entry: Any, what: str, path: Path) -> dict[str, Any]:
    """One RANK object (a manifest entry or a rank.json), every field ingest reads typed."""
    v.fields(entry, RANK_FIELDS, what, path)
    if not isinstance(entry.get("rank"), int):
        raise InputError(f"{what} has no integer 'rank': {str(entry)[:200]}", str(path))
    where = f"{what} (rank {entry['rank']})"
    for key, value in (entry.get("coords") or {}).items():
        v.integer(value, f"{where}: coords {key!r}", path, lo=0, hi=v.INT32_MAX)
    for peak in entry.get("memory") or []:
        v.fields(peak, MEMORY_FIELDS, f"{where}: a memory entry", path)
    v.fields(entry.get("clock") or {}, CLOCK_FIELDS, f"{where}: clock", path)
    for group in entry.get("process_groups") or []:
        v.fields(group, GROUP_FIELDS, f"{where}: a process group", path)
    return entry


def load_capture(root: Path) -> Capture:
    """Read and check a capture folder's manifest.json (or its rank-*/rank.json parts)."""
    manifest_path = root / MANIFEST
    manifest = v.read_json(manifest_path, "capture manifest")
    if not isinstance(manifest, dict) or manifest.get("format") != CAPTURE_FORMAT:
        raise InputError(
            f"not a tracelab capture manifest (format must be {CAPTURE_FORMAT!r}).",
            str(manifest_path),
        )
    version = manifest.get("format_version")
    if version != CAPTURE_FORMAT_VERSION or type(version) is not int:
        found = (
            f"the {type(version).__name__} {version!r}"
            if type(version) is not int
            else str(version)
        )
        raise InputError(
            f"capture format version {found}, but this tracelab reads version "
            f"{CAPTURE_FORMAT_VERSION} (the integer). Upgrade tracelab or re-capture.",
            str(manifest_path),
        )
    v.fields(manifest, MANIFEST_FIELDS, "the manifest", manifest_path)
    v.fields(
        manifest.get("pipeline") or {}, PIPELINE_FIELDS, "the manifest: pipeline", manifest_path
    )
    return _capture(root, manifest, manifest.get("ranks") or [], manifest_path)


def _capture(root: Path, manifest: dict[str, Any], entries: list[Any], where: Path) -> Capture:
    world = manifest.get("world_size")
    ranks: dict[int, dict[str, Any]] = {}
    for entry in entries:
        check_rank_entry(entry, "a rank entry", where)
        rank = entry["rank"]
        if rank in ranks:
            raise InputError(f"rank {rank} is listed twice.", str(where))
        v.rank_and_world(rank, world, "the manifest's", where)
        ranks[rank] = entry
    if not ranks:
        raise InputError("the manifest lists no ranks.", str(where))
    return Capture(root=root, manifest=manifest, ranks=ranks)


def load_capture_parts(root: Path) -> Capture:
    """A capture whose manifest.json was never written (rank 0 died): rebuild it from the
    per-rank rank.json parts, with run-level fields unknown."""
    entries = []
    for part in sorted(root.glob("rank-*/rank.json")):
        entries.append(check_rank_entry(v.read_json(part, "rank part"), "the rank part", part))
    manifest = {
        "format": CAPTURE_FORMAT,
        "format_version": CAPTURE_FORMAT_VERSION,
        "run_name": root.name,
        "world_size": None,
        "ranks": entries,
        "rebuilt_from_parts": True,
    }
    return _capture(root, manifest, entries, root)


def capture_path(capture: Capture, rel: Any, what: str) -> Path:
    """A path the manifest names, confined to the capture folder: relative, no '..', and no
    symlink leading outside the folder."""
    where = str(capture.root / MANIFEST)
    if not isinstance(rel, str) or not rel:
        raise InputError(
            f"{what} must be a path relative to the capture folder, not {rel!r:.80}.", where
        )
    parts = Path(rel).parts
    if Path(rel).is_absolute() or ".." in parts:
        raise InputError(
            f"{what} {rel!r} leaves the capture folder: paths in a manifest are "
            "relative to it, without '..'. Fix the manifest.",
            where,
        )
    path = capture.root / rel
    root = capture.root.resolve()
    if path.exists() and root not in path.resolve().parents:
        raise InputError(
            f"{what} {rel!r} is a symlink to {path.resolve()}, outside the "
            "capture folder. Copy the file into the capture instead.",
            where,
        )
    return path


def _capture_files(capture: Capture) -> tuple[list[TraceFile], list[InputError]]:
    files: list[TraceFile] = []
    problems: list[InputError] = []
    claimed: dict[Path, int] = {}
    for rank, entry in sorted(capture.ranks.items()):
        traces = entry.get("traces") or []
        if not traces:
            why = entry.get("collector_error")
            problems.append(
                InputError(
                    f"rank {rank} has no trace files in the manifest"
                    + (f" (its collector failed: {why})" if why else "")
                    + ". Use --skip-bad to ingest the other ranks.",
                    str(capture.root / MANIFEST),
                )
            )
            continue
        for window, rel in enumerate(traces):
            path = capture_path(capture, rel, f"rank {rank}'s trace")
            owner = claimed.setdefault(path.resolve(), rank)
            if owner != rank:
                raise InputError(
                    f"{rel} is listed as a trace of rank {owner} and of rank {rank}: one file "
                    "holds one rank. Fix the manifest.",
                    str(capture.root / MANIFEST),
                )
            if not path.is_file():
                problems.append(
                    InputError(
                        f"rank {rank}'s trace {rel} is listed in the manifest but missing. "
                        "Copy the whole capture folder, or use --skip-bad to ingest the others.",
                        str(path),
                    )
                )
                continue
            files.append(TraceFile(path=path, rank=rank, window=window))
    files += _unlisted_traces(capture, set(claimed))
    return files, problems


def _unlisted_traces(capture: Capture, claimed: set[Path]) -> list[TraceFile]:
    """The windows in the capture's rank-<N>/ folders (rank-N/window-K.pt.trace.json.gz, as
    the collector names them) that its manifest does not list: a rank that died before it
    wrote its entry (the rank a diagnosis needs most) was left out without a word. Each is
    ingested as its folder's rank, in the order of its window number."""
    out = []
    for folder in sorted(capture.root.glob("rank-*")):
        named = COLLECTOR_RANK_DIR.fullmatch(folder.name)
        if named is None or not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            window = collector_window(path)
            if window is None or not path.is_file() or path.resolve() in claimed:
                continue
            out.append(TraceFile(path=path, rank=int(named["rank"]), window=window))
    return out


def discover(paths: list[str | os.PathLike[str]]) -> Discovery:
    """Expand the command line's paths into trace files, captures and ignored files."""
    found = Discovery()
    seen: set[Path] = set()

    def add(tf: TraceFile) -> None:
        key = tf.path.resolve()
        if key not in seen:
            seen.add(key)
            found.files.append(tf)

    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise InputError("no such file or folder.", str(path))
        if path.is_file():
            if path.name != MANIFEST:
                add(_trace_file(path))
                continue
            path = path.parent
        if any(c.root.resolve() == path.resolve() for c in found.captures):
            continue  # the same capture named twice
        is_capture = (path / MANIFEST).is_file()
        if is_capture or any(path.glob("rank-*/rank.json")):
            _add_capture(found, path, add)
        else:
            _walk_folder(found, path, add)
    _check(found, paths)
    return found


def _trace_file(path: Path) -> TraceFile:
    """A file named on the command line: a trace, by its name."""
    if not is_trace_name(path):
        raise InputError(
            "not a trace file name (expected .json or .json.gz). Rename it or pass "
            "the folder that holds the traces.",
            str(path),
        )
    return TraceFile(path=path)


def _add_capture(found: Discovery, root: Path, add: Callable[[TraceFile], None]) -> None:
    """Add the capture at `root` (a manifest, or only the rank-*/rank.json parts) and its files."""
    capture = load_capture(root) if (root / MANIFEST).is_file() else load_capture_parts(root)
    found.captures.append(capture)
    files, problems = _capture_files(capture)
    found.problems.extend(problems)
    for tf in files:
        add(tf)


def _walk_folder(found: Discovery, path: Path, add: Callable[[TraceFile], None]) -> None:
    """A folder that is no capture: the captures below it, and its loose traces."""
    roots = capture_roots(path)
    for root in roots:
        _add_capture(found, root, add)
    for sub in sorted(p for p in path.rglob("*") if p.is_file()):
        parts = sub.relative_to(path).parts
        if any(p.startswith(".") or p.endswith(CONVERTED_SUFFIX) for p in parts):
            continue
        if any(sub.is_relative_to(root) for root in roots):
            continue  # a capture's files come from its manifest
        if DUMP_DIR in parts[:-1]:  # Flight Recorder dumps (rank_0.json): never a trace
            found.ignored.append(sub)
            continue
        if is_trace_name(sub):
            add(TraceFile(path=sub))
        else:
            found.ignored.append(sub)


def _check(found: Discovery, paths: list[str | os.PathLike[str]]) -> None:
    """Raise when the paths hold no trace, or several captures (which cannot be one run)."""
    if not found.files and found.problems:
        raise found.problems[0]
    if not found.files:
        raise InputError(
            "no trace files (.json or .json.gz) found in "
            + ", ".join(str(p) for p in paths)
            + (f"; ignored {len(found.ignored)} other files" if found.ignored else "")
            + "."
        )
    loose = [
        tf for tf in found.files if not any(tf.path.is_relative_to(c.root) for c in found.captures)
    ]
    if len(found.captures) == 1 and loose:
        raise InputError(
            f"the capture folder {found.captures[0].root} and loose traces beside it "
            f"({', '.join(str(tf.path) for tf in loose[:3])}{', ...' if len(loose) > 3 else ''}) "
            "cannot be one run: a trace the capture does not hold may be another job's. Ingest "
            "the loose traces apart from the capture."
        )
    if len(found.captures) > 1:
        names = ", ".join(str(c.root) for c in found.captures[:5])
        more = f" and {len(found.captures) - 5} more" if len(found.captures) > 5 else ""
        raise InputError(
            f"{len(found.captures)} capture folders ({names}{more}) cannot be one run. "
            + (
                "Ingest the loose traces apart from the captures, and each capture as its own "
                f"run (loose: {', '.join(str(tf.path) for tf in loose[:3])}"
                + (", ..." if len(loose) > 3 else "")
                + ")."
                if loose
                else "`tracelab ingest FOLDER` (without --run) ingests each as a run named after its "
                "folder; from Python, call ingest() once per capture (capture_runs() lists them)."
            )
        )


def capture_roots(folder: Path) -> list[Path]:
    """Capture folders at or below `folder` (a manifest.json, or only the rank-*/rank.json parts
    of a capture whose rank 0 died), outermost first and none inside another."""
    roots: set[Path] = set()
    for marker in (*folder.rglob(MANIFEST), *folder.rglob("rank-*/rank.json")):
        root = marker.parent if marker.name == MANIFEST else marker.parent.parent
        parts = root.relative_to(folder).parts
        if any(p.startswith(".") or p.endswith(CONVERTED_SUFFIX) for p in parts):
            continue
        if marker.name != MANIFEST and not marker.parent.name.startswith("rank-"):
            continue
        if marker.name == MANIFEST and not _claims_capture(marker):
            continue  # another tool's manifest.json: its folder's files are scanned as usual
        roots.add(root)
    return sorted(r for r in roots if not any(r != o and r.is_relative_to(o) for o in roots))


def _claims_capture(manifest: Path) -> bool:
    """Whether a manifest.json found below a folder is a tracelab capture's: its format names
    tracelab, or it cannot be read (a capture's damaged manifest is reported, not skipped).
    Another tool's manifest ({"name": "app"}) made the whole folder an invalid capture."""
    try:
        doc = json.loads(manifest.read_bytes())
    except (OSError, ValueError, RecursionError):
        return True
    return not isinstance(doc, dict) or str(doc.get("format", "")).startswith("tracelab")


def capture_runs(paths: list[str | os.PathLike[str]]) -> list[tuple[str, Path]] | None:
    """(run name, capture folder) for each capture when `paths` are folders that hold several
    capture folders and no other traces (e.g. sample_traces/): ingest each as its own run,
    named after its folder. None when the paths make a single run."""
    runs: list[tuple[str, Path]] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_dir() or (path / MANIFEST).is_file():
            return None
        roots = capture_roots(path)
        if not roots or path in roots:
            return None
        for sub in path.rglob("*"):
            if (
                sub.is_file()
                and is_trace_name(sub)
                and not any(sub.is_relative_to(r) for r in roots)
                and not any(
                    p.startswith(".") or p.endswith(CONVERTED_SUFFIX)
                    for p in sub.relative_to(path).parts
                )
            ):
                return None  # loose traces beside the captures: not a folder of captures
        runs.extend((root.name, root) for root in roots)
    if len(runs) < 2:
        return None
    names: dict[str, list[Path]] = {}
    for name, root in runs:
        names.setdefault(name, []).append(root)
    clash = {n: r for n, r in names.items() if len(r) > 1}
    if clash:
        name, roots = next(iter(clash.items()))
        raise InputError(
            f"{len(roots)} capture folders are named {name!r} ({', '.join(map(str, roots[:4]))}"
            f"{', ...' if len(roots) > 4 else ''}): each capture of a folder becomes a run named "
            "after its folder, and one would replace the other. Ingest them one at a time, "
            f"each with its own name: tracelab ingest {roots[0]} --run NAME."
        )
    return runs
