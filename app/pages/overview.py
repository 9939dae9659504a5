"""Overview of a run: the diagnosis first. The headline (step time, the biggest loss), where the
time goes (per rank, the step split into the lost-time parts, root cause first, each part linked
to its evidence), the findings, and the step-time heatmap."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, dcc, html

from tracelab.app import db, ids, pending
from tracelab.app.components import data_attr, findings_list, graph, page, timeline_href
from tracelab.app.guard import safe_layout
from tracelab.app.state import href, text
from tracelab.figures.overview import step_heatmap, time_split_figure
from tracelab.render.text import duration, one_line
from tracelab.views.findings import step_windows, targets
from tracelab.views.hang import HangBanner, hang_banner
from tracelab.views.overview import DimRow, TimeSplit, dim_split, step_matrix, summary, time_split


def analyzer_errors(errors: dict[str, str]) -> list[Any]:
    if not errors:
        return []
    return [
        html.Div(
            [html.Strong("Some analyses failed; their results are missing: ")]
            + [html.Div(f"{name}: {msg}") for name, msg in errors.items()],
            className="warning-box",
        )
    ]


def hang_box(banner: HangBanner | None, timeline: tuple[str, str] | None = None) -> list[Any]:
    """The hang verdict, above everything else: the job stopped, so no other number matters
    first. Every text is the dumps' and renders as text (Dash escapes it). `timeline`: (label,
    href) of the timeline at the step of the hang (the finding's own link)."""
    if banner is None:
        return []
    link = (
        [
            html.Div(
                dcc.Link(timeline[0], href=timeline[1], id=ids.OV_HANG_TIMELINE),
                className="hang-link",
            )
        ]
        if timeline is not None
        else []
    )
    ranks = [
        html.Li(
            [html.Span(r.text, className="hang-op")]
            + ([html.Span(f" · in {r.where}", className="hang-where")] if r.where else []),
            className=f"hang-{r.role}",
        )
        for r in banner.ranks
    ]
    return [
        html.Div(
            [
                html.Div(
                    [
                        html.Span(banner.kind.upper(), className="hang-kind"),
                        html.Span(banner.code, className="code"),
                        html.Strong(one_line(banner.title), className="hang-title"),
                    ],
                    className="hang-head",
                ),
                html.Dl(
                    [x for k, v in banner.facts for x in (html.Dt(k), html.Dd(v))],
                    className="summary hang-facts",
                ),
                html.Ul(ranks, className="hang-ranks"),
                html.Div([html.Strong("Fix: "), banner.fix], className="hang-fix"),
                *link,
                *[html.Div(a, className="hint") for a in banner.also],
            ],
            id=ids.OV_HANG,
            className="hang-banner",
            role="alert",
            **data_attr("code", banner.code),
        )
    ]


def _hang_link(
    banner: HangBanner | None, found_targets: list[Any], run: str, all_ranks: tuple[int, ...]
) -> tuple[str, str] | None:
    """The banner's timeline link: the blocking finding's (the step of the hang, the ranks of
    the verdict), the same link as its entry in the findings list."""
    t = next((t for t in found_targets if banner and t.finding.code == banner.code), None)
    if t is None or t.t0_ms is None:
        return None
    steps = t.steps
    label = f"Show step {steps[0]} in the timeline" if steps else "Show in timeline"
    return label, timeline_href(t, run, all_ranks)


def part_links(
    split: TimeSplit | None,
    run: str,
    found_targets: list[Any],
    all_ranks: tuple[int, ...],
    typical: tuple[float, float] | None,
) -> dict[str, str]:
    """part -> where its evidence is: the timeline at the finding that claims it (its window,
    blamed and affected ranks), else the timeline at a typical steady step."""
    out: dict[str, str] = {}
    if split is None:
        return out
    by_finding = {id(t.finding): t for t in found_targets}
    for p in split.parts:
        t = by_finding.get(id(p.finding)) if p.finding is not None else None
        if t is not None:
            out[p.part] = timeline_href(t, run, all_ranks)
        elif typical is not None:
            out[p.part] = href("/timeline", run=run, t0=typical[0], t1=typical[1])
        else:
            out[p.part] = href("/timeline", run=run)
    return out


def parts_table(split: TimeSplit | None, links: dict[str, str]) -> Any:
    """The job's row of "where the time goes", as text with a link per part."""
    if split is None:
        return html.Div()
    rows = []
    for p in split.parts:
        cause = (
            html.Span([html.Span(p.finding.code, className="code"), " ", one_line(p.finding.title)])
            if p.finding is not None
            else html.Span("no finding claims it", className="hint")
        )
        rows.append(
            html.Tr(
                [
                    html.Td(html.Span("■", style={"color": _color(p.part)}), className="swatch"),
                    html.Td(p.label),
                    html.Td(f"{duration(p.job_ns)}", className="num"),
                    html.Td(f"{100 * p.share:.1f}%", className="num"),
                    html.Td(cause),
                    html.Td(
                        html.Span(
                            dcc.Link(
                                "evidence →", href=links.get(p.part, "#"), className="part-link"
                            ),
                            **data_attr("part", p.part),
                        )
                    ),
                ]
            )
        )
    head = html.Thead(
        html.Tr(
            [
                html.Th(""),
                html.Th("part"),
                html.Th("per step"),
                html.Th("share"),
                html.Th("explained by"),
                html.Th(""),
            ]
        )
    )
    return html.Table([head, html.Tbody(rows)], className="table parts", id=ids.OV_PARTS)


#: Most process groups listed in a dimension's row (the cell's tooltip lists them all).
MAX_DIM_GROUPS = 4


def groups_cell(labels: list[str]) -> Any:
    """A dimension's groups with their ranks, the first MAX_DIM_GROUPS then how many more (all
    of them in the tooltip). Group names are trace text: Dash renders them as text."""
    if not labels:
        return html.Td("-")
    shown = "; ".join(labels[:MAX_DIM_GROUPS])
    if len(labels) > MAX_DIM_GROUPS:
        shown += f"; and {len(labels) - MAX_DIM_GROUPS} more"
    return html.Td(shown, title="; ".join(labels), className="groups")


def dims_table(rows: list[DimRow]) -> Any:
    """Exposed communication by parallel dimension: which dimension's transfer and waiting
    the 'communication (exposed)' and 'waiting' parts hold."""
    if not rows:
        return html.Div()
    body = [
        html.Tr(
            [
                html.Td(r.label),
                html.Td(f"{duration(r.transfer_ns)}", className="num"),
                html.Td(f"{100 * r.transfer_share:.1f}%", className="num"),
                html.Td(f"{duration(r.wait_ns)}", className="num"),
                html.Td(f"{100 * r.wait_share:.1f}%", className="num"),
                groups_cell(r.group_labels),
                html.Td(", ".join(r.sources) or "-"),
            ],
            **data_attr("dim", r.dim),
        )
        for r in rows
    ]
    head = html.Thead(
        html.Tr(
            [
                html.Th("dimension"),
                html.Th("transfer per step"),
                html.Th("share"),
                html.Th("waiting per step"),
                html.Th("share"),
                html.Th("process groups"),
                html.Th("named by"),
            ]
        )
    )
    return html.Div(
        [
            html.H2("Communication by parallel dimension"),
            html.Table([head, html.Tbody(body)], className="table dims", id=ids.OV_DIMS),
        ]
    )


def _color(part: str) -> str:
    from tracelab.vocabulary import PART_COLORS

    return PART_COLORS.get(part, "#999")


@safe_layout("/overview")
def layout(**kwargs: Any) -> html.Div:
    wait = pending.wait_for("/overview", kwargs, [text(kwargs, "run")])
    if wait is not None:
        return wait
    with db.cursor() as cur:
        run_id, run = db.resolve(cur, text(kwargs, "run"))
        ctx = db.context(cur, run_id)
        found = db.analysis(cur, run_id)
        split = time_split(found)
        drawn = split.ranks if split is not None and split.reasons else None
        matrix = step_matrix(cur, run_id, found.metric("steps", "step_ns"), first=drawn)
        windows, typical = step_windows(cur, run_id)
        dims = dim_split(cur, run_id, found)
    head = summary(ctx, found)
    found_targets = targets(found.findings, ctx, windows, typical)
    typical_ms = None
    if typical is not None and typical in windows:
        a, b = windows[typical]
        typical_ms = (ctx.to_ms(a), ctx.to_ms(b))
    links = part_links(split, run, found_targets, ctx.ranks, typical_ms)
    notes = [html.Li(n) for r in found.results for n in r.notes]
    banner = hang_banner(found)
    return page(
        run,
        "/overview",
        f"Overview of {run}",
        *hang_box(banner, _hang_link(banner, found_targets, run, ctx.ranks)),
        html.P(head.headline, className="headline", id=ids.OV_HEADLINE),
        html.Dl(
            [x for k, v in head.items for x in (html.Dt(k), html.Dd(v))],
            id=ids.OV_SUMMARY,
            className="summary",
        ),
        *analyzer_errors(found.errors),
        graph(ids.OV_BREAKDOWN, time_split_figure(split, links)),
        html.Div(id=ids.OV_CLICK_SINK, style={"display": "none"}),
        parts_table(split, links),
        dims_table(dims),
        html.H2(f"Findings ({len(found_targets)}), largest impact first"),
        findings_list(found_targets, run, id=ids.OV_FINDINGS, all_ranks=ctx.ranks),
        graph(ids.OV_HEATMAP, step_heatmap(matrix)),
        html.Details([html.Summary("Analysis notes"), html.Ul(notes)]) if notes else html.Div(),
    )


# A click on a part of "where the time goes" opens its evidence (the URL is in customdata).
dash.clientside_callback(
    """
    function(click) {
        const p = click && click.points && click.points[0];
        const url = p && p.customdata && p.customdata[0];
        if (url) { window.location.assign(url); }
        return window.dash_clientside.no_update;
    }
    """,
    Output(ids.OV_CLICK_SINK, "children"),
    Input(ids.OV_BREAKDOWN, "clickData"),
    prevent_initial_call=True,
)

# Registered last: Dash Pages needs the layout function at registration.
dash.register_page(
    __name__, path="/overview", name="Overview", title="tracelab: overview", order=1, layout=layout
)
