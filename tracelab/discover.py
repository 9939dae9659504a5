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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracelab.errors import InputError

#: Suffix of a trace's pre-converted columnar folder (see tracelab.convert.converted_dir).
CONVERTED_SUFFIX = ".tracelab"

TRACE_SUFFIXES = (".json", ".json.gz")
MANIFEST = "manifest.json"
CAPTURE_FORMAT = "tracelab.capture"
CAPTURE_FORMAT_VERSION = 1


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


def tensorboard_name(path: Path) -> tuple[str, int] | None:
    """(worker, time stamp) of a file named as tensorboard_trace_handler names it, else None."""
    found = TENSORBOARD_NAME.fullmatch(path.name)
    return (found["worker"], int(found["time"])) if found else None


def is_trace_name(path: Path) -> bool:
    return path.name.endswith(TRACE_SUFFIXES) and path.name != MANIFEST


def load_capture(root: Path) -> Capture:
    """Read and check a capture folder's manifest.json (or its rank-*/rank.json parts)."""
    manifest_path = root / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"unreadable capture manifest ({exc}).", str(manifest_path)) from exc
    if not isinstance(manifest, dict) or manifest.get("format") != CAPTURE_FORMAT:
        raise InputError(
            f"not a tracelab capture manifest (format must be {CAPTURE_FORMAT!r}).",
            str(manifest_path),
        )
    version = manifest.get("format_version")
    if version != CAPTURE_FORMAT_VERSION:
        raise InputError(
            f"capture format version {version}, but this tracelab reads version "
            f"{CAPTURE_FORMAT_VERSION}. Upgrade tracelab or re-capture.",
            str(manifest_path),
        )
    ranks: dict[int, dict[str, Any]] = {}
    for entry in manifest.get("ranks") or []:
        rank = entry.get("rank")
        if not isinstance(rank, int):
            raise InputError(f"a rank entry has no integer 'rank': {entry!r:.200}", str(manifest_path))
        if rank in ranks:
            raise InputError(f"rank {rank} is listed twice.", str(manifest_path))
        ranks[rank] = entry
    if not ranks:
        raise InputError("the manifest lists no ranks.", str(manifest_path))
    return Capture(root=root, manifest=manifest, ranks=ranks)


def load_capture_parts(root: Path) -> Capture:
    """A capture whose manifest.json was never written (rank 0 died): rebuild it from the
    per-rank rank.json parts, with run-level fields unknown."""
    entries = []
    for part in sorted(root.glob("rank-*/rank.json")):
        try:
            entries.append(json.loads(part.read_text()))
        except (OSError, ValueError) as exc:
            raise InputError(f"unreadable rank part ({exc}).", str(part)) from exc
    manifest = {
        "format": CAPTURE_FORMAT,
        "format_version": CAPTURE_FORMAT_VERSION,
        "run_name": root.name,
        "world_size": None,
        "ranks": entries,
        "rebuilt_from_parts": True,
    }
    ranks = {int(e["rank"]): e for e in entries if isinstance(e.get("rank"), int)}
    return Capture(root=root, manifest=manifest, ranks=ranks)


def _capture_files(capture: Capture) -> tuple[list[TraceFile], list[InputError]]:
    files: list[TraceFile] = []
    problems: list[InputError] = []
    for rank, entry in sorted(capture.ranks.items()):
        traces = entry.get("traces") or []
        if not traces:
            why = entry.get("collector_error")
            problems.append(InputError(
                f"rank {rank} has no trace files in the manifest"
                + (f" (its collector failed: {why})" if why else "")
                + ". Use --skip-bad to ingest the other ranks.",
                str(capture.root / MANIFEST),
            ))
            continue
        for window, rel in enumerate(traces):
            path = capture.root / rel
            if not path.is_file():
                problems.append(InputError(
                    f"rank {rank}'s trace {rel} is listed in the manifest but missing. "
                    "Copy the whole capture folder, or use --skip-bad to ingest the others.",
                    str(path),
                ))
                continue
            files.append(TraceFile(path=path, rank=rank, window=window))
    return files, problems


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
            if path.name == MANIFEST:
                path = path.parent
            elif not is_trace_name(path):
                raise InputError(
                    "not a trace file name (expected .json or .json.gz). Rename it or pass "
                    "the folder that holds the traces.",
                    str(path),
                )
            else:
                add(TraceFile(path=path))
                continue
        if any(c.root.resolve() == path.resolve() for c in found.captures):
            continue  # the same capture named twice
        is_capture = (path / MANIFEST).is_file()
        if is_capture or any(path.glob("rank-*/rank.json")):
            capture = load_capture(path) if is_capture else load_capture_parts(path)
            found.captures.append(capture)
            files, problems = _capture_files(capture)
            found.problems.extend(problems)
            for tf in files:
                add(tf)
            continue
        roots = capture_roots(path)
        for root in roots:
            capture = load_capture(root) if (root / MANIFEST).is_file() else load_capture_parts(root)
            found.captures.append(capture)
            files, problems = _capture_files(capture)
            found.problems.extend(problems)
            for tf in files:
                add(tf)
        for sub in sorted(p for p in path.rglob("*") if p.is_file()):
            parts = sub.relative_to(path).parts
            if any(p.startswith(".") or p.endswith(CONVERTED_SUFFIX) for p in parts):
                continue
            if any(sub.is_relative_to(root) for root in roots):
                continue  # a capture's files come from its manifest
            if is_trace_name(sub):
                add(TraceFile(path=sub))
            else:
                found.ignored.append(sub)
    if not found.files and found.problems:
        raise found.problems[0]
    if not found.files:
        raise InputError(
            "no trace files (.json or .json.gz) found in "
            + ", ".join(str(p) for p in paths)
            + (f"; ignored {len(found.ignored)} other files" if found.ignored else "")
            + "."
        )
    if len(found.captures) > 1:
        loose = [tf for tf in found.files
                 if not any(tf.path.is_relative_to(c.root) for c in found.captures)]
        names = ", ".join(str(c.root) for c in found.captures[:5])
        more = f" and {len(found.captures) - 5} more" if len(found.captures) > 5 else ""
        raise InputError(
            f"{len(found.captures)} capture folders ({names}{more}) cannot be one run. "
            + ("Ingest the loose traces apart from the captures, and each capture as its own "
               f"run (loose: {', '.join(str(tf.path) for tf in loose[:3])}"
               + (", ..." if len(loose) > 3 else "") + ")."
               if loose else
               "`tracelab ingest FOLDER` (without --run) ingests each as a run named after its "
               "folder; from Python, call ingest() once per capture (capture_runs() lists them).")
        )
    return found


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
        roots.add(root)
    return sorted(r for r in roots if not any(r != o and r.is_relative_to(o) for o in roots))


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
            if (sub.is_file() and is_trace_name(sub)
                    and not any(sub.is_relative_to(r) for r in roots)
                    and not any(p.startswith(".") or p.endswith(CONVERTED_SUFFIX)
                                for p in sub.relative_to(path).parts)):
                return None  # loose traces beside the captures: not a folder of captures
        runs.extend((root.name, root) for root in roots)
    return runs if len(runs) > 1 else None
