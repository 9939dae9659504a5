"""Timeline: one lane per rank and stream/thread on the aligned clock, by level of detail.

The server answers each zoom with at most a bounded number of shapes (tracelab.views.timeline);
the status line says when it shows aggregates. The view state (window, ranks, steps,
categories) lives in the URL.
"""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, callback, dcc, html

from tracelab.app import db, ids
from tracelab.app.components import graph, page, url_sync
from tracelab.app.guard import describe, safe_layout
from tracelab.app.state import BadParam, href, int_list, number, str_list, text
from tracelab.figures import empty_figure
from tracelab.figures.ranksummary import rank_summary_figure
from tracelab.figures.timeline import timeline_figure, timeline_status
from tracelab.render.text import duration
from tracelab.views.ranksummary import MANY_RANKS, METRIC_WORDS, rank_summary
from tracelab.views.timeline import TimelineRequest, event_detail, lanes, timeline
from tracelab.vocabulary import Category

CATEGORIES = tuple(c.value for c in Category)


def parse_request(kwargs: dict[str, Any]) -> tuple[str | None, TimelineRequest]:
    """The run name and the request from URL-style parameters (BadParam when one is bad)."""
    req = TimelineRequest(
        t0_ms=number(kwargs, "t0"),
        t1_ms=number(kwargs, "t1"),
        ranks=int_list(kwargs, "ranks"),
        steps=int_list(kwargs, "steps"),
        categories=str_list(kwargs, "cats", CATEGORIES),
    )
    if req.t0_ms is not None and req.t1_ms is not None and req.t1_ms <= req.t0_ms:
        raise BadParam("URL parameters 't0' and 't1': the window must end after it starts.")
    return text(kwargs, "run"), req


def state_of(run: str, req: TimelineRequest) -> dict[str, Any]:
    return {
        "run": run,
        "t0": req.t0_ms,
        "t1": req.t1_ms,
        "ranks": list(req.ranks),
        "steps": list(req.steps),
        "cats": list(req.categories),
    }


def query_of(state: dict[str, Any]) -> str:
    url = href(
        "/timeline",
        run=state["run"],
        t0=state.get("t0"),
        t1=state.get("t1"),
        ranks=tuple(state.get("ranks") or ()),
        steps=tuple(state.get("steps") or ()),
        cats=tuple(state.get("cats") or ()),
    )
    return url.split("?", 1)[1] if "?" in url else ""


def check_request(ctx: Any, req: TimelineRequest, steps: list[int]) -> None:
    """BadParam (the documented error page, docs/app.md) when the request names ranks or steps
    the run lacks, or a window entirely outside the run."""
    from tracelab.app.state import compact_ints

    span = ctx.span_ms
    missing = [r for r in req.ranks if r not in ctx.ranks]
    if missing:
        raise BadParam(
            f"URL parameter 'ranks': run {ctx.name} has ranks "
            f"{compact_ints(ctx.ranks)}; {compact_ints(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not among them."
        )
    gone = [s for s in req.steps if s not in steps]
    if gone:
        raise BadParam(
            f"URL parameter 'steps': run {ctx.name} has steps "
            f"{compact_ints(steps) or 'none'}; {compact_ints(gone)} "
            f"{'is' if len(gone) == 1 else 'are'} not among them."
        )
    if req.t0_ms is not None and req.t0_ms >= span:
        raise BadParam(
            f"URL parameter 't0': {req.t0_ms:g} ms is after the end of the run "
            f"({span:.3f} ms long)."
        )
    if req.t1_ms is not None and req.t1_ms <= 0:
        raise BadParam(f"URL parameter 't1': {req.t1_ms:g} ms is before the run starts (0 ms).")
    if req.t0_ms is not None and req.t0_ms < -span:
        raise BadParam(f"URL parameter 't0': {req.t0_ms:g} ms is far before the run starts.")


