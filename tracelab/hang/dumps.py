"""Reading PyTorch Flight Recorder dumps: the JSON and the pickle form, NCCL and gloo.

A dump is one rank's recorder: `version`, `pg_config` (process group name -> its ranks),
`pg_status`, and `entries`, one per collective or p2p op the rank enqueued, with its process
group, sequence numbers, op (`profiling_name`), tensor sizes and dtypes, state, enqueue time and
(in the pickle form) the Python stack. A dump does not say which rank wrote it: the rank is the
number at the end of the file's name, as PyTorch names them (`<prefix><rank>`).

Pickle dumps are read with an unpickler that builds only plain containers and scalars, so a
dump file can never run code.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracelab.errors import InputError, UsageError

#: Dump versions this reader has been checked against (PyTorch 2.4 wrote "2.2" ... 2.13 "2.10").
KNOWN_VERSIONS = ("2.2", "2.3", "2.4", "2.5", "2.6", "2.7", "2.8", "2.9", "2.10")
_RANK = re.compile(r"(\d+)(?:\.(?:json|pkl|pickle))?$")
#: The capture's folder of the ranks' dumps (the collector writes rank_<N>.pkl / .json there).
DUMP_DIR = "flight-recorder"
#: Dumps as PyTorch names them by default, found next to the traces: TORCH_FR_DUMP_TEMP_FILE's
#: default prefix `nccl_trace_rank_` (and fr_trace's `fr_trace_rank_`) followed by the rank.
PYTORCH_DUMP_NAME = re.compile(r"(?:nccl|fr)_trace_rank_\d+(?:\.(?:json|pkl|pickle))?")


@dataclass(frozen=True, kw_only=True)
class Frame:
    name: str
    file: str
    line: int | None


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One op a rank enqueued."""

    pg: str
    seq: int
    p2p: bool
    op: str
    input_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_sizes: tuple[tuple[int, ...], ...]
    state: str
    created_ns: int | None
    frames: tuple[Frame, ...]


@dataclass(frozen=True, kw_only=True)
class RankDump:
    rank: int
    path: str
    version: str
    entries: tuple[Entry, ...]
    #: Process group name -> its ranks, where the dump lists them.
    groups: dict[str, tuple[int, ...]]
    has_stacks: bool


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings and numbers only: any class or function a pickle
    names is refused, so a hostile file cannot run code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: not a plain value")


def _decode(raw: bytes, path: Path) -> dict[str, Any]:
    try:
        if raw[:1] == b"\x80":
            doc = _PlainUnpickler(io.BytesIO(raw)).load()
        else:
            doc = json.loads(raw)
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        UnicodeDecodeError,
        RecursionError,
    ) as exc:
        raise InputError(
            f"not a Flight Recorder dump (neither its JSON nor its pickle form): {exc}. "
            "Dump with torch._C._distributed_c10d._dump_fr_trace_json() or _dump_fr_trace().",
            str(path),
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise InputError(
            "not a Flight Recorder dump: no 'entries' list. Pass the files the recorder wrote "
            "(TORCH_FR_DUMP_TEMP_FILE, or the collector's flight-recorder/ folder).",
            str(path),
        )
    return doc


def _ints(value: Any) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, list):
        return ()
    return tuple(tuple(int(d) for d in s) if isinstance(s, list) else () for s in value)


def _groups(config: Any) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    if not isinstance(config, dict):
        return out
    for name, cfg in config.items():
        ranks = cfg.get("ranks") if isinstance(cfg, dict) else None
        if isinstance(ranks, str):  # JSON dumps write the list as text: "[0, 1]"
            ranks = [int(x) for x in re.findall(r"-?\d+", ranks)]
        if isinstance(ranks, list) and ranks:  # an empty list: the dump does not know them
            out[str(name)] = tuple(int(r) for r in ranks)
    return out


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


#: The largest sequence number read (PyTorch's are uint64 in C++, and no job enqueues 2^63 ops).
_MAX_SEQ = 2**63 - 1


