"""Operators & kernels: the top host operators (self and total time) and device kernels by time,
per rank or over ranks, in the chosen steps (default: the steady steps), optionally by input
shape, like the TensorBoard plugin's Operator and Kernel views. Bounded: the top TOP_ROWS of
each. The rows come from tracelab.views.operators, the charts from tracelab.figures.operators.

Of a run of more ranks than tracelab.views.operators.MANY_RANKS, the page opens on the ranks
the Overview draws (opening_ranks), and `ranks=all` asks for every rank."""

from __future__ import annotations

from typing import Any

import dash
from dash import dcc, html

from tracelab.app import db, ids, pending
from tracelab.app.components import graph, page, table
from tracelab.app.guard import safe_layout
from tracelab.app.state import BadParam, compact_ints, href, int_list, text
from tracelab.figures.operators import top_figure
from tracelab.render.text import duration, int_ranges
from tracelab.views.operators import (
    MANY_RANKS,
    OperatorsView,
    opening_ranks,
    operators_view,
    run_steps,
)

OP_COLUMNS = (
    ("name", "operator"),
    ("n", "calls"),
    ("self", "self"),
    ("total", "total (inclusive)"),
    ("mean", "mean (total)"),
    ("per_step", "self per rank and step"),
    ("self_share", "self share of step"),
    ("share", "total share of step"),
)
SHAPE_COLUMN = ("shape", "input shapes")
KERNEL_COLUMNS = (
    ("name", "kernel"),
    ("category", "category"),
    ("op", "launched by"),
    ("n", "launches"),
    ("total", "total"),
    ("mean", "mean"),
    ("per_step", "per rank and step"),
    ("share", "share of step"),
)
#: The URL parameter `group`: operators by name (default) or by name and input shapes.
GROUPS = ("name", "shape")
#: The URL parameter `ranks` that asks for every rank of a run of more than MANY_RANKS (not
#: tracelab.derived.batches.ALL_RANKS, a rank range).
EVERY_RANK = "all"


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def _rows(v: OperatorsView, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            **r,
            "name": str(r["name"])[:160],
            "shape": str(r.get("shape") or "")[:160],
            "self": duration(r.get("self_ns")),
            "total": duration(r["total_ns"]),
            "mean": duration(r["mean_ns"]),
            "per_step": duration(r.get("self_ns", r["total_ns"]) / v.per_step),
            "share": _pct(r["share"]),
            "self_share": _pct(r.get("self_share")),
        }
        for r in rows
    ]


def _picker(label: str, links: list[tuple[str, str, bool]]) -> html.Div:
    return html.Div(
        [f"{label}: "]
        + [dcc.Link(t, href=h, className="active" if on else "") for t, h, on in links],
        className="steps-picker",
    )


def _rank_links(
    run_ranks: list[int],
    ranks: tuple[int, ...],
    everyone: bool,
    picks: list[tuple[int, str]],
    to: Any,
    analyzed: bool = True,
) -> list[tuple[str, str, bool]]:
    """The rank picker: every rank, then each rank; of a run of more than MANY_RANKS ranks,
    the Overview's ranks (`picks`, with why; not yet known unless `analyzed`) as one choice,
    then each of them."""
    if len(run_ranks) <= MANY_RANKS:
        return [("all", to(ranks=()), not ranks)] + [
            (str(r), to(ranks=(r,)), ranks == (r,)) for r in run_ranks
        ]
    opened = not ranks and not everyone
    links = [(f"all {len(run_ranks):,}", to(ranks=EVERY_RANK), everyone or (opened and not picks))]
    if picks or not analyzed:  # a run without a step budget has no Overview's ranks
        links.append(("the Overview's", to(ranks=()), opened and bool(picks)))
    links += [(f"{r} ({why})", to(ranks=(r,)), ranks == (r,)) for r, why in picks]
    if ranks and ranks not in [(r,) for r, _ in picks]:
        links.append((compact_ints(ranks), to(ranks=ranks), True))
    return links


def _wait_for_the_overviews_ranks(kwargs: dict[str, Any], *, opens: bool) -> Any | None:
    """The page that polls while the run is analyzed, where the page opens (`opens`: no
    ranks asked for) on a run of more than MANY_RANKS ranks, whose Overview's ranks need the
    analysis (at 10,000 ranks, seconds); else None."""
    if not opens:
        return None
    with db.cursor() as cur:
        run_id, _ = db.resolve(cur, text(kwargs, "run"))
        many = len(db.context(cur, run_id).ranks) > MANY_RANKS
    return pending.wait_for("/operators", kwargs, [text(kwargs, "run")]) if many else None


