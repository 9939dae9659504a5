"""The hang verdict as the Overview's banner: the finding that stops the job (a hang or a
desync, vocabulary.BLOCKING), what each rank of the group was doing, and the fix.

Everything comes from the runner's Analysis (the hang analyzer reads the verdict stored at
ingest); nothing is re-derived here. The text is the dumps' (op names, file names): the app
renders it as text, never as markup.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracelab.views.analysis import Analysis
from tracelab.vocabulary import BLOCKING, Code

_KIND = {Code.HANG: "The job hangs", Code.COLLECTIVE_DESYNC: "The ranks are out of sync"}
_ROLE = {"entered": "entered", "absent": "never entered it; its last op:"}


@dataclass(frozen=True, kw_only=True)
class RankLine:
    """One rank of the verdict: whether it entered the collective, the op, and where."""

    rank: int
    #: 'entered' or 'absent'.
    role: str
    text: str
    where: str | None


@dataclass(frozen=True, kw_only=True)
class HangBanner:
    code: str
    #: "The job hangs" or "The ranks are out of sync".
    kind: str
    #: The finding's title: `rank(s) 1 never entered gloo:all_reduce #5`.
    title: str
    #: (label, value) facts: the collective, its sequence number, the process group.
    facts: list[tuple[str, str]]
    ranks: list[RankLine]
    fix: str
    #: Later divergences, usually consequences of this one.
    also: list[str]


def _rank_text(row: dict[str, object]) -> str:
    if row["role"] == "absent" and row["op"] == "no dump":
        return f"rank {row['rank']} left no dump (it died or was killed)"
    return f"rank {row['rank']} {_ROLE.get(str(row['role']), str(row['role']))} {row['op']}"


def hang_banner(analysis: Analysis) -> HangBanner | None:
    """The banner of the run's blocking finding, or None when the run has none."""
    f = next((f for f in analysis.findings if f.code in BLOCKING), None)
    if f is None:
        return None
    n = f.evidence.numbers
    facts = [
        (label, str(n[key]))
        for key, label in (
            ("collective", "collective"),
            ("seq", "sequence number"),
            ("process_group", "process group"),
            ("never_entered", "ranks that never entered"),
            ("left_no_dump", "ranks that left no dump"),
        )
        if n.get(key) is not None
    ]
    result = analysis.get("hang")
    ranks = [
        RankLine(rank=int(r["rank"]), role=str(r["role"]), text=_rank_text(r), where=r.get("where"))
        for r in analysis.table("hang", "ranks")
    ]
    return HangBanner(
        code=f.code,
        kind=_KIND.get(f.code, f.code),
        title=f.title,
        facts=facts,
        ranks=ranks,
        fix=f.suggestion,
        also=list(result.notes) if result else [],
    )