def render(
    run: str | None, req: TimelineRequest
) -> tuple[dict[str, Any], str | html.Span, dict[str, Any], str]:
    """(figure, status, state, query string) for a request: the lanes, or the rank summary when
    there are too many ranks to draw and no rank filter."""
    with db.cursor() as cur:
        run_id, name = db.resolve(cur, run)
        ctx = db.context(cur, run_id)
        steps = db.memo(
            cur,
            run_id,
            "steps",
            (),
            lambda: [
                int(r[0])
                for r in cur.execute(
                    "SELECT DISTINCT step FROM step_spans WHERE run_id = ? ORDER BY step", [run_id]
                ).fetchall()
            ],
        )
        check_request(ctx, req, steps)
        if len(ctx.ranks) > MANY_RANKS and not req.ranks:
            summary = rank_summary(cur, run_id)
            fig = rank_summary_figure(summary)
            picks = [o.rank for o in summary.outliers]
            if summary.typical_rank is not None and summary.typical_rank not in picks:
                picks.append(summary.typical_rank)
            outliers = "; ".join(
                f"rank {o.rank} ({METRIC_WORDS.get(o.metric, o.metric)} "
                f"{duration(o.value * 1e6)}, median {duration(o.median * 1e6)})"
                for o in summary.outliers
            )
            link = href(
                "/timeline",
                run=name,
                t0=req.t0_ms,
                t1=req.t1_ms,
                ranks=tuple(picks),
                steps=req.steps,
                cats=req.categories,
            )
            status = html.Span(
                [
                    f"{len(ctx.ranks)} ranks are too many to draw as lanes: this is a rank summary. "
                    + (f"Outliers: {outliers}. " if outliers else "No outlier ranks. "),
                    dcc.Link(
                        (
                            "Show the lanes of the outliers next to typical rank "
                            f"{summary.typical_rank}"
                            if outliers
                            else f"Show the lanes of rank {summary.typical_rank}"
                        ),
                        href=link,
                        id=ids.TL_SUMMARY,
                    ),
                    " — or enter ranks above.",
                ]
            )
            state = {**state_of(name, req), "summary_ranks": picks}
            state["query"] = query_of(state)
            return fig, status, state, state["query"]
        lane_list = db.memo(
            cur, run_id, "lanes", (req.ranks, req.categories), lambda: lanes(cur, ctx, req)
        )
        # Windows already drawn (the whole run above all) come back from a small LRU.
        data = db.memo(
            cur,
            run_id,
            "timeline",
            (req.t0_ms, req.t1_ms, req.ranks, req.steps, req.categories, req.width_px),
            lambda: timeline(cur, ctx, req, lane_list),
        )
    fig = timeline_figure(data)
    state = {**state_of(name, req), "shown": [data.t0_ms, data.t1_ms]}
    state["query"] = query_of(state)
    return fig, timeline_status(data), state, state["query"]


def controls(req: TimelineRequest) -> html.Div:
    return html.Div(
        [
            html.Label(
                [
                    "Ranks ",
                    dcc.Input(
                        id=ids.TL_RANKS,
                        type="text",
                        debounce=True,
                        value=_ints(req.ranks),
                        placeholder="all (e.g. 0-3,7)",
                        style={"width": "130px"},
                    ),
                ]
            ),
            html.Label(
                [
                    "Steps ",
                    dcc.Input(
                        id=ids.TL_STEPS,
                        type="text",
                        debounce=True,
                        value=_ints(req.steps),
                        placeholder="all (e.g. 5)",
                        style={"width": "110px"},
                    ),
                ]
            ),
            dcc.Checklist(
                id=ids.TL_CATS,
                options=[{"label": c, "value": c} for c in CATEGORIES],
                value=list(req.categories),
                inline=True,
                className="cats",
            ),
            html.Button("Apply filters", id=ids.TL_APPLY, n_clicks=0),
            html.Button("Whole run", id=ids.TL_RESET, n_clicks=0),
        ],
        className="controls",
    )


def perfetto_button(run: str) -> html.Div:
    """Download the run as one clock-aligned Chrome trace (a process per rank) for Perfetto."""
    return html.Div(
        [
            html.A(
                "Open in Perfetto (download the aligned trace)",
                href=href("/export/perfetto", run=run),
                id=ids.TL_PERFETTO,
                className="button",
                download=f"{run}.perfetto.json.gz",
            ),
            html.Span(
                " One file, every rank on the aligned clock, a process per rank: open it at "
                "ui.perfetto.dev (Open trace file) or chrome://tracing.",
                className="hint",
            ),
        ],
        className="row",
    )


def _ints(values: tuple[int, ...]) -> str:
    from tracelab.app.state import compact_ints

    return compact_ints(values)


