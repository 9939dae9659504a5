"""Every component id of the app, in one place. Pages and callbacks import these; tests too."""

from __future__ import annotations

# Shell
NAV = "nav"

# Runs
RUNS_TABLE = "runs-table"
RUNS_FINDINGS = "runs-findings"
RUNS_TRIGGER = "runs-trigger"
RUNS_COMPARE_A = "runs-compare-a"
RUNS_COMPARE_B = "runs-compare-b"
RUNS_COMPARE_LINK = "runs-compare-link"
RUNS_PRELOAD = "runs-plotly-preload"

# Overview
OV_HEATMAP = "overview-step-heatmap"
OV_BREAKDOWN = "overview-breakdown"
OV_FINDINGS = "overview-findings"
OV_SUMMARY = "overview-summary"
OV_HEADLINE = "overview-headline"
OV_PARTS = "overview-parts"
OV_DIMS = "overview-dims"
OV_CLICK_SINK = "overview-click-sink"
OV_HANG = "overview-hang"
#: The hang banner's link to the timeline at the step of the hang.
OV_HANG_TIMELINE = "overview-hang-timeline"

# Timeline
TL_GRAPH = "timeline-graph"
TL_STATUS = "timeline-status"
TL_RANKS = "timeline-ranks"
TL_STEPS = "timeline-steps"
TL_CATS = "timeline-categories"
TL_APPLY = "timeline-apply"
TL_RESET = "timeline-reset"
TL_STATE = "timeline-state"
#: The x-range the plot shows after a zoom (written in the browser from the plot itself).
TL_VIEW = "timeline-view"
#: The query string the timeline wants in the address bar (a clientside callback writes it).
TL_URL = "timeline-url"
TL_URL_SINK = "timeline-url-sink"
TL_DETAIL = "timeline-detail"
TL_SUMMARY = "timeline-rank-summary"
TL_TOP = "timeline-top-events"
TL_PERFETTO = "timeline-perfetto"
TL_STATE_SINK = "timeline-state-sink"
TL_LEGEND = "timeline-legend"

# Pipeline
PP_SCHEDULE = "pipeline-schedule"
PP_BUBBLES = "pipeline-bubbles"
PP_TABLE = "pipeline-table"
PP_HEADLINE = "pipeline-headline"

# Stragglers
ST_SKEW = "stragglers-skew"
ST_WAIT = "stragglers-wait"
ST_BLAME = "stragglers-blame"
ST_PAGE = "stragglers-page"
ST_HEADLINE = "stragglers-headline"

# Memory
MEM_PEAKS = "memory-peaks"
MEM_STAGES = "memory-stages"
MEM_SERIES = "memory-series"
MEM_ESTIMATE = "memory-estimate"
MEM_SUMMARY = "memory-summary"
MEM_HEADLINE = "memory-headline"

# Operators & kernels
OP_OPS = "operators-ops"
OP_KERNELS = "operators-kernels"
OP_SUMMARY = "operators-summary"
OP_OPS_CHART = "operators-ops-chart"
OP_KERNELS_CHART = "operators-kernels-chart"
OP_GROUP = "operators-group"

# Compare
CMP_METRICS = "compare-metrics"
CMP_STEPS = "compare-steps"
CMP_SUMMARY = "compare-summary"

# Shared
ERROR = "error-page"
FINDINGS_PAGE = "findings-page"

# Pages waiting for their analyses (tracelab.app.pending)
PENDING_BODY = "pending-body"
PENDING_POLL = "pending-poll"
PENDING_ARGS = "pending-args"
PENDING_NOTE = "pending-note"
