"""The app's layouts and callbacks, called directly, and its routing over HTTP (no browser)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

PROBE = "<img src=x onerror=alert(1)>"


def texts(node: Any) -> list[str]:
    """Every string in a Dash component tree (children and text-like props)."""
    out: list[str] = []
    if node is None:
        return out
    if isinstance(node, str):
        return [node]
    if isinstance(node, (int, float)):
        return [str(node)]
    if isinstance(node, (list, tuple)):
        for x in node:
            out += texts(x)
        return out
    if isinstance(node, dict):
        for v in node.values():
            out += texts(v)
        return out
    children = getattr(node, "children", None)
    out += texts(children)
    for prop in ("value", "placeholder", "title"):
        v = getattr(node, prop, None)
        if isinstance(v, str):
            out.append(v)
    return out


def find_text(node: Any, needle: str) -> bool:
    return any(needle in t for t in texts(node))


@pytest.fixture()
def analyzed(app_module: Any) -> Any:
    """Every run of the test store analyzed (cached), as after the server's first visits."""
    from tracelab.app import db

    with db.cursor() as cur:
        for name in ("stragglers", "pipeline", "overlap_gloo", "xss"):
            db.analysis(cur, db.resolve(cur, name)[0])
    return app_module


def test_pages_wait_for_analysis_then_draw(app_module: Any) -> None:
    """Uncached analyses: the page renders a placeholder at once and polls; the poll callback
    returns the real page when the background analysis is done."""
    import time

    import dash

    from tracelab.app import db, ids, pending
    from tracelab.app.pages import overview

    db.ANALYSES.clear()
    tree = overview.layout(run="stragglers")
    assert find_text(tree, "Analyzing stragglers")
    args = tree.children[-1].data
    assert args == {"path": "/overview", "kwargs": {"run": "stragglers"}}
    deadline = time.monotonic() + 120
    while True:
        out = pending.poll(1, args)
        if out is not dash.no_update:
            break
        assert time.monotonic() < deadline, "analysis did not finish in 120 s"
        time.sleep(0.2)
    assert find_text(out, "Overview of stragglers") and find_text(out, "STRAGGLER_COMPUTE")
    # Exposed communication by parallel dimension (the breakdown's by_dim).
    assert find_text(out, "Communication by parallel dimension")
    assert find_text(out, "data parallel (dp)")
    # Its process groups by name and ranks, not the bare key '0' (which reads like a count).
    assert find_text(out, "group 0 (default_pg; ranks 0-3)")
    assert pending.poll(1, {"path": "/elsewhere"}) is dash.no_update
    assert ids.PENDING_BODY == tree.id


def test_layouts_render_every_view(analyzed: Any) -> None:
    from tracelab.app.pages import (
        compare,
        memory,
        operators,
        overview,
        pipeline,
        runs,
        stragglers,
        timeline,
    )

    for layout, kwargs, expect in [
        (runs.layout, {}, "Runs"),
        (overview.layout, {"run": "stragglers"}, "Overview of stragglers"),
        (timeline.layout, {"run": "stragglers"}, "Timeline of stragglers"),
        (pipeline.layout, {"run": "pipeline"}, "Pipeline of pipeline"),
        (stragglers.layout, {"run": "stragglers"}, "Stragglers of stragglers"),
        (memory.layout, {"run": "pipeline"}, "Memory of pipeline"),
        (compare.layout, {"a": "stragglers", "b": "pipeline"}, "Compare stragglers (A)"),
        (operators.layout, {"run": "stragglers"}, "Operators & kernels of stragglers"),
    ]:
        tree = layout(**kwargs)
        assert find_text(tree, expect), expect
        assert not find_text(tree, "Something went wrong")


def test_newest_run_is_the_default(analyzed: Any) -> None:
    from tracelab.app import db
    from tracelab.app.pages import overview

    with db.cursor() as cur:
        newest = cur.execute("SELECT name FROM runs ORDER BY run_id DESC LIMIT 1").fetchone()[0]
    tree = overview.layout()
    assert find_text(tree, f"Overview of {newest}") or find_text(tree, f"Analyzing {newest}")