@safe_layout("/timeline")
def layout(**kwargs: Any) -> html.Div:
    run, req = parse_request(kwargs)
    fig, status, state, _query = render(run, req)
    return page(
        state["run"],
        "/timeline",
        f"Timeline of {state['run']}",
        controls(req),
        perfetto_button(state["run"]),
        html.Div(status, id=ids.TL_STATUS, className="status"),
        dcc.Store(id=ids.TL_STATE, data=state),
        dcc.Store(id=ids.TL_VIEW),
        html.Div(id=ids.TL_STATE_SINK, style={"display": "none"}),
        *url_sync(ids.TL_URL, ids.TL_URL_SINK),
        dcc.Loading(
            graph(ids.TL_GRAPH, fig, scrollZoom=True),
            type="dot",
            delay_show=400,
            overlay_style={"visibility": "visible", "opacity": 0.6},
        ),
        html.H2("Event details"),
        html.Div(
            html.P("Click an event to see all of its fields and args.", className="hint"),
            id=ids.TL_DETAIL,
        ),
    )


def zoom_window(relayout: dict[str, Any] | None) -> tuple[float | None, float | None] | None:
    """The x-range a plotly relayout event asks for; (None, None) for 'whole range'; None when
    the event is not an x zoom (e.g. a resize)."""
    if not relayout:
        return None
    if relayout.get("xaxis.autorange"):
        return (None, None)
    if "xaxis.range[0]" in relayout and "xaxis.range[1]" in relayout:
        return float(relayout["xaxis.range[0]"]), float(relayout["xaxis.range[1]"])
    rng = relayout.get("xaxis.range")
    if isinstance(rng, list) and len(rng) == 2:
        return float(rng[0]), float(rng[1])
    return None


def update(
    trigger: str | None,
    relayout: dict[str, Any] | None,
    state: dict[str, Any] | None,
    ranks_text: str | None,
    steps_text: str | None,
    cats: list[str] | None,
) -> tuple[Any, ...]:
    """The timeline callback's logic: zoom (relayout), apply filters, or reset to the whole run.
    Returns (figure, status, state, query string); dash.no_update where nothing changes."""
    no = dash.no_update
    state = dict(state or {})
    if not state.get("run"):
        return no, "Reload the page: the timeline lost its state.", no, no
    params: dict[str, Any] = {
        "run": state["run"],
        "t0": state.get("t0"),
        "t1": state.get("t1"),
        "ranks": ",".join(map(str, state.get("ranks") or [])),
        "steps": ",".join(map(str, state.get("steps") or [])),
        "cats": ",".join(state.get("cats") or []),
    }
    if trigger in (ids.TL_GRAPH, ids.TL_VIEW):
        window = zoom_window(relayout)
        if window is None:
            return no, no, no, no
        params["t0"], params["t1"] = window
    elif trigger == ids.TL_RESET:
        params["t0"] = params["t1"] = None
    elif trigger == ids.TL_APPLY or trigger in (ids.TL_RANKS, ids.TL_STEPS, ids.TL_CATS):
        params.update(ranks=ranks_text or "", steps=steps_text or "", cats=",".join(cats or []))
        params["t0"] = params["t1"] = None
    else:
        return no, no, no, no
    try:
        run, req = parse_request({k: ("" if v is None else str(v)) for k, v in params.items()})
        return render(run, req)
    except Exception as exc:  # noqa: BLE001 - keep the current figure, say what went wrong
        title, message, _ = describe(exc)
        if not isinstance(exc, BadParam):
            return empty_figure(f"{title}: {message}"), f"{title}: {message}", no, no
        return no, f"{title}: {message}", no, no


def _update_cb(
    relayout: Any,
    apply_clicks: Any,
    reset_clicks: Any,
    state: Any,
    ranks_text: Any,
    steps_text: Any,
    cats: Any,
) -> tuple[Any, ...]:
    trigger = dash.ctx.triggered_id
    if (trigger == ids.TL_APPLY and not apply_clicks) or (
        trigger == ids.TL_RESET and not reset_clicks
    ):
        trigger = None  # a button rendered, not clicked
    return update(trigger, relayout, state, ranks_text, steps_text, cats)


def detail(click: dict[str, Any] | None, state: dict[str, Any] | None) -> Any:
    """The clicked event's fields and full args, or a hint."""
    points = (click or {}).get("points") or []
    cd = points[0].get("customdata") if points else None
    if not isinstance(cd, list) or len(cd) != 2 or not state or not state.get("run"):
        return html.P(
            "Click an event (zoom in until single events show) to see its details.",
            className="hint",
        )
    try:
        rank, idx = int(cd[0]), int(cd[1])
        with db.cursor() as cur:
            run_id, _ = db.resolve(cur, str(state["run"]))
            ev = event_detail(cur, db.context(cur, run_id), rank, idx)
    except Exception as exc:  # noqa: BLE001
        title, message, _ = describe(exc)
        return html.P(f"{title}: {message}", className="error-message")
    if ev is None:
        return html.P("That event is no longer in the store.", className="hint")
    fields = [
        (k, ev[k])
        for k in (
            "name",
            "category",
            "cat",
            "rank",
            "start_ms",
            "dur_ms",
            "step",
            "pid",
            "tid",
            "stream",
            "correlation",
            "external_id",
        )
    ]
    return html.Div(
        [
            html.Table(
                html.Tbody([html.Tr([html.Th(k), html.Td(str(v))]) for k, v in fields]),
                className="table detail",
            ),
            html.Pre(str(ev["args"] or "{}"), className="args"),
        ]
    )


