"""Which rank each trace file is: from the capture manifest, the trace's distributedInfo, the
user's --rank mapping, or (for a lone rank-less trace) rank 0 of 1; never guessed silently."""

from __future__ import annotations

import os
import shlex
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tracelab.errors import (
    RankConflictError,
    TracelabError,
)
from tracelab.ingest.converted import TraceInfo
from tracelab.ingest.discover import TraceFile, collector_window, tensorboard_name

if TYPE_CHECKING:
    pass


@dataclass(frozen=True, kw_only=True)
class ConvertedRank:
    rank: int
    infos: list[TraceInfo]
    dirs: list[Path]


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
    # The collector's windows of one rank (rank-N/window-K.pt.trace.json.gz) in a folder
    # without its manifest or rank.json (a job killed before it wrote them).
    found = {i: collector_window(files[i].path) for i in idxs}
    windows = {i: w for i, w in found.items() if w is not None}
    if len({files[i].path.parent for i in idxs}) == 1 and len(windows) == len(idxs):
        if len(set(windows.values())) == len(idxs):
            return sorted(idxs, key=windows.__getitem__)
    return None


def _rank_zero_note(files: list[TraceFile], rankless: list[int]) -> str:
    """What the ingest says when it takes rank-less traces of one process as rank 0 of 1."""
    what = (
        f"{files[rankless[0]].path}"
        if len(rankless) == 1
        else f"the {len(rankless)} windows of worker {_rank_key(files[rankless[0]].path, [])}"
    )
    return (
        f"{what} {'has' if len(rankless) == 1 else 'have'} no rank metadata (no distributedInfo): ingested as rank 0 of 1. "
        "If it is one rank of a larger job, re-ingest with --replace --rank "
        f"{shlex.quote(_rank_key(files[rankless[0]].path, []))}=N."
    )


def _odd_world_sizes(
    files: list[TraceFile], done: dict[int, tuple[TraceInfo, Path]]
) -> dict[int, TracelabError]:
    """Traces whose distributedInfo.world_size differs from most of the others' (no capture
    manifest says the job's size): not one job's traces, and merged they made a run of "2
    ranks of 8". Each odd one is a per-file error (--skip-bad leaves it out)."""
    sizes = {i: done[i][0].world_size for i in done if done[i][0].world_size is not None}
    if len(set(sizes.values())) < 2:
        return {}
    common, n = Counter(sizes.values()).most_common(1)[0]
    return {
        i: RankConflictError(
            f"this trace says its job has {size} ranks, but {n} of the others say {common}: "
            "they are not one job's traces. Ingest it as its own run, or leave it out with "
            "--skip-bad.",
            str(files[i].path),
        )
        for i, size in sizes.items()
        if size != common
    }


def resolve_ranks(
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
    errors: dict[int, TracelabError] = _odd_world_sizes(files, done) if world_size is None else {}
    rankless: list[int] = []
    for i in sorted(done):
        if i in errors:
            continue
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
            note = _rank_zero_note(files, rankless)
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