@pytest.mark.parametrize(
    "page,kwargs,message",
    [
        ("timeline", {"run": "stragglers", "t0": "abc"}, "must be a number"),
        ("timeline", {"run": "stragglers", "t0": "5", "t1": "2"}, "must end after it starts"),
        ("timeline", {"run": "stragglers", "ranks": "0,x"}, "whole numbers"),
        ("timeline", {"run": "stragglers", "cats": "bogus"}, "unknown value"),
        ("timeline", {"run": "stragglers", "t0": "inf"}, "finite"),
        ("overview", {"run": "no-such-run"}, "no run named"),
        ("stragglers", {"run": "stragglers", "page": "-1"}, "between"),
        ("pipeline", {"run": "pipeline", "step": "1e9999"}, "whole number"),
        ("runs", {"page": "two"}, "whole number"),
        ("compare", {"a": "stragglers", "b": "nope"}, "no run named"),
        # Values that parse but name nothing in the run: the documented error page, never a
        # silently different view (docs/app.md).
        ("timeline", {"run": "stragglers", "t0": "5000", "t1": "6000"}, "after the end of the run"),
        ("timeline", {"run": "stragglers", "t1": "-5"}, "before the run starts"),
        ("timeline", {"run": "stragglers", "ranks": "9"}, "9 is not among them"),
        ("timeline", {"run": "stragglers", "steps": "99"}, "99 is not among them"),
        ("pipeline", {"run": "pipeline", "step": "99"}, "no pipeline step 99"),
        ("stragglers", {"run": "stragglers", "page": "99"}, "between 1 and"),
        ("operators", {"run": "stragglers", "ranks": "9"}, "not among them"),
        ("operators", {"run": "stragglers", "steps": "99"}, "not among them"),
    ],
)
def test_bad_parameters_give_a_friendly_page(
    analyzed: Any, page: str, kwargs: dict[str, str], message: str
) -> None:
    import importlib

    mod = importlib.import_module(f"tracelab.app.pages.{page}")
    tree = mod.layout(**kwargs, unexpected="ignored")
    assert find_text(tree, message)
    assert not find_text(tree, "Traceback")


def test_timeline_zoom_callback(app_module: Any) -> None:
    from tracelab.app import ids
    from tracelab.app.pages import timeline

    _, _, state, _ = timeline.render("stragglers", timeline.TimelineRequest())
    fig, status, new_state, query = timeline.update(
        ids.TL_GRAPH, {"xaxis.range[0]": 15.0, "xaxis.range[1]": 20.0}, state, "", "", []
    )
    assert fig["layout"]["xaxis"]["range"] == [15.0, 20.0]
    assert "Showing all" in status
    assert new_state["t0"] == 15.0 and new_state["t1"] == 20.0
    assert "t0=15" in query and "t1=20" in query and "run=stragglers" in query
    # A resize is not a zoom: nothing changes.
    assert all(
        x is timeline.dash.no_update
        for x in timeline.update(ids.TL_GRAPH, {"autosize": True}, new_state, "", "", [])
    )
    # Double-click (autorange) goes back to the whole run.
    fig, _, reset, query = timeline.update(
        ids.TL_GRAPH, {"xaxis.autorange": True}, new_state, "", "", []
    )
    assert reset["t0"] is None and "t0" not in query
    # Filters: ranks 1-2, communication only.
    fig, status, st, query = timeline.update(
        ids.TL_APPLY, None, state, "1-2", "", ["communication"]
    )
    names = {
        t["name"] for t in fig["data"] if t["type"] == "bar" and t.get("legendgroup") == "events"
    }
    assert names == {"communication"}
    assert st["ranks"] == [1, 2] and "ranks=1-2" in query and "cats=communication" in query
    # A bad filter keeps the figure and says why.
    fig, status, st, query = timeline.update(ids.TL_APPLY, None, state, "zero", "", [])
    assert fig is timeline.dash.no_update and "whole numbers" in status


def test_timeline_detail_callback(app_module: Any) -> None:
    from tracelab.app.pages import timeline

    fig, _, state, _ = timeline.render("stragglers", timeline.TimelineRequest())
    bar = next(t for t in fig["data"] if t["type"] == "bar" and t["name"] == "communication")
    rank, idx = bar["customdata"][0]
    out = timeline.detail({"points": [{"customdata": [rank, idx]}]}, state)
    assert find_text(out, "Collective name")
    assert find_text(timeline.detail(None, state), "Click an event")
    assert find_text(
        timeline.detail({"points": [{"customdata": [0, 10**9]}]}, state), "no longer in the store"
    )