@safe_layout("/operators")
def layout(**kwargs: Any) -> html.Div:
    asked = (text(kwargs, "ranks") or "").strip().lower()
    everyone = asked == EVERY_RANK
    if EVERY_RANK in asked and not everyone:
        raise BadParam(
            "URL parameter 'ranks': 'all' stands alone (every rank); else list whole numbers "
            "like 0,2,5-7."
        )
    ranks = () if everyone else int_list(kwargs, "ranks")
    steps = int_list(kwargs, "steps")
    wait = _wait_for_the_overviews_ranks(kwargs, opens=not ranks and not everyone)
    if wait is not None:
        return wait
    group = text(kwargs, "group") or "name"
    if group not in GROUPS:
        raise BadParam(f"URL parameter 'group' is {group!r}; use one of: {', '.join(GROUPS)}.")
    by_shape = group == "shape"
    with db.cursor() as cur:
        run_id, run = db.resolve(cur, text(kwargs, "run"))
        ctx = db.context(cur, run_id)
        missing = [r for r in ranks if r not in ctx.ranks]
        if missing:
            raise BadParam(
                f"URL parameter 'ranks': run {run} has ranks "
                f"{compact_ints(ctx.ranks)}; {compact_ints(missing)} not among them."
            )
        known = run_steps(cur, run_id)
        gone = [s for s in steps if s not in known]
        if gone:
            raise BadParam(
                f"URL parameter 'steps': run {run} has steps "
                f"{compact_ints(known) or 'none'}; {compact_ints(gone)} not among them."
            )
        # The Overview's ranks (waited for above where the page opens on them); in the picker
        # once the run is analyzed, which a page of chosen ranks starts in the background.
        many = len(ctx.ranks) > MANY_RANKS
        found = db.peek_analysis(cur, run_id) if many else None
        if many and found is None:
            pending.analyze_in_background(run_id)
        picks = opening_ranks(found, len(ctx.ranks)) if found is not None else []
        opening = [] if ranks or everyone else picks
        chosen = ranks or tuple(sorted(r for r, _ in opening))
        v = db.memo(
            cur,
            run_id,
            "operators",
            (chosen, steps, by_shape),
            lambda: operators_view(cur, run_id, chosen, steps, by_shape=by_shape),
        )
    if opening:
        out = len(opening) - 1
        lead = (
            f"and the {out} that stand{'s' if out == 1 else ''} out"
            if out
            else "(no rank stands out)"
        )
        which = (
            f"a typical rank {lead}, of {len(ctx.ranks):,} ranks, as on the Overview "
            f"(rank{'s' if len(chosen) != 1 else ''} {int_ranges(chosen)}; "
            f"'all {len(ctx.ranks):,}' reads every rank's events, slowly)"
        )
    elif ranks:
        which = f"rank{'s' if len(ranks) != 1 else ''} {compact_ints(ranks)}"
    else:
        which = f"all {v.ranks:,} ranks" if v.ranks != 1 else "the one rank"
    st = f"steps {compact_ints(v.steps)}" + ("" if steps else " (the steady steps)")
    grp = "shape" if by_shape else None

    def to(**over: Any) -> str:
        here = EVERY_RANK if everyone else ranks
        return href(
            "/operators", **{"run": run, "ranks": here, "steps": steps, "group": grp, **over}
        )

    rank_links = _rank_links(ctx.ranks, ranks, everyone, picks, to, analyzed=found is not None)
    step_links = [("steady", to(steps=()), not steps)] + [
        (str(s), to(steps=(s,)), steps == (s,)) for s in known[:100]
    ]
    group_links = [
        ("name", to(group=None), not by_shape),
        ("name + input shapes", to(group="shape"), by_shape),
    ]
    return page(
        run,
        "/operators",
        f"Operators & kernels of {run}",
        html.P(
            f"{which}, {st}: {duration(v.step_ns / v.per_step)} per rank and step. An "
            "operator's self time leaves out the operators and runtime calls it makes; its total "
            "time includes them (totals of nested operators overlap, self times add up).",
            className="status",
            id=ids.OP_SUMMARY,
        ),
        _picker("Rank", rank_links),
        _picker("Step", step_links),
        html.Div(_picker("Group operators by", group_links), id=ids.OP_GROUP),
        graph(ids.OP_OPS_CHART, top_figure(v, v.operators, "host operators")),
        table(
            (OP_COLUMNS[0], SHAPE_COLUMN, *OP_COLUMNS[1:]) if by_shape else OP_COLUMNS,
            _rows(v, v.operators),
            id=ids.OP_OPS,
            empty="No host operators in the selected steps.",
        ),
        graph(ids.OP_KERNELS_CHART, top_figure(v, v.kernels, "device kernels")),
        table(
            KERNEL_COLUMNS,
            _rows(v, v.kernels),
            id=ids.OP_KERNELS,
            empty="No device kernels in the selected steps (a CPU-only run has none).",
        ),
    )


dash.register_page(
    __name__,
    path="/operators",
    name="Operators & kernels",
    title="tracelab: operators and kernels",
    order=6,
    layout=layout,
)