def _entry(e: dict[str, Any], path: Path) -> Entry:
    # (name, description): a list in the JSON form, a tuple in the pickle form. Not `pg_id`
    # where the name is there: that is the group's index on its own rank, and two groups of
    # different ranks (a 2-D mesh's rows) have the same one.
    pg = e.get("process_group")
    pg_name = str(pg[0]) if isinstance(pg, (list, tuple)) and pg else str(e.get("pg_id", "?"))
    p2p = e.get("is_p2p", False)
    if not isinstance(p2p, bool):
        raise InputError(
            f"an entry's is_p2p is {p2p!r}, not true or false ({e.get('profiling_name')}). "
            "Pass the files the recorder wrote.",
            str(path),
        )
    seq = e.get("p2p_seq_id" if p2p else "collective_seq_id")
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise InputError(f"an entry has no sequence number ({e.get('profiling_name')}).", str(path))
    if not 0 <= seq <= _MAX_SEQ:
        raise InputError(
            f"an entry's sequence number is {seq}, outside 0..2^63-1 "
            f"({e.get('profiling_name')}). Pass the files the recorder wrote.",
            str(path),
        )
    frames = tuple(
        Frame(name=str(f.get("name", "?")), file=str(f.get("filename", "?")), line=f.get("line"))
        for f in e.get("frames") or []
        if isinstance(f, dict)
    )
    return Entry(
        pg=pg_name,
        seq=seq,
        p2p=p2p,
        op=str(e.get("profiling_name") or "?"),
        input_sizes=_ints(e.get("input_sizes")),
        input_dtypes=tuple(str(d) for d in e.get("input_dtypes") or []),
        output_sizes=_ints(e.get("output_sizes")),
        state=str(e.get("state", "?")),
        created_ns=_int_or_none(e.get("time_created_ns")),
        frames=frames,
    )


def rank_of(path: Path) -> int | None:
    """The rank that wrote a dump, from its file's name; None when the name does not say."""
    found = _RANK.search(path.name)
    return int(found.group(1)) if found else None


def read_dump(path: Path) -> RankDump:
    rank = rank_of(path)
    if rank is None:
        raise UsageError(
            f"{path}: cannot tell which rank wrote this dump: PyTorch names dumps "
            "<prefix><rank> (e.g. nccl_trace_rank_3); rename it so that its name ends in the rank."
        )
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read the dump: {exc.strerror}.", str(path)) from None
    doc = _decode(raw, path)
    try:
        entries = tuple(_entry(e, path) for e in doc["entries"] if isinstance(e, dict))
        groups = _groups(doc.get("pg_config"))
    except (TypeError, ValueError, AttributeError, RecursionError) as exc:
        # A value of the wrong kind where the format has numbers or lists (`input_sizes` of
        # text, a group's ranks that are not numbers): the file is no dump PyTorch wrote.
        raise InputError(
            f"not a Flight Recorder dump as PyTorch writes it: a malformed value "
            f"({type(exc).__name__}: {str(exc)[:200]}). Pass the files the recorder wrote.",
            str(path),
        ) from None
    return RankDump(
        rank=rank,
        path=str(path),
        version=str(doc.get("version", "?")),
        entries=entries,
        groups=groups,
        has_stacks=any(e.frames for e in entries),
    )


def dump_files(paths: list[str | Path]) -> list[Path]:
    """The dump files among `paths` (files, or folders whose files are dumps)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith("."))
        elif p.is_file():
            out.append(p)
        else:
            raise UsageError(f"{p}: no such file or folder.")
    if not out:
        raise UsageError(f"no dump files in {', '.join(map(str, paths))}.")
    return out


def read_dumps(paths: list[str | Path]) -> list[RankDump]:
    """One dump per rank. A rank dumped in both forms keeps the one with Python stacks (the
    pickle form); two different dumps of one form for a rank are an error naming both."""
    return one_per_rank([read_dump(path) for path in dump_files(paths)])


def one_per_rank(dumps: list[RankDump]) -> list[RankDump]:
    """The dumps read, one per rank, by rank (see read_dumps)."""
    by_rank: dict[int, RankDump] = {}
    for d in dumps:
        seen = by_rank.get(d.rank)
        if seen is None or (d.has_stacks and not seen.has_stacks):
            by_rank[d.rank] = d
        elif seen.has_stacks == d.has_stacks and seen.entries != d.entries:
            raise UsageError(
                f"two different dumps claim rank {d.rank}: {seen.path} and {d.path}. "
                "Pass one dump per rank."
            )
    return [by_rank[r] for r in sorted(by_rank)]
