"""Headless CI regression reports: compare a candidate run against a baseline and gate on it.

The pipeline runs one way: the command (tracelab.commands._report_inputs) resolves the two
runs, ingesting folders on the fly; `metrics` reads each run's metrics from the store and the
analyzers, `compare` judges them against `thresholds` with `stats`, and `outputs` writes the
result through a renderer (`render_markdown`, `render_html`, `render_json`, `render_junit`).
This package reads the store and never imports tracelab.ingest. This package imports neither
dash nor a browser; plotly is used for the HTML figures only when installed.
"""
