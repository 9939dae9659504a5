"""Headless CI regression reports: compare a candidate run against a baseline and gate on it.

The pipeline runs one way: `build` resolves the two runs (ingesting folders on the fly),
`metrics` and `analyzer_metrics` read each run's metrics from the store and the analyzers,
`compare` judges them against `thresholds` with `stats`, and a renderer (`render_markdown`,
`render_html`, `render_json`, `render_junit`) writes the result. This package imports neither
dash nor a browser; plotly is used for the HTML figures only when installed.
"""
