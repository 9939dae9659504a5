"""Building blocks shared by the pages: navigation, friendly error pages, tables, pagers, findings.

Text from traces goes into Dash components as plain strings, which React renders as text (never
as HTML); nothing here uses dangerouslySetInnerHTML or raw-HTML markdown.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, cast

from dash import dcc, html

from tracelab.app import ids
from tracelab.app.state import href
from tracelab.render.text import duration, one_line
from tracelab.results import Finding
from tracelab.views.findings import FindingTarget, focus_ranks

#: (path, label) of the views that belong to one run, in menu order.
RUN_VIEWS = (
    ("/overview", "Overview"),
    ("/timeline", "Timeline"),
    ("/pipeline", "Pipeline"),
    ("/stragglers", "Stragglers"),
    ("/memory", "Memory"),
    ("/operators", "Operators & kernels"),
)


def nav(run: str | None, active: str) -> html.Nav:
    """The top bar: the runs list, then this run's views (when a run is chosen)."""
    links: list[Any] = [dcc.Link("tracelab", href="/", className="brand")]
    links.append(dcc.Link("Runs", href="/", className="active" if active == "/" else ""))
    if run is not None:
        for path, label in RUN_VIEWS:
            links.append(
                dcc.Link(
                    label, href=href(path, run=run), className="active" if active == path else ""
                )
            )
        links.append(
            dcc.Link(
                "Compare",
                href=href("/compare", a=run),
                className="active" if active == "/compare" else "",
            )
        )
        links.append(html.Span(f"run: {run}", className="run-name"))
    return html.Nav(links, id=ids.NAV, className="nav")


def page(run: str | None, active: str, title: str, *children: Any) -> html.Div:
    return html.Div([nav(run, active), html.Main([html.H1(title), *children])])


def error_page(
    title: str, message: str, *, hint: str | None = None, run: str | None = None, active: str = ""
) -> html.Div:
    """What a bad link or an unknown run shows instead of a traceback."""
    body: list[Any] = [html.P(message, className="error-message")]
    if hint:
        body.append(html.P(hint, className="hint"))
    body.append(html.P(dcc.Link("Back to the runs", href="/")))
    return html.Div(
        [
            nav(run, active),
            html.Main([html.H1(title), html.Div(body, id=ids.ERROR, className="error")]),
        ]
    )


def fmt(value: Any, digits: int = 4) -> str:
    """A cell value as text: numbers to `digits` significant figures, None as a dash."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        return f"{value:,.{digits}g}" if abs(value) < 1e6 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(
    columns: Sequence[tuple[str, str]],
    rows: Sequence[dict[str, Any]],
    *,
    id: str | None = None,
    links: dict[str, Callable[[dict[str, Any]], str]] | None = None,
    empty: str = "Nothing to show.",
) -> html.Div | html.P:
    """A plain HTML table; `columns` is (key, header); `links` maps a key to a row -> href."""
    if not rows:
        return (
            html.Div(html.P(empty, className="hint"), id=id)
            if id
            else html.P(empty, className="hint")
        )
    head = html.Thead(html.Tr([html.Th(h) for _, h in columns]))
    body = []
    for row in rows:
        cells = []
        for key, _ in columns:
            text = fmt(row.get(key))
            if links and key in links:
                cells.append(html.Td(dcc.Link(text, href=links[key](row))))
            else:
                cells.append(html.Td(text))
        body.append(html.Tr(cells))
    kwargs: dict[str, Any] = {"id": id} if id else {}
    return html.Div(html.Table([head, html.Tbody(body)], className="table"), **kwargs)


def pager(page: int, total_rows: int, page_rows: int, make_href: Callable[[int], str]) -> html.Div:
    """'Page 2 of 7' with previous/next links (the page is a URL parameter)."""
    pages = max(1, -(-total_rows // page_rows))
    parts: list[Any] = []
    if page > 1:
        parts.append(dcc.Link("← previous", href=make_href(page - 1)))
    parts.append(html.Span(f" page {page} of {pages} ({total_rows:,} rows) "))
    if page < pages:
        parts.append(dcc.Link("next →", href=make_href(page + 1)))
    return html.Div(parts, className="pager")


SEVERITY_CLASS = {0: "sev-info", 1: "sev-warning", 2: "sev-critical"}


def timeline_href(t: FindingTarget, run: str, all_ranks: Sequence[int] = ()) -> str:
    """The timeline at a finding's evidence: its window, its blamed and affected ranks."""
    return href("/timeline", run=run, t0=t.t0_ms, t1=t.t1_ms, ranks=focus_ranks(t, all_ranks))


