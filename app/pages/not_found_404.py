"""Any unknown path: a friendly page that points back to the runs."""

from __future__ import annotations

from typing import Any

import dash
from dash import html

from tracelab.app.components import error_page


def layout(**kwargs: Any) -> html.Div:
    return error_page(
        "No such page",
        "This address is not a tracelab view.",
        hint="The views are: runs, overview, timeline, pipeline, stragglers, memory and compare.",
    )


# Registered last: Dash Pages needs the layout function at registration.
dash.register_page(
    __name__, path="/404", name="Not found", title="tracelab: not found", layout=layout
)