def test_runs_page_runs_no_analyzer(app_module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 15 item 9: the Runs page reads the derived layer; it never runs the analyzers, and
    shows findings only for runs already analyzed."""
    from tracelab.app import db
    from tracelab.app.pages import runs

    def boom(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the Runs page ran the analyzers")

    monkeypatch.setattr("tracelab.analyzers.run", boom)
    monkeypatch.setattr(db.ANALYSES, "get", boom)
    tree = runs.layout()
    assert find_text(tree, "pipeline stall") or find_text(tree, "pipeline bubble")
    assert find_text(tree, "waiting for other ranks") or find_text(tree, "host")
    assert runs.compare_href("a b", "c") == "/compare?a=a+b&b=c"


def test_runs_show_cached_findings(analyzed: Any) -> None:
    from tracelab.app.pages import runs

    tree = runs.layout()
    assert find_text(tree, "STRAGGLER_COMPUTE")


def test_many_ranks_show_a_rank_summary(app_module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracelab.app.pages import timeline

    monkeypatch.setattr(timeline, "MANY_RANKS", 2)
    fig, status, state, _ = timeline.render("stragglers", timeline.TimelineRequest())
    assert find_text(status, "rank summary") and "Rank summary" in fig["layout"]["title"]["text"]
    assert state["summary_ranks"]
    fig, status, _, _ = timeline.render("stragglers", timeline.TimelineRequest(ranks=(2, 3)))
    assert "Showing all" in status

    # 40 ranks, rank 33 slow: the summary names it and links its lanes next to a typical rank.
    monkeypatch.setattr(timeline, "MANY_RANKS", 32)
    fig, status, state, _ = timeline.render("many", timeline.TimelineRequest())
    assert find_text(status, "Outliers: rank 33 (")
    # In words and units ("comm_ms_per_step 0.6 vs median 1.21" before), one outlier singular,
    # the rank axis under the lower plot (its title sat over the lower plot's points).
    assert find_text(status, ", median ") and not find_text(status, "_ms")
    assert not any("e+" in t or "e-0" in t for t in texts(status))  # durations, not 1.23e+03
    assert "40 ranks, 1 outlier (red)" in fig["layout"]["title"]["text"]
    assert fig["layout"]["xaxis"]["anchor"] == "y2"
    link = next(x for x in status.children if hasattr(x, "href"))
    assert "ranks=" in link.href and "33" in link.href


def test_dims_groups_cell_lists_a_few_groups_as_text(app_module: Any) -> None:
    """A dimension's groups cell: the first MAX_DIM_GROUPS labels, how many more, and every
    label in its tooltip; trace text (a group named by the probe) is a plain string child,
    which Dash renders as text."""
    from tracelab.app.pages.overview import MAX_DIM_GROUPS, groups_cell

    labels = [f"group {i} (ranks {2 * i}, {2 * i + 1})" for i in range(MAX_DIM_GROUPS + 2)]
    cell = groups_cell(labels)
    assert cell.children == "; ".join(labels[:MAX_DIM_GROUPS]) + "; and 2 more"
    assert cell.title == "; ".join(labels)
    probe = groups_cell([f"group {PROBE} (ranks 0, 1)"])
    assert probe.children == f"group {PROBE} (ranks 0, 1)"
    assert groups_cell([]).children == "-"


def test_xss_probe_is_escaped_in_figures(app_module: Any) -> None:
    from tracelab.app.pages import timeline

    fig, _, _, _ = timeline.render("xss", timeline.TimelineRequest())
    blob = json.dumps(fig)
    assert "<img" not in blob
    assert "&lt;img src=x onerror=alert(1)&gt;" in blob  # in hover text and lane labels
    ticks = fig["layout"]["yaxis"]["ticktext"]
    assert any("&lt;img" in t for t in ticks)
    names = [t for tr in fig["data"] for t in (tr.get("text") or []) if isinstance(t, str)]
    assert any("&lt;img" in t for t in names)  # slice names are escaped too


def test_http_routing_never_shows_a_traceback(analyzed: Any, page_request: Any) -> None:
    client = analyzed.server.test_client()
    assert client.get("/").status_code == 200
    for path, search, expect in [
        ("/overview", "?run=stragglers", "Overview of stragglers"),
        ("/overview", "?run=%3Cscript%3E", "Unknown run"),
        ("/timeline", "?run=stragglers&t0=nan", "bad parameter"),
        ("/no/such/page", "", "No such page"),
        ("/memory", "?run=stragglers&run=pipeline", "Memory of pipeline"),
    ]:
        r = client.post(
            "/_dash-update-component",
            data=page_request(path, search),
            content_type="application/json",
        )
        status, body = r.status_code, r.get_data(as_text=True)
        assert status == 200, body[:500]
        assert expect in body and "Traceback" not in body


def test_empty_and_missing_store(tmp_path: Path, app_module: Any) -> None:
    """(app_module: the pages register themselves with the app when imported; alone in a
    worker, without an app, the import failed: "register_page() must be called after app
    instantiation".)"""
    from tracelab.errors import StoreError
    from tracelab.store import open_store

    with open_store(tmp_path / "empty.duckdb", read_only=False):
        pass
    from tracelab.app import db
    from tracelab.app.pages import overview, runs

    old = db.db_path()
    try:
        db.configure(str(tmp_path / "empty.duckdb"))
        assert find_text(runs.layout(), "holds no runs yet")
        assert find_text(overview.layout(), "Unknown run")
        db.configure(str(tmp_path / "missing.duckdb"))
        assert find_text(runs.layout(), "Cannot open the store")
    finally:
        db.configure(old)
    with pytest.raises(StoreError), open_store(tmp_path / "missing.duckdb"):
        pass


def _uncached(monkeypatch: pytest.MonkeyPatch) -> None:
    from tracelab.app import db

    memo = db.memo
    monkeypatch.setattr(
        db,
        "memo",
        lambda cur, rid, kind, key, fn: fn() if kind == "report" else memo(cur, rid, kind, key, fn),
    )


def test_compare_names_the_analyzers_that_failed(
    analyzed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An analyzer that failed on a run makes `tracelab report` exit 3; the Compare page says
    which one and why, instead of a verdict that reads as complete."""
    from tracelab.app.pages import compare

    real = compare.report

    def with_failure(*a: Any, **k: Any) -> Any:
        rep = real(*a, **k)
        rep.candidate.errors["pipeline"] = "RuntimeError: boom <b>"
        return rep

    _uncached(monkeypatch)
    monkeypatch.setattr(compare, "report", with_failure)
    tree = compare.layout(a="stragglers", b="pipeline")
    assert find_text(tree, "Analyzers that failed")
    assert find_text(tree, "candidate: pipeline: RuntimeError: boom <b>")
    assert find_text(tree, "Metrics, most significant first")


def test_compare_keeps_the_step_times_when_the_report_fails(
    analyzed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tracelab.app import ids
    from tracelab.app.pages import compare

    def broken(*_a: Any, **_k: Any) -> Any:
        raise ValueError("no report today")

    _uncached(monkeypatch)
    monkeypatch.setattr(compare, "report", broken)
    tree = compare.layout(a="stragglers", b="pipeline")
    assert find_text(tree, "The report could not be built")
    assert find_text(tree, "ValueError")
    graphs = [n for n in _walk(tree) if getattr(n, "id", None) == ids.CMP_STEPS]
    assert graphs and graphs[0].figure["data"], "the step time distributions are drawn"


def _walk(node: Any) -> Any:
    yield node
    kids = getattr(node, "children", None)
    for kid in kids if isinstance(kids, list | tuple) else [kids] if kids is not None else []:
        if hasattr(kid, "children") or hasattr(kid, "figure"):
            yield from _walk(kid)


def test_stragglers_headline_says_when_the_waiting_is_spread(analyzed: Any) -> None:
    """A run with SYNC_WAIT and no blamed rank (sample ddp) read "Blamed: none. No rank is late
    ... to cost the others time." right above that finding's card, "Blamed: ranks 0, 1, 2, 3"
    at 41.6% of the step."""
    from tracelab.app import db
    from tracelab.app.pages import stragglers
    from tracelab.render.text import duration

    with db.cursor() as cur:
        found = db.analysis(cur, db.resolve(cur, "sample-ddp")[0])
    sync = next(f for f in found.findings if f.code == "SYNC_WAIT")
    tree = stragglers.layout(run="sample-ddp")
    assert find_text(tree, "Blamed: no single rank. The ranks wait for each other")
    assert find_text(tree, duration(sync.impact_ns_per_step))
    assert not find_text(tree, "No rank is late often enough")
