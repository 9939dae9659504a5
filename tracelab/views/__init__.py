"""Queries behind the dashboard: each function takes a DuckDB cursor and returns plain, bounded data.

The app (tracelab.app) is a thin shell over this package and tracelab.figures: its callbacks parse
the URL, open a read-only cursor, call one function here, hand the result to a figure builder and
return it. Everything that touches SQL or decides what a number means lives here, so it is tested
without a browser and reused by other renderers.

Every function bounds what it returns (pages, bins, top-N), whatever the size of the trace: the
timeline aggregates by zoom level (`timeline.py`), tables page (`PAGE_ROWS`), series are binned.
Times are nanoseconds on the *aligned* clock (rank clock minus its offset to rank 0, see
`context.RunContext`) and are shown in milliseconds since the first event of the run.
"""

from __future__ import annotations

#: Rows per page of any table the app shows.
PAGE_ROWS = 25
