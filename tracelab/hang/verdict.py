"""Where the ranks of a hung or desynchronized job parted, from their Flight Recorder dumps.

The ranks' entries are lined up per process group and sequence number (collective_seq_id for
collectives, p2p_seq_id for point-to-point ops). Walking each group's sequence from the first
number every rank's ring buffer still holds, the first number at which the ranks disagree is the
verdict:

- `missing_rank`: a member of the group left no dump (it died, or was killed before it could
  dump) and the ranks that did dump agree, so they wait for it in their last op (where they
  disagree, that is the verdict, the rank without a dump listed beside it);
- `not_entered`: some ranks enqueued the op and others never did (their last op is earlier):
  the others are stuck in it;
- `op_mismatch`: the ranks enqueued different ops at the same number;
- `size_mismatch` / `dtype_mismatch`: the same op with different tensor sizes or dtypes.

The earliest divergence over all groups (by the op's enqueue time, then group) is the root;
later ones are usually its consequences and are listed after it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tracelab.errors import InputError
from tracelab.hang.dumps import Entry, RankDump
from tracelab.vocabulary import collective_op

#: Frames inside these paths are PyTorch's own; the user's frame is the first outside them.
_LIBRARY_PATHS = ("/torch/", "/site-packages/", "/dist-packages/", "<frozen")


@dataclass(frozen=True, kw_only=True)
class Divergence:
    kind: str
    pg: str
    members: tuple[int, ...]
    seq: int | None
    p2p: bool
    op: str | None
    #: Ranks that enqueued the op (rank -> what they enqueued).
    entered: dict[int, Entry]
    #: Ranks that did not: rank -> their last op in this group (None: no dump, or none yet).
    absent: dict[int, Entry | None]
    created_ns: int | None

    def as_dict(self) -> dict[str, Any]:
        def entry(e: Entry | None) -> dict[str, Any] | None:
            if e is None:
                return None
            return {
                "seq": e.seq,
                "op": e.op,
                "input_sizes": [list(s) for s in e.input_sizes],
                "input_dtypes": list(e.input_dtypes),
                "state": e.state,
                "stack": [f"{f.name} at {f.file}:{f.line}" for f in user_frames(e)],
            }

        return {
            "kind": self.kind,
            "process_group": self.pg,
            "members": list(self.members),
            "seq": self.seq,
            "p2p": self.p2p,
            "op": self.op,
            "entered": {str(r): entry(e) for r, e in sorted(self.entered.items())},
            "absent": {str(r): entry(e) for r, e in sorted(self.absent.items())},
        }


@dataclass(frozen=True, kw_only=True)
class HangReport:
    ranks: tuple[int, ...]
    divergences: tuple[Divergence, ...]
    dumps: tuple[RankDump, ...] = field(default_factory=tuple)

    @property
    def hung(self) -> bool:
        return bool(self.divergences)


@functools.cache
def _library_paths() -> tuple[str, ...]:
    """_LIBRARY_PATHS and tracelab's collectors' folder (their hooks sit between the user's
    call and the collective), found without importing them (they import torch)."""
    try:
        spec = importlib.util.find_spec("tracelab.collectors")
    except (ImportError, ValueError):
        spec = None
    found = spec.submodule_search_locations if spec is not None else None
    return _LIBRARY_PATHS + tuple(str(Path(d)) + os.sep for d in found or [])


def user_frames(e: Entry) -> list[Any]:
    """The stack's frames from the first one outside PyTorch (and tracelab's collectors),
    innermost first."""
    frames = list(e.frames)
    library = _library_paths()
    for i, f in enumerate(frames):
        if not any(p in f.file for p in library):
            return frames[i:]
    return frames


def _members(
    dumps: list[RankDump], pg: str, ranks_in_pg: set[int], world_size: int | None
) -> tuple[int, ...]:
    """The group's ranks, from any dump's pg_config (gloo names the default group '' there
    while its entries say '0'); for the default group, else every rank of the world when its
    size is known (the capture's manifest, --world-size); else the ranks whose dumps name it."""
    for d in dumps:
        if pg in d.groups:
            return d.groups[pg]
    if pg == "0":
        for d in dumps:
            if "" in d.groups:
                return d.groups[""]
        if world_size:
            return tuple(range(world_size))
    return tuple(sorted(ranks_in_pg))


def _check_members(dumps: list[RankDump]) -> None:
    """Every dump that lists a group lists the same ranks for it: dumps that disagree come
    from different jobs (or were edited), and the first to list a group would decide its
    members: a job of 4 ranks read as a group of 2 hid the rank that never entered."""
    seen: dict[str, RankDump] = {}
    for d in dumps:
        for pg, ranks in d.groups.items():
            first = seen.setdefault(pg, d)
            if first.groups[pg] != ranks:
                raise InputError(
                    f"the dumps disagree on the ranks of process group {pg!r}: "
                    f"{first.path} lists {list(first.groups[pg])}, {d.path} lists "
                    f"{list(ranks)}. Pass the dumps of one job, as its ranks wrote them."
                )


#: Ops whose tensors differ by rank in a well-formed job: a rooted op's root records the
#: gathered (scattered, reduced) tensor and the other ranks none; an all-to-all's splits are
#: each rank's own. Only what must agree is compared (_same): dtypes, and an all-to-all's
#: shape after the first dimension.
PER_RANK_SHAPES = frozenset({"gather", "scatter", "reduce", "all_to_all"})
#: Ops every rank of a well-formed job calls with the same tensors: ranks that entered one and
#: disagree on it are the verdict even while other ranks never entered (dumps of two jobs
#: mixed); elsewhere the ranks that never entered come first.
_SAME_SHAPES = frozenset({"all_reduce", "broadcast"})


def _same(a: Entry, b: Entry) -> str | None:
    if a.op != b.op:
        return "op_mismatch"
    op = collective_op(a.op)
    if op in PER_RANK_SHAPES:
        # The sizes may differ by rank, the element type may not: where both ranks record
        # tensors (a rooted op's other ranks may record none), their dtypes must agree. An
        # all-to-all's tensors differ only in their first dimension (its splits).
        if a.input_dtypes and b.input_dtypes and set(a.input_dtypes) != set(b.input_dtypes):
            return "dtype_mismatch"
        if op == "all_to_all" and _rows(a.input_sizes) != _rows(b.input_sizes):
            return "size_mismatch"
        return None
    if a.input_sizes != b.input_sizes or a.output_sizes != b.output_sizes:
        return "size_mismatch"
    if a.input_dtypes != b.input_dtypes:
        return "dtype_mismatch"
    return None


def _rows(sizes: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """Each tensor's shape without its first dimension (an all-to-all's row shape)."""
    return tuple(s[1:] for s in sizes)


def _walk(dumps: list[RankDump], pg: str, p2p: bool, world_size: int | None) -> Divergence | None:
    by_rank = {d.rank: {e.seq: e for e in d.entries if e.pg == pg and e.p2p == p2p} for d in dumps}
    by_rank = {r: m for r, m in by_rank.items() if m}
    if not by_rank:
        return None
    members = _members(dumps, pg, set(by_rank), world_size)
    dumped = {d.rank for d in dumps}
    last = {r: m[max(m)] for r, m in by_rank.items()}
    missing = [r for r in members if r not in dumped]
    if p2p:  # p2p numbers count each pair's ops apart; compare only what both sides hold
        return None
    # The ranks that did dump first: one that never entered an op the others did, or that
    # entered it with other sizes, is the cause whether or not another rank left no dump (a
    # rank killed by the others' timeout hid the rank that never arrived).
    found = _first_disagreement(pg, members, by_rank, last, dumped)
    if found is not None:
        return replace(found, absent={**found.absent, **{r: None for r in missing}})
    if missing:
        newest = max(last.values(), key=lambda e: e.seq)
        return Divergence(
            kind="missing_rank",
            pg=pg,
            members=members,
            seq=newest.seq,
            p2p=p2p,
            op=newest.op,
            entered={r: e for r, e in last.items() if e.seq == newest.seq},
            absent={r: None for r in missing},
            created_ns=newest.created_ns,
        )
    return None


def _first_disagreement(
    pg: str,
    members: tuple[int, ...],
    by_rank: dict[int, dict[int, Entry]],
    last: dict[int, Entry],
    dumped: set[int],
) -> Divergence | None:
    """The first sequence number at which the ranks that dumped disagree on a collective (see
    _walk)."""
    start = max(min(m) for m in by_rank.values())
    end = max(max(m) for m in by_rank.values())
    for seq in range(start, end + 1):
        here = {r: m[seq] for r, m in by_rank.items() if seq in m}
        others = {r: last.get(r) for r in members if r in dumped and seq not in by_rank.get(r, {})}
        ref = here[min(here)] if here else None
        if ref is None:
            continue
        kinds = {k for e in here.values() if (k := _same(ref, e))}
        if others and "op_mismatch" not in kinds and collective_op(ref.op) not in _SAME_SHAPES:
            kinds = set()  # sizes that may differ by rank: the rank that never entered is it
        if others and not kinds:
            return Divergence(
                kind="not_entered",
                pg=pg,
                members=members,
                seq=seq,
                p2p=False,
                op=ref.op,
                entered=here,
                absent=others,
                created_ns=ref.created_ns,
            )
        if kinds:
            # The ranks that did enqueue this number disagree on it: a desync, whether or not
            # others are missing (dumps of two jobs mixed read as "rank 2 never entered").
            kind = min(kinds, key=("op_mismatch", "size_mismatch", "dtype_mismatch").index)
            return Divergence(
                kind=kind,
                pg=pg,
                members=members,
                seq=seq,
                p2p=False,
                op=ref.op,
                entered=here,
                absent=others,
                created_ns=ref.created_ns,
            )
    return None


def analyze(dumps: list[RankDump], world_size: int | None = None) -> HangReport:
    """The divergences of every process group, the root (earliest) first. `world_size` names
    the default group's ranks where the dumps do not list them (a rank that left no dump is
    found only among ranks someone names)."""
    _check_members(dumps)
    keys = sorted({(e.pg, e.p2p) for d in dumps for e in d.entries})
    found = [dv for pg, p2p in keys if (dv := _walk(dumps, pg, p2p, world_size)) is not None]
    found.sort(key=lambda dv: (dv.created_ns is None, dv.created_ns or 0, dv.pg))
    return HangReport(
        ranks=tuple(d.rank for d in dumps), divergences=tuple(found), dumps=tuple(dumps)
    )
