"""Finding trace files and their ranks: plain folders, single files, and capture folders.

A capture folder (docs/capture-format.md) names every rank's files in `manifest.json`. Elsewhere
the rank comes from the trace's `distributedInfo`, read later by the converter. Files that are
not traces are never taken silently: a folder scan lists what it ignored, and a file named on the
command line must be a trace.
"""

from __future__ import annotations

import json
import os
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
        is_capture = (path / MANIFEST).is_file()
        if is_capture or any(path.glob("rank-*/rank.json")):
            capture = load_capture(path) if is_capture else load_capture_parts(path)
            found.captures.append(capture)
            files, problems = _capture_files(capture)
            found.problems.extend(problems)
            for tf in files:
                add(tf)
            continue
        for sub in sorted(p for p in path.rglob("*") if p.is_file()):
            parts = sub.relative_to(path).parts
            if any(p.startswith(".") or p.endswith(CONVERTED_SUFFIX) for p in parts):
                continue
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
        raise InputError(
            "several capture folders in one run: "
            + ", ".join(str(c.root) for c in found.captures)
            + ". Ingest each as its own run (--run NAME)."
        )
    return found