def finding_hrefs(
    t: FindingTarget, run: str, all_ranks: Sequence[int] = ()
) -> list[tuple[str, str]]:
    """(label, href) links of a finding: the timeline at its evidence (window, blamed rank and
    the ranks that paid), and its own view."""
    out = []
    if t.t0_ms is not None or t.view == "timeline":
        out.append(("Show in timeline", timeline_href(t, run, all_ranks)))
    if t.view not in ("timeline", "overview"):
        out.append((f"Open {t.view}", href(f"/{t.view}", run=run)))
    return out


def _ranks_line(f: Finding) -> str:
    ev = f.evidence
    if not ev.ranks:
        return ""
    who = ", ".join(str(r) for r in ev.ranks[:12])
    paid = [r for r in ev.affected_ranks if r not in ev.ranks]
    out = f"Blamed: rank{'s' if len(ev.ranks) > 1 else ''} {who}"
    if paid:
        out += f"; paid by rank{'s' if len(paid) > 1 else ''} " + ", ".join(
            str(r) for r in paid[:12]
        )
    return out


def findings_list(
    targets: Sequence[FindingTarget],
    run: str,
    *,
    id: str | None = None,
    limit: int = 50,
    all_ranks: Sequence[int] = (),
) -> html.Div:
    """Findings in the runner's order (largest impact first), each with its impact, the ranks
    it blames and the ranks that pay, its evidence and links to the views that show it."""
    if not targets:
        return html.Div(
            html.P("No findings: nothing crossed a threshold.", className="hint"), id=id or ""
        )
    items = []
    for link in targets[:limit]:
        f: Finding = link.finding
        impact = []
        if f.impact_ns_per_step is not None:
            impact.append(f"{duration(f.impact_ns_per_step)} per step")
        if f.impact_share is not None:
            impact.append(f"{100 * f.impact_share:.1f}% of the step")
        anchors = [
            dcc.Link(label, href=url, className="finding-link")
            for label, url in finding_hrefs(link, run, all_ranks)
        ]
        items.append(
            html.Li(
                [
                    html.Span(
                        str(f.severity).upper(),
                        className=f"sev {SEVERITY_CLASS.get(int(f.severity), '')}",
                    ),
                    html.Span(f.code, className="code"),
                    html.Strong(one_line(f.title)),
                    html.Span(f" — {', '.join(impact)}" if impact else ""),
                    html.Div(_ranks_line(f), className="blame") if f.evidence.ranks else None,
                    html.Div(link.evidence_text, className="evidence"),
                    html.Div(one_line(f.suggestion), className="suggestion"),
                    html.Div(anchors, className="finding-links"),
                ],
                className=f"finding {SEVERITY_CLASS.get(int(f.severity), '')}-border",
                **data_attr("code", f.code),
            )
        )
    more = (
        [html.P(f"{len(targets) - limit} more findings not shown.", className="hint")]
        if len(targets) > limit
        else []
    )
    return html.Div([html.Ul(items, className="findings"), *more], id=id or "")


#: Replaces the address bar's query string without reloading (Dash's router does not notice).
_URL_SYNC_JS = """
function(query) {
    if (typeof query === 'string') {
        const url = window.location.pathname + (query ? '?' + query : '');
        if (url !== window.location.pathname + window.location.search) {
            window.history.replaceState(window.history.state, '', url);
        }
    }
    return '';
}
"""


def register_url_sync(store_id: str, sink_id: str) -> None:
    """Mirror a store's string data (a query string) into the address bar, so that the current
    view state can be shared as a link at any moment. Call at import time of the page; put
    `url_sync(...)` in its layout. Both components live in the page, so the clientside callback
    honours prevent_initial_call."""
    import dash

    dash.clientside_callback(
        _URL_SYNC_JS,
        dash.Output(sink_id, "children"),
        dash.Input(store_id, "data"),
        prevent_initial_call=True,
    )


def url_sync(store_id: str, sink_id: str) -> list[Any]:
    """The components of `register_url_sync`, for a page's layout."""
    return [dcc.Store(id=store_id), html.Div(id=sink_id, style={"display": "none"})]


def data_attr(name: str, value: str) -> dict[str, Any]:
    """A `data-NAME` attribute, as keyword arguments of an html component."""
    return {f"data-{name}": value}


def graph(id: str, figure: dict[str, Any], **config: Any) -> dcc.Graph:
    """A plotly graph without the plotly logo and with the mode bar tools a trace viewer needs."""
    return dcc.Graph(
        id=id,
        figure=figure,
        # The keyword arguments are plotly config keys (dcc.Graph.Config) chosen by the pages.
        config=cast(
            "dcc.Graph.Config",
            {
                "displaylogo": False,
                "responsive": True,
                "modeBarButtonsToRemove": ["lasso2d", "select2d", "autoScale2d"],
                **config,
            },
        ),
    )
