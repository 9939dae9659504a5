"""Which process group each collective ran on, where the trace names none: the timing
inference of tracelab.derived.groups (docs/metrics.md, "Process groups and parallel
dimensions").

The members of one collective overlap in time: no rank's collective ends before the last one
arrived. So the group layout is the partition of the ranks under which every collective,
matched by occurrence within its group (per op and step, in start order), overlaps its peers.
The unit is a rank's communication thread (gloo runs each process group on its own worker
threads, NCCL each on its own stream): the k-th such thread of every rank (by thread id) is
one class, and a class runs on one layout. The classes' layouts are chosen together: the
fewest matches that fail to overlap or lack a member first, then the largest groups (a
collective of the whole world also overlaps within any of its subgroups).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: Most class-to-layout assignments tried exhaustively; beyond, a descent that moves one class,
#: or two neighbouring classes (gloo's two worker threads of one group), at a time.
_EXHAUSTIVE = 4096
#: The layout is chosen on the collectives of the run's first steps (all of them are placed):
#: every step runs the same program, and the search costs the number of collectives it reads.
SOLVE_STEPS = 4
#: A match whose last arrival is this much after a member's end does not overlap (1 µs, the
#: resolution of a host clock).
TOLERANCE_NS = 1000


@dataclass(frozen=True, kw_only=True)
class Op:
    """A host collective with no group: one row of `collectives`."""

    rank: int
    event_idx: int
    tid: int
    op: str
    step: int
    start_ns: int
    end_ns: int
    bytes: int | None


Cost = tuple[int, int, int]


class Inference:
    """The group layout of the collectives that name no group (see the module docstring)."""

    def __init__(self, ops: list[Op], layouts: list[list[tuple[int, ...]]]) -> None:
        self.layouts = layouts
        by_rank: dict[int, list[int]] = defaultdict(list)
        for o in ops:
            if o.tid not in by_rank[o.rank]:
                by_rank[o.rank].append(o.tid)
        counts = {len(t) for t in by_rank.values()}
        self.by_thread = len(counts) == 1
        cls_of: dict[tuple[int, int], int] = {}
        for rank, tids in by_rank.items():
            for i, tid in enumerate(sorted(tids)):
                cls_of[(rank, tid)] = i if self.by_thread else 0
        self.classes: dict[int, list[Op]] = defaultdict(list)
        for o in ops:
            self.classes[cls_of[(o.rank, o.tid)]].append(o)
        self.ranks = sorted(by_rank)

    def cost(self, choice: Sequence[int], classes: dict[int, list[Op]] | None = None) -> Cost:
        """(matches that do not overlap, collectives left unmatched, matches) when class i
        takes layout choice[i]; over `classes` (default: every collective)."""
        classes = self.classes if classes is None else classes
        seqs: dict[tuple[int, tuple[int, ...], str, int], list[Op]] = defaultdict(list)
        for cls, layout_i in zip(sorted(self.classes), choice, strict=True):
            layout = self.layouts[layout_i]
            group_of = {r: g for g in layout for r in g}
            for o in classes.get(cls, []):
                seqs[(o.rank, group_of[o.rank], o.op, o.step)].append(o)
        bad = unmatched = matches = 0
        per_group: dict[tuple[tuple[int, ...], str, int], dict[int, list[Op]]] = defaultdict(dict)
        for (rank, g, op, step), lst in seqs.items():
            per_group[(g, op, step)][rank] = sorted(lst, key=lambda o: o.start_ns)
        for (g, _op, _step), by_rank in per_group.items():
            present = [r for r in g if r in self.ranks]
            n = max(len(by_rank.get(r, [])) for r in present)
            for k in range(n):
                members = [by_rank[r][k] for r in present if k < len(by_rank.get(r, []))]
                unmatched += len(present) - len(members)
                if len(members) < 2:
                    continue
                matches += 1
                last = max(m.start_ns for m in members)
                if any(m.end_ns + TOLERANCE_NS < last for m in members):
                    bad += 1
        return bad, unmatched, matches

    def solve(self) -> tuple[list[int], Cost, dict[int, Cost]]:
        """The chosen layout per class, its cost over every collective, and per class the
        best cost with any other layout (the evidence that the choice is not a coin toss)."""
        n_cls, n_lay = len(self.classes), len(self.layouts)
        steps = set(sorted({o.step for ops in self.classes.values() for o in ops})[:SOLVE_STEPS])
        sample = {c: [o for o in ops if o.step in steps] for c, ops in self.classes.items()}

        def score(choice: Iterable[int]) -> tuple[int, int]:
            choice = list(choice)
            bad, unmatched, _ = self.cost(choice, sample)
            # Fewest failures first; among layouts that all overlap, the largest groups (a
            # collective of the whole world also overlaps within any of its subgroups).
            return bad + unmatched, -sum(len(self.layouts[c][0]) for c in choice)

        if n_lay**n_cls <= _EXHAUSTIVE:
            best = list(min(itertools.product(range(n_lay), repeat=n_cls), key=score))
        else:
            best = [0] * n_cls
            for _ in range(3):
                for i in range(n_cls):
                    for width in (1, 2):
                        span = range(i, min(i + width, n_cls))
                        moves = [[j if k in span else c for k, c in enumerate(best)]
                                 for j in range(n_lay)]  # fmt: skip
                        best = min([best, *moves], key=score)
        alt: dict[int, Cost] = {}
        for i in range(n_cls):
            others = [
                self.cost(best[:i] + [j] + best[i + 1 :]) for j in range(n_lay) if j != best[i]
            ]
            if others:
                alt[i] = min(others)
        return best, self.cost(best), alt


def stride_layouts(world: int) -> list[list[tuple[int, ...]]]:
    """Every mesh-like partition of 0..world-1: groups of g ranks at stride s (g * s divides
    the world), as a DeviceMesh's dimensions slice it."""
    out = []
    for g in range(2, world + 1):
        for s in range(1, world // g + 1):
            if world % (g * s):
                continue
            groups = sorted(
                {
                    tuple(b + s * i for i in range(g))
                    for blk in range(0, world, g * s)
                    for b in range(blk, blk + s)
                }
            )
            out.append(groups)
    return out


def layouts(known: Iterable[tuple[int, ...]], world: int) -> list[list[tuple[int, ...]]]:
    """Candidate partitions: the stride partitions whose every group is a known group (when
    the trace lists groups at all), else every stride partition."""
    have = {g for g in known if len(g) > 1}
    cands = stride_layouts(world)
    if have:
        kept = [lay for lay in cands if all(g in have for g in lay)]
        if kept:
            return kept
    return cands
