"""Figure builders: data from tracelab.views in, plotly figure dicts out.

They return plain dicts ({"data": [...], "layout": {...}}) that dcc.Graph, plotly.io and the HTML
report all accept, so this package needs neither plotly nor dash at import time, and building a
figure costs no plotly validation. Every string that came from a trace goes through `esc()`:
plotly renders a subset of HTML in labels and hover text, and escaping turns any markup in a
kernel or thread name into plain text.
"""

from __future__ import annotations

import html
from typing import Any

Figure = dict[str, Any]

#: One color per event category (tracelab.vocabulary.Category values).
CATEGORY_COLORS: dict[str, str] = {
    "compute": "#4C78A8",
    "communication": "#F58518",
    "memcpy": "#54A24B",
    "memset": "#88D27A",
    "sync": "#E45756",
    "runtime": "#9D755D",
    "cpu_op": "#72B7B2",
    "annotation": "#BAB0AC",
    "python": "#EECA3B",
    "other": "#D3D3D3",
}

#: Colors of the time-breakdown parts (the analyzers' names for them).
BREAKDOWN_COLORS: dict[str, str] = {
    "compute": "#4C78A8",
    "exposed_comm": "#E45756",
    "overlapped_comm": "#F58518",
    "exposed_memcpy": "#54A24B",
    "memcpy": "#54A24B",
    "idle": "#D3D3D3",
    "other": "#BAB0AC",
}

FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12}


def esc(text: object, limit: int = 200) -> str:
    """Trace text made safe for plotly labels: cut to `limit` characters, then HTML-escaped.
    Quotes stay as they are: with < and > escaped no tag can form, and plotly's text is not an
    attribute value (this keeps args JSON short in hover text)."""
    s = str(text)
    if len(s) > limit:
        s = s[: limit - 1] + "…"
    return html.escape(s, quote=False)


def base_layout(title: str = "", height: int = 360, **extra: Any) -> dict[str, Any]:
    """The house layout: compact margins, readable font, white background."""
    layout: dict[str, Any] = {
        "height": height,
        "margin": {"l": 60, "r": 20, "t": 40 if title else 16, "b": 40},
        "font": FONT,
        "paper_bgcolor": "white",
        "plot_bgcolor": "white",
        "hoverlabel": {"font": {"family": FONT["family"], "size": 12}, "align": "left"},
    }
    if title:
        layout["title"] = {"text": esc(title), "x": 0.01, "xanchor": "left", "font": {"size": 14}}
    layout.update(extra)
    return layout


def empty_figure(message: str, height: int = 240) -> Figure:
    """A blank figure that says why it is blank."""
    return {
        "data": [],
        "layout": base_layout(
            height=height,
            xaxis={"visible": False},
            yaxis={"visible": False},
            annotations=[
                {
                    "text": esc(message),
                    "showarrow": False,
                    "xref": "paper",
                    "yref": "paper",
                    "x": 0.5,
                    "y": 0.5,
                    "font": {"size": 14, "color": "#666"},
                }
            ],
        ),
    }


def ms(value: float | None, digits: int = 3) -> str:
    """A duration in ms for labels, with units ('—' when missing)."""
    if value is None:
        return "—"
    if abs(value) >= 1000:
        return f"{value / 1000:.{digits}g} s"
    if abs(value) < 1:
        return f"{value * 1000:.{digits}g} µs"
    return f"{value:.{digits}g} ms"
