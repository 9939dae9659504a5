"""The one registry of output formats, for `tracelab analyze` and `tracelab report`.

A renderer turns a document into text: an analysis (tracelab.analyzers.Analysis with its run
info) for `analyze`, a comparison (tracelab.report.compare.Report) for `report`. Renderers
receive raw values (ns, bytes, 0..1 shares) and are the only code that rounds or converts
them (tracelab.render.units); text from traces is escaped for the format it goes into.

    from tracelab.render import renderer, formats
    formats("analysis")                  # ('text', 'markdown', 'json')
    renderer("report", "junit").render(report)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tracelab.errors import UsageError


@dataclass(frozen=True, kw_only=True)
class Renderer:
    """One output format of one kind of document."""

    #: document -> text.
    render: Callable[[Any], str]
    #: File name used when several formats go to one --out folder.
    filename: str


#: kind -> format -> "module:function", imported on first use (so `analyze` never imports
#: the report's HTML and plotting code).
_SPECS: dict[str, dict[str, tuple[str, str]]] = {
    "analysis": {
        "text": ("tracelab.render.analysis:render_text", "tracelab-analysis.txt"),
        "markdown": ("tracelab.render.analysis:render_markdown", "tracelab-analysis.md"),
        "json": ("tracelab.render.analysis:render_json", "tracelab-analysis.json"),
    },
    "report": {
        "markdown": ("tracelab.report.render_markdown:render", "tracelab-report.md"),
        "html": ("tracelab.report.render_html:render", "tracelab-report.html"),
        "json": ("tracelab.report.render_json:render", "tracelab-report.json"),
        "junit": ("tracelab.report.render_junit:render", "tracelab-report.junit.xml"),
    },
}


def formats(kind: str) -> tuple[str, ...]:
    """The formats a kind of document can be rendered in."""
    return tuple(_SPECS[kind])


def renderer(kind: str, fmt: str) -> Renderer:
    """The renderer of `fmt` for `kind` ('analysis' or 'report'); a usage error naming the
    choices for an unknown format."""
    specs = _SPECS[kind]
    if fmt not in specs:
        raise UsageError(f"unknown --format {fmt!r}; choose from {', '.join(specs)}")
    target, filename = specs[fmt]
    module, func = target.split(":")
    return Renderer(render=getattr(importlib.import_module(module), func), filename=filename)
