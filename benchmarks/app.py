"""Web app speed in a real browser: time to first render of each view and of timeline zooms, and
the bytes sent to the browser, on the 8-rank, 1.7M-event set (and the 1-rank set, to show that
the payload does not grow with the trace).

    python benchmarks/app.py [--reps 5] [--ranks 1,8] [--beside 14]

Data: benchmarks/datasets.py (N copies of df_index_resolver with the rank rewritten), ingested
once into bench_data/app_xN.duckdb; with `--beside K`, into bench_data/app_xN_besideK.duckdb
beside K small synthetic runs (tracelab.testing.synth), as a user's store holds earlier runs:
DuckDB's estimates of a query over the `events` view change with the store's other files, and
one such estimate made the Operators page of a GPU run in a store of 15 runs quadratic
(docs/app.md). Each repetition starts a fresh `tracelab serve --no-warm` and
drives headless Chromium (selenium, /usr/bin/chromium) against it:

- cold: the first visit of the overview after the server started, before any analysis: time to
  the first paint (the "Analyzing..." page) and to the full page (includes running all the
  analyzers once; they are cached per ingest afterwards).
- every view with its analyses cached, in a browser that has opened the app before (two warm-up
  loads of the overview: Chromium compiles plotly.js, 4.8 MB, on the first pages that use it and
  caches the code from the second; the cold row above includes that one-time cost): navigation
  start to the page drawn (H1 and every plot rendered), and the bytes of the Dash responses that carry the page (layout and callbacks:
  encodedBodySize from the Resource Timing API; the Flask server does not compress).
- the same views reached from the navigation bar (a click, no page load: what moving around the
  app costs): click to page drawn.
- timeline zooms from the whole run: to half the run, to 2 %, to 0.05 % (single events), and
  back out (double-click; the whole-run window was drawn before, so the server answers it from
  its small LRU of drawn windows): time from Plotly.relayout to the new figure drawn, and its bytes.

Times are measured in the page (performance.now()), polled every 20 ms by selenium; medians over
the repetitions are reported. The static JS bundles (fetched once, then cached) are reported apart.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.datasets import DATA, rank_set

RUN = "bench"
POLL_S = 0.02
TIMEOUT_S = 180

#: (name, path, heading prefix, plots that must be drawn)
VIEWS = [
    ("runs", "/", "Runs", 0),
    ("overview", f"/overview?run={RUN}", "Overview of", 2),
    ("timeline", f"/timeline?run={RUN}", "Timeline of", 1),
    ("pipeline", f"/pipeline?run={RUN}", "Pipeline of", 0),
    ("stragglers", f"/stragglers?run={RUN}", "Stragglers of", 0),
    ("memory", f"/memory?run={RUN}", "Memory of", 1),
    ("compare", f"/compare?a={RUN}&b={RUN}", "Compare", 1),
    ("operators", f"/operators?run={RUN}", "Operators & kernels of", 2),
]
#: Zoom windows as (start, end) fractions of the run; None = back to the whole run.
ZOOMS: list[tuple[str, tuple[float, float] | None]] = [
    ("zoom to 50%", (0.25, 0.75)),
    ("zoom to 2%", (0.49, 0.51)),
    ("zoom to 0.05%", (0.5, 0.5005)),
    ("zoom out (whole run)", None),
]

RENDERED_JS = """
const h1 = document.querySelector('main h1');
if (!h1 || !h1.textContent.startsWith(arguments[0])) return null;
if (document.querySelectorAll('.js-plotly-plot .main-svg').length < arguments[1]) return null;
if (document.querySelector('[data-dash-is-loading="true"]')) return null;
return performance.now();
"""
DASH_BYTES_JS = """
let data = 0, assets = 0;
for (const e of performance.getEntriesByType('resource')) {
  if (e.name.includes('/_dash-update-component') || e.name.includes('/_dash-layout')
      || e.name.includes('/_dash-dependencies')) data += e.encodedBodySize;
  else assets += e.encodedBodySize;
}
return [data, assets];
"""


def ensure_store(ranks: int, beside: int = 0) -> Path:
    """bench_data/app_xN.duckdb holding the N-rank set as run 'bench' (ingested once), with
    `beside` small synthetic runs ingested before it (app_xN_besideK.duckdb)."""
    db = DATA / (f"app_x{ranks}_beside{beside}.duckdb" if beside else f"app_x{ranks}.duckdb")
    if db.exists():
        import duckdb

        with duckdb.connect(str(db), read_only=True) as con:
            if con.execute("SELECT count(*) FROM runs WHERE name = ?", [RUN]).fetchone()[0]:
                return db
    folder = rank_set(ranks)
    if beside:
        from tracelab.ingest import ingest
        from tracelab.testing.synth import SCENARIOS, build_run

        names = sorted(SCENARIOS)
        with tempfile.TemporaryDirectory(prefix="tracelab-bench-beside-") as tmp:
            for i in range(beside):
                r = build_run(Path(tmp) / f"r{i}", names[i % len(names)])
                ingest(r.paths, db=str(db), run=f"beside{i}", if_exists="replace", workers=1)
    print(f"ingesting {folder} into {db} ...", file=sys.stderr)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tracelab.cli",
            "ingest",
            str(folder),
            "--db",
            str(db),
            "--run",
            RUN,
            "--replace",
        ],
        check=True,
    )
    return db


def start_server(db: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tracelab.cli",
            "serve",
            "--db",
            str(db),
            "--port",
            str(port),
            "--no-warm",
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/_dash-layout", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"server did not start: {log.read_text()[-2000:]}")


def make_driver(profile: str) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from tracelab.testing.chromium import CHROMEDRIVER, CHROMIUM, headless_flags

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in (*headless_flags(profile), "--window-size=1400,1000"):
        opts.add_argument(flag)
    drv = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)
    drv.set_page_load_timeout(TIMEOUT_S)
    drv.execute_cdp_cmd("Network.enable", {})
    drv.execute_cdp_cmd("Network.setCacheDisabled", {"cacheDisabled": False})
    return drv


def wait_value(drv: Any, script: str, *args: Any) -> Any:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        value = drv.execute_script(script, *args)
        if value is not None:
            return value
        time.sleep(POLL_S)
    raise TimeoutError(f"page not ready after {TIMEOUT_S} s: {drv.current_url}")


def load_view(drv: Any, url: str, heading: str, plots: int) -> dict[str, float]:
    drv.get("about:blank")
    drv.get(url)
    ms = wait_value(drv, RENDERED_JS, heading, plots)
    data, assets = drv.execute_script(DASH_BYTES_JS)
    return {"ms": float(ms), "bytes": int(data), "asset_bytes": int(assets)}


NAV_CLICK_JS = """
const link = Array.from(document.querySelectorAll('nav a')).find(a => a.textContent === arguments[0]);
window.__nav_t0 = performance.now();
link.click();
"""
NAV_DONE_JS = """
const h1 = document.querySelector('main h1');
if (!h1 || !h1.textContent.startsWith(arguments[0])) return null;
if (document.querySelectorAll('.js-plotly-plot .main-svg').length < arguments[1]) return null;
if (document.querySelector('[data-dash-is-loading="true"]')) return null;
return performance.now() - window.__nav_t0;
"""
#: (nav label, heading prefix, plots) for in-app navigation, starting from the overview.
NAV = [
    ("Timeline", "Timeline of", 1),
    ("Pipeline", "Pipeline of", 0),
    ("Stragglers", "Stragglers of", 0),
    ("Memory", "Memory of", 1),
    ("Overview", "Overview of", 2),
    ("Runs", "Runs", 0),
]


def navigate(drv: Any, base: str) -> dict[str, float]:
    load_view(drv, base + f"/overview?run={RUN}", "Overview of", 2)
    out = {}
    for label, heading, plots in NAV:
        drv.execute_script(NAV_CLICK_JS, label)
        out[label.lower()] = float(wait_value(drv, NAV_DONE_JS, heading, plots))
        if label == "Runs":
            break
    return out


def cold_overview(drv: Any, base: str) -> dict[str, float]:
    drv.get("about:blank")
    drv.get(base + f"/overview?run={RUN}")
    first = wait_value(drv, RENDERED_JS, "Analyzing", 0)
    full = wait_value(drv, RENDERED_JS, "Overview of", 2)
    return {"first_paint_ms": float(first), "full_ms": float(full)}


STATUS_JS = "const s = document.getElementById('timeline-status'); return s ? s.textContent : null;"
ZOOM_JS = """
const gd = document.getElementById('timeline-graph').querySelector('.js-plotly-plot');
performance.clearResourceTimings();
window.__zoom_t0 = performance.now();
window.__zoom_status = document.getElementById('timeline-status').textContent;
if (arguments[0] === null) Plotly.relayout(gd, {'xaxis.autorange': true});
else Plotly.relayout(gd, {'xaxis.range[0]': arguments[0], 'xaxis.range[1]': arguments[1]});
"""
ZOOM_DONE_JS = """
const s = document.getElementById('timeline-status').textContent;
if (s === window.__zoom_status) return null;
if (document.querySelector('[data-dash-is-loading="true"]')) return null;
const gd = document.getElementById('timeline-graph').querySelector('.js-plotly-plot');
let shapes = 0;
for (const t of gd.data) {
  if (t.type === 'heatmap') shapes += t.z.reduce((n, row) => n + row.length, 0);
  else shapes += (t.x || []).length;
}
return [performance.now() - window.__zoom_t0, s, shapes];
"""


def zooms(drv: Any, base: str) -> dict[str, dict[str, Any]]:
    load_view(drv, base + f"/timeline?run={RUN}", "Timeline of", 1)
    span = drv.execute_script(
        "return document.getElementById('timeline-graph').querySelector('.js-plotly-plot')"
        "._fullLayout.xaxis.range;"
    )
    lo, hi = float(span[0]), float(span[1])
    out = {}
    for name, frac in ZOOMS:
        args = (
            (None, None) if frac is None else (lo + frac[0] * (hi - lo), lo + frac[1] * (hi - lo))
        )
        drv.execute_script(ZOOM_JS, *args)
        elapsed, status, shapes = wait_value(drv, ZOOM_DONE_JS)
        data, _ = drv.execute_script(DASH_BYTES_JS)
        out[name] = {
            "ms": float(elapsed),
            "bytes": int(data),
            "shapes": int(shapes),
            "mode": "aggregates" if status.startswith("Showing aggregates") else "events",
            "status": status,
        }
    return out


def one_rep(db: Path, work: Path) -> dict[str, Any]:
    proc, base = start_server(db, work / "serve.log")
    profile = tempfile.mkdtemp(prefix="tracelab-bench-chromium-", dir=work)
    drv = make_driver(profile)
    try:
        rep: dict[str, Any] = {"cold": cold_overview(drv, base), "views": {}}
        for _ in range(2):  # warm-up: the browser compiles and caches plotly.js (the overview:
            # its analyses are cached already; the timeline's windows are not touched)
            load_view(drv, base + f"/overview?run={RUN}", "Overview of", 2)
        for name, path, heading, plots in VIEWS:
            rep["views"][name] = load_view(drv, base + path, heading, plots)
        rep["nav"] = navigate(drv, base)
        rep["zooms"] = zooms(drv, base)
        return rep
    finally:
        drv.quit()
        proc.terminate()
        proc.wait(20)


def summarize(reps: list[dict[str, Any]]) -> dict[str, Any]:
    med = statistics.median
    return {
        "cold_first_paint_ms": med(r["cold"]["first_paint_ms"] for r in reps),
        "cold_full_ms": med(r["cold"]["full_ms"] for r in reps),
        "views": {
            v: {
                "ms": med(r["views"][v]["ms"] for r in reps),
                "bytes": med(r["views"][v]["bytes"] for r in reps),
                "runs_ms": [round(r["views"][v]["ms"]) for r in reps],
            }
            for v in reps[0]["views"]
        },
        "asset_bytes_first_load": reps[0]["views"]["runs"]["asset_bytes"],
        "nav_ms": {v: med(r["nav"][v] for r in reps) for v in reps[0]["nav"]},
        "zooms": {
            z: {
                "ms": med(r["zooms"][z]["ms"] for r in reps),
                "bytes": med(r["zooms"][z]["bytes"] for r in reps),
                "shapes": med(r["zooms"][z]["shapes"] for r in reps),
                "mode": reps[0]["zooms"][z]["mode"],
                "runs_ms": [round(r["zooms"][z]["ms"]) for r in reps],
            }
            for z in reps[0]["zooms"]
        },
    }


def table(results: dict[int, dict[str, Any]]) -> str:
    ns = sorted(results)
    head = "| | " + " | ".join(f"{n} rank{'s' if n > 1 else ''}: time | bytes" for n in ns) + " |"
    lines = [head, "|---|" + "---|---|" * len(ns)]
    first = results[ns[0]]
    for v in first["views"]:
        cells = [
            f"{results[n]['views'][v]['ms']:.0f} ms | {results[n]['views'][v]['bytes'] / 1024:.0f} KiB"
            for n in ns
        ]
        lines.append(f"| {v} (first render) | " + " | ".join(cells) + " |")
    for z in first["zooms"]:
        cells = [
            f"{results[n]['zooms'][z]['ms']:.0f} ms | {results[n]['zooms'][z]['bytes'] / 1024:.0f} KiB"
            f" ({results[n]['zooms'][z]['mode']}, {results[n]['zooms'][z]['shapes']:,.0f} shapes)"
            for n in ns
        ]
        lines.append(f"| timeline {z} | " + " | ".join(cells) + " |")
    for v in first["nav_ms"]:
        cells = [f"{results[n]['nav_ms'][v]:.0f} ms | —" for n in ns]
        lines.append(f"| {v} (from the navigation bar) | " + " | ".join(cells) + " |")
    cells = [
        f"{results[n]['cold_first_paint_ms']:.0f} ms → {results[n]['cold_full_ms'] / 1000:.1f} s | —"
        for n in ns
    ]
    lines.append(
        "| overview, cold (first paint → page with all analyses) | " + " | ".join(cells) + " |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--ranks", default="1,8", help="comma-separated rank counts")
    parser.add_argument(
        "--beside", type=int, default=0, help="small synthetic runs in the store beside it"
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "app.json"))
    args = parser.parse_args()
    results: dict[int, dict[str, Any]] = {}
    for n in (int(x) for x in args.ranks.split(",")):
        db = ensure_store(n, args.beside)
        work = Path(tempfile.mkdtemp(prefix="tracelab-bench-app-"))
        try:
            reps = []
            for i in range(args.reps):
                reps.append(one_rep(db, work))
                v = reps[-1]["views"]
                print(
                    f"{n} ranks, rep {i + 1}: "
                    + ", ".join(f"{k} {x['ms']:.0f} ms" for k, x in v.items())
                    + "; zooms "
                    + ", ".join(f"{x['ms']:.0f} ms" for x in reps[-1]["zooms"].values()),
                    file=sys.stderr,
                )
        finally:
            shutil.rmtree(work, ignore_errors=True)
        results[n] = {**summarize(reps), "reps": reps, "events": events(db)}
    print(table(results))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"cpus": os.cpu_count(), "results": results}, indent=1))


def events(db: Path) -> int:
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        return int(con.execute("SELECT count(*) FROM events").fetchone()[0])


if __name__ == "__main__":
    main()