callback(
    Output(ids.TL_GRAPH, "figure"),
    Output(ids.TL_STATUS, "children"),
    Output(ids.TL_STATE, "data"),
    Output(ids.TL_URL, "data"),
    Input(ids.TL_VIEW, "data"),
    Input(ids.TL_APPLY, "n_clicks"),
    Input(ids.TL_RESET, "n_clicks"),
    State(ids.TL_STATE, "data"),
    State(ids.TL_RANKS, "value"),
    State(ids.TL_STEPS, "value"),
    State(ids.TL_CATS, "value"),
    prevent_initial_call=True,
)(_update_cb)
#: Plotly's relayout events race: the graph's own autosize event right after it mounts can replace
#: a zoom in relayoutData before Dash sends it. So the browser reads the range the plot actually
#: shows, and asks the server only when it differs from the window last drawn.
dash.clientside_callback(
    """
    function(relayout, state) {
        const nu = window.dash_clientside.no_update;
        if (!relayout || !state || !state.shown) return nu;
        if (relayout['xaxis.autorange']) {
            window.__tracelab_tl_asked = null;
            return state.t0 === null && state.t1 === null ? nu : {'xaxis.autorange': true};
        }
        const host = document.getElementById('%s');
        const gd = host && (host.classList.contains('js-plotly-plot') ? host
                            : host.querySelector('.js-plotly-plot'));
        if (!gd || !gd._fullLayout || !gd._fullLayout.xaxis) return nu;
        const r = gd._fullLayout.xaxis.range.map(Number);
        const span = Math.abs(state.shown[1] - state.shown[0]) || 1;
        const same = (x) => x && Math.abs(r[0] - x[0]) < 1e-6 * span
                              && Math.abs(r[1] - x[1]) < 1e-6 * span;
        // Already drawn, or already asked for (the redraw of a new figure emits relayout too).
        if (same(state.shown) || same(window.__tracelab_tl_asked)) return nu;
        window.__tracelab_tl_asked = r;
        return {'xaxis.range[0]': r[0], 'xaxis.range[1]': r[1]};
    }
    """
    % ids.TL_GRAPH,
    Output(ids.TL_VIEW, "data"),
    Input(ids.TL_GRAPH, "relayoutData"),
    State(ids.TL_STATE, "data"),
    prevent_initial_call=True,
)
# Each new view state is a browser history entry, so Back undoes a zoom (assets/timeline.js
# turns Back/Forward within the timeline into zooms instead of page loads).
dash.clientside_callback(
    """
    function(query) {
        if (typeof query !== 'string') return '';
        const url = window.location.pathname + (query ? '?' + query : '');
        if (url !== window.location.pathname + window.location.search) {
            if (window.__tracelab_tl_popping) {
                window.history.replaceState(window.history.state, '', url);
            } else {
                window.history.pushState(window.history.state, '', url);
            }
        }
        window.__tracelab_tl_popping = false;
        window.__tracelab_tl_query = query;
        return '';
    }
    """,
    Output(ids.TL_URL_SINK, "children"),
    Input(ids.TL_URL, "data"),
    prevent_initial_call=True,
)
dash.clientside_callback(
    """
    function(state) {
        if (state && typeof state.query === 'string') window.__tracelab_tl_query = state.query;
        return '';
    }
    """,
    Output(ids.TL_STATE_SINK, "children"),
    Input(ids.TL_STATE, "data"),
)
callback(
    Output(ids.TL_DETAIL, "children"),
    Input(ids.TL_GRAPH, "clickData"),
    State(ids.TL_STATE, "data"),
    prevent_initial_call=True,
)(detail)

# Registered last: Dash Pages needs the layout function at registration.
dash.register_page(
    __name__, path="/timeline", name="Timeline", title="tracelab: timeline", order=2, layout=layout
)
