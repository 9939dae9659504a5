"""The analyzers and the one runner that every surface uses.

Each analyzer is one module with one pure function `analyze(con, ctx, params) -> Result` over
the derived layer (tracelab.derived; it never reads raw JSON, writes nothing and imports no
other analyzer). `run()` runs them on one run with a failure policy, hands each lost nanosecond
to one finding (tracelab.analyzers._budget) and orders the findings once; the CLI (`tracelab
analyze`), the reports and the app all call it, so they show the same numbers.

    from tracelab.analyzers import run
    with open_store("x.duckdb") as con:
        analysis = run(con, run_id)                     # every analyzer, failures isolated
        analysis.findings                               # worst first, impacts allocated
        analysis.get("stragglers").metrics
        run(con, run_id, only=["steps"], on_error="raise", params={"steps": {...}})
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import duckdb

from tracelab.analyzers._budget import Budget, allocate, budget, ordered
from tracelab.analyzers._common import RunContext, run_context
from tracelab.defaults import WARMUP_STEPS
from tracelab.errors import UsageError, failure_reason, raise_if_interrupted
from tracelab.results import Finding, Result
from tracelab.store.open import store_cursor

AnalyzeFn = Callable[[duckdb.DuckDBPyConnection, RunContext, Mapping[str, Any]], Result]
OnError = Literal["isolate", "raise"]


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
    "tracelab.analyzers.alltoall",
    "tracelab.analyzers.pipeline",
    "tracelab.analyzers.memory",
    "tracelab.analyzers.hang",
)

#: Published whole, once every module is imported: the app analyzes runs on several threads,
#: and a registry filled in place let a second thread see only the analyzers imported so far
#: (a run analyzed by `steps` alone showed no other finding, and no error, until restarted).
_REGISTRY: dict[str, Analyzer] | None = None
_REGISTRY_LOCK = threading.Lock()


def registry() -> dict[str, Analyzer]:
    """name -> Analyzer, in run order (modules are imported on first use)."""
    global _REGISTRY
    if _REGISTRY is None:
        with _REGISTRY_LOCK:
            if _REGISTRY is None:
                built: dict[str, Analyzer] = {}
                for modname in MODULES:
                    mod = importlib.import_module(modname)
                    built[mod.NAME] = Analyzer(
                        name=mod.NAME,
                        title=mod.TITLE,
                        view=mod.VIEW,
                        defaults=dict(mod.DEFAULTS),
                        analyze=mod.analyze,
                    )
                _REGISTRY = built
    return _REGISTRY


def __getattr__(name: str) -> Any:
    if name == "REGISTRY":
        return registry()
    raise AttributeError(f"module 'tracelab.analyzers' has no attribute {name!r}")


@dataclass(frozen=True, kw_only=True)
class Analysis:
    """Every analyzer's result for one run, the analyzers that failed, and the findings with
    their allocated impacts, worst first."""

    #: None only when the run could not even be read (the reason is in `errors`).
    context: RunContext | None
    results: tuple[Result, ...] = ()
    #: Analyzer (or derived component) name -> one-line reason it failed.
    errors: dict[str, str] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()
    budget: Budget | None = None
    elapsed_s: float = 0.0

    def get(self, name: str) -> Result | None:
        return next((r for r in self.results if r.analyzer == name), None)

    def table(self, analyzer: str, name: str) -> list[dict[str, Any]]:
        result = self.get(analyzer)
        return list(result.tables.get(name, [])) if result else []

    def metric(self, analyzer: str, name: str) -> Any:
        result = self.get(analyzer)
        return result.metrics.get(name) if result else None


def run(
    con: duckdb.DuckDBPyConnection,
    run_id: int,
    *,
    only: Iterable[str] | None = None,
    params: Mapping[str, Mapping[str, Any]] | None = None,
    warmup_steps: int = WARMUP_STEPS,
    on_error: OnError = "isolate",
) -> Analysis:
    """Run the named analyzers (default: all) on one run. `params` maps analyzer name to
    overrides (unknown names or keys are usage errors). on_error='isolate' keeps a failing
    analyzer's one-line reason in `errors` and runs the others; 'raise' re-raises it."""
    start = time.perf_counter()
    reg = registry()
    names = list(only) if only is not None else list(reg)
    unknown = [n for n in names if n not in reg] + [n for n in (params or {}) if n not in reg]
    if unknown:
        raise UsageError(f"unknown analyzer(s) {', '.join(unknown)}; known: {', '.join(reg)}.")
    if warmup_steps < 0:
        raise UsageError(f"warm-up steps must be 0 or more, not {warmup_steps}.")
    ctx = run_context(con, run_id, warmup_steps)
    results: list[Result] = []
    errors = {f"derived {k}": v for k, v in ctx.derived_errors.items()}
    for name in names:
        analyzer = reg[name]
        given = dict((params or {}).get(name, {}))
        cur = store_cursor(con)
        try:
            results.append(analyzer.analyze(cur, ctx, given))
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001 - the failure policy: isolate, name, go on
            raise_if_interrupted(exc)  # a signal during a query stops the command
            if on_error == "raise":
                raise
            errors[name] = failure_reason(exc)
        finally:
            cur.close()
    bud = budget(con, ctx)
    found = allocate((f for r in results for f in r.findings), bud)
    by_analyzer: dict[str, list[Finding]] = {}
    for f in found:
        by_analyzer.setdefault(f.analyzer, []).append(f)
    results = [
        Result(
            analyzer=r.analyzer,
            run=r.run,
            params=r.params,
            metrics=r.metrics,
            tables=r.tables,
            findings=tuple(ordered(by_analyzer.get(r.analyzer, []))),
            notes=r.notes,
        )
        for r in results
    ]
    return Analysis(
        context=ctx,
        results=tuple(results),
        errors=errors,
        findings=tuple(found),
        budget=bud,
        elapsed_s=time.perf_counter() - start,
    )


def run_all(
    con: duckdb.DuckDBPyConnection,
    run_id: int,
    *,
    only: Iterable[str] | None = None,
    params: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Result]:
    """The results of run(), failures raised: for tests and scripts."""
    return list(run(con, run_id, only=only, params=params, on_error="raise").results)


#: Version tag of the JSON document below (docs/json-schema.md). Bumped on breaking change.
SCHEMA = "tracelab.analysis/2"


def analysis_document(run_info: Mapping[str, Any], analysis: Analysis) -> dict[str, Any]:
    """The stable JSON document of an analysis (docs/json-schema.md): the run, the budget,
    every finding worst first, each analyzer's full result, and the analyzers that failed."""
    from tracelab import __version__

    bud = analysis.budget
    return {
        "schema": SCHEMA,
        "tracelab_version": __version__,
        "run": dict(run_info),
        "settings": {"warmup_steps": analysis.context.warmup_steps if analysis.context else None},
        "lost_time": None
        if bud is None
        else {
            "step_ns": bud.step_ns,
            "parts_ns": bud.parts,
            "steps": bud.steps,
            "ranks": bud.ranks,
        },
        "findings": [f.to_dict() for f in analysis.findings],
        "analyzers": {res.analyzer: res.to_dict() for res in analysis.results},
        "errors": dict(analysis.errors),
    }
