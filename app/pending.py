"""Pages that need analyzer results render at once: while a run is analyzed (seconds on a big run,
once per ingest) the page says so and polls, then draws itself.

A page's layout calls `wait_for(path, kwargs, runs)`; when any of `runs` has no cached analysis,
that returns a placeholder (and starts the analysis in a background thread), and the page returns
it instead of its content. The poll callback re-runs the page's layout once the results exist.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from typing import Any

from dash import Input, Output, State, callback, dcc, html

from tracelab.app import db, ids
from tracelab.app.components import page

log = logging.getLogger("tracelab.app")

#: path -> page module, for re-running a layout when its analyses are ready.
MODULES = {
    "/overview": "tracelab.app.pages.overview",
    "/pipeline": "tracelab.app.pages.pipeline",
    "/stragglers": "tracelab.app.pages.stragglers",
    "/memory": "tracelab.app.pages.memory",
    "/compare": "tracelab.app.pages.compare",
    # Of a run of many ranks: it opens on the ranks the Overview draws.
    "/operators": "tracelab.app.pages.operators",
}
POLL_MS = 600

_inflight: set[int] = set()
_lock = threading.Lock()
_started: dict[int, float] = {}


def analyze_in_background(run_id: int) -> None:
    """Analyze a run in a daemon thread (once at a time per run)."""
    with _lock:
        if run_id in _inflight:
            return
        _inflight.add(run_id)
        _started.setdefault(run_id, time.monotonic())

    def work() -> None:
        try:
            with db.cursor() as cur:
                db.analysis(cur, run_id)
        except Exception:
            log.exception("analysis of run %s failed", run_id)
        finally:
            with _lock:
                _inflight.discard(run_id)

    threading.Thread(target=work, name=f"tracelab-analyze-{run_id}", daemon=True).start()


def missing(names: list[str | None]) -> list[tuple[int, str]]:
    """(run_id, name) of the runs among `names` whose analysis is not cached yet."""
    out = []
    with db.cursor() as cur:
        for name in names:
            rid, run = db.resolve(cur, name)
            if db.peek_analysis(cur, rid) is None:
                out.append((rid, run))
    return out


def wait_for(path: str, kwargs: dict[str, Any], names: list[str | None]) -> Any | None:
    """None when every run's analysis is cached; else a placeholder page that polls."""
    todo = missing(names)
    if not todo:
        return None
    for rid, _ in todo:
        analyze_in_background(rid)
    runs = ", ".join(name for _, name in todo)
    args = {k: v for k, v in kwargs.items() if isinstance(v, (str, list))}
    return html.Div(
        [
            page(
                todo[0][1],
                path,
                f"Analyzing {runs}…",
                html.P(
                    "Running the analyzers on this run (once per ingest; a few seconds on big "
                    "runs). The page draws itself when they finish.",
                    className="status",
                ),
                html.Div(id=ids.PENDING_NOTE, className="hint"),
            ),
            dcc.Interval(id=ids.PENDING_POLL, interval=POLL_MS),
            dcc.Store(id=ids.PENDING_ARGS, data={"path": path, "kwargs": args}),
        ],
        id=ids.PENDING_BODY,
    )


def poll(_n: int | None, data: dict[str, Any] | None) -> Any:
    """The page once its analyses are cached, else a progress note."""
    import dash

    if not data or data.get("path") not in MODULES:
        return dash.no_update
    kwargs = dict(data.get("kwargs") or {})
    module = importlib.import_module(MODULES[data["path"]])
    names = (
        [kwargs.get("a"), kwargs.get("b")] if data["path"] == "/compare" else [kwargs.get("run")]
    )
    try:
        todo = missing(names)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - let the layout render its friendly error
        todo = []
    if todo:
        for rid, _ in todo:
            analyze_in_background(rid)
        waited = max(time.monotonic() - _started.get(rid, time.monotonic()) for rid, _ in todo)
        return dash.no_update if waited < 1 else _note(waited)
    return module.layout(**kwargs)


def _note(waited: float) -> Any:
    """Update the progress note (only inside a running callback; a direct call skips it)."""
    import dash

    try:
        dash.set_props(ids.PENDING_NOTE, {"children": f"{waited:.0f} s so far…"})
    except dash.exceptions.MissingCallbackContextException:
        pass
    return dash.no_update


callback(
    Output(ids.PENDING_BODY, "children"),
    Input(ids.PENDING_POLL, "n_intervals"),
    State(ids.PENDING_ARGS, "data"),
    prevent_initial_call=True,
)(poll)
