"""The analyzer registry: one module per analysis, one pure function per module.

Each analyzer is `analyze(con, run_id, params) -> Result`: it reads the store for one run (never
raw JSON), writes nothing, and returns its metrics, tables and findings, plus the parameters it
used. The CLI (`tracelab analyze`), the reports and the app all iterate `REGISTRY` or call
`run_all`, so they show the same numbers.

    from tracelab.analyzers import REGISTRY, run_all
    with open_store("x.duckdb") as con:
        results = run_all(con, run_id)               # every analyzer, registry order
        results = run_all(con, run_id, only=["stragglers"], params={"stragglers": {...}})
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import duckdb

from tracelab.errors import UsageError
from tracelab.results import Finding, Result

AnalyzeFn = Callable[[duckdb.DuckDBPyConnection, int, Mapping[str, Any]], Result]


@dataclass(frozen=True, kw_only=True)
class Analyzer:
    """A registered analysis: its name, what it answers, the app view, and its defaults."""

    name: str
    title: str
    #: The dashboard view that shows it (overview, timeline, pipeline, stragglers, memory).
    view: str
    defaults: Mapping[str, Any]
    analyze: AnalyzeFn


#: Modules holding one analyzer each, in the order they run and are shown.
MODULES = (
    "tracelab.analyzers.steps",
    "tracelab.analyzers.breakdown",
    "tracelab.analyzers.clocks",
    "tracelab.analyzers.stragglers",
    "tracelab.analyzers.pipeline",
    "tracelab.analyzers.memory",
)


def _load() -> dict[str, Analyzer]:
    out: dict[str, Analyzer] = {}
    for modname in MODULES:
        mod = importlib.import_module(modname)
        out[mod.NAME] = Analyzer(name=mod.NAME, title=mod.TITLE, view=mod.VIEW,
                                 defaults=dict(mod.DEFAULTS), analyze=mod.analyze)
    return out


_REGISTRY: dict[str, Analyzer] = {}


def registry() -> dict[str, Analyzer]:
    """name -> Analyzer, in run order (modules are imported on first use)."""
    if not _REGISTRY:
        _REGISTRY.update(_load())
    return _REGISTRY


def __getattr__(name: str) -> Any:
    # `REGISTRY` is built lazily so that importing a helper module (e.g. _schedules from
    # tracelab.testing) does not import every analyzer.
    if name == "REGISTRY":
        return registry()
    raise AttributeError(f"module 'tracelab.analyzers' has no attribute {name!r}")


def run_all(
    con: duckdb.DuckDBPyConnection,
    run_id: int,
    *,
    only: Iterable[str] | None = None,
    params: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Result]:
    """Run the named analyzers (default: all) on one run; `params` maps analyzer name to overrides."""
    reg = registry()
    names = list(only) if only is not None else list(reg)
    unknown = [n for n in names if n not in reg]
    if unknown:
        raise UsageError(f"unknown analyzer(s) {', '.join(unknown)}; known: {', '.join(reg)}.")
    params = params or {}
    return [reg[n].analyze(con, run_id, params.get(n, {})) for n in names]


def all_findings(results: Iterable[Result]) -> list[Finding]:
    """Every finding of `results`, worst impact first (then severity, then code)."""
    found = [f for r in results for f in r.findings]
    return sorted(
        found,
        key=lambda f: (-(f.impact_ms_per_step or 0.0), -int(f.severity), f.code),
    )


#: Version tag of the JSON document below (docs/json-schema.md). Bumped on breaking change.
SCHEMA = "tracelab.analysis/1"


def analysis_document(run: Mapping[str, Any], results: Iterable[Result]) -> dict[str, Any]:
    """The stable JSON document of an analysis (docs/json-schema.md): the run, every finding
    worst first, and each analyzer's full result."""
    from tracelab import __version__

    results = list(results)
    return {
        "schema": SCHEMA,
        "tracelab_version": __version__,
        "run": dict(run),
        "findings": [f.to_dict() for f in all_findings(results)],
        "analyzers": {res.analyzer: res.to_dict() for res in results},
    }
