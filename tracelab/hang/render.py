"""The hang verdict as text (the root cause first, then each rank's last ops) and as JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tracelab.hang.dumps import KNOWN_VERSIONS, Entry
from tracelab.hang.verdict import PER_RANK_SHAPES as PER_RANK
from tracelab.hang.verdict import Divergence, HangReport, user_frames
from tracelab.render.text import terminal
from tracelab.vocabulary import collective_op

#: Each rank's last ops shown after the verdict.
LAST_ENTRIES = 3

_HEADLINE = {
    "missing_rank": ("HANG", "rank(s) {absent} left no dump; the others wait for them"),
    "not_entered": ("HANG", "rank(s) {absent} never entered {op} #{seq}"),
    "op_mismatch": ("DESYNC", "the ranks enqueued different ops at #{seq}"),
    "size_mismatch": ("DESYNC", "{op} #{seq} has different tensor sizes on the ranks"),
    "dtype_mismatch": ("DESYNC", "{op} #{seq} has different dtypes on the ranks"),
}


def _ranks(ranks: Any) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


def entry_text(e: Mapping[str, Any] | None) -> str:
    """One op as `tracelab hang` prints it, from its JSON form (an `entered` or `absent` value
    of the verdict): `#5 gloo:all_reduce [1024] Float (scheduled)`."""
    if e is None:
        return "no dump"
    return f"#{e['seq']} {e['op']} {shape_text(e)} ({e['state']})"


def shape_text(e: Mapping[str, Any]) -> str:
    """An op's input tensors as `[1024] Float` (sizes, then dtypes)."""
    sizes = ", ".join("x".join(map(str, s)) or "scalar" for s in e["input_sizes"]) or "-"
    dtypes = ", ".join(e["input_dtypes"]) or "-"
    return f"[{sizes}] {dtypes}"


def _entry(e: Entry | None) -> str:
    if e is None:
        return "no dump"
    return entry_text(
        {
            "seq": e.seq,
            "op": e.op,
            "input_sizes": e.input_sizes,
            "input_dtypes": e.input_dtypes,
            "state": e.state,
        }
    )


def headline(verdict: Mapping[str, Any], *, label: bool = True) -> str:
    """The verdict's first line, from its JSON form (Divergence.as_dict, a hang_verdicts row):
    `HANG: rank(s) 1 never entered gloo:all_reduce #5` (without `HANG: ` when not `label`)."""
    kind, text = _HEADLINE[verdict["kind"]]
    behind, no_dump = absent_ranks(verdict)
    gone = verdict["kind"] == "missing_rank"
    said = text.format(
        absent=_ranks(no_dump if gone else behind), op=verdict["op"], seq=verdict["seq"]
    )
    if no_dump and not gone:
        said += f"; rank(s) {_ranks(no_dump)} left no dump"
    return f"{kind}: {said}" if label else said


def absent_ranks(verdict: Mapping[str, Any]) -> tuple[list[int], list[int]]:
    """The verdict's absent ranks, from its JSON form: (those that dumped, and never entered
    its op: their last op is given; those that left no dump). A rank killed by the others'
    timeout sits beside the rank that never entered (tracelab.hang.verdict)."""
    absent = verdict["absent"].items()
    return (
        sorted(int(r) for r, e in absent if e is not None),
        sorted(int(r) for r, e in absent if e is None),
    )


def _divergence(dv: Divergence) -> list[str]:
    head = headline(dv.as_dict())
    kind = "p2p" if dv.p2p else "collectives"
    lines = [f"{head}", f"  process group {dv.pg!r} ({kind}), ranks {_ranks(dv.members)}"]
    for r, e in sorted(dv.entered.items()):
        lines.append(f"  rank {r} entered {_entry(e)}")
        frames = user_frames(e)[:4]
        for f in frames:
            lines.append(f"      at {f.name} ({f.file}:{f.line})")
    for r, last in sorted(dv.absent.items()):
        what = "left no dump" if last is None else f"last entered {_entry(last)}"
        lines.append(f"  rank {r} {what}")
    return lines


def text(report: HangReport) -> str:
    out: list[str] = []
    if not report.hung:
        out.append(
            f"OK: the {len(report.ranks)} ranks' dumps agree (ranks {_ranks(report.ranks)}): "
            "every rank entered the same ops with the same sizes and dtypes."
        )
        ops = {op for d in report.dumps for e in d.entries if (op := collective_op(e.op))}
        unsaid = [f"the sizes of {op}" for op in sorted(ops & PER_RANK - {"all_to_all"})]
        if "all_to_all" in ops:
            unsaid.insert(0, "the first dimension of all_to_all tensors (its splits)")
        if unsaid:
            out.append(
                f"  Not compared, as they differ by rank in a well-formed job: {'; '.join(unsaid)}."
            )
    else:
        out += _divergence(report.divergences[0])
        for dv in report.divergences[1:]:
            out += ["", "Also (likely a consequence of the above):", *_divergence(dv)]
    newer = [d for d in report.dumps if d.version not in KNOWN_VERSIONS]
    if newer:
        out += [
            "",
            f"note: rank(s) {_ranks(d.rank for d in newer)} wrote dump format version "
            f"{', '.join(sorted({d.version for d in newer}))}, which tracelab has not been "
            f"checked against ({KNOWN_VERSIONS[0]} to {KNOWN_VERSIONS[-1]}); read as those are.",
        ]
    out += ["", f"Last {LAST_ENTRIES} ops per rank:"]
    for d in report.dumps:
        last = sorted(d.entries, key=lambda e: (e.created_ns or 0, e.seq))[-LAST_ENTRIES:]
        shown = "; ".join(f"[{e.pg}] {_entry(e)}" for e in reversed(last)) or "none recorded"
        out.append(f"  rank {d.rank}: {shown}")
    return terminal("\n".join(out))


def as_json(report: HangReport) -> str:
    doc = {
        "hang": report.hung,
        "ranks": list(report.ranks),
        "verdict": report.divergences[0].as_dict() if report.hung else None,
        "also": [dv.as_dict() for dv in report.divergences[1:]],
        "dumps": [
            {"rank": d.rank, "file": d.path, "version": d.version, "entries": len(d.entries)}
            for d in report.dumps
        ],
    }
    return json.dumps(doc, indent=2)
