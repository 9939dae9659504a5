"""The tracelab web app (Dash Pages): `tracelab serve` and `tracelab demo` start it.

A thin shell: each page parses its URL (tracelab.app.state), opens a read-only cursor
(tracelab.app.db), calls a query in tracelab.views and a figure builder in tracelab.figures.
No SQL and no analysis happen here. The URL carries the run and the view state (window, filters,
page), so any view can be shared as a link.

    from tracelab.app import create_app
    create_app("tracelab.duckdb").run(host="127.0.0.1", port=8050)
"""

from __future__ import annotations

import importlib
import importlib.resources
import logging
from typing import Any

#: Page modules, imported after the Dash app exists (register_page needs it).
PAGES = (
    "tracelab.app.pages.runs",
    "tracelab.app.pages.overview",
    "tracelab.app.pages.timeline",
    "tracelab.app.pages.pipeline",
    "tracelab.app.pages.stragglers",
    "tracelab.app.pages.memory",
    "tracelab.app.pages.operators",
    "tracelab.app.pages.compare",
    "tracelab.app.pages.not_found_404",
)

_APP: Any = None


def create_app(db: str, *, warm: bool = True) -> Any:
    """The Dash app serving the store at `db` (one per process: Dash Pages keeps a global
    registry). With `warm`, the newest runs are analyzed in the background right away."""
    global _APP
    import dash
    from dash import html

    from tracelab.app import db as appdb

    appdb.configure(db)
    if _APP is not None:
        return _APP
    app = dash.Dash(
        __name__,
        use_pages=True,
        pages_folder="",
        title="tracelab",
        update_title="",  # the tab title never changes while a callback runs
        suppress_callback_exceptions=True,
        assets_folder=str(importlib.resources.files("tracelab.app") / "assets"),
    )
    for name in PAGES:
        importlib.import_module(name)
    # Import now what requests would import lazily: two request threads importing one module
    # at once can see it half-initialized ("partially initialized module 'pandas'").
    for name in (
        "pandas",
        "plotly.io.json",
        "tracelab.analyzers",
        "tracelab.store.export",
        "tracelab.report.compare",
        "tracelab.report.metrics",
    ):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    app.layout = html.Div([dash.page_container])
    _routes(app)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    if warm:
        appdb.warm_newest()
    _APP = app
    return app


def _routes(app: Any) -> None:
    """Plain HTTP routes next to the pages: the Perfetto download."""
    import os
    import re
    import tempfile

    from flask import Response, request, send_file

    from tracelab.app import db as appdb
    from tracelab.errors import TracelabError

    cache = os.path.join(tempfile.gettempdir(), f"tracelab-perfetto-{os.getpid()}")

    @app.server.route("/export/perfetto")
    def perfetto() -> Any:  # one clock-aligned Chrome trace of the run, gzip
        from tracelab.store.export import export_perfetto

        name = request.args.get("run") or None
        if name is not None and len(name) > 300:
            return Response("run name too long", status=400, mimetype="text/plain")
        try:
            with appdb.cursor() as cur:
                run_id, run = appdb.resolve(cur, name)
                key = appdb.run_key(cur, run_id)
                os.makedirs(cache, exist_ok=True)
                tag = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{run_id}-{key[2] if key else ''}")
                path = os.path.join(cache, f"{tag}.json.gz")
                if not os.path.exists(path):
                    export_perfetto(cur, run, path, overwrite=True)
        except TracelabError as exc:
            return Response(str(exc), status=404, mimetype="text/plain")
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run)[:100] or "run"
        return send_file(
            path,
            mimetype="application/gzip",
            as_attachment=True,
            download_name=f"{safe}.perfetto.json.gz",
        )
